"""mono_vllm."""

__version__ = "0.1.1"
