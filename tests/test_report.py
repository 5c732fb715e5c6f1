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
from mas.training.metrics import episode_details, sample_episodes
from mas.report import load_run, write_compare, write_report
from mas.report.charts import nice_ticks, tick_label
from mas.report.checklist import checklist_rows
from mas.report.episodes import credit_colour, credit_scale
from mas.report.page import render_report
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
                  "Per policy: loss", "Per policy: entropy", "Per policy: learning rate"):
        assert title in html
    # terms that were off (kl_coef 0; one on-policy epoch) get no empty panel, and the page says why
    assert "Per policy: KL to reference" not in html and "Per policy: clip fraction" not in html
    assert "KL to reference (trainer.kl_coef is 0)" in html and "clip fraction (on-policy updates" in html
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
    # a chart is a plain string to Python code that builds pages (e.g. `mas study`): adding markup keeps it
    assert ('<div class="grid">' + svg + "</div>").startswith('<div class="grid"><figure class="card">')
    assert f"<div>{svg}</div>".startswith("<div><figure")


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


def test_a_damaged_config_yaml_is_reported_and_the_metrics_still_are(run_dir, tmp_path):
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for name in ("metrics.jsonl", "episodes.jsonl"):
        (damaged / name).write_text((run_dir / name).read_text())
    (damaged / "config.yaml").write_text("team: {name: [unclosed\n")  # hand-edited, or cut short
    run = load_run(damaged)
    assert run.config == {} and run.config_problem.startswith("config.yaml unreadable (YAML syntax")
    report = write_report(damaged).read_text()
    assert "config.yaml unreadable" in report and "Reward: team and per agent" in report
    (damaged / "config.yaml").write_text("a: &a [*a]\n")  # a recursive alias: the bounded reader refuses it
    assert load_run(damaged).config_problem.startswith("config.yaml unreadable")


def test_tool_calls_and_observations_show_in_the_transcript():
    from mas.report.episodes import episode_block

    ep = {"step": 3, "task": {"task_id": "q1", "prompt": "Who?", "answer": "Ann"}, "answer": "Ann", "reward": 1.0,
          "turns": [{"agent": "researcher", "policy": "p", "text": "<tool_call>...</tool_call>", "credit": 0.5,
                     "tool_calls": [{"name": "search", "arguments": {"query": "Ann", "k": 2}, "valid": True},
                                    {"name": "read", "arguments": {"title": "Nope"}, "valid": False, "error": "unknown title"}],
                     "observations": ["1. Ann (score 3.2) ...", "error: unknown title 'Nope'"], "details": {}}]}
    html = episode_block(ep, ["researcher"], 1.0, open_=True)
    assert "search(query=&#39;Ann&#39;, k=2)" in html and "read(title=&#39;Nope&#39;)" in html
    assert html.count('<pre class="observation">') == 2 and "invalid call: unknown title" in html
    assert "1. Ann (score 3.2)" in html


def test_a_failed_episode_says_what_ended_it():
    from mas.report.episodes import episode_block

    ep = {"step": 2, "task": {"task_id": "q1", "prompt": "3+2", "answer": "5"}, "answer": None, "reward": 0.0,
          "status": "error", "error": "AdapterParseError: cannot parse", "failure": "agent_error",
          "turns": [{"agent": "solver", "policy": "p", "text": "5?", "credit": -0.5, "details": {}}]}
    html = episode_block(ep, ["solver"], 1.0, open_=True)
    assert '<p class="tag bad">error (agent_error): AdapterParseError: cannot parse</p>' in html
    del ep["failure"]  # an episode stored before failures were recorded
    assert '<p class="tag bad">error: AdapterParseError: cannot parse</p>' in episode_block(ep, ["solver"], 1.0, open_=True)


def test_sample_episodes_prefer_episodes_whose_turns_got_credit():
    task = Task("t", "q", "1")
    eps = [Episode(task, 0, i, 0, turns=[_turn("a")], reward=r) for i, r in enumerate([1.0, 1.0, 0.0, 0.0])]
    credit = Credit(advantages=torch.tensor([0.0, 0.7, 0.0, -0.4]))
    records = sample_episodes(0, [EpisodeGroup(task, eps)], credit, 3)
    assert [r["sample_id"] for r in records] == [1, 3, 0]  # best with credit, worst with credit, then the next best


# --- what the page explains: decisive badge, method lines, unparsed turns, panels, warnings ----


def _ep(credits, agents, valid=None, step=1):
    valid = valid or [True] * len(credits)
    return {"step": step, "task": {"task_id": "t", "prompt": "q", "answer": "1"}, "answer": "1", "reward": 1.0,
            "turns": [{"agent": a, "policy": "p", "text": f"{a} says", "credit": c, "valid": v, "details": {}}
                      for c, a, v in zip(credits, agents, valid)]}


