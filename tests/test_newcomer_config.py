"""A new user's mistakes, each refused with what is wrong, why, and what to write instead (issue 39).

- a key of another section (``trainer.lr``) says where it belongs, not the nearest name here;
- a misspelt policy name in an override lists the policies (an agent's already did);
- learning rates outside (0, 1), AdamW betas outside [0, 1) and an infinite KL weight;
- ``trainer.group_size: 1`` where the credit is relative to the task's group: checked against
  what ``run_credit`` gives on groups of one episode;
- a ``module:function`` reference whose module needs an optional framework names the pip extra.
"""

from __future__ import annotations

import copy
import itertools
import sys
import typing
from pathlib import Path

import pytest
from hidden_packages import Hide
import yaml

from mas.cli import main
from mas.config.checks import meaning_errors
from mas.refs import RefError, extra_providing, import_ref
from mas.config.schema import ConfigError, apply_overrides, group_relative, validate_config
from mas.credit.batch import build_credit_batch
from mas.credit.registry import _REGISTRY, run_credit
from mas.types import Episode, EpisodeGroup, Task, Turn

REPO = Path(__file__).parents[1]

BASE: dict = {
    "team": {"name": "newcomer"},
    "policies": {"planner": {"model": "embedded"}, "workers": {"model": "embedded", "kind": "lora"}},
    "agents": [
        {"name": "orchestrator", "policy": "planner", "role": "You delegate.", "parser": "orchestrator"},
        {"name": "adder", "policy": "workers", "role": "You add."},
    ],
    "topology": {"kind": "orchestrator", "orchestrator": "orchestrator", "specialists": ["adder"]},
    "env": {"name": "synthetic_math"},
    "credit": {"method": "dr_mas"},
}


def base(**sections) -> dict:
    data = copy.deepcopy(BASE)
    data.update(sections)
    return data


def errors_of(data: dict, overrides: list[str] = ()) -> list[str]:
    with pytest.raises(ConfigError) as info:
        validate_config(apply_overrides(data, list(overrides)), "team.yaml", check=meaning_errors)
    return info.value.lines


def one_line(lines: list[str], path: str) -> str:
    hits = [ln for ln in lines if ln.startswith(path + ":")]
    assert len(hits) == 1, f"expected one error at {path!r}, got {lines}"
    return hits[0]


# --------------------------------------------------------------------------------------------
# unknown keys: where they belong
# --------------------------------------------------------------------------------------------


def test_a_key_of_another_section_says_where_it_belongs(tmp_path, capsys):
    """``trainer.lr`` is a policy's optimizer setting (and the warm-up's): said, in the override and in the file."""
    line = one_line(errors_of(base(), ["trainer.lr=1e-5"]), "trainer.lr")
    assert "unknown key; did you mean 'policies.<name>.optim.lr' or 'trainer.warmup.lr'?" in line
    # the sampling temperature is an agent's, not the nearest trainer key ('alternate')
    line = one_line(errors_of(base(trainer={"temperature": 0.5})), "trainer.temperature")
    assert "did you mean 'agents[<i>].sampling.temperature'" in line and "'alternate'?" not in line
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(base(trainer={"lr": 1e-5})))
    assert main(["validate", "-q", str(path)]) == 1
    assert "  - trainer.lr: unknown key; did you mean 'policies.<name>.optim.lr'" in capsys.readouterr().err


def test_a_misspelt_key_still_gets_the_nearest_key_of_its_section():
    assert "did you mean 'steps'?" in one_line(errors_of(base(), ["trainer.stpes=2"]), "trainer.stpes")
    line = one_line(errors_of(base(), ["policies.planner.optim.lrr=1e-5"]), "policies.planner.optim.lrr")
    assert "did you mean 'lr'?" in line
    # a key that is valid for another credit method is not suggested as itself
    line = one_line(errors_of(base(), ["credit.fanout=[2, 2]"]), "credit.fanout")
    assert "did you mean 'credit.fanout'" not in line and "valid: [" in line


# --------------------------------------------------------------------------------------------
# unknown names in overrides
# --------------------------------------------------------------------------------------------


