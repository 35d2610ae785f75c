"""mono_peer."""

__version__ = "0.1.0"
