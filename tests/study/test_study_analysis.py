"""mas.study.analysis: curves, the final table, the frontier and the checklist, by hand on
hand-written metrics records (no training)."""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pytest

from mas.study.analysis import (analyse, bootstrap_ci, curve, eval_values, first_reach, method_row, metric_label, noise_floor,
                                paired, run_points)
from mas.study.runner import BudgetStop, StudySpec, step_usage


def step(s: int, rollout: int, credit: int, seconds: float, credit_s: float = 0.0) -> dict:
    return {"step": s, "generated": {"rollout_tokens": rollout, "credit_tokens": credit, "total": rollout + credit},
            "time": {"step": seconds, "credit": credit_s}}


def ev(name: str, value: float, s: int | None = None) -> dict:
    return {"eval": name, "accuracy": value, **({} if s is None else {"step": s})}


def test_run_points_accumulate_tokens_and_seconds_by_hand():
    """before 0.1; steps 0..3 of 100 rollout + 50 credit tokens and 2 s; evals after steps 1 and 3."""
    rows = [ev("before", 0.1)] + [step(s, 100, 50, 2.0, 0.5) for s in range(4)]
    rows.insert(3, ev("periodic", 0.3, 1))
    rows.append(ev("periodic", 0.6, 3))
    rows.append(ev("after", 0.6))  # the same evaluation again: not a new point
    p = run_points(rows)
    assert [(q["steps"], q["tokens"], q["seconds"], q["value"]) for q in p["points"]] == [
        (0, 0, 0, 0.1), (2, 300, 4.0, 0.3), (4, 600, 8.0, 0.6)]
    assert (p["steps"], p["tokens"], p["rollout_tokens"], p["credit_tokens"], p["seconds"], p["credit_seconds"]) == (4, 600, 400, 200, 8.0, 2.0)


def test_curve_on_steps_and_interpolated_tokens():
    a = [{"steps": 0, "tokens": 0, "value": 0.0}, {"steps": 2, "tokens": 100, "value": 0.4}, {"steps": 4, "tokens": 200, "value": 0.8}]
    b = [{"steps": 0, "tokens": 0, "value": 0.2}, {"steps": 2, "tokens": 50, "value": 0.2}, {"steps": 4, "tokens": 150, "value": 0.6}]
    c = curve([a, b], "steps")
    assert c["x"] == [0, 2, 4] and c["mean"] == pytest.approx([0.1, 0.3, 0.7]) and c["n"] == [2, 2, 2]
    assert c["std"] == pytest.approx([statistics.stdev([0.0, 0.2]), statistics.stdev([0.4, 0.2]), statistics.stdev([0.8, 0.6])])
    t = curve([a, b], "tokens")
    # shared points up to the shorter seed's last (150): 0, 50, 100, 150; a at 50 -> 0.2, at 150 -> 0.6;
    # b at 100 -> 0.2 + 0.4 * 50/100 = 0.4
    assert t["x"] == [0, 50, 100, 150]
    assert t["mean"] == pytest.approx([(0 + 0.2) / 2, (0.2 + 0.2) / 2, (0.4 + 0.4) / 2, (0.6 + 0.6) / 2])
    assert curve([a], "tokens")["std"] == [0.0, 0.0, 0.0]


def test_bootstrap_ci_brackets_the_mean_and_is_seeded():
    v = [0.2, 0.5, 0.4]
    lo, hi = bootstrap_ci(v)
    assert lo <= statistics.fmean(v) <= hi and min(v) <= lo and hi <= max(v)
    assert bootstrap_ci(v) == (lo, hi)  # seeded
    assert bootstrap_ci([0.7]) == (0.7, 0.7)
    # against an independent numpy loop
    rng = np.random.default_rng(0)
    means = np.asarray(v)[rng.integers(0, 3, size=(10_000, 3))].mean(axis=1)
    assert (lo, hi) == pytest.approx(tuple(np.percentile(means, [2.5, 97.5])))


