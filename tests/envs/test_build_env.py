"""build_env dispatch and the discriminated env config union."""

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