def test_an_override_of_an_unknown_policy_lists_the_policies():
    with pytest.raises(ConfigError) as info:
        apply_overrides(base(), ["policies.planer.optim.lr=1e-5"])
    assert info.value.lines == ["policies.planer.optim.lr: no policy named 'planer'; did you mean 'planner'? valid: "
                                "['planner', 'workers'] (to add one, also set policies.planer.model=...)"]
    with pytest.raises(ConfigError) as info:
        apply_overrides(base(), ["policies.zzz.kind=frozen"])
    assert "no policy named 'zzz'; valid: ['planner', 'workers']" in info.value.lines[0]


def test_overrides_may_still_add_a_policy_with_its_model():
    data = apply_overrides(base(), ["policies.judge.kind=frozen", "policies.judge.model=embedded",
                                    "agents.adder.policy=judge"])
    cfg = validate_config(data)
    assert cfg.policies["judge"].kind == "frozen" and cfg.agent("adder").policy == "judge"
    data = apply_overrides(base(), ["policies.judge={model: embedded, kind: frozen}"])
    assert data["policies"]["judge"] == {"model": "embedded", "kind": "frozen"}


def test_an_override_of_an_unknown_agent_lists_the_agents():
    with pytest.raises(ConfigError) as info:
        apply_overrides(base(), ["agents.nosuch.sampling.temperature=0.5"])
    assert "no list entry named 'nosuch'; valid: ['orchestrator', 'adder']" in info.value.lines[0]


# --------------------------------------------------------------------------------------------
# numbers that cannot be right
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("override,path", [
    ("policies.planner.optim.lr=1e5", "policies.planner.optim.lr"),
    ("policies.planner.optim.lr=1.0", "policies.planner.optim.lr"),
    ("policies.planner.optim.lr=0", "policies.planner.optim.lr"),
    ("policies.planner.optim.lr=-1e-5", "policies.planner.optim.lr"),
    ("policies.planner.optim.lr=.nan", "policies.planner.optim.lr"),
    ("trainer.warmup.lr=2", "trainer.warmup.lr"),
])
def test_a_learning_rate_outside_0_to_1_is_refused_with_the_reason(override, path):
    line = one_line(errors_of(base(), [override]), path)
    assert "a learning rate must be > 0 and < 1: AdamW moves every weight by about lr per step" in line


@pytest.mark.parametrize("override", ["policies.planner.optim.lr=0.5", "policies.planner.optim.lr=2e-3",
                                      "trainer.warmup.lr=1e-6", "policies.planner.optim.lr=1.0e-7"])
def test_usual_and_large_but_possible_learning_rates_pass(override):
    validate_config(apply_overrides(base(), [override]), check=meaning_errors)


def test_adam_betas_must_be_in_0_to_1_and_the_kl_weight_finite():
    assert "less than 1" in one_line(errors_of(base(), ["policies.planner.optim.betas=[0.9, 1.5]"]),
                                     "policies.planner.optim.betas[1]")
    assert one_line(errors_of(base(), ["policies.planner.optim.betas=[-0.1, 0.999]"]), "policies.planner.optim.betas[0]")
    assert "finite" in one_line(errors_of(base(), ["trainer.kl_coef=.inf"]), "trainer.kl_coef")
    cfg = validate_config(apply_overrides(base(), ["policies.planner.optim.betas=[0.0, 0.95]", "trainer.kl_coef=0.1",
                                                   "trainer.clip_high=0.28"]))
    assert cfg.policies["planner"].optim.betas == (0.0, 0.95)


# --------------------------------------------------------------------------------------------
# a group of one episode
# --------------------------------------------------------------------------------------------


def test_a_group_of_one_is_refused_where_the_credit_is_group_relative(capsys):
    line = one_line(errors_of(base(), ["trainer.group_size=1"]), "trainer.group_size")
    assert line == ("trainer.group_size: credit 'dr_mas': normaliser 'agent' takes its mean and std over each task's "
                    "group of episodes, so with one episode per task every advantage is 0 and nothing trains; set "
                    "trainer.group_size to 2 or more (GRPO-style runs use 4 to 16), or credit.normaliser: global (found 1)")
    line = one_line(errors_of(base(credit={"method": "rloo"}), ["trainer.group_size=1"]), "trainer.group_size")
    assert "its baseline is the mean of the task's other episodes" in line and "normaliser" not in line
    quickstart = str(REPO / "configs" / "quickstart.yaml")
    assert main(["validate", "-q", quickstart, "trainer.group_size=1"]) == 1
    assert "trainer.group_size: credit 'dr_mas'" in capsys.readouterr().err


