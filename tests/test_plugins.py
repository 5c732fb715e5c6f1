"""Plugins: an installed package adds an env, a credit method, a parser and a turn verifier through entry points,
and `mas validate` accepts them and lists them among the valid choices.

The package is a real distribution on disk (a ``.dist-info`` with ``entry_points.txt`` next to
its modules), found by ``importlib.metadata`` through ``PYTHONPATH`` in a fresh interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

ENTRY_POINTS = """\
[mas.envs]
coin_env = coinplug.envs

[mas.credit]
coin_credit = coinplug.credit

[mas.parsers]
shout = coinplug.parsers:shout
broken = coinplug.parsers:missing

[mas.verifiers]
heads_turn = coinplug.parsers:heads_turn
"""

MODULES = {
    "envs.py": '''
        from typing import Literal
        from pydantic import BaseModel, ConfigDict, Field
        from mas.envs import register_env
        from mas.types import Task

        class CoinEnvConfig(BaseModel):
            model_config = ConfigDict(extra="forbid", frozen=True)
            name: Literal["coin_env"] = Field(description="Selects this env.")
            sides: int = Field(2, description="Sides of the coin.")

        class CoinEnv:
            def __init__(self, cfg):
                self.cfg = cfg
            def sample_tasks(self, n):
                return [Task(str(i), "heads or tails?", "heads") for i in range(n)]
            def eval_tasks(self, n):
                return self.sample_tasks(n)
            def score(self, episode):
                return float(episode.answer == "heads")
            def state_dict(self):
                return {}
            def load_state_dict(self, state):
                pass

        register_env("coin_env", CoinEnvConfig, CoinEnv)
    ''',
    "credit.py": '''
        from typing import Literal
        import torch
        from pydantic import Field
        from mas.credit import CreditConfigBase, register_credit
        from mas.types import Credit

        class CoinCreditConfig(CreditConfigBase):
            method: Literal["coin_credit"] = Field("coin_credit", description="Credit method tag.")

        @register_credit("coin_credit", CoinCreditConfig)
        def coin_credit(batch, cfg, results=None):
            return Credit(advantages=torch.zeros(batch.num_turns))
    ''',
    "parsers.py": '''
        def shout(text):
            return {"answer": text.upper(), "label": "answer"}, True

        def heads_turn(episode, turn):
            return float("HEADS" in turn.text.upper())
    ''',
}


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("site")
    pkg = root / "coinplug"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, code in MODULES.items():
        (pkg / name).write_text(textwrap.dedent(code))
    dist = root / "coinplug-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: coinplug\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    return root


def run_mas(args: list[str], plugin_path: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(plugin_path)}
    return subprocess.run([sys.executable, "-m", "mas.cli", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


def config(**changes) -> dict:
    cfg = {
        "team": {"name": "coin"},
        "policies": {"main": {"model": "some/hub-id"}},
        "agents": [{"name": "caller", "policy": "main", "role": "Call it.", "parser": "shout"}],
        "topology": {"kind": "chain", "sequence": ["caller"]},
        "env": {"name": "coin_env", "sides": 2},
        "credit": {"method": "coin_credit"},
    }
    cfg.update(changes)
    return cfg


def test_plugins_are_valid_choices_in_configs_and_errors(plugin_path, tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(config()))
    bad = tmp_path / "bad.yaml"
    bad_cfg = config(env={"name": "dice"}, credit={"method": "oracle"}, verifier={"name": "tails_turn"})
    bad_cfg["agents"][0]["parser"] = "whisper"
    bad.write_text(yaml.safe_dump(bad_cfg))

    out = run_mas(["validate", "-q", str(good), str(bad)], plugin_path, tmp_path)
    assert out.returncode == 1 and f"{good}: ok" in out.stdout, out.stderr
    # the broken entry point is skipped, with the reason
    assert "plugin 'broken' (mas.parsers = 'coinplug.parsers:missing', from coinplug) was not loaded" in out.stderr
    lines = {line.strip().split(":")[0].lstrip("- "): line for line in out.stderr.splitlines() if line.strip().startswith("- ")}
    assert "'coin_env'" in lines["env.name"] and "'synthetic_math'" in lines["env.name"]
    assert "'coin_credit'" in lines["credit.method"] and "'grpo'" in lines["credit.method"]
    assert "'shout'" in lines["agents[0].parser"] and "'answer'" in lines["agents[0].parser"]
    assert "heads_turn" in lines["verifier.name"] and "synthetic_math" in lines["verifier.name"]


def test_a_plugin_env_parser_and_credit_method_run(plugin_path, tmp_path):
    code = textwrap.dedent('''
        import torch
        from mas.config.schema import load_config
        from mas.agents.agent import build_agents
        from mas.credit import get_credit
        from mas.envs import ENV_CONFIGS, build_env, env_configs, env_names
        from mas.envs.verifiers import resolve_verifier
        from mas.types import Turn
        cfg = load_config("good.yaml")
        assert env_names()[-1] == "coin_env" and env_configs()[:-1] == ENV_CONFIGS  # plugins after the built-ins
        assert cfg.verifier.name == "heads_turn"
        verify = resolve_verifier(cfg.verifier.name, None)
        assert verify(None, Turn("caller", "main", 0, None, [], [], [], [], "Heads!")) == 1.0
        env = build_env(cfg.env)
        agent = build_agents(cfg.agents, "coin")["caller"]
        assert agent.parse("heads") == ({"answer": "HEADS", "label": "answer"}, True)
        assert env.sample_tasks(2)[1].prompt == "heads or tails?"
        assert get_credit("coin_credit").config_cls.__name__ == "CoinCreditConfig"
        print("plugin ok")
    ''')
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(config(verifier={"name": "heads_turn"})))
    env = {**os.environ, "PYTHONPATH": str(plugin_path)}
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=300)
    assert out.returncode == 0 and "plugin ok" in out.stdout, out.stderr
