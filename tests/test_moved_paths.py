"""The import paths from before mas/ was grouped by layer still work, and give the module itself."""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from mas import _moved

# every old path warns (checked once below, with its location); the other tests import them on purpose
pytestmark = pytest.mark.filterwarnings(r"ignore:mas\.\S+ moved to mas\.:DeprecationWarning")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_an_old_path_is_the_moved_module_itself(old):
    new = f"mas.{_moved.MOVED[old]}"
    assert (ROOT / Path(*new.split("."))).with_suffix(".py").is_file() or (ROOT / Path(*new.split("."))).is_dir()
    module = importlib.import_module(f"mas.{old}")
    assert module is importlib.import_module(new)
    assert module.__name__ == new and module.__spec__.name == new  # its own spec, not the alias's


def test_old_paths_of_a_package_reach_its_submodules_and_names():
    from mas.backends.hf import HFBackend
    from mas.engine import EpisodeContext
    from mas.rollout.backends.hf import HFBackend as Moved
    from mas.rollout.engine import EpisodeContext as MovedContext

    assert HFBackend is Moved and EpisodeContext is MovedContext


def test_a_pickle_written_under_an_old_path_loads_the_moved_class():
    from mas.rollout.engine import Engine
    from mas.types import Outcome

    old = pickle.dumps(Engine, protocol=0).replace(b"mas.rollout.engine", b"mas.engine")
    assert b"mas.engine" in old and pickle.loads(old) is Engine
    # Outcome moved on down to mas.types (the protocol topologies run against); a pickle that names
    # it under the engine's old path still loads it
    assert pickle.loads(b"cmas.engine\nOutcome\np0\n.") is Outcome


def test_the_config_keeps_its_public_path():
    from mas.config import ConfigError, load_config
    from mas.config.schema import ConfigError as SchemaError, load_config as schema_load

    assert ConfigError is SchemaError and load_config is schema_load
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        import mas.config

        mas.config.nope  # noqa: B018


def test_the_learning_and_process_floors_answer_their_old_paths():
    """Modules that moved into mas/learning and mas/process (and the renamed log-prob scoring, the
    ground-floor tools and refs) are the same modules under their old dotted paths, with a warning."""
    import mas.learning.learner
    import mas.learning.logprobs
    import mas.process.sandbox
    import mas.refs
    import mas.tools

    for old, new in (("mas.training.learner", mas.learning.learner), ("mas.rollout.scoring", mas.learning.logprobs),
                     ("mas.rollout.sandbox", mas.process.sandbox), ("mas.config.refs", mas.refs),
                     ("mas.agents.tools", mas.tools)):
        sys.modules.pop(old, None)
        with pytest.warns(DeprecationWarning, match=f"{old} moved to {new.__name__}"):
            assert importlib.import_module(old) is new
    assert _moved.new_name("mas.training.memory_plan") == "mas.learning.memory_plan"
    assert _moved.new_name("mas.training.memory") == "mas.process.memory"
    assert _moved.new_name("mas.training.trainer") is None  # it did not move


def test_a_module_that_never_existed_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("mas.engine.nope")
    assert _moved.new_name("mas.nope") is None and _moved.new_name("other.engine") is None


def test_the_config_re_export_works_in_a_fresh_process_before_the_schema_is_imported():
    # in this process other tests have imported the schema already, which hid a recursion
    code = ("import sys, mas.config as c; assert 'mas.config.schema' not in sys.modules; "
            "from mas.config import ConfigError; assert c.load_config.__module__ == 'mas.config.loading', c.load_config")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_importing_a_low_config_module_does_not_build_the_schema():
    code = "import sys, mas.config.safe_yaml; assert 'mas.config.schema' not in sys.modules, 'schema built'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_old_path_warns_once_at_the_line_that_imports_it():
    """Each old name says where the module went, pointed at the importing line (not at the import
    machinery), and once: the alias stays in sys.modules."""
    sys.modules.pop("mas.scoring", None)
    with pytest.warns(DeprecationWarning, match=r"mas\.scoring moved to mas\.learning\.logprobs") as caught:
        importlib.import_module("mas.scoring")
    assert [Path(w.filename).name for w in caught] == [Path(__file__).name]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importlib.import_module("mas.scoring")  # cached: no second warning
