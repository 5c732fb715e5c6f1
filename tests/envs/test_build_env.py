"""build_env dispatch and the discriminated env config union."""

import json
import subprocess
import sys
from typing import Annotated, Union

import pytest
from pydantic import Field, TypeAdapter, ValidationError

from mas.envs import ENV_CONFIGS, Env, build_env
from mas.envs.math import GSM8KConfig, GSM8KEnv, SyntheticMathConfig, SyntheticMathEnv

EnvSection = Annotated[Union[ENV_CONFIGS], Field(discriminator="name")]


def test_union_dispatches_on_name():
    adapter = TypeAdapter(EnvSection)
    syn = adapter.validate_python({"name": "synthetic_math", "num_ops": 3})
    gsm = adapter.validate_python({"name": "gsm8k", "max_eval": 5})
    assert isinstance(syn, SyntheticMathConfig) and syn.num_ops == 3
    assert isinstance(gsm, GSM8KConfig)
    with pytest.raises(ValidationError, match="synthetic_math") as err:
        adapter.validate_python({"name": "chess"})
    assert "gsm8k" in str(err.value)


def test_build_env_returns_the_right_env():
    syn = build_env(SyntheticMathConfig(name="synthetic_math"))
    gsm = build_env(GSM8KConfig(name="gsm8k"))
    assert isinstance(syn, SyntheticMathEnv) and isinstance(gsm, GSM8KEnv)
    for env in (syn, gsm):
        assert isinstance(env, Env)  # satisfies the protocol
        assert len(env.sample_tasks(2)) == 2 and len(env.eval_tasks(2)) == 2


def test_build_env_unknown_name_lists_choices():
    class Fake:
        name = "chess"

    with pytest.raises(ValueError, match="gsm8k.*synthetic_math"):
        build_env(Fake())


def test_import_is_light():
    code = "import sys, mas.envs; assert 'datasets' not in sys.modules, 'datasets imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


BUILT_IN = ["synthetic_math", "gsm8k", "hotpotqa", "facts", "team_conjunctive", "team_saboteur", "team_relay", "team_fork",
            "custom"]


@pytest.mark.parametrize("first", ["mas.envs", "mas.envs.team.fork", "mas.envs.custom", "mas.agents.parsers"])
def test_built_in_envs_register_in_a_fixed_order_whatever_is_imported_first(first):
    """Each built-in registers itself when its module is imported; the order (the schema's union, its
    error messages) is the package inits' import order, not whichever module a program reaches first."""
    code = f"import json, {first}, mas.envs as e; print(json.dumps([e.env_names(), [c.__name__ for c in e.env_configs()]]))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    names, configs = json.loads(out)
    assert names == BUILT_IN
    assert configs == [c.__name__ for c in ENV_CONFIGS]


def test_each_built_in_registers_its_config_builder_and_tools_from_its_own_module():
    from mas.envs import ENV_TOOLS, env_configs, env_names
    from mas.envs.registry import _BUILDERS

    assert env_names()[:len(BUILT_IN)] == BUILT_IN and env_configs()[:len(BUILT_IN)] == ENV_CONFIGS
    for name, config_cls in zip(BUILT_IN, ENV_CONFIGS):
        assert config_cls.model_fields["name"].annotation.__args__ == (name,)
        assert _BUILDERS[name].__module__ == config_cls.__module__  # one module holds the env and its registration
    assert ENV_TOOLS["hotpotqa"] == ENV_TOOLS["facts"] == ("search", "read")
    assert all(ENV_TOOLS[n] == () for n in BUILT_IN if n not in ("hotpotqa", "facts"))


def test_registering_a_name_twice_is_an_error():
    from mas.envs import register_env

    with pytest.raises(ValueError, match="'team_relay' is already registered"):
        register_env("team_relay", GSM8KConfig, GSM8KEnv)
    with pytest.raises(TypeError, match=r"must be a pydantic model declaring `name: Literal\['chess'\]`"):
        register_env("chess", GSM8KConfig, GSM8KEnv)
