"""mono_tools."""

__version__ = "0.1.1"
