"""mono_kernels_kimi: Kimi-K3 specialized-decode kernels (config, reference math, K1)."""

from .config import KimiK3Config

__all__ = ["KimiK3Config"]
__version__ = "0.1.1"
