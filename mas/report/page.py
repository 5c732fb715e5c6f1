"""Assemble the self-contained HTML report of one run, or the comparison of several.

The page loads nothing from anywhere: styles are inline, charts are inline SVG, the episode
browser uses ``<details>`` elements, and the one script (legend entries hide and show curves)
is inline and allowed by its hash in the page's Content-Security-Policy.  The markup is in
``templates/`` (Jinja2, autoescape on); this module decides what goes on the page.
"""

from __future__ import annotations

import statistics
from typing import Any

from mas.training.metrics import eval_summary, held_out_story, story_text
from mas.report.charts import DASHES, PALETTE, Series, colour, fmt, line_chart, stacked_chart
from mas.report.checklist import agent_table, checklist_table, duration, wall_seconds
from mas.report.episodes import MAX_SIDE, episode_browser
from mas.report.methods import credit_level, method_of, share_note
from mas.report.render import finite, macro, render
from mas.report.run import RunData

MAX_WARNINGS = 20  # distinct warnings (kind and message) shown in a banner; the rest are counted


def _smooth(n: int) -> float | None:
    """EMA weight for curves of ``n`` steps: none for short runs, smoother for long ones."""
    return None if n < 30 else max(0.05, min(0.3, 10 / n))


def warnings_banner(run: RunData, title: str = "While training") -> str:
    """The run's warnings (warnings.jsonl), the same kind and message once with its count and
    steps; "" when there are none."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for w in run.warnings:
        key = (str(w.get("kind", "warning")), str(w.get("message", "")))
        g = groups.setdefault(key, {"kind": key[0], "message": key[1], "steps": []})
        g["steps"].append(w.get("step"))
    if not groups:
        return ""
    shown = []
    for g in list(groups.values())[:MAX_WARNINGS]:
        steps = sorted({s for s in g["steps"] if finite(s)})
        n = len(g["steps"])
        where = [f"{n} times"] if n > 1 else []
        if steps:
            where.append(f"step {fmt(steps[0])}" if len(steps) == 1 else f"steps {fmt(steps[0])}–{fmt(steps[-1])}")
        message = g["message"] if len(g["message"]) <= MAX_SIDE else g["message"][:MAX_SIDE] + " …"
        shown.append({"kind": g["kind"], "message": message, "where": ", ".join(where)})
    return macro("tables.html.j2", "warnings")(shown, len(run.warnings), max(0, len(groups) - MAX_WARNINGS), title)


# --- one run ---------------------------------------------------------------------------------


def _reward_chart(run: RunData) -> str:
    xs = run.step_numbers
    series = [Series("team", xs, run.series("reward", "team"), color="#000000", width=2.6)]
    series += [Series(a, xs, run.series("agents", a, "reward"), color=colour(i), dash="4 3", attrs={"agent": a})
               for i, a in enumerate(run.agents)]
    return line_chart(series, "Reward: team and per agent", "reward", smooth=_smooth(len(xs)),
                      note="An agent's reward is the mean outcome of the episodes it spoke in.")


def _share_chart(run: RunData) -> str:
    xs = run.step_numbers
    method, _ = method_of(run.info, run.config)
    series = [Series(a, xs, run.series("agents", a, "credit_share"), color=colour(i), attrs={"agent": a})
              for i, a in enumerate(run.agents)]
    return line_chart(series, "Credit share per agent", "share of positive credit", y_range=(0.0, 1.0),
                      smooth=_smooth(len(xs)), note=f"Each agent's summed positive credit over the team's, per step. "
                                                   f"Under {method}: {share_note(method)}")


def _advantage_chart(run: RunData) -> str:
    xs = run.step_numbers
    series = []
    for i, a in enumerate(run.agents):
        mean = run.series("agents", a, "advantage", "mean")
        std = run.series("agents", a, "advantage", "std")
        lo = [m - s if m is not None and s is not None else None for m, s in zip(mean, std)]
        hi = [m + s if m is not None and s is not None else None for m, s in zip(mean, std)]
        series.append(Series(a, xs, mean, color=colour(i), band=(lo, hi), attrs={"agent": a}))
    return line_chart(series, "Advantage per agent (mean ± std)", "advantage",
                      note="Shaded: ± one standard deviation of the agent's turn advantages in the step.")


def _range_chart(run: RunData) -> str:
    xs = run.step_numbers
    series = []
    for i, a in enumerate(run.agents):
        series.append(Series(f"{a} max", xs, run.series("agents", a, "advantage", "max"), color=colour(i), attrs={"agent": a}))
        series.append(Series(f"{a} min", xs, run.series("agents", a, "advantage", "min"), color=colour(i), dash="2 3",
                             attrs={"agent": a}))
    return line_chart(series, "Advantage range per agent (min, max)", "advantage", smooth=_smooth(len(xs)))


TIMERS = (("rollout", "rollout"), ("credit_replays", "credit: replays"), ("credit_interventions", "credit: coalitions / counterfactuals"),
          ("credit_critic", "credit: critic calls"), ("credit_assign", "credit: assignment"), ("update", "update"), ("sync", "weight sync"))


def _timing_chart(run: RunData) -> str:
    xs = run.step_numbers
    series = []
    for i, (key, label) in enumerate(TIMERS):
        ys = run.series("time", key)
        if key == "credit_assign" and all(y is None for y in ys):  # runs from before the split: the whole credit phase
            ys, label = run.series("time", "credit"), "credit"
        series.append(Series(label, xs, [y or 0.0 for y in ys], color=PALETTE[i], attrs={"timer": key}))
    return stacked_chart(series, "Step time breakdown", "seconds")


POLICY_METRICS = (("loss", "loss"), ("kl", "KL to reference"), ("clip_frac", "clip fraction"), ("entropy", "entropy"),
                  ("grad_norm", "gradient norm (pre-clip)"), ("lr", "learning rate"),
                  ("mismatch_abs_mean", "rollout/learner mean |Δ logprob| (first pass)"),
                  ("mismatch_abs_max", "rollout/learner max |Δ logprob| (first pass)"),
                  ("mismatch_kl", "KL(learner ‖ rollout), k3 estimate"),
                  ("first_clip_frac", "share of tokens clipped on the first pass"),
                  ("is_weight_mean", "rollout importance weight, mean"), ("is_capped_frac", "importance weights at the cap"))


def terms_off(run: RunData) -> dict[str, str]:
    """Loss terms that were off in this run, each with why: {metric key: reason}.

    KL is off when ``trainer.kl_coef`` is 0 (no reference pass; the logged value is 0).  Clipping
    is off on-policy: with one epoch per step (``ppo_epochs: 1``) and no stale rollouts
    (``max_staleness: 0``) the new policy is the sampling one, so the ratio stays at 1 up to
    numerics.  A term whose logged values are not all 0 is drawn anyway: it did act."""
    trainer = run.config.get("trainer") or {}
    off = {}
    if not trainer.get("kl_coef", 0.0):
        off["kl"] = "trainer.kl_coef is 0"
    if trainer.get("ppo_epochs", 1) == 1 and not trainer.get("max_staleness", 0):
        off["clip_frac"] = "on-policy updates (trainer.ppo_epochs 1, no stale rollouts), so the ratio stays at 1"
    if trainer.get("rollout_is", "none") == "none":
        off["is_weight_mean"] = off["is_capped_frac"] = "trainer.rollout_is is none"
    return {k: why for k, why in off.items()  # the importance weights are 1 when off: off by the config alone
            if k.startswith("is_") or all(not y for p in run.policies for y in run.series("policies", p, k))}


def _policy_charts(run: RunData) -> tuple[list[str], str]:
    xs = run.step_numbers
    off = terms_off(run)
    out = []
    for key, label in POLICY_METRICS:
        if key in off:
            continue
        series = [Series(p, xs, run.series("policies", p, key), color=colour(i), attrs={"policy": p})
                  for i, p in enumerate(run.policies)]
        out.append(line_chart(series, f"Per policy: {label}", label))
    labels = dict(POLICY_METRICS)
    note = "; ".join(f"{labels[k]} ({why})" for k, why in off.items())
    return out, (f"Not drawn, because the term was off: {note}." if note else "")


def _agent_charts(run: RunData) -> list[str]:
    xs = run.step_numbers
    charts = []
    for key, title, y_label in (("completion_tokens_mean", "Completion length per turn", "tokens"),
                                ("invalid", "Parse-failure rate", "fraction of turns"),
                                ("tool_valid", "Valid tool calls", "fraction"),
                                ("verified_accuracy", "Verified accuracy (mean turn-verifier score)", "score"),
                                ("designed_signal", "Per-agent signal (advantage vs own correctness)", "Pearson r")):
        series = [Series(a, xs, run.series("agents", a, key), color=colour(i), attrs={"agent": a})
                  for i, a in enumerate(run.agents)]
        if any(y is not None for s in series for y in s.ys):
            charts.append(line_chart(series, title, y_label))
    return charts


def heldout_points(run: RunData) -> list[tuple[float, dict]]:
    """(steps done, evaluation record) for the held-out curve: the start of RL (after the warm-up
    where there was one, else before training) at 0, each periodic evaluation after step s at s + 1."""
    start = "warmup" if any(r["eval"] == "warmup" for r in run.eval_rows) else "before"
    out = []
    for r in run.eval_rows:
        if r["eval"] == start:
            out.append((0.0, r))
        elif r["eval"] == "periodic" and isinstance(r.get("step"), int):
            out.append((float(r["step"] + 1), r))
    return out


def _heldout_chart(run: RunData) -> str | None:
    """Held-out accuracy per evaluation: greedy (the deployed team), sampled avg@k and pass@k, and
    the training tasks (greedy): a sampled gain without a greedy one, or a growing training-vs-held-out
    gap, shows here."""
    points = heldout_points(run)
    if len(points) < 2:
        return None
    xs = [x for x, _ in points]

    def ys(get):
        out = []
        for _, r in points:
            try:
                v = get(r)
            except (KeyError, TypeError):
                v = None
            out.append(float(v) if isinstance(v, (int, float)) else None)
        return out

    k = next((r["sampled"]["k"] for _, r in points if isinstance(r.get("sampled"), dict)), None)
    legacy = any(r.get("decoding") == "sampled" for _, r in points)
    series = [Series("held-out, sampled (older run)" if legacy else "held-out, greedy", xs, ys(lambda r: r["accuracy"]),
                     color=colour(0), width=2.6, attrs={"decoding": "greedy"}),
              Series(f"held-out, sampled avg@{k}", xs, ys(lambda r: r["sampled"]["avg"]), color=colour(1),
                     attrs={"decoding": "sampled"}),
              Series(f"held-out, pass@{k}", xs, ys(lambda r: r["sampled"]["pass"]), color=colour(2), dash="4 3",
                     attrs={"decoding": "pass"}),
              Series("training tasks, greedy", xs, ys(lambda r: r["train"]["accuracy"]), color=colour(3), dash="2 3",
                     attrs={"decoding": "train"})]
    note = ("Greedy is the team a user deploys; sampled is the policy RL trains, at each agent's own temperature. "
            "The training tasks are a fixed set from the start of the run's task stream: a gap to the held-out "
            "line that grows means the team learns its training tasks, not the skill.")
    return line_chart(series, "Held-out accuracy by decoding", "accuracy", x_label="steps done", note=note)


def unheard(run: RunData) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """The steps in which each agent did not speak, and in which each policy that updated got no
    samples: ({agent: steps}, {policy: steps}).  From each step's ``silent_agents`` and
    ``idle_policies``; a step record of an older run, without them, counts the team's agents
    missing from its ``agents`` and the policies whose update had ``samples`` 0."""
    agents: dict[str, list[int]] = {}
    policies: dict[str, list[int]] = {}
    for m in run.steps:
        silent = m["silent_agents"] if isinstance(m.get("silent_agents"), list) else \
            [a for a in run.agents if a not in (m.get("agents") or {})]
        idle = m["idle_policies"] if isinstance(m.get("idle_policies"), list) else \
            [p for p, u in (m.get("policies") or {}).items() if isinstance(u, dict) and u.get("samples") == 0]
        for name in silent:
            agents.setdefault(str(name), []).append(m["step"])
        for name in idle:
            policies.setdefault(str(name), []).append(m["step"])
    return agents, policies


def _unheard_facts(run: RunData) -> list[tuple[str, str]]:
    agents, policies = unheard(run)
    n = len(run.steps)

    def where(steps: list[int]) -> str:
        return f"{len(steps)} of {n} steps (first: step {fmt(steps[0])})"

    facts = []
    if agents:
        facts.append(("agents that did not speak", "; ".join(f"{a} in {where(s)}" for a, s in agents.items())))
    if policies:
        facts.append(("policies without samples", "; ".join(f"{p} in {where(s)}: its weights did not change then"
                                                            for p, s in policies.items())))
    return facts


def _facts(run: RunData) -> list[tuple[str, str]]:
    method, _ = method_of(run.info, run.config)
    facts = [("credit", method), ("topology", str((run.config.get("topology") or {}).get("kind", "?"))),
             ("agents", ", ".join(run.agents)), ("steps", str(len(run.steps))),
             ("training time", duration(wall_seconds(run)))]
    facts += _unheard_facts(run)
    for when, label in (("before", "held-out before training"), ("warmup", "held-out after the warm-up"),
                        ("after", "held-out after training")):
        if when in run.evals:
            facts.append((label, eval_summary(run.evals[when])))
    story = held_out_story(run.evals.get("before"), run.evals.get("warmup"), run.evals.get("after"))
    if story is not None and story["after_warmup"] is not None:  # RL's gain counts from the warm-up, not from before it
        facts.append(("held-out, phase by phase", story_text(story)))
    if story is not None and story.get("ceiling"):
        facts.append(("note", story["ceiling"]))
    worse = run.summary.get("greedy_regression")
    if worse:
        facts.append(("greedy regression", f"{worse['start']:.3f} at the start -> {worse['now']:.3f} after step {worse['step']} "
                                           f"(noise floor ±{worse['floor']:.3f} on {worse['tasks']} tasks)"))
    best = run.summary.get("best")
    if best:
        facts.append(("best greedy checkpoint", f"{best['accuracy']:.3f}, "
                      + ("the start" if best["step"] < 0 else f"after step {best['step']}") + " (checkpoints/best)"))
    return facts


def warmup_table(run: RunData) -> str:
    """The format warm-up as its own phase: per policy its demonstrations, steps, loss and time,
    then the held-out team accuracy after it."""
    w = run.warmup or {}
    rows = [{"policy": name, "demonstrations": p.get("demonstrations"), "steps": len(p.get("losses", [])),
             "tokens": p.get("tokens"), "loss_first": p.get("loss_first"), "loss_last": p.get("loss_last"),
             "seconds": p.get("seconds")} for name, p in (w.get("policies") or {}).items()]
    return render("warmup.html.j2", warmup=w, rows=rows, after=run.evals.get("warmup"),
                  before=run.evals.get("before"), summary=eval_summary)


def _tags(run: RunData) -> list[str]:
    tags = []
    stopped = run.summary.get("stopped")
    if isinstance(stopped, dict):
        after = stopped.get("after_step")
        tags.append(f"stopped {'after step ' + str(after) if isinstance(after, int) and after >= 0 else 'before the first step'}: "
                    f"{stopped.get('reason', '?')}")
    if run.skipped_lines:
        tags.append(f"{run.skipped_lines} unreadable log lines skipped")
    if run.config_problem:
        tags.append(run.config_problem)
    return tags


def render_report(run: RunData) -> str:
    method, granularity = method_of(run.info, run.config)
    curves = None
    if run.steps:
        policy, omitted = _policy_charts(run)
        heldout = _heldout_chart(run)
        curves = {"main": [*([heldout] if heldout else []), _reward_chart(run), _share_chart(run), _advantage_chart(run),
                           _range_chart(run), _timing_chart(run), *_agent_charts(run)],
                  "policy": policy, "omitted": omitted}
    sections = [
        *([("warmup", "Format warm-up (before RL)", warmup_table(run))] if run.warmup else []),
        ("agents", "Who earned the reward", agent_table(run)),
        ("curves", "Curves", render("curves.html.j2", curves=curves)),
        ("episodes", "Episode browser", episode_browser(run.episodes, run.agents, level=credit_level(granularity),
                                                        granularity=granularity)),
        ("checklist", "Reporting checklist", checklist_table(run)),
    ]
    return render("report.html.j2", title=f"mas report: {run.name}", name=run.name,
                  description=str((run.config.get("team") or {}).get("description", "")),
                  facts=_facts(run), tags=_tags(run), banner=warnings_banner(run), sections=sections) + "\n"


# --- several runs ----------------------------------------------------------------------------


def _tail_mean(ys: list[float | None], tail: float = 0.1) -> float | None:
    vals = [y for y in ys if y is not None]
    if not vals:
        return None
    return statistics.fmean(vals[int(len(vals) * (1 - tail)):] or vals[-1:])


def render_compare(runs: list[RunData]) -> str:
    """Curves of several runs on the same axes: one colour per run, one dash pattern per agent."""
    longest = max((len(r.steps) for r in runs), default=0)
    smooth = _smooth(longest)
    team = [Series(r.name, r.step_numbers, r.series("reward", "team"), color=colour(i), width=2.4, attrs={"run": r.name})
            for i, r in enumerate(runs)]
    agents = list(dict.fromkeys(a for r in runs for a in r.agents))
    per_agent, shares = [], []
    for i, r in enumerate(runs):
        for j, a in enumerate(agents):
            if a not in r.agents:
                continue
            attrs = {"run": r.name, "agent": a}
            dash = DASHES[j % len(DASHES)]
            per_agent.append(Series(f"{r.name} · {a}", r.step_numbers, r.series("agents", a, "reward"), color=colour(i), dash=dash, attrs=attrs))
            shares.append(Series(f"{r.name} · {a}", r.step_numbers, r.series("agents", a, "credit_share"), color=colour(i), dash=dash, attrs=attrs))
    times = [Series(r.name, r.step_numbers, r.series("time", "step"), color=colour(i), attrs={"run": r.name}) for i, r in enumerate(runs)]
    methods = list(dict.fromkeys(method_of(r.info, r.config)[0] for r in runs))
    charts = [line_chart(team, "Team reward", "reward", smooth=smooth),
              line_chart(per_agent, "Reward per agent", "reward", smooth=smooth, note="Colour: run; dash pattern: agent."),
              line_chart(shares, "Credit share per agent", "share of positive credit", y_range=(0.0, 1.0), smooth=smooth,
                         note="Colour: run; dash pattern: agent."),
              line_chart(times, "Step wall time", "seconds")]
    rows = []
    for i, r in enumerate(runs):
        final = _tail_mean(r.series("reward", "team"))
        rows.append({"colour": colour(i), "name": r.name, "path": str(r.path), "method": method_of(r.info, r.config)[0],
                     "steps": len(r.steps), "final": fmt(final) if final is not None else "—",
                     "before": eval_summary(r.evals["before"]) if "before" in r.evals else "—",
                     "after": eval_summary(r.evals["after"]) if "after" in r.evals else "—",
                     "time": duration(wall_seconds(r)), "warnings": len(r.warnings)})
    banners = [warnings_banner(r, title=f"Run {r.name}") for r in runs]
    runs_html = macro("tables.html.j2", "runs")(rows, [(m, share_note(m)) for m in methods])
    return render("compare.html.j2", title="mas report: comparison", count=len(runs), banners=[b for b in banners if b],
                  sections=[("runs", "Runs", runs_html), ("curves", "Curves", render("curves.html.j2", curves={"main": charts}))]) + "\n"
