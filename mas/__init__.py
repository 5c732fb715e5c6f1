"""mas: train teams of LLM agents with reinforcement learning and per-agent credit assignment."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("mas-rl")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0+unknown"
