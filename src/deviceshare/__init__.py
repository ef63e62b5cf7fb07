"""deviceshare: a group of pods sharing the same accelerator devices on one node."""

__version__ = "0.1.0"