def _badged(html: str) -> list[int]:
    """Indices of the transcript turns that carry a decisive badge."""
    turns = re.findall(r'<div class="turn" id="[^"]*-t(\d+)".*?</div>\s*<pre', html, flags=re.S)
    heads = re.findall(r'<div class="turn" id="[^"]*-t(\d+)"(.*?)</div>\s*<pre', html, flags=re.S)
    assert len(turns) == len(heads)
    return [int(i) for i, head in heads if 'class="tag key"' in head]


def test_decisive_badge_follows_the_credit_granularity():
    from mas.credit import credit_names, get_credit
    from mas.report.episodes import episode_block
    from mas.report.methods import credit_level

    levels = {m: credit_level(get_credit(m).card.granularity) for m in credit_names()}
    assert levels == {"grpo": "episode", "dr_grpo": "episode", "rloo": "episode", "magrpo": "episode",
                      "reinforce_pp": "episode", "dr_mas": "statistics", "sharp": "agent", "ccpo": "agent",
                      "m_grpo": "agent", "c3": "turn", "critic": "turn", "verified": "turn"}
    agents = ["lead", "helper", "lead"]
    # agent-level credit: lead's two turns share 1.0, helper has 0.5. The decisive agent is lead, so both
    # of its turns carry the badge (the largest-|credit| rule marked only the first), and its heatmap row
    html = episode_block(_ep([1.0, 0.5, 1.0], agents), agents, 1.0, open_=True, level="agent")
    assert _badged(html) == [0, 2] and html.count("decisive agent") == 3
    assert '<th class="agent key" title="decisive agent">lead</th>' in html and "decisive: lead" in html
    # the mean of the agent's turns decides: lead's (1.0 + 0.2) / 2 = 0.6 < helper's 0.7
    assert _badged(episode_block(_ep([1.0, 0.7, 0.2], agents), agents, 1.0, True, level="agent")) == [1]
    # every agent's credit the same: nothing is decisive; agents tied in magnitude: nothing either
    assert _badged(episode_block(_ep([0.5, 0.5, 0.5], agents), agents, 1.0, True, level="agent")) == []
    assert _badged(episode_block(_ep([0.5, -0.5, 0.5], agents), agents, 1.0, True, level="agent")) == []
    # per-turn credit: the largest |credit|, negative included; none when every turn is the same
    html = episode_block(_ep([0.2, -0.9, 0.5], agents), agents, 1.0, True, level="turn")
    assert _badged(html) == [1] and "largest |credit| in this episode" in html
    assert _badged(episode_block(_ep([0.5, 0.5, 0.5], agents), agents, 1.0, True, level="turn")) == []
    # episode-level credit, and Dr. MAS's per-agent statistics: never a badge, even where values differ
    for level in ("episode", "statistics"):
        assert _badged(episode_block(_ep([0.2, -0.9, 0.5], agents), agents, 1.0, True, level=level)) == []
    # granularity unknown (an old run): read from the credit (each agent's turns share one value: per agent)
    assert _badged(episode_block(_ep([1.0, 0.5, 1.0], agents), agents, 1.0, True, level=None)) == [0, 2]
    assert _badged(episode_block(_ep([1.0, 0.5, 0.2], agents), agents, 1.0, True, level=None)) == [0]
    # a turn the method left out of the update (credit 0, not trained) does not drag its agent's mean down
    ep = _ep([1.0, 0.7, 0.0], agents)
    ep["turns"][2]["details"] = {"trained": False}
    assert _badged(episode_block(ep, agents, 1.0, True, level="agent")) == [0]


def test_every_credit_method_says_what_its_credit_share_means(run_dir):
    from mas.credit import credit_names
    from mas.report.methods import SHARE_NOTES

    assert sorted(SHARE_NOTES) == credit_names()
    # a method's line says how it makes credit, never what a run's numbers turned out to be
    for method, note in SHARE_NOTES.items():
        for claim in ("follow turn counts", "mean is 0", "mean advantage is 0", "free rider"):
            assert claim not in note, (method, claim)
    html = write_report(run_dir).read_text()
    agents = html[html.index('<section id="agents">'):html.index('<section id="curves">')]
    assert "What the credit share means under dr_mas:</b> every turn gets the episode&#39;s outcome" in agents
    # what the table's numbers show is said beside it, from those numbers (checked in the next tests)
    assert "<b>In this table:</b>" in agents and "mean advantage" in agents.lower()
    episodes = html[html.index('<section id="episodes">'):]
    assert "Decisive badge.</b> Credit is the episode&#39;s outcome normalised per agent (agent: statistics per agent)" in episodes
    assert "largest |credit| in this episode" not in html and "decisive agent" not in html  # Dr. MAS: no badge