def test_method_row_reach_and_overhead_by_hand():
    """Baseline ends at 0.5.  Seed 0 reaches 0.5 after 2 steps / 300 tokens, seed 1 never does."""
    r0 = {"points": [{"steps": 0, "tokens": 0, "seconds": 0, "value": 0.1}, {"steps": 2, "tokens": 300, "seconds": 4, "value": 0.5},
                     {"steps": 4, "tokens": 600, "seconds": 8, "value": 0.7}],
          "steps": 4, "tokens": 600, "rollout_tokens": 400, "credit_tokens": 200, "seconds": 8.0, "credit_seconds": 2.0}
    r1 = {**r0, "points": [{"steps": 0, "tokens": 0, "seconds": 0, "value": 0.1}, {"steps": 4, "tokens": 600, "seconds": 8, "value": 0.3}],
          "credit_tokens": 100, "credit_seconds": 4.0}
    base = {"steps_to_baseline": 4.0, "tokens_to_baseline": 400.0}
    row = method_row("sharp", [r0, r1], 0.5, base)
    assert row["final_mean"] == pytest.approx(0.5) and row["final_std"] == pytest.approx(math.sqrt(0.08))
    assert row["reached_baseline"] == 1 and row["steps_to_baseline"] == 2 and row["tokens_to_baseline"] == 300
    assert row["steps_share_of_baseline"] == 0.5 and row["tokens_share_of_baseline"] == 0.75
    assert row["extra_compute"] == pytest.approx((200 / 400 + 100 / 400) / 2)
    assert row["credit_time_share"] == pytest.approx((2 / 8 + 4 / 8) / 2)
    assert first_reach(r1["points"], 0.5) is None


def test_budget_counts_what_each_step_generated():
    b = BudgetStop("tokens", 250)
    assert not b.on_step_end(0, step(0, 100, 20, 1.0), [], None)
    assert b.on_step_end(1, step(1, 100, 40, 1.0), [], None)  # 260 >= 250: stop after this step
    assert b.used == 260
    s = BudgetStop("seconds", 2.5, used=2.0)
    assert s.on_step_end(2, step(2, 1, 0, 0.75), [], None)
    assert step_usage(step(0, 7, 3, 1.5)) == {"steps": 1.0, "tokens": 10.0, "seconds": 1.5}
    steps = BudgetStop("steps", 1)  # trainer.steps ends a steps budget: the callback only counts
    assert not steps.on_step_end(0, step(0, 1, 0, 0.1), [], None) and steps.reached and steps.used == 1
    with pytest.raises(ValueError, match="valid"):
        BudgetStop("episodes", 3)


def _write_study(tmp_path, runs: dict, kind="steps", budget=4.0):
    spec = StudySpec(config="team.yaml", methods=tuple(runs), seeds=2, out=str(tmp_path), budget_kind=kind, budget=budget)
    from dataclasses import asdict

    (tmp_path / "study_spec.json").write_text(json.dumps(asdict(spec)))
    for method, seeds in runs.items():
        for s, rows in enumerate(seeds):
            d = tmp_path / "runs" / method / f"seed_{s}"
            d.mkdir(parents=True)
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            (d / "study_run.json").write_text(json.dumps({"budget": {"kind": kind, "limit": budget, "used": budget, "reached": True}}))


