"""mas: train teams of LLM agents with reinforcement learning and per-agent credit assignment.

The Python API (docs/python_api.md) is ``mas.load_team``, ``mas.train`` and ``mas.evaluate``;
they are imported on first use, so ``import mas`` stays cheap.
"""

import importlib.util as _util

# agents/, credit/, envs/ and topologies/ sit beside mas/ in a checkout and install as mas.agents,
# mas.credit, ... (pyproject.toml's package-dir); a checkout put on sys.path (PYTHONPATH=.) has no
# such mapping, and would fail later on the first of them with "No module named 'mas.agents'"
if _util.find_spec("mas.agents") is None:
    raise ImportError(
        f"mas was imported from {__path__[0]}, a source checkout that is not installed: its agents/, credit/, envs/ "
        "and topologies/ folders become mas.agents, mas.credit, ... only when it is. Install it with "
        "`bash scripts/setup.sh` (or `pip install -e .`) instead of putting the checkout on PYTHONPATH.")

from mas import _moved  # noqa: E402
from mas.refs import shield_checkout_folders  # noqa: E402
from mas.version import __version__  # noqa: E402

_moved.install()  # the import paths from before mas/ was grouped by layer (mas.engine, ...)
# the checkout's agents/ (mas.agents) never shadows the top-level `agents` of the OpenAI Agents SDK
shield_checkout_folders()

__all__ = ["evaluate", "load_team", "train"]


def __getattr__(name: str):
    if name in __all__:
        from mas.process.memory import huge_pages_for_large_tensors

        huge_pages_for_large_tensors()  # torch's allocator as the mas command sets it, where torch is not loaded yet
        from mas import api

        return getattr(api, name)
    raise AttributeError(f"module 'mas' has no attribute {name!r}")