def test_step_metrics_count_the_credit_of_unparsed_turns():
    from mas.credit.batch import build_credit_batch
    from mas.training.metrics import step_metrics

    task = Task("t", "q", "1")
    turns = [_turn("lead"), _turn("checker"), _turn("checker")]
    turns[1].valid = False  # unparsed
    turns[2].valid, turns[2].tool_calls = False, [{"name": "search", "valid": False}]  # a failed tool call: not unparsed
    groups = [EpisodeGroup(task, [Episode(task, 0, 0, 0, turns=turns, reward=1.0)])]
    batch = build_credit_batch(groups, ["lead", "checker"])
    credit = Credit(advantages=torch.tensor([0.5, 0.3, 0.2]))
    m = step_metrics(0, groups, batch, credit, {}, {})
    # team positive credit 0.5 + 0.3 + 0.2 = 1.0; checker's unparsed turn earned 0.3 of it
    assert m["agents"]["checker"]["credit_share"] == pytest.approx(0.5)
    assert m["agents"]["checker"]["unparsed_credit_share"] == pytest.approx(0.3)
    assert m["agents"]["lead"]["unparsed_credit_share"] == 0.0
    m = step_metrics(0, groups, batch, Credit(advantages=torch.tensor([-0.5, 0.0, -0.1])), {}, {})
    assert m["agents"]["checker"]["unparsed_credit_share"] is None  # no positive credit: no share


def _synthetic_run(src, dest, **edits):
    """A copy of the run ``src`` with ``edits`` applied: {file name: fn(text) -> text}."""
    dest.mkdir()
    names = {p.name for p in src.iterdir() if p.is_file()} | set(edits)
    for name in names:
        text = (src / name).read_text() if (src / name).exists() else ""
        dest.joinpath(name).write_text(edits.get(name, lambda t: t)(text))
    return dest


def test_unparsed_turns_are_flagged_with_their_share_of_the_credit(run_dir, tmp_path):
    from mas.report.episodes import episode_block

    agents = ["lead", "helper", "checker"]
    # the checker's unparsed turn earned 0.268 of the episode's 1.0 positive credit
    ep = _ep([0.5, 0.232, 0.268, -0.4], [*agents, "helper"], valid=[True, True, False, False])
    html = episode_block(ep, agents, 1.0, open_=True, level="agent")
    assert "unparsed output, yet 26.8% of this episode&#39;s positive credit" in html  # the checker's turn
    assert html.count('data-unparsed="1"') == 2 and html.count("unparsed output") == 2  # the blamed one: just flagged
    assert "unparsed turns: 26.8% of the positive credit" in html  # in the episode's summary line

    def unparsed(text):  # the checker's unparsed turns earned 26.8% of the team's positive credit each step
        rows = [json.loads(line) for line in text.splitlines()]
        for r in rows:
            if "agents" in r:
                r["agents"]["checker"]["unparsed_credit_share"] = 0.268
                r["agents"]["lead"]["unparsed_credit_share"] = 0.0
        return "".join(json.dumps(r) + "\n" for r in rows)

    run = _synthetic_run(run_dir, tmp_path / "unparsed", **{"metrics.jsonl": unparsed})
    table = write_report(run).read_text()
    table = table[table.index('<section id="agents">'):table.index('<section id="curves">')]
    checker = re.search(r"<tr><th>checker.*?</tr>", table, flags=re.S).group(0)
    assert "<td>26.8%</td>" in checker and "26.8% of the team&#39;s positive credit went to its unparsed turns" in checker
    lead = re.search(r"<tr><th>lead.*?</tr>", table, flags=re.S).group(0)
    assert "<td>0.0%</td>" in lead and "unparsed turns</span>" not in lead
    assert "<td>—</td>" in re.search(r"<tr><th>helper.*?</tr>", table, flags=re.S).group(0)  # not logged: unknown


def test_panels_of_terms_that_are_on_are_drawn(run_dir, tmp_path):
    def config(**trainer):
        def edit(text):
            cfg = yaml.safe_load(text)
            cfg["trainer"].update(trainer)
            return yaml.safe_dump(cfg)
        return edit

    html = write_report(_synthetic_run(run_dir, tmp_path / "kl", **{"config.yaml": config(kl_coef=0.1)})).read_text()
    assert "Per policy: KL to reference" in html and "Per policy: clip fraction" not in html
    html = write_report(_synthetic_run(run_dir, tmp_path / "epochs", **{"config.yaml": config(ppo_epochs=2)})).read_text()
    assert "Per policy: clip fraction" in html and "Per policy: KL to reference" not in html

    def clipped(text):  # on-policy, yet some tokens were clipped (the sampler's numerics differ): drawn
        rows = [json.loads(line) for line in text.splitlines()]
        for r in rows:
            if "policies" in r:
                r["policies"]["main"]["clip_frac"] = 0.01
        return "".join(json.dumps(r) + "\n" for r in rows)

    html = write_report(_synthetic_run(run_dir, tmp_path / "clipped", **{"metrics.jsonl": clipped})).read_text()
    assert "Per policy: clip fraction" in html and "Not drawn, because the term was off: KL to reference" in html


def _warnings(*rows):
    return lambda _: "".join(json.dumps(r) + "\n" for r in rows)


