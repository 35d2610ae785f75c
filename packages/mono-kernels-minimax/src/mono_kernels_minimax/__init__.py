"""mono_kernels_minimax."""

__version__ = "0.1.1"
