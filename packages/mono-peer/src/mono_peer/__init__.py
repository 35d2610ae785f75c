"""mono_peer: peer memory that every tensor-parallel rank maps, for in-kernel collectives."""

from .agree import tp_agree
from .buffer import PeerBuffer

__all__ = ["PeerBuffer", "tp_agree"]
__version__ = "0.1.1"