@pytest.mark.parametrize("credit", [
    {"method": "grpo", "normaliser": "global"},
    {"method": "dr_mas", "normaliser": "none"},
    {"method": "reinforce_pp"},
    {"method": "magrpo", "advantage_mode": "raw"},
])
def test_a_group_of_one_passes_where_one_episode_still_trains(credit):
    cfg = validate_config(apply_overrides(base(credit=credit), ["trainer.group_size=1"]), check=meaning_errors)
    assert cfg.trainer.group_size == 1


def _turn(agent: str, index: int) -> Turn:
    return Turn(agent=agent, policy=f"{agent}_policy", index=index, parent=None if index == 0 else index - 1,
                messages=[{"role": "user", "content": "q"}], prompt_ids=[1, 2, 3], completion_ids=[4, 5],
                logprobs=[-0.1, -0.2], text=f"{agent} says ANSWER: 1", valid=True, trainable=True)


def groups_of_one(rewards: list[float], agents: list[str]) -> list[EpisodeGroup]:
    """One episode per task, each with turns by ``agents`` (an agent may speak twice), rewards differing across tasks."""
    out = []
    for b, reward in enumerate(rewards):
        task = Task(task_id=f"task{b}", prompt="q", answer="a")
        episode = Episode(task=task, group_id=b, sample_id=0, seed=b, reward=reward,
                          turns=[_turn(a, t) for t, a in enumerate(agents)])
        out.append(EpisodeGroup(task=task, episodes=[episode]))
    return out


def _variants(name: str, cls) -> list[dict]:
    """Configs of method ``name`` over every normaliser and the options that change its baseline."""
    fields = cls.model_fields
    axes = {k: list(typing.get_args(fields[k].annotation)) for k in ("normaliser", "advantage_mode") if k in fields}
    if "baseline" in fields and fields["baseline"].annotation is bool:
        axes["baseline"] = [False, True]
    required = {"m_grpo": {"main_agent": "a"}}.get(name, {})
    return [{"method": name, **required, **dict(zip(axes, combo))} for combo in itertools.product(*axes.values())]


def _methods_without_extra_runs() -> list[tuple[str, dict]]:
    return [(name, kw) for name, m in sorted(_REGISTRY.items()) if m.plan is None for kw in _variants(name, m.config_cls)]


@pytest.mark.parametrize("name,kw", _methods_without_extra_runs(), ids=lambda v: v if isinstance(v, str) else
                         ",".join(f"{k}={x}" for k, x in v.items() if k != "method") or "default")
def test_group_relative_says_exactly_when_groups_of_one_give_zero_advantages(name, kw):
    """The config check against the method itself: refused iff every advantage of one-episode groups is 0."""
    cfg = _REGISTRY[name].config_cls(**kw)
    agents = ["a", "b", "a"]
    credit = run_credit(build_credit_batch(groups_of_one([0.0, 1.0, 0.3, 0.7], agents), sorted(set(agents))), cfg, None)
    all_zero = bool(credit.advantages.abs().max() < 1e-9)
    assert (group_relative(cfg) is not None) == all_zero, (kw, credit.advantages)


# --------------------------------------------------------------------------------------------
# a reference whose module needs an optional framework
# --------------------------------------------------------------------------------------------


