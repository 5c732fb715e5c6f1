"""A study over team sizes: the scaling view by hand on hand-written runs (steps to the
baseline's final with censored seeds, cost, the per-agent signal at step 0, methods that do not
apply), and `mas study` with one config per size on tiny models (layout, resume, what is left out)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from study_helpers import hand_scaling_study, relay_team

from mas.cli import main
from mas.config.schema import ConfigError
from mas.study import StudySpec, analyse_sizes, plan_jobs, run_study, write_outputs
from mas.study.analysis import planned_coalitions, steps_to_target
from mas.study.page import render_sizes
from mas.study.runner import job_config, not_applicable_methods, read_jsonl, size_specs



# --- by hand ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hand_study(tmp_path_factory):
    return hand_scaling_study(tmp_path_factory.mktemp("scaling"))


def test_steps_to_the_baselines_final_per_size_with_censored_seeds(hand_study):
    result = analyse_sizes(hand_study)
    sc = result["scaling"]
    assert sc["sizes"] == [2, 4] and list(sc["points"]) == ["grpo", "c3", "sharp"] and sc["baseline"] == "grpo"
    at = {(m, p["n"]): p for m, pts in sc["points"].items() for p in pts}
    assert at[("grpo", 2)]["target"] == pytest.approx(0.5) and at[("grpo", 4)]["target"] == pytest.approx(0.2)
    g2 = at[("grpo", 2)]["steps_to_target"]
    assert g2["values"] == [4, 4] and g2["reached"] == 1 and g2["seeds"] == 2 and g2["mean"] == 4  # seed 1 censored at 4
    assert at[("c3", 2)]["steps_to_target"]["values"] == [2, 2] and at[("c3", 2)]["steps_to_target"]["reached"] == 2
    assert at[("c3", 4)]["steps_to_target"]["mean"] == 3 and at[("c3", 4)]["steps_to_target"]["ci95"] == [2, 4]
    assert at[("sharp", 4)]["steps_to_target"] == {"mean": 4, "ci95": [4.0, 4.0], "reached": 0, "seeds": 2, "values": [4, 4]}
    # the gain: last evaluation minus the one before training, per seed
    assert at[("grpo", 2)]["gain"]["values"] == pytest.approx([0.5, 0.3]) and at[("grpo", 2)]["gain"]["mean"] == pytest.approx(0.4)
    assert at[("sharp", 4)]["gain"]["mean"] == pytest.approx(0.1)


def test_cost_and_planned_coalitions_per_size(hand_study):
    sc = analyse_sizes(hand_study)["scaling"]
    at = {(m, p["n"]): p for m, pts in sc["points"].items() for p in pts}
    c3 = at[("c3", 4)]
    assert c3["extra_compute"] == pytest.approx(3.0) and c3["credit_tokens_per_step"] == 300
    assert c3["credit_seconds_per_step"] == 2.0 and c3["reruns_per_episode"] == pytest.approx(3 / 4)
    assert at[("sharp", 4)]["coalitions_per_episode"] == 15.0  # 60 coalition evaluations over 4 episodes
    # exact Shapley over every specialist (exclude: []): 2^N - 1 re-runs per episode
    assert at[("sharp", 2)]["planned"] == "exact Shapley over 2 players (2^2 - 1): 3 coalitions per episode"
    assert at[("sharp", 4)]["planned"] == "exact Shapley over 4 players (2^4 - 1): 15 coalitions per episode"
    assert at[("grpo", 4)]["planned"] is None
    assert sc["not_applicable"] == {"2": {"ccpo": "CCPO's counterfactual removes the upstream agent of a two-agent dyad"},
                                    "4": {"ccpo": "CCPO's counterfactual removes the upstream agent of a two-agent dyad"}}


def test_planned_coalitions_beyond_exact_and_with_the_default_exclude():
    assert planned_coalitions({"method": "sharp", "exclude": [], "max_exact_players": 8}, 8).endswith(": 255 coalitions per episode")
    mc = planned_coalitions({"method": "sharp", "exclude": [], "max_exact_players": 8, "mc_permutations": 2}, 10)
    assert mc.startswith("Monte-Carlo Shapley over 10 players, 2 orderings: ")
    assert int(mc.split(": ")[1].split()[0]) == 2 * 9 + 1  # P·(n - 1) + 1 distinct coalitions (the grand one not re-run)
    assert planned_coalitions({"method": "sharp", "exclude": None}, 3).startswith("exact Shapley over 2 players")
    assert planned_coalitions({"method": "sharp", "marginal": "loo", "exclude": []}, 3) == "leave-one-out masking: 3 coalitions per episode"
    assert planned_coalitions({"method": "sharp", "lambda_s": 0.0}, 3) is None


def test_signal_at_step_0_per_method_and_size(hand_study):
    sc = analyse_sizes(hand_study)["scaling"]
    g2 = sc["points"]["grpo"][0]["signal"]
    # s1: mean of 0.5 and 0.3; s2: 0.3 (its second seed is undefined and left out, counted)
    assert g2["agents"] == {"s1": pytest.approx(0.4), "s2": pytest.approx(0.3)} and g2["undefined"] == 1
    assert g2["mean"] == pytest.approx(0.35) and g2["min"] == pytest.approx(0.3) and g2["max"] == pytest.approx(0.4)
    assert sc["points"]["c3"][0]["signal"]["mean"] == pytest.approx((0.8 + 0.8) / 2)
    assert sc["points"]["grpo"][1]["signal"]["mean"] is None  # no designed signal recorded at N = 4


def test_the_page_and_json_of_a_study_over_sizes(hand_study):
    json_path, html_path = write_outputs(hand_study)
    data = json.loads(json_path.read_text())
    assert data["scaling"]["sizes"] == [2, 4] and [s["n"] for s in data["sizes"]] == [2, 4]
    for n in (2, 4):  # every size keeps its own study page, with its one point
        size = json.loads((hand_study / f"n{n}" / "study.json").read_text())
        assert size["size"] == n and size["scaling"]["sizes"] == [n]
        page = (hand_study / f"n{n}" / "study.html").read_text()
        assert page.split('<section id="scaling">')[1].split("</section>")[0].count('class="point"') == 3 * 4  # methods x charts
    html = html_path.read_text()
    assert html.startswith("<!DOCTYPE html>") and "<script" not in html
    assert html.count('class="point"') == 3 * 2 * 4  # methods x sizes x charts
    assert 'href="n2/study.html"' in html and "does not apply" not in html.split('id="sizes"')[1]
    assert "ccpo</b> at N = 2" in html and "0.35 (0.30 to 0.40); 1 undefined" in html
    assert "exact Shapley over 4 players (2^4 - 1): 15 coalitions per episode" in html
    assert render_sizes(analyse_sizes(hand_study)) == html  # the page is a pure function of the runs


def test_steps_to_target_without_a_target():
    assert steps_to_target([], 0.5)["mean"] is None and steps_to_target([{"points": [], "steps": 2}], None)["mean"] is None


# --- the runner on tiny models ----------------------------------------------------------------------------------


def test_sizes_come_from_the_env_and_are_one_per_config(tmp_path, tiny_model_dir):
    paths = []
    for n in (3, 2):
        path = tmp_path / f"relay{n}.yaml"
        path.write_text(yaml.safe_dump(relay_team(n, str(tiny_model_dir))))
        paths.append(str(path))
    spec = StudySpec(config=paths[0], methods=("grpo", "c3", "sharp", "ccpo", "m_grpo"), seeds=1, out=str(tmp_path / "o"))
    sizes = size_specs(spec, paths)
    assert [(n, Path(s.out).name, s.config) for n, s in sizes] == [(2, "n2", paths[1]), (3, "n3", paths[0])]
    with pytest.raises(ConfigError, match="N = 3 again"):
        size_specs(spec, [paths[0], paths[0]])
    three = sizes[1][1]
    skipped = not_applicable_methods(three)
    assert set(skipped) == {"ccpo", "m_grpo"} and "leaves its part unanswered" in skipped["ccpo"]
    assert {j.method for j in plan_jobs(three)} == {"grpo", "c3", "sharp"}
    # a team of specialists: C3's tree covers every specialist, SHARP's players are all of them
    assert job_config(three, "c3", 0)["credit"]["fanout"] == [2, 2, 2]
    assert job_config(three, "sharp", 0)["credit"]["exclude"] == []
    assert job_config(three, "grpo", 0)["trainer"]["eval_every"] == 2  # eval_size 2 <= 2 x 1 x 2 episodes a step


def test_eval_every_defaults_to_2_where_affordable_and_hints_otherwise(tmp_path, tiny_model_dir, capsys):
    path = tmp_path / "relay.yaml"
    path.write_text(yaml.safe_dump(relay_team(2, str(tiny_model_dir), steps=20, eval_size=10)))
    spec = StudySpec(config=str(path), methods=("grpo",), seeds=1, out=str(tmp_path / "o"))
    assert job_config(spec, "grpo", 0)["trainer"]["eval_every"] == 4  # 10 > 2 x 2 episodes: about five per run
    from mas.study.runner import eval_hint, prepare_study

    assert "--eval-every 2" in eval_hint(spec)
    prepare_study(spec)
    assert "hint: " in capsys.readouterr().out
    assert eval_hint(StudySpec(config=str(path), methods=("grpo",), seeds=1, out="x", eval_every=2)) is None


def test_mas_study_over_two_sizes_on_tiny_models(tmp_path, tiny_model_dir, capsys):
    """`mas study relay2.yaml relay3.yaml --methods grpo,c3,ccpo --seeds 1 --out DIR`: a study per
    size under DIR/n2 and DIR/n3, ccpo left out with why, the scaling view over both; a re-run trains nothing."""
    paths = []
    for n in (2, 3):
        path = tmp_path / f"relay{n}.yaml"
        path.write_text(yaml.safe_dump(relay_team(n, str(tiny_model_dir))))
        paths.append(str(path))
    out = tmp_path / "out"
    args = ["study", *paths, "--methods", "grpo,c3,ccpo", "--seeds", "1", "--out", str(out), "trainer.steps=1"]
    assert main(args) == 0
    log = capsys.readouterr().out
    assert "team size N = 2" in log and "team size N = 3" in log and "ccpo does not apply" in log
    spec = json.loads((out / "scaling_spec.json").read_text())
    assert [s["dir"] for s in spec["sizes"]] == ["n2", "n3"] and spec["configs"] == paths
    for n in (2, 3):
        for method in ("grpo", "c3"):
            run = out / f"n{n}" / "runs" / method / "seed_0"
            assert [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "eval" not in r] == [0]
            first = next(r for r in read_jsonl(run / "metrics.jsonl") if "eval" not in r)
            assert set(first["agents"]) == {f"s{k}" for k in range(1, n + 1)}
            assert all("designed_signal" in a for a in first["agents"].values())  # the relay records who did their job
        assert not (out / f"n{n}" / "runs" / "ccpo").exists()
        assert json.loads((out / f"n{n}" / "not_applicable.json").read_text()).keys() == {"ccpo"}
    study = json.loads((out / "study.json").read_text())
    assert study["scaling"]["sizes"] == [2, 3] and set(study["scaling"]["points"]) == {"grpo", "c3"}
    c3 = {p["n"]: p for p in study["scaling"]["points"]["c3"]}
    assert c3[3]["reruns_per_episode"] > c3[2]["reruns_per_episode"] > 0  # C3's replays grow with N
    before = {p: p.stat().st_mtime_ns for p in out.glob("n*/runs/*/*/metrics.jsonl")}
    assert main(args) == 0
    assert capsys.readouterr().out.count("2 done, 0 to resume, 0 to start") == 2  # both sizes, nothing trained again
    assert {p: p.stat().st_mtime_ns for p in out.glob("n*/runs/*/*/metrics.jsonl")} == before
    with pytest.raises(ConfigError, match="study over team sizes"):  # a one-config study into it is refused
        run_study(StudySpec(config=paths[0], methods=("grpo",), seeds=1, out=str(out)))
