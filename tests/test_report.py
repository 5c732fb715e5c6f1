"""`mas report`: the HTML report of a real tiny run, its checklist, episodes, comparison and size."""

from __future__ import annotations

import json
import re
import statistics
from html.parser import HTMLParser

import pytest
import torch
import yaml
from team_helpers import team_config, varied_reward

from mas.cli import main
from mas.envs.math.synthetic import SyntheticMathEnv
from mas.metrics import episode_details, sample_episodes
from mas.report import load_run, write_compare, write_report
from mas.report.charts import nice_ticks, tick_label
from mas.report.checklist import checklist_rows
from mas.report.episodes import credit_colour, credit_scale
from mas.types import Credit, Episode, EpisodeGroup, Task, Turn


def train_run(tmp_path, model_dir, monkeypatch, name="run", method="dr_mas", steps=3, episodes_every=1):
    """A real tiny training through `mas train` (rewards with variance, so credit is not all 0).

    A chain, so every agent speaks in every episode (random tiny models rarely delegate)."""
    cfg = team_config(model_dir, "chain", credit={"method": method})
    cfg["trainer"].update(steps=steps, sample_episodes=2)
    cfg["logging"] = {"progress": False, "episodes_every": episodes_every}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    monkeypatch.setattr(SyntheticMathEnv, "score", lambda self, ep: varied_reward(ep))
    run = tmp_path / name
    assert main(["train", str(path), "--run-dir", str(run)]) == 0
    return run


