"""mas: train teams of LLM agents with reinforcement learning and per-agent credit assignment.

The Python API (docs/python_api.md) is ``mas.load_team``, ``mas.train`` and ``mas.evaluate``;
they are imported on first use, so ``import mas`` stays cheap.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("mas-rl")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0+unknown"

__all__ = ["evaluate", "load_team", "train"]


def __getattr__(name: str):
    if name in __all__:
        from mas import api

        return getattr(api, name)
    raise AttributeError(f"module 'mas' has no attribute {name!r}")