def test_warnings_show_in_a_banner_at_the_top_and_per_run_in_compare(run_dir, tmp_path):
    parsed = "the embedded model parsed 0% of the orchestrator's turns; it was warm-started on the quickstart"
    run = _synthetic_run(run_dir, tmp_path / "warned", **{"warnings.jsonl": _warnings(
        {"step": 0, "kind": "embedded_parse", "message": parsed}, {"step": 2, "kind": "embedded_parse", "message": parsed},
        {"step": None, "kind": "other", "message": "second <b>thing</b>"})})
    with (run / "warnings.jsonl").open("a") as f:
        f.write('{"step": 3, "kind": "half')  # killed mid-write
    html = write_report(run).read_text()
    banner = re.search(r'<div class="banner" role="alert">.*?</div>', html, flags=re.S).group(0)
    assert html.index(banner) < html.index("<main>")  # at the top, before every section
    assert "While training: 3 warnings" in banner
    assert "parsed 0% of the orchestrator&#39;s turns" in banner and "(2 times, steps 0–2)" in banner
    assert "second &lt;b&gt;thing&lt;/b&gt;" in banner  # escaped: shown as text
    assert "1 unreadable log lines skipped" in html
    assert '<div class="banner"' not in write_report(run_dir).read_text()  # no warnings: no banner

    out = write_compare([run_dir, run], tmp_path / "cmp.html").read_text()
    banners = re.findall(r'<div class="banner" role="alert"><h2>(.*?)</h2>', out)
    assert banners == ["Run warned: 3 warnings"]  # only the run that has warnings
    rows = re.findall(r"<tr><th><span.*?</tr>", out, flags=re.S)
    assert '<span class="tag bad">3</span>' in rows[1] and rows[0].endswith("<td>—</td></tr>")
    assert "What the credit share means under dr_mas" in out


def test_templates_ship_as_package_data():
    """A non-editable install finds the templates: mas.report.templates is a listed package whose
    files all ship (package-data "*"; tests/test_packaging.py builds a wheel and checks it)."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).parents[1]
    setup = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    templates = root / "mas" / "report" / "templates"
    files = {p.name for p in templates.iterdir() if p.is_file()}
    assert {"page.html.j2", "toggle.js", "style.css", "warmup.html.j2"} <= files
    assert "mas.report.templates" in setup["packages"] and setup["package-data"]["*"] == ["*"]


# --- the report escapes everything it shows ---------------------------------------------------

# text a run can carry that would run script, break out of an attribute, or load something if
# it reached the page as markup; each must show as text
PAYLOADS = (
    '<script>window.__mas_pwned = 1; alert("script")</script>',
    '<img src=x onerror="window.__mas_pwned = 2; alert(2)">',
    '" onmouseover="window.__mas_pwned = 3" data-x="',
    "' autofocus onfocus='window.__mas_pwned = 4' x='",
    '<a href="javascript:alert(5)">click me</a>',
    "javascript:window.__mas_pwned = 6",
    '</pre></div></details></td></table><svg onload="window.__mas_pwned = 7">',
    '<iframe srcdoc="<script>parent.__mas_pwned = 8</script>"></iframe>',
    "{{ 7 * 7 }} {% if true %}x{% endif %}",
    "<style>body { display: none }</style><!-- <base href=\"http://example.invalid/\">",
)
HOSTILE = " ".join(PAYLOADS)
# agent and policy names: the config schema forbids these, but a report reads whatever the files hold
NAMES = {"lead": "lead<script>window.__mas_pwned = 9</script>", "helper": 'helper" onmouseover="window.__mas_pwned = 10',
         "checker": "checker' onfocus='window.__mas_pwned = 11", "main": "main<img src=x onerror=alert(12)>"}
ALLOWED_TAGS = {"html", "head", "meta", "title", "style", "body", "header", "h1", "h2", "h3", "nav", "a", "main", "section",
                "div", "span", "b", "p", "br", "table", "thead", "tbody", "tr", "th", "td", "details", "summary", "pre",
                "code", "ol", "ul", "li", "figure", "figcaption", "svg", "line", "text", "g", "path", "circle", "polygon",
                "button", "script"}


class Page(HTMLParser):
    """A page as a browser parses it: tags with attributes, text, and script bodies."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.text: list[str] = []
        self.scripts: list[str] = []
        self._script = False
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, attrs))
        self._script = tag == "script"

    def handle_endtag(self, tag):
        self._script = False

    def handle_data(self, data):
        (self.scripts if self._script else self.text).append(data)


