"""MutualRL: concurrent GRPO post-training of heterogeneous policies that share experience."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("mutualrl")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+local"

__all__ = ["__version__"]
