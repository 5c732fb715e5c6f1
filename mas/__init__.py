"""mas: train teams of LLM agents with reinforcement learning and per-agent credit assignment.

The Python API (docs/python_api.md) is ``mas.load_team``, ``mas.train`` and ``mas.evaluate``;
they are imported on first use, so ``import mas`` stays cheap.
"""

from mas.version import __version__

__all__ = ["evaluate", "load_team", "train"]


def __getattr__(name: str):
    if name in __all__:
        from mas import api

        return getattr(api, name)
    raise AttributeError(f"module 'mas' has no attribute {name!r}")
