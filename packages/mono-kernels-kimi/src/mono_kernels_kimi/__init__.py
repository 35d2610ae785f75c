"""mono_kernels_kimi."""

__version__ = "0.1.0"
