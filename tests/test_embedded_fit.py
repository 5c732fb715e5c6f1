"""The warning for a team the embedded model was not warm-started for: its wording, when it
fires, and end to end through `mas train` (terminal and warnings.jsonl)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from team_helpers import team_config

from mas.config.schema import validate_config
from mas.embedded import FORMATS
from mas.embedded.fit import EmbeddedFitCheck, fit_warnings

ROOT = Path(__file__).parents[1]


def embedded_team(topology="chain"):
    return validate_config(team_config("embedded", topology))


def test_a_foreign_team_is_told_what_the_model_knows_and_what_to_do():
    cfg = embedded_team("chain")
    msgs = fit_warnings(cfg, {"lead": (40, 40), "helper": (40, 10), "checker": (40, 38)}, "the first evaluation")
    assert len(msgs) == 2  # helper parsed 75%: not warned
    lead = next(m for m in msgs if "of lead's turns" in m)
    assert lead.startswith("the embedded model parsed 0% of lead's turns (orchestrator parser, chain topology) in the first evaluation")
    assert "configs/quickstart.yaml" in lead and "configs/team_saboteur.yaml" in lead  # what it was warm-started on
    assert "use a hub model (policies.main.model)" in lead
    assert FORMATS["chain"].agents["verifier"].role in lead  # the prompts of the chain it knows
    assert any("parsed 5% of checker's turns (verdict parser" in m for m in msgs)


def test_a_warm_started_team_or_a_hub_model_gets_no_warning():
    data = yaml.safe_load((ROOT / "configs" / "cpu_chain.yaml").read_text())
    cfg = validate_config(data)
    assert fit_warnings(cfg, {"solver": (50, 2), "verifier": (50, 0)}, "step 0") == []
    hub = validate_config(team_config("Qwen/Qwen2.5-0.5B-Instruct", "chain"))
    assert fit_warnings(hub, {"lead": (40, 40)}, "step 0") == []


def test_the_list_of_warm_started_configs_names_each_once():
    """A one-agent format (the graph's worker, the saboteur's solver) shares its team's configs;
    the warning lists cpu_graph.yaml and team_saboteur.yaml once each."""
    (msg,) = fit_warnings(embedded_team("chain"), {"lead": (40, 40)}, "step 0")
    listed = msg.split("warm-started only on the teams of ")[1].split(", and this role")[0].split(", ")
    assert "configs/cpu_graph.yaml" in listed and "configs/team_saboteur.yaml" in listed
    assert len(listed) == len(set(listed)), listed


def test_a_prompt_warm_started_in_another_topology_gets_the_right_article():
    data = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())
    orchestrator = data["agents"][0]["role"]
    cfg = validate_config(team_config("embedded", "chain"))
    cfg = cfg.model_copy(update={"agents": [cfg.agents[0].model_copy(update={"role": orchestrator}), *cfg.agents[1:]]})
    (msg,) = fit_warnings(cfg, {"lead": (40, 40)}, "step 0")
    assert "which was warm-started in an orchestrator topology" in msg


def test_a_warm_started_prompt_in_the_wrong_place_is_named():
    data = yaml.safe_load((ROOT / "configs" / "cpu_chain.yaml").read_text())
    data["agents"][1]["parser"] = "answer"  # the verifier's prompt with the answer parser
    data["topology"]["loop_to"] = None  # (a loop judged by a parser that never rejects is a config error of its own)
    msgs = fit_warnings(validate_config(data), {"verifier": (30, 30)}, "step 0")
    assert len(msgs) == 1 and "configs/cpu_chain.yaml's verifier prompt, which was warm-started with the verdict parser" in msgs[0]


def test_the_check_runs_once_at_the_first_evaluation_or_step():
    cfg = embedded_team("chain")
    seen = []
    check = EmbeddedFitCheck(cfg, lambda message, kind, step: seen.append((kind, step, message)))
    check.on_eval("before", {"accuracy": 0.0, "agents": {"lead": {"turns": 8, "parse_failures": 8}}})
    check.on_step_end(0, {"agents": {"lead": {"turns": 8, "parse_failures": 8}}}, [], None)
    check.on_eval("after", {"accuracy": 0.0, "agents": {"lead": {"turns": 8, "parse_failures": 8}}})
    assert [(k, s) for k, s, _ in seen] == [("embedded_format", None)]
    later = EmbeddedFitCheck(cfg, lambda message, kind, step: seen.append((kind, step, message)))
    later.on_step_end(3, {"agents": {"lead": {"turns": 8, "parse_failures": 8}}}, [], None)  # a resumed run: no check
    later.on_step_end(0, {"agents": {"lead": {"turns": 8, "parse_failures": 8}}}, [], None)
    assert [(k, s) for k, s, _ in seen] == [("embedded_format", None), ("embedded_format", 0)]


def test_mas_train_warns_in_the_terminal_and_the_run_directory(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """A foreign team on ``model: embedded`` (served here by a random tiny model, which parses
    nothing, exactly like the real one on prompts it never saw) trains one step and is warned."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mas.cli import main

    monkeypatch.setattr("mas.embedded.load_embedded", lambda: (AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                                                               AutoTokenizer.from_pretrained(tiny_model_dir)))
    cfg = team_config("embedded", "chain")
    cfg["trainer"].update(steps=1, eval_size=4)
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(path), "--run-dir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "warning: the embedded model parsed 0% of lead's turns" in out
    rows = [json.loads(line) for line in (tmp_path / "run" / "warnings.jsonl").read_text().splitlines()]
    assert rows and {r["kind"] for r in rows} == {"embedded_format"} and {r["step"] for r in rows} == {None}
    assert any("of lead's turns" in r["message"] and "use a hub model" in r["message"] for r in rows)