class Tags(HTMLParser):
    """Collects tags with attributes, to check the page like a browser would see it."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model_dir):
    mp = pytest.MonkeyPatch()
    try:
        yield train_run(tmp_path_factory.mktemp("report"), tiny_model_dir, mp)
    finally:
        mp.undo()


def test_report_is_one_self_contained_page_with_every_section(run_dir, capsys):
    assert main(["report", str(run_dir)]) == 0
    out = run_dir / "report.html"
    assert str(out) in capsys.readouterr().out
    html = out.read_text()
    parser = Tags()
    parser.feed(html)
    # offline: nothing is fetched from anywhere (no scripts, stylesheets, images or frames by URL)
    for tag, attrs in parser.tags:
        for key in ("src", "href"):
            value = attrs.get(key) or ""
            assert not value or value.startswith("#"), f"<{tag} {key}={value!r}> loads something from outside the page"
    ids = {attrs.get("id") for _, attrs in parser.tags}
    assert {"agents", "curves", "episodes", "checklist"} <= ids
    for title in ("Reward: team and per agent", "Credit share per agent", "Advantage per agent", "Step time breakdown",
                  "Per policy: loss", "Per policy: KL to reference", "Per policy: learning rate"):
        assert title in html
    turns = [a for t, a in parser.tags if t == "div" and "turn" in (a.get("class") or "").split()]
    assert turns and any(a["data-credit"] not in ("", "0.0") for a in turns)
    # a turn's colour is its credit's: blue for positive, red for negative
    for a in turns:
        if a["data-credit"]:
            c = float(a["data-credit"])
            border = re.search(r"border-left-color:(#[0-9a-f]{6})", a["style"]).group(1)
            assert border == credit_colour(c, credit_scale(load_run(run_dir).episodes))


def test_checklist_answers_each_question_from_the_run(run_dir):
    run = load_run(run_dir)
    rows = dict(checklist_rows(run))
    assert set(rows) == {"Base models and sizes", "Data source and size", "Credit granularity", "Methodology family",
                         "Baseline", "Compute: wall time and device-hours", "Credit-specific overhead",
                         "Trajectory length (turns)", "Trajectory length (completion tokens)"}
    info = json.loads((run_dir / "run_info.json").read_text())
    n_params = info["policies"]["main"]["parameters"]
    assert n_params > 0 and "main" in rows["Base models and sizes"] and "frozen" in rows["Base models and sizes"]
    assert "synthetic_math" in rows["Data source and size"] and "3 steps × 2 tasks × 4 episodes per task = 24 episodes" in rows["Data source and size"]
    assert "dr_mas" in rows["Methodology family"] and "agent" in rows["Credit granularity"]
    assert "device-hours" in rows["Compute: wall time and device-hours"]
    turns = [v for m in run.steps for v in m["lengths"]["turns"]]
    assert len(turns) == 24
    expected = f"min {min(turns):g} · median {statistics.median(turns):g} · max {max(turns):g} (n = 24 episodes)"
    assert rows["Trajectory length (turns)"] == expected
    assert "replays: 0" in rows["Credit-specific overhead"] and "critic calls: 0" in rows["Credit-specific overhead"]


def test_episodes_are_stored_every_k_steps_with_the_methods_breakdown(tmp_path, tiny_model_dir, monkeypatch):
    run = train_run(tmp_path, tiny_model_dir, monkeypatch, steps=5, episodes_every=2)
    episodes = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    assert sorted({e["step"] for e in episodes}) == [0, 2, 4]  # every 2 steps, and the last step (4)
    assert all(len([e for e in episodes if e["step"] == s]) == 2 for s in (0, 2, 4))
    turn = episodes[0]["turns"][0]
    assert {"baseline_mean", "baseline_std", "turn_reward"} <= set(turn["details"])  # Dr. MAS's per-agent statistics
    assert "episode_score" in episodes[0]["details"]


def _turn(agent: str) -> Turn:
    return Turn(agent=agent, policy="p", index=0, parent=None, messages=[], prompt_ids=[1], completion_ids=[2, 3],
                logprobs=[-0.1, -0.2], text=f"{agent} says")


def test_episode_details_split_the_breakdown_by_owner_and_keep_critic_replies():
    # 2 episodes with 2 and 1 turns: N = 3, E = 2
    credit = Credit(
        advantages=torch.tensor([0.5, -0.5, 1.0]),
        breakdown={"node_value": torch.tensor([0.125, 0.25, float("nan")]), "r_solo": torch.tensor([1.0, 0.0]),
                   "evals": torch.tensor(7.0), "shapley": torch.tensor([[0.25, 0.75], [1.0, 0.0]])},
        train_mask=torch.tensor([True, False, True]),
        notes={"critic_reply": ["good step", "bad step", "fine"]},
    )
    per_turn, per_episode = episode_details(credit, n_turns=3, n_episodes=2)
    assert per_turn[1] == {"node_value": 0.25, "critic_reply": "bad step", "trained": False}
    assert per_turn[2]["node_value"] is None  # NaN is not JSON: stored as null
    assert per_episode == [{"r_solo": 1.0, "shapley": [0.25, 0.75]}, {"r_solo": 0.0, "shapley": [1.0, 0.0]}]

    groups = [EpisodeGroup(Task("t", "q", "1"), [
        Episode(Task("t", "q", "1"), 0, 0, 0, turns=[_turn("a"), _turn("b")], reward=0.0),
        Episode(Task("t", "q", "1"), 0, 1, 0, turns=[_turn("a")], reward=1.0),
    ])]
    records = sample_episodes(4, groups, credit, 2)
    assert [r["reward"] for r in records] == [1.0, 0.0]  # best first, then the worst
    assert records[1]["turns"][1]["credit"] == -0.5 and records[1]["turns"][1]["details"]["critic_reply"] == "bad step"
    assert records[0]["turns"][0]["details"]["node_value"] is None and records[0]["details"]["r_solo"] == 0.0
    assert json.dumps(records, allow_nan=False)


def test_credit_colours_and_scale():
    assert credit_colour(0.0, 1.0) == "#ffffff"
    assert credit_colour(1.0, 1.0) == "#2166ac" and credit_colour(5.0, 1.0) == "#2166ac"  # clamped at the scale
    assert credit_colour(-1.0, 1.0) == "#b2182b"
    assert credit_colour(None, 1.0) == credit_colour(float("nan"), 1.0) == "#f2f2f2"
    weak, strong = credit_colour(0.1, 1.0), credit_colour(0.5, 1.0)
    assert int(weak[1:3], 16) > int(strong[1:3], 16)  # more credit, deeper blue
    eps = [{"turns": [{"credit": float(c)} for c in range(-50, 51)]}]
    assert credit_scale(eps) == 48.0  # 95th percentile of |credit| over 101 turns
    assert nice_ticks(0, 199, 6, integer=True) == [0, 50, 100, 150] and nice_ticks(0, 2, 6, integer=True) == [0, 1, 2]
    ticks = nice_ticks(5.6755, 5.6795)
    assert [tick_label(t, ticks[1] - ticks[0]) for t in ticks] == ["5.676", "5.677", "5.678", "5.679"]  # distinct labels


def test_compare_puts_both_runs_on_the_same_axes(run_dir, tmp_path, tiny_model_dir, monkeypatch, capsys):
    other = train_run(tmp_path, tiny_model_dir, monkeypatch, name="grpo", method="grpo")
    out = tmp_path / "cmp.html"
    assert main(["report", "--compare", str(run_dir), str(other), "--out", str(out)]) == 0
    html = out.read_text()
    figures = re.findall(r"<figure.*?</figure>", html, flags=re.S)
    team = next(f for f in figures if "<figcaption>Team reward</figcaption>" in f)
    svg = re.search(r"<svg.*?</svg>", team, flags=re.S).group(0)  # one chart: one set of axes
    runs = set(re.findall(r'class="series" data-run="([^"]+)"', svg))
    assert runs == {run_dir.name, "grpo"}  # same team name: named by directory
    share = next(f for f in figures if "<figcaption>Credit share per agent</figcaption>" in f)
    assert {run_dir.name, "grpo"} == set(re.findall(r'class="series" data-run="([^"]+)"', share))
    assert "dr_mas" in html and "grpo" in html
    assert main(["report", "--compare", str(run_dir), "--out", str(out)]) == 2
    assert "two or more" in capsys.readouterr().err


def test_report_of_a_long_run_stays_small(run_dir, tmp_path):
    """200 steps and 50 stored episodes stay under 5 MB, even when every episode has 8 long turns
    with long tool observations and critic replies full of characters HTML must escape."""
    long = tmp_path / "long"
    long.mkdir()
    for name in ("config.yaml", "run_info.json", "summary.json"):
        (long / name).write_text((run_dir / name).read_text())
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "eval" not in line]
    episodes = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    heavy = "<tool_call>&amp; " * 400  # 6,400 characters, a third of them escaped
    with (long / "metrics.jsonl").open("w") as f:
        for i in range(200):
            f.write(json.dumps({**steps[i % len(steps)], "step": i}) + "\n")
    with (long / "episodes.jsonl").open("w") as f:
        for i in range(50):
            ep = episodes[i % len(episodes)]
            turn = {**ep["turns"][0], "text": heavy, "observations": [heavy, heavy],
                    "tool_calls": [{"name": "search", "arguments": {"query": "q", "k": 5}, "valid": True}] * 2,
                    "details": {"critic_reply": heavy}}
            f.write(json.dumps({**ep, "step": 4 * i, "turns": [turn] * 8}) + "\n")
    path = write_report(long)
    size = path.stat().st_size
    assert size < 5_000_000, f"report is {size / 1e6:.2f} MB"
    html = path.read_text()
    assert html.count('<details class="episode"') == 50  # every episode is listed ...
    assert 0 < html.count("(heatmap only)") < 50  # ... the newest in full, older ones as heatmaps once the budget is spent
    assert html.count("more characters)") > 0  # long texts are cut, and say so


def test_long_curves_are_drawn_through_at_most_400_points():
    from mas.report.charts import MAX_POINTS, Series, line_chart

    xs = [float(i) for i in range(5000)]
    svg = line_chart([Series("a", xs, [float(i % 7) for i in range(5000)])], "t", "y")
    (path,) = re.findall(r'<path d="M([^"]+)"[^>]*class="series"', svg)
    assert len(path.split(" L")) == MAX_POINTS


def test_report_errors_are_clear_and_a_partial_last_line_is_skipped(run_dir, tmp_path, capsys):
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "no such directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    for name in ("config.yaml", "metrics.jsonl", "episodes.jsonl"):
        (crashed / name).write_text((run_dir / name).read_text())
    with (crashed / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "reward": {"te')  # killed mid-write
    html = write_compare([run_dir, crashed], tmp_path / "c.html").read_text()
    assert "Team reward" in html
    report = write_report(crashed).read_text()
    assert "1 unreadable log lines skipped" in report


def test_tool_calls_and_observations_show_in_the_transcript():
    from mas.report.episodes import episode_block

    ep = {"step": 3, "task": {"task_id": "q1", "prompt": "Who?", "answer": "Ann"}, "answer": "Ann", "reward": 1.0,
          "turns": [{"agent": "researcher", "policy": "p", "text": "<tool_call>...</tool_call>", "credit": 0.5,
                     "tool_calls": [{"name": "search", "arguments": {"query": "Ann", "k": 2}, "valid": True},
                                    {"name": "read", "arguments": {"title": "Nope"}, "valid": False, "error": "unknown title"}],
                     "observations": ["1. Ann (score 3.2) ...", "error: unknown title 'Nope'"], "details": {}}]}
    html = episode_block(ep, ["researcher"], 1.0, open_=True)
    assert "search(query=&#x27;Ann&#x27;, k=2)" in html and "read(title=&#x27;Nope&#x27;)" in html
    assert html.count('<pre class="observation">') == 2 and "invalid call: unknown title" in html
    assert "1. Ann (score 3.2)" in html


def test_sample_episodes_prefer_episodes_whose_turns_got_credit():
    task = Task("t", "q", "1")
    eps = [Episode(task, 0, i, 0, turns=[_turn("a")], reward=r) for i, r in enumerate([1.0, 1.0, 0.0, 0.0])]
    credit = Credit(advantages=torch.tensor([0.0, 0.7, 0.0, -0.4]))
    records = sample_episodes(0, [EpisodeGroup(task, eps)], credit, 3)
    assert [r["sample_id"] for r in records] == [1, 3, 0]  # best with credit, worst with credit, then the next best