def assert_inert(html: str, shown: tuple[str, ...] = ()) -> Page:
    """The page has no markup but its own: one script (the legend toggle, allowed by its hash),
    no event handlers, nothing loaded, no link but in-page anchors; ``shown`` appear as text."""
    from mas.report.render import csp, script_hash, toggle_script

    page = Page(html)
    assert {t for t, _ in page.tags} <= ALLOWED_TAGS, {t for t, _ in page.tags} - ALLOWED_TAGS
    assert page.scripts == [str(toggle_script())] and sum(t == "script" for t, _ in page.tags) == 1
    assert sum(t == "style" for t, _ in page.tags) == 1
    metas = [dict(a) for t, a in page.tags if t == "meta"]
    assert {"charset": "utf-8"} in metas and {"http-equiv": "Content-Security-Policy", "content": csp()} in metas
    assert "script-src " + script_hash(str(toggle_script())) + ";" in csp() and "default-src 'none'" in csp()
    for tag, attrs in page.tags:
        for name, value in attrs:
            assert not name.startswith("on") and name not in ("src", "srcdoc", "autofocus", "formaction", "action"), (tag, name)
            if name == "href":
                assert value.startswith("#") and re.fullmatch(r"#[A-Za-z0-9_-]+", value), value
    text = "".join(page.text)
    for s in shown:
        assert s in text, s
    return page