@pytest.fixture()
def without_autogen(monkeypatch, tmp_path):
    """autogen uninstalled, and a team module in the current directory that imports it."""
    hidden = {"autogen_agentchat", "autogen_core", "autogen_ext"}
    for name in list(sys.modules):
        if name.split(".")[0] in hidden or name == "needs_autogen_team":
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [Hide(hidden), *sys.meta_path])
    (tmp_path / "needs_autogen_team.py").write_text("from autogen_agentchat.teams import RoundRobinGroupChat\n\n\n"
                                                    "def build(clients):\n    return RoundRobinGroupChat([])\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_the_pip_extra_of_an_optional_package_comes_from_the_package_metadata():
    assert extra_providing("autogen_agentchat") == "autogen"
    assert extra_providing("autogen_core.models") == "autogen"
    assert extra_providing("ray") == "ray" and extra_providing("datasets") == "data"
    assert extra_providing("torch") is None and extra_providing("no_such_package") is None


def test_a_missing_optional_framework_names_the_extra_that_installs_it(without_autogen):
    with pytest.raises(RefError) as info:
        import_ref("needs_autogen_team:build")
    python = Path(sys.executable)
    shown = python.relative_to(Path.cwd()) if python.is_relative_to(Path.cwd()) else python
    assert str(info.value) == (f"'needs_autogen_team' imports 'autogen_agentchat': needs the `autogen` extra: "
                               f"{shown} -m pip install -e '{REPO}[autogen]'")


def test_validate_an_autogen_factory_without_autogen_warns_with_the_extra_and_passes(without_autogen, capsys):
    """The config is right; this machine lacks the extra: a warning with the command (the README's
    `mas validate configs/*.yaml` exits 0), --strict fails, and the factory is not imported."""
    data = base(topology={"kind": "autogen", "factory": "needs_autogen_team:build"})
    path = without_autogen / "team.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["validate", "-q", str(path)]) == 0
    err = capsys.readouterr().err
    line = f"{path}: warning: topology.kind: needs the `autogen` extra: "
    assert line in err and "-m pip install -e '" in err and "[autogen]' (found 'autogen') [on this machine]" in err
    assert "Traceback" not in err
    assert main(["validate", "-q", "--strict", str(path)]) == 1


def test_train_refuses_an_autogen_team_without_autogen_before_any_episode(without_autogen, capsys):
    """A YAML AutoGen team imports nothing at validate; `mas train` must not start and fail every
    episode on the import: it stops with the extra's line (exit 2) and writes no run."""
    data = base(topology={"kind": "autogen", "team": "round_robin", "termination": {"max_messages": 2}})
    path = without_autogen / "team.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["train", str(path), "--run-dir", str(without_autogen / "run")]) == 2
    err = capsys.readouterr().err
    assert "topology.kind: needs the `autogen` extra: " in err and "Traceback" not in err
    assert not (without_autogen / "run").exists()
    assert main(["eval", str(path), "--size", "2"]) == 2  # build_team refuses too (mas eval, mas study, mas.train)
    assert "needs the `autogen` extra: " in capsys.readouterr().err


def test_a_framework_package_the_docs_import_beside_the_framework_gets_a_hint(monkeypatch, tmp_path):
    """The AutoGen docs' "before" code imports autogen_ext's OpenAI client, the LangGraph tutorials
    langchain_openai: neither is mas's; the error says what to install, not a bare 'No module named'."""
    monkeypatch.setattr(sys, "meta_path", [Hide({"langchain_openai", "langgraph_supervisor", "no_such_lib"}),
                                           *sys.meta_path])
    (tmp_path / "team_with_openai.py").write_text("from langchain_openai import ChatOpenAI\n\ndef build():\n    pass\n")
    (tmp_path / "team_with_supervisor.py").write_text("import langgraph_supervisor\n\ndef build():\n    pass\n")
    (tmp_path / "team_with_other.py").write_text("import no_such_lib\n\ndef build():\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("team_with_openai", "team_with_supervisor", "team_with_other", "langchain_openai", "langgraph_supervisor"):
        monkeypatch.delitem(sys.modules, name, raising=False)  # imported already in this process: import afresh
    with pytest.raises(RefError) as info:  # the serve extra installs the clients the endpoint examples import
        import_ref("team_with_openai:build")
    assert "'team_with_openai' imports 'langchain_openai': needs the `serve` extra: " in str(info.value)
    assert "-m pip install -e " in str(info.value) and "[serve]'" in str(info.value)
    with pytest.raises(RefError) as info:  # a package the docs import that no extra of mas installs
        import_ref("team_with_supervisor:build")
    assert "'team_with_supervisor' imports 'langgraph_supervisor': 'langgraph_supervisor' is not installed (mas does not " \
           "need it; your code does): " in str(info.value) and "-m pip install 'langgraph-supervisor'" in str(info.value)
    with pytest.raises(RefError) as info:
        import_ref("team_with_other:build")
    assert "'no_such_lib' is not installed in this environment" in str(info.value)
    assert "-m pip install no-such-lib" in str(info.value)


def test_a_missing_module_of_ones_own_is_still_named_as_such(without_autogen):
    with pytest.raises(RefError) as info:
        import_ref("no_such_team_module:build")
    assert "cannot import 'no_such_team_module': no module named 'no_such_team_module'" in str(info.value)