def _rows(values: list[float], credit: int) -> list[dict]:
    rows = [ev("before", values[0])]
    for s in range(4):
        rows.append(step(s, 100, credit, 1.0, 0.1 * credit / 50))
        if s % 2 == 1:
            rows.append(ev("periodic", values[(s + 1) // 2], s))
    return rows


def test_analyse_a_hand_written_study(tmp_path):
    _write_study(tmp_path, {"grpo": [_rows([0.1, 0.3, 0.5], 0), _rows([0.1, 0.2, 0.3], 0)],
                            "sharp": [_rows([0.1, 0.5, 0.7], 100), _rows([0.1, 0.4, 0.5], 100)]})
    study = analyse(tmp_path)
    assert study["baseline"] == "grpo" and study["baseline_final"] == pytest.approx(0.4)
    by = {r["method"]: r for r in study["table"]}
    assert by["sharp"]["final_mean"] == pytest.approx(0.6) and by["sharp"]["extra_compute"] == pytest.approx(1.0)
    # sharp reaches 0.4 after 2 steps (both seeds); grpo: seed 0 after 4 steps, seed 1 never
    assert by["sharp"]["steps_to_baseline"] == 2 and by["grpo"]["steps_to_baseline"] == 4 and by["grpo"]["reached_baseline"] == 1
    assert by["sharp"]["steps_share_of_baseline"] == 0.5
    front = {p["method"]: p for p in study["frontier"]}
    assert front["grpo"] == {"method": "grpo", "extra_compute": 0.0, "gain": pytest.approx(0.0)}
    assert front["sharp"]["gain"] == pytest.approx(0.2)
    assert [c["item"] for c in study["checklist"]] == ["Episode-level baseline on the same model and compute", "Variance over seeds",
                                                       "Credit-specific overhead"]
    assert "steps-matched" in study["checklist"][0]["value"] and "2.00x" in study["checklist"][0]["value"]
    assert "fewer than the survey's minimum of 3" in study["checklist"][1]["value"]
    assert study["curves"]["tokens"]["sharp"]["x"][-1] == 800  # 4 steps x (100 + 100) tokens


def test_metric_label_names_the_env_reward_and_the_decoding():
    assert metric_label({}) == "accuracy (greedy)"
    assert metric_label({"env": {"reward": "f1"}}) == "F1 (greedy)"
    agents = [{"sampling": {"temperature": 0.7}}, {"sampling": {"temperature": 1.0}}]
    assert metric_label({"agents": agents, "trainer": {"eval_sampled_k": 8}}, "sampled") == "accuracy (sampled, avg@8 at T=0.7/1)"
    assert metric_label({"env": {"reward": "em"}}, "sampled") == "EM (sampled, avg@4)"


def full_ev(name: str, greedy: float, sampled: float, train: float, s: int | None = None, passed: float = 0.9) -> dict:
    """An evaluation record as mas.training.evaluation writes it."""
    return {**ev(name, greedy, s), "decoding": "greedy", "sampled": {"k": 4, "avg": sampled, "pass": passed},
            "train": {"accuracy": train, "sampled": {"k": 4, "avg": sampled + 0.1, "pass": passed}}}


def test_eval_values_read_every_decoding_and_an_older_sampled_headline():
    v = eval_values(full_ev("periodic", 0.5, 0.3, 0.7, 1))
    assert v == {"greedy": 0.5, "sampled": 0.3, "pass": 0.9, "train": 0.7, "train_sampled": pytest.approx(0.4)}
    old = {"eval": "before", "accuracy": 0.2, "decoding": "sampled"}  # a run of the eval_do_sample days
    assert eval_values(old) == {"greedy": None, "sampled": 0.2, "pass": None, "train": None, "train_sampled": None}


def test_the_ranked_metric_the_gap_the_noise_floor_and_paired_seeds(tmp_path):
    """Greedy ranks by default; sampled on request.  grpo: greedy falls while sampled rises (the relay's
    story); the gap is training minus held-out, greedy.  The noise floor comes from the baseline's
    second evaluation of its start.  Pairs are formed by seed."""
    def run(greedy, sampled, train, noise):
        rows = [full_ev("before", greedy[0], sampled[0], train[0]), {**full_ev("noise", noise[0], noise[1], train[0])}]
        rows += [step(s, 100, 0, 1.0) for s in range(2)]
        rows.append(full_ev("periodic", greedy[1], sampled[1], train[1], 1))
        return rows

    _write_study(tmp_path, {
        "grpo": [run((0.6, 0.4), (0.1, 0.3), (0.7, 0.7), (0.6, 0.12)), run((0.6, 0.5), (0.1, 0.2), (0.7, 0.6), (0.6, 0.15))],
        "verified": [run((0.6, 0.6), (0.1, 0.4), (0.7, 0.7), (0.6, 0.1)), run((0.6, 0.5), (0.1, 0.3), (0.7, 0.6), (0.6, 0.1))],
    })
    study = analyse(tmp_path)
    assert study["metric"] == "accuracy (greedy)" and study["metric_kind"] == "greedy"
    rows = {r["method"]: r for r in study["table"]}
    assert rows["grpo"]["final_mean"] == pytest.approx(0.45)  # greedy finals 0.4, 0.5
    d = rows["grpo"]["decodings"]
    assert d["start"]["greedy"] == pytest.approx(0.6) and d["final"]["sampled"] == pytest.approx(0.25)
    assert d["start"]["gap"] == pytest.approx(0.1) and d["final"]["gap"] == pytest.approx(((0.7 - 0.4) + (0.6 - 0.5)) / 2)
    floor = study["noise_floor"]
    assert floor["greedy"] == {"mean": 0.0, "max": 0.0, "seeds": 2}  # greedy on the same tasks repeats exactly
    assert floor["sampled"]["max"] == pytest.approx(0.05) and floor["sampled"]["mean"] == pytest.approx(0.035)
    p = rows["verified"]["paired"]
    assert p["diffs"] == pytest.approx([0.2, 0.0]) and p["mean"] == pytest.approx(0.1) and p["seeds"] == 2
    assert p["inside_noise"] is True  # two seeds whose CI spans 0
    assert rows["grpo"]["paired"] is None
    from mas.study.page import render_study

    html = render_study(study)
    assert "accuracy (greedy)" in html and "training − held-out gap, greedy" in html and "inside the noise" in html
    assert "+30.0 → +20.0 points" not in html and "+10.0 → +20.0 points" in html  # grpo's gap: start → final
    # the same runs ranked by the sampled avg@4
    spec = json.loads((tmp_path / "study_spec.json").read_text())
    (tmp_path / "study_spec.json").write_text(json.dumps({**spec, "metric": "sampled"}))
    sampled = analyse(tmp_path)
    assert sampled["metric"].startswith("accuracy (sampled, avg@4")
    assert {r["method"]: r["final_mean"] for r in sampled["table"]} == pytest.approx({"grpo": 0.25, "verified": 0.35})


def test_paired_difference_outside_the_noise_by_hand():
    def pts(*finals):
        return [{"seed": s, "points": [{"value": 0.0}, {"value": v}]} for s, v in enumerate(finals)]

    out = paired({"grpo": pts(0.2, 0.3, 0.25), "verified": pts(0.4, 0.5, 0.46)}, "grpo", floor=0.05)
    assert out["verified"]["diffs"] == pytest.approx([0.2, 0.2, 0.21]) and out["verified"]["inside_noise"] is False
    out = paired({"grpo": pts(0.2, 0.3, 0.25), "c3": pts(0.23, 0.33, 0.28)}, "grpo", floor=0.05)
    assert out["c3"]["inside_noise"] is True  # always +3 points: a CI apart from 0, but within the floor
    assert noise_floor([{"points": [{"steps": 0, "greedy": 0.5}], "noise": None}]) == {}


def _agents(**verified: float) -> dict:
    return {"agents": {a: {"turns": 4, "parse_failures": 0, "verified_accuracy": v, "verified_turns": 4} for a, v in verified.items()}}


def test_a_warmed_up_run_starts_from_the_evaluation_after_its_warm_up():
    """RL is measured from the warm-up: the raw model's evaluation before it is no point of the curve."""
    rows = [ev("before", 0.0), {**ev("warmup", 0.2), **_agents(adder=0.5, orchestrator=0.4)}]
    rows += [step(s, 100, 0, 1.0) for s in range(2)]
    rows.append({**ev("periodic", 0.5, 1), **_agents(adder=0.9, orchestrator=0.6)})
    p = run_points(rows)
    assert [(q["steps"], q["value"]) for q in p["points"]] == [(0, 0.2), (2, 0.5)]
    assert p["points"][0]["verified"] == {"adder": 0.5, "orchestrator": 0.4}


def test_verified_accuracy_before_and_final_per_agent_and_team(tmp_path):
    """Two seeds: each agent's mean over seeds; the team's is the mean over its agents."""
    def run(before: dict, after: dict) -> list[dict]:
        return [{**ev("before", 0.1), **_agents(**before)}, step(0, 10, 0, 1.0), step(1, 10, 0, 1.0),
                {**ev("periodic", 0.3, 1), **_agents(**after)}]

    _write_study(tmp_path, {"verified": [run({"a": 0.5, "b": 0.7}, {"a": 0.9, "b": 0.7}),
                                         run({"a": 0.3, "b": 0.7}, {"a": 0.7, "b": 0.9})],
                            "grpo": [run({"a": 0.5}, {"a": 0.5}), run({"a": 0.3}, {"a": 0.3})]})
    study = analyse(tmp_path)
    v = {r["method"]: r["verified"] for r in study["table"]}
    assert v["verified"]["before"]["agents"] == pytest.approx({"a": 0.4, "b": 0.7})
    assert v["verified"]["final"]["agents"] == pytest.approx({"a": 0.8, "b": 0.8})
    assert v["verified"]["final"]["team"] == pytest.approx(0.8) and v["verified"]["before"]["team"] == pytest.approx(0.55)
    assert v["grpo"]["final"]["team"] == pytest.approx(0.4)
    from mas.study.page import render_study

    html = render_study(study)
    assert 'id="verified"' in html and "0.400 → 0.800" in html and "0.550 → 0.800" in html


def test_each_outcome_only_method_gets_the_share_of_verifieds_lead_it_recovers(tmp_path):
    """Finals (means of 2 seeds): grpo 0.4, verified 0.6, sharp 0.5, c3 0.3.  Shares of the lead
    (0.6 - 0.4 = 0.2): sharp (0.5 - 0.4) / 0.2 = 50%, c3 (0.3 - 0.4) / 0.2 = -50%; none for the
    baseline and the ceiling themselves, and none at all where the ceiling is not ahead."""
    _write_study(tmp_path, {"grpo": [_rows([0.1, 0.3, 0.5], 0), _rows([0.1, 0.2, 0.3], 0)],
                            "verified": [_rows([0.1, 0.5, 0.7], 0), _rows([0.1, 0.4, 0.5], 0)],
                            "sharp": [_rows([0.1, 0.4, 0.6], 0), _rows([0.1, 0.3, 0.4], 0)],
                            "c3": [_rows([0.1, 0.2, 0.4], 50), _rows([0.1, 0.2, 0.2], 50)]})
    study = analyse(tmp_path)
    share = {r["method"]: r["ceiling_lead_share"] for r in study["table"]}
    assert share["sharp"] == pytest.approx(0.5) and share["c3"] == pytest.approx(-0.5)
    assert share["grpo"] is None and share["verified"] is None
    from mas.study.page import render_study

    html = render_study(study)
    assert "share of verified's lead over the baseline" in html
    assert '<td class="lead">50%</td>' in html and '<td class="lead">-50%</td>' in html

    from mas.study.analysis import lead_share

    assert lead_share(0.5, 0.4, 0.4) is None and lead_share(0.5, 0.4, 0.3) is None  # the ceiling is not ahead
    assert lead_share(0.7, 0.4, 0.6) == pytest.approx(1.5)  # beyond the ceiling


def test_a_study_without_verified_shows_no_lead_column(tmp_path):
    _write_study(tmp_path, {"grpo": [_rows([0.1, 0.3, 0.5], 0), _rows([0.1, 0.2, 0.3], 0)],
                            "sharp": [_rows([0.1, 0.5, 0.7], 100), _rows([0.1, 0.4, 0.5], 100)]})
    study = analyse(tmp_path)
    assert all(r["ceiling_lead_share"] is None for r in study["table"])
    from mas.study.page import render_study

    assert "verified's lead" not in render_study(study)


def test_verified_team_figure_compares_the_same_agents_before_and_final():
    """Before training only the planner was verified (the adder never spoke); at the end both were.
    The team's before and final figures average the agents scored at both times: the planner."""
    from mas.study.analysis import verified_summary

    runs = [{"points": [{"steps": 0, "verified": {"planner": 0.5}},
                        {"steps": 10, "verified": {"planner": 0.7, "adder": 0.1}}]},
            {"points": [{"steps": 0, "verified": {"planner": 0.3}},
                        {"steps": 10, "verified": {"planner": 0.9, "adder": 0.3}}]}]
    got = verified_summary(runs)
    assert got["before"]["team"] == pytest.approx(0.4) and got["before"]["team_agents"] == ["planner"]
    assert got["final"]["team"] == pytest.approx(0.8)  # (0.7 + 0.9) / 2, not the mean with the adder's 0.2
    assert got["final"]["agents"] == pytest.approx({"planner": 0.8, "adder": 0.2})
    # nothing scored at both times: each time averages its own agents
    only_final = verified_summary([{"points": [{"steps": 0, "verified": {}}, {"steps": 5, "verified": {"a": 0.2, "b": 0.6}}]}])
    assert "before" not in only_final and only_final["final"]["team"] == pytest.approx(0.4)