def _rename(value, names=NAMES):
    """Every agent and policy name in a record replaced by its hostile twin."""
    if isinstance(value, dict):
        return {names.get(k, k) if isinstance(k, str) else k: _rename(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [_rename(v, names) for v in value]
    return names.get(value, value) if isinstance(value, str) else value


def hostile_run(run_dir, dest):
    """``run_dir`` rewritten so that every text the report shows carries ``HOSTILE``."""
    def jsonl(edit):
        return lambda text: "".join(json.dumps(edit(_rename(json.loads(line)))) + "\n" for line in text.splitlines())

    def config(text):
        cfg = _rename(yaml.safe_load(text))
        cfg["team"].update(name=f"team {HOSTILE}", description=HOSTILE)
        cfg["topology"]["kind"] = HOSTILE
        for a in cfg["agents"]:
            a["role"] = HOSTILE
        return yaml.safe_dump(cfg)

    def episode(ep):
        ep["task"] = {"task_id": HOSTILE, "prompt": HOSTILE, "answer": HOSTILE}
        ep.update(answer=HOSTILE, status=HOSTILE, error=HOSTILE, scores={HOSTILE: 1.0}, details={HOSTILE: HOSTILE})
        for t in ep["turns"]:
            t.update(text=HOSTILE, parsed={"answer": HOSTILE}, finish_reason=HOSTILE, observations=[HOSTILE],
                     tool_calls=[{"name": HOSTILE, "arguments": {HOSTILE: HOSTILE}, "valid": False, "error": HOSTILE}],
                     details={"critic_reply": HOSTILE, HOSTILE: [HOSTILE, 1.0]})
        return ep

    def info(text):
        d = _rename(json.loads(text))
        d["credit"].update(method=HOSTILE, family=HOSTILE, granularity=HOSTILE, baseline=HOSTILE)
        d["env"] = {"name": HOSTILE, "source": HOSTILE}
        d["devices"] = [HOSTILE]
        for p in d["policies"].values():
            p["model"] = HOSTILE
        return json.dumps(d)

    def metrics(m):
        if "eval" in m:
            m["tool_calls"] = {HOSTILE: 1.0}
        return m

    return _synthetic_run(run_dir, dest, **{
        "config.yaml": config, "run_info.json": info, "episodes.jsonl": jsonl(episode), "metrics.jsonl": jsonl(metrics),
        "summary.json": lambda _: json.dumps({"stopped": {"reason": HOSTILE, "after_step": HOSTILE}}),
        "warnings.jsonl": _warnings({"step": 0, "kind": HOSTILE, "message": HOSTILE}, {"step": HOSTILE, "kind": "x", "message": "y"})})


def test_the_report_shows_hostile_run_files_as_text(run_dir, tmp_path):
    run = hostile_run(run_dir, tmp_path / "hostile")
    html = write_report(run).read_text()
    page = assert_inert(html, shown=PAYLOADS + tuple(NAMES.values()))
    text = "".join(page.text)
    assert "{{ 7 * 7 }}" in text and "49" not in text.split("{{ 7 * 7 }}")[0][-5:]  # not evaluated as a template
    banner = re.search(r'<div class="banner" role="alert">.*?</div>', html, flags=re.S).group(0)
    assert "&lt;script&gt;window.__mas_pwned = 1" in banner  # the warnings banner, escaped
    turn_attrs = [dict(a) for t, a in page.tags if t == "div" and dict(a).get("class") == "turn"]
    assert turn_attrs and {a["data-agent"] for a in turn_attrs} <= set(NAMES.values())  # quotes stayed inside the value
    out = write_compare([run_dir, run], tmp_path / "cmp.html").read_text()
    assert_inert(out, shown=(HOSTILE, NAMES["lead"]))


def test_the_format_warm_up_is_its_own_phase_and_long_turns_fold(run_dir, tmp_path):
    """A run with trainer.warmup shows the warm-up before the RL curves (per policy: demonstrations,
    steps, losses, time; held-out accuracy before and after it); a long turn shows its first 400
    characters and unfolds the rest."""
    from mas.report.episodes import FOLD_TEXT

    dest = _synthetic_run(run_dir, tmp_path / "warm")
    record = {"steps": 20, "batch_size": 8, "lr": 2e-4, "source": "teacher", "teacher_reward": 1.0,
              "policies": {"planner": {"losses": [2.5] + [0.4] * 19, "tokens": 3100, "seconds": 41.5,
                                       "demonstrations": 120, "loss_first": 2.5, "loss_last": 0.4}}}
    with open(dest / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"warmup": record}) + "\n")
        f.write(json.dumps({"eval": "warmup", "accuracy": 0.42, "episodes": 50}) + "\n")
    rows = [json.loads(line) for line in (dest / "episodes.jsonl").read_text().splitlines()]
    long_text = "I will reason step by step. " * 40  # 1,120 characters
    rows[0]["turns"][0]["text"] = long_text
    (dest / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    html = render_report(load_run(dest))
    section = html[html.index('id="warmup"'):html.index('id="agents"')]
    assert "<th>planner</th><td>120</td><td>20</td><td>3100</td><td>2.5</td><td>0.4</td><td>41.5</td>" in section
    assert "accuracy 0.420 (greedy) after it, before RL" in section
    assert "held-out after the warm-up</b> accuracy 0.420" in html
    cut = long_text[:FOLD_TEXT]
    assert f'{cut}<details class="fold"><summary>… {len(long_text) - FOLD_TEXT} more characters</summary>' in html


def test_the_held_out_chart_shows_every_decoding_and_the_facts_say_a_greedy_regression(run_dir, tmp_path):
    def evals(text: str) -> str:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        kept = [r for r in rows if "eval" not in r]
        def ev(name, greedy, sampled, train, step=None):
            return {"eval": name, **({} if step is None else {"step": step}), "accuracy": greedy, "decoding": "greedy",
                    "sampled": {"k": 4, "avg": sampled, "pass": sampled + 0.2}, "train": {"accuracy": train}}
        rows = [ev("before", 0.58, 0.04, 0.68)] + kept + [ev("periodic", 0.39, 0.21, 0.63, 2), ev("after", 0.39, 0.21, 0.63)]
        return "".join(json.dumps(r) + "\n" for r in rows)

    def summary(text: str) -> str:
        s = json.loads(text)
        s["greedy_regression"] = {"step": 2, "start": 0.58, "now": 0.39, "change": -0.19, "se": 0.05, "floor": 0.1, "tasks": 100}
        s["best"] = {"step": -1, "accuracy": 0.58}
        return json.dumps(s)

    run = _synthetic_run(run_dir, tmp_path / "decodings", **{"metrics.jsonl": evals, "summary.json": summary})
    html = render_report(load_run(run))
    assert "Held-out accuracy by decoding" in html
    for name in ("held-out, greedy", "held-out, sampled avg@4", "held-out, pass@4", "training tasks, greedy"):
        assert name in html
    assert "0.580 at the start -&gt; 0.390 after step 2" in html  # the regression, in the facts
    assert "0.580, the start (checkpoints/best)" in html
    assert "sampled at" not in html or "avg@4 0.210" in html  # the after-training line carries the sampled numbers


def test_the_rollout_learner_mismatch_is_plotted_and_the_importance_weights_only_when_on(run_dir, tmp_path):
    html = render_report(load_run(run_dir))
    assert "rollout/learner mean |Δ logprob| (first pass)" in html and "share of tokens clipped on the first pass" in html
    assert "Per policy: rollout importance weight" not in html and "trainer.rollout_is is none" in html
    on = _synthetic_run(run_dir, tmp_path / "tis", **{"config.yaml": lambda t: t.replace("rollout_is: none", "rollout_is: token")})
    assert "Per policy: rollout importance weight, mean" in render_report(load_run(on))


# --- the per-agent table: notes from its own numbers, the free-rider flag, correctness ---------


def _agents_section(html: str) -> str:
    return html[html.index('<section id="agents">'):html.index('<section id="curves">')]


def _row(section: str, agent: str) -> str:
    return re.search(rf"<tr><th>{agent}.*?</tr>", section, flags=re.S).group(0)


def _cells(row: str) -> list[str]:
    return re.findall(r"<td>(.*?)</td>", row, flags=re.S)


def _set_agents(values: dict[str, dict]):
    """A metrics.jsonl edit: every step's per-agent record of each named agent replaced by ``values[name]``
    (over the run's own, so every key the report reads is there)."""
    def edit(text):
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        for r in rows:
            if "agents" in r:
                for name, v in values.items():
                    base = {k: x for k, x in r["agents"][name].items() if k not in ("verified_accuracy", "verified_turns",
                                                                                    "designed_accuracy", "designed_episodes")}
                    r["agents"][name] = {**base, **v}
        return "".join(json.dumps(r) + "\n" for r in rows)
    return edit


def _agent(share, turns, adv, **more):
    return {"credit_share": share, "turns": turns, "advantage": {"mean": adv, "std": 1.0, "min": -1.0, "max": 1.0}, **more}


def test_the_notes_beside_the_agent_table_are_computed_from_its_numbers(run_dir, tmp_path):
    """Dr. MAS's line used to say "shares follow turn counts; ... their mean is 0" whatever the table
    showed.  Here lead has 80% of the credit for a third of the turns, and the mean advantages are
    +0.3 and -0.1 (normaliser: group, say): the notes say that, and nothing that contradicts it."""
    wrong = _synthetic_run(run_dir, tmp_path / "unequal", **{"metrics.jsonl": _set_agents({
        "lead": _agent(0.8, 2, 0.3), "helper": _agent(0.1, 2, -0.1), "checker": _agent(0.1, 2, 0.0)})})
    section = _agents_section(write_report(wrong).read_text())
    # each agent took 2 of the step's 6 turns: 33.3%; lead's share 80.0% is 46.7 points above it
    assert [_cells(_row(section, a))[1:4] for a in ("lead", "helper", "checker")] == [
        ["80.0%", "33.3%", "+0.300"], ["10.0%", "33.3%", "-0.100"], ["10.0%", "33.3%", "+0.000"]]
    assert ("The credit shares do not follow the shares of turns: lead has 80.0% of the credit for 33.3% of the turns."
            in section)
    assert "Mean advantages are not 0 for lead (+0.300), helper (-0.100)." in section
    assert "follow turn counts" not in section and "mean is 0" not in section and "follow the shares of turns:" not in \
        section.replace("do not follow the shares of turns:", "")

    # shares within 5 points of the turns (35%, 33%, 32% against 33.3% each) and every mean 0 to 3 decimals
    even = _synthetic_run(run_dir, tmp_path / "even", **{"metrics.jsonl": _set_agents({
        "lead": _agent(0.35, 2, 0.0002), "helper": _agent(0.33, 2, 0.0), "checker": _agent(0.32, 2, -0.0001)})})
    section = _agents_section(write_report(even).read_text())
    assert "The credit shares follow the shares of turns: every agent&#39;s is within 5 points of its share of turns." in section
    assert "Every agent&#39;s mean advantage is 0 (to 3 decimals)." in section
    assert "do not follow" not in section and "are not 0" not in section


def test_table_notes_read_the_cells_they_describe():
    from mas.report.checklist import table_notes

    def row(name, share, turns, adv):
        return {"name": name, "silent": False, "share": share, "turn_share": turns, "advantage": adv}

    # 5 points is the line: 38.3% against 33.3% still follows, 38.4% does not
    assert table_notes([row("a", "38.3%", "33.3%", "+0.000"), row("b", "28.4%", "33.3%", "+0.000")])[0].startswith(
        "The credit shares follow")
    assert table_notes([row("a", "38.4%", "33.3%", "+0.000"), row("b", "28.3%", "33.3%", "+0.000")])[0] == (
        "The credit shares do not follow the shares of turns: a has 38.4% of the credit for 33.3% of the turns.")
    # no share to compare (no positive credit), one agent, silent agents: no sentence about shares
    assert table_notes([row("a", "—", "50.0%", "+0.000"), row("b", "—", "50.0%", "+0.000")]) == [
        "Every agent's mean advantage is 0 (to 3 decimals)."]
    assert table_notes([{"name": "c", "silent": True}]) == []


def test_an_agent_that_does_its_part_is_not_called_a_free_rider(run_dir, tmp_path):
    """Low credit for many turns is a free rider only where nothing says its turns were right.
    helper's turns verified right every time: no free-rider tag, a plain note; checker's mostly
    wrong: tagged; a verified accuracy column shows both (lead has none: "—")."""
    run = _synthetic_run(run_dir, tmp_path / "verified", **{"metrics.jsonl": _set_agents({
        "lead": _agent(0.9, 2, 0.0),
        "helper": _agent(0.05, 2, 0.0, verified_accuracy=1.0, verified_turns=2),
        "checker": _agent(0.05, 2, 0.0, verified_accuracy=0.25, verified_turns=2)})})
    section = _agents_section(write_report(run).read_text())
    assert "<th title=\"mean turn-verifier score of the agent&#39;s turns (envs/verifiers.py)\">verified accuracy</th>" in section
    helper, checker, lead = _row(section, "helper"), _row(section, "checker"), _row(section, "lead")
    assert _cells(helper)[4] == "100.0%" and _cells(checker)[4] == "25.0%" and _cells(lead)[4] == "—"
    assert "free-rider?" not in helper
    assert "low credit for its share of turns, though it does its part (verified accuracy 100.0%)" in helper
    assert "its turns were mostly wrong (verified accuracy 25.0%): free-rider?" in checker

    # the same credit without verification: nothing says its turns were right, so the credit decides
    bare = _synthetic_run(run_dir, tmp_path / "bare", **{"metrics.jsonl": _set_agents({
        "lead": _agent(0.9, 2, 0.0), "helper": _agent(0.05, 2, 0.0), "checker": _agent(0.05, 2, 0.0)})})
    section = _agents_section(write_report(bare).read_text())
    assert "low credit for its share of turns: free-rider?" in _row(section, "helper")
    assert "verified accuracy" not in section  # no verification in the run: no column

    # a designed team task's ground truth counts the same way, weighted by the episodes it judged
    designed = _synthetic_run(run_dir, tmp_path / "designed", **{"metrics.jsonl": _set_agents({
        "lead": _agent(0.9, 2, 0.0), "helper": _agent(0.05, 2, 0.0, designed_accuracy=0.75, designed_episodes=4),
        "checker": _agent(0.05, 2, 0.0)})})
    section = _agents_section(write_report(designed).read_text())
    assert ">did its part</th>" in section and _cells(_row(section, "helper"))[4] == "75.0%"
    assert "though it does its part (did its part 75.0%)" in _row(section, "helper")
    assert "free-rider?" in _row(section, "checker")  # no judgement of its part: the credit decides


def test_verified_accuracy_is_weighted_by_the_turns_it_scored():
    from mas.report.checklist import _weighted

    # 1 of 1 turns right in one step, 1 of 3 in the next: 2 of 4 turns, not the mean of 1.0 and 0.333
    ms = [{"verified_accuracy": 1.0, "verified_turns": 1}, {"verified_accuracy": 1 / 3, "verified_turns": 3}, {}]
    assert _weighted(ms, "verified_accuracy", "verified_turns") == pytest.approx(2 / 4)
    assert _weighted([{}], "verified_accuracy", "verified_turns") is None


def test_step_metrics_record_designed_accuracy_per_agent():
    from mas.credit.batch import build_credit_batch
    from mas.training.metrics import step_metrics

    task = Task("t", "q", "1")
    eps = [Episode(task, 0, i, 0, turns=[_turn("lead"), _turn("helper")], reward=1.0) for i in range(4)]
    for ep, (lead, helper) in zip(eps, [(1.0, 1.0), (1.0, 0.0), (1.0, 0.0), (0.0, 0.0)]):
        ep.info["designed"] = {"lead": lead, "helper": helper}
    del eps[3].info["designed"]["helper"]  # helper had no judged part there: it does not count
    groups = [EpisodeGroup(task, eps)]
    batch = build_credit_batch(groups, ["lead", "helper"])
    m = step_metrics(0, groups, batch, Credit(advantages=torch.zeros(8)), {}, {})
    assert m["kind"] == "step"
    assert m["agents"]["lead"]["designed_accuracy"] == 3 / 4 and m["agents"]["lead"]["designed_episodes"] == 4
    assert m["agents"]["helper"]["designed_accuracy"] == 1 / 3 and m["agents"]["helper"]["designed_episodes"] == 3


def test_a_sharp_agent_whose_marginal_is_0_is_never_decisive():
    """SHARP's credit is the outcome plus λ·φ, normalised per agent: lead's Shapley value is 0 (it
    changed nothing) yet its normalised credit 1.2 is the largest.  The badge goes to helper, whose
    φ = 0.5 is the largest contribution; with every φ 0, or every credit 0, nothing is decisive."""
    from mas.report.episodes import episode_block
    from mas.report.methods import decisive

    agents = ["lead", "helper", "lead"]

    def sharp_ep(credits, marginals):
        ep = _ep(credits, agents)
        for t, phi in zip(ep["turns"], marginals):
            t["details"] = {"marginal": phi, "broadcast": 1.0}
        return ep

    ep = sharp_ep([1.2, 0.3, 1.2], [0.0, 0.5, 0.0])
    assert decisive(ep["turns"], "agent").agents == {"helper"}
    html = episode_block(ep, agents, 1.0, True, level="agent")
    assert _badged(html) == [1] and "decisive: helper" in html and "decisive: lead" not in html
    # λ_s = 0 (or every player excluded): every φ is 0, so no agent contributed more than another
    assert _badged(episode_block(sharp_ep([1.2, 0.3, 1.2], [0.0, 0.0, 0.0]), agents, 1.0, True, level="agent")) == []
    # a group without reward variance: every credit 0, whatever the Shapley values
    assert _badged(episode_block(sharp_ep([0.0, 0.0, 0.0], [0.0, 0.5, 0.0]), agents, 1.0, True, level="agent")) == []
    # the largest contributor got credit 0 (its normalisation set was constant): no badge, not the runner-up
    assert decisive(sharp_ep([0.0, 0.4, 0.0], [0.9, 0.5, 0.9])["turns"], "agent").agents == set()
    # per-turn and unknown levels: credit 0 everywhere is never decisive, and a 0 never wins
    for level in ("turn", None):
        assert decisive(_ep([0.0, 0.0, 0.0], agents)["turns"], level).turns == set()
    assert decisive(_ep([0.0, -0.0, 0.0], agents)["turns"], "agent").agents == set()
