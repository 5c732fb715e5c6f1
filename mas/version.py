"""The installed version of mas-rl, importable from any layer (``mas.__version__`` re-exports it)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("mas-rl")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0+unknown"
