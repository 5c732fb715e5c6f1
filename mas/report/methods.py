"""What a credit method's numbers mean, for the report: one line per method on what its credit
share measures, and which turn or agent (if any) is decisive in an episode.

The decisive badge follows the credit's granularity, read from the method card in
``run_info.json`` (``credit.granularity``, see ``credit/registry.py``):

    episode     one advantage for every turn of an episode: nothing is decisive, no badge
    statistics  the outcome normalised per agent (Dr. MAS): agents differ only through their
                own statistics and the invalid-turn penalty, not through what they did: no badge
    agent       a value per agent or role (SHARP, CCPO, M-GRPO): the decisive agent is the one
                whose contribution is largest in magnitude; the badge marks its turns
    turn        a value per turn (C3, critic): the turn with the largest |credit|

What is compared is a turn's contribution: the method's own measure of it where the turn
records one (``CONTRIBUTION_KEYS``: SHARP's Shapley value, ``marginal``), else its credit.
SHARP's credit mixes the Shapley value with the team's outcome and normalises it per agent,
so an agent whose Shapley value is 0 (it changed nothing, or it is excluded from the players)
can still hold the largest |credit|: it is never decisive.

In every level the badge is absent where the contribution it compares is the same everywhere in
the episode (all turns, or all agents, within a relative 1e-6), or where everything ties.  A
turn or agent whose contribution is 0, or whose credit is 0, is never decisive, and an episode
whose credit is 0 everywhere has no decisive turn.  Turns the method left out of the update
(M-GRPO's dropped sub-agent copies) do not count.  A run without a recorded granularity
(written before run_info.json, or by an unknown method) gets the level its stored credit
shows: per agent if each agent's turns share one value, else per turn.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from mas.report.render import finite

# What each built-in method's credit share measures (share: an agent's summed positive credit
# over the team's, per step).  Each line says how the method makes the credit, never what the
# numbers of a run turned out to be: whether shares follow the shares of turns, or mean advantages
# are 0, is said under the per-agent table from that table's own numbers (checklist.table_notes).
# A test checks every registered method has a line.
SHARE_NOTES = {
    "grpo": "every turn of an episode gets the episode's group-normalised advantage, so an agent's share grows with "
            "the turns it took in better-than-average episodes; it does not measure who helped.",
    "dr_grpo": "every turn of an episode gets its reward minus the task group's mean, so an agent's share grows with "
               "the turns it took in better-than-average episodes; it does not measure who helped.",
    "rloo": "every turn of an episode gets its reward minus the mean of the task's other episodes, so an agent's share "
            "grows with the turns it took in better-than-average episodes; it does not measure who helped.",
    "magrpo": "every turn of a joint rollout gets the rollout's reward minus the node baseline, so an agent's share "
              "grows with the turns it took in better-than-baseline rollouts; it does not measure who helped.",
    "reinforce_pp": "every turn gets its episode's return, whitened over the batch (or per agent) and token-weighted, "
                    "so an agent's share grows with the turns it took in above-average episodes.",
    "dr_mas": "every turn gets the episode's outcome (less a penalty where its output did not parse), normalised "
              "against its own agent's turns (per task group, by default). Every agent is judged on the shared "
              "outcome against its own statistics, not on what it contributed.",
    "sharp": "an agent's credit in an episode is the team's outcome plus its Shapley value from coalition re-runs "
             "(plus any tool reward), normalised per agent; the Shapley values themselves are the episodes' "
             "'marginal' details.",
    "c3": "shares follow each turn's counterfactual value: its outcome against replays from the same frozen context, "
          "so agents whose decisions changed the outcome earn more credit.",
    "ccpo": "shares split credit by role: the upstream agent's turns carry a bonus when the team does better with it "
            "than without it, the downstream turns the joint reward; each role is centred per task.",
    "m_grpo": "shares split main from sub-agent credit: the main agent's turns carry the group-relative main reward, "
              "sub-agent turns the aligned sub reward (once per copy); each side is normalised on its own, so shares "
              "compare main with sub, not one sub-agent's merit with another's.",
    "critic": "shares follow the critic's per-turn scores (MAPPA) or per-message credits (LLM-MCA), normalised per "
              "agent (token-weighted under MAPPA): a share says which of an agent's turns the critic rated above "
              "that agent's average.",
    "verified": "shares follow each turn's reward, its verifier's score mixed with the team's outcome, normalised per "
                "agent: a share says which of an agent's turns did their own job (and helped the team) more than "
                "that agent's average.",
}

GENERIC_SHARE_NOTE = "an agent's summed positive credit over the team's, per step; what drives it depends on the method."

LEVELS = ("episode", "statistics", "agent", "turn")

DECISIVE_RULES = {
    "episode": "Credit is per episode ({g}): every turn of an episode gets the same advantage, so no turn or agent "
               "is marked as decisive.",
    "statistics": "Credit is the episode's outcome normalised per agent ({g}): agents differ only through their own "
                  "statistics and the penalty on unparsed turns, not through what they did, so no turn or agent is "
                  "marked as decisive.",
    "agent": "Credit is per agent ({g}): an agent's turns in an episode share its credit, so the badge marks the "
             "decisive agent, the one whose contribution is largest in magnitude (its Shapley value where the "
             "method records one, else its turns' mean credit), on each of its turns and in the heatmap. No badge "
             "where every agent's is the same, and never for an agent whose contribution or credit is 0.",
    "turn": "Credit is per turn ({g}): the badge marks the turn with the largest |credit| in the episode. No badge "
            "where every turn's credit is the same, and never on a turn whose credit is 0.",
    None: "The credit granularity is not recorded for this run, so it is read from the stored credit: where each "
          "agent's turns share one value the badge marks the agent whose credit is largest in magnitude, otherwise "
          "the turn with the largest |credit|. No badge where the credit is the same everywhere, and never on "
          "credit 0.",
}

# per-turn details that measure a turn's own contribution, in the order looked for (see the module doc)
CONTRIBUTION_KEYS = ("marginal",)


def share_note(method: str) -> str:
    return SHARE_NOTES.get(method, GENERIC_SHARE_NOTE)


def credit_level(granularity: str | None) -> str | None:
    """The decisive-badge level of a method card's granularity text (None: unknown)."""
    if not isinstance(granularity, str):
        return None
    head, _, detail = granularity.strip().lower().partition(":")
    word = head.split(" ")[0] if head else ""
    if word == "agent" and detail.strip().startswith("statistics"):
        return "statistics"
    return word if word in ("episode", "agent", "turn") else None


def method_of(run_info: dict[str, Any], config: dict[str, Any]) -> tuple[str, str | None]:
    """(method name, card granularity) of a run: from run_info.json, else the registry's card."""
    credit = run_info.get("credit") or {}
    method = str(credit.get("method") or (config.get("credit") or {}).get("method") or "?")
    granularity = credit.get("granularity")
    if granularity is None:
        from mas.credit import get_credit

        try:
            card = get_credit(method).card
        except KeyError:  # a plugin method that is not installed here
            card = None
        granularity = card.granularity if card else None
    return method, granularity


@dataclass
class Decisive:
    """What carries the decisive badge in one episode."""

    turns: set[int] = field(default_factory=set)  # indices of the badged turns
    agents: set[str] = field(default_factory=set)  # agents marked decisive (agent-level credit)


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))


def _largest(values: dict[Any, float]) -> set:
    """Keys whose |value| is the largest, unless every value is the same or every key ties; a
    key whose value is 0 is never among them."""
    vals = list(values.values())
    if len(vals) < 2 or all(_same(v, vals[0]) for v in vals):
        return set()
    top = max(abs(v) for v in vals)
    keys = {k for k, v in values.items() if _same(abs(v), top) and not _same(v, 0.0)}
    return set() if len(keys) == len(values) else keys


def contribution(turn: dict[str, Any]) -> float:
    """What the decisive badge compares for one turn: the method's own measure of its
    contribution where the turn records one (``CONTRIBUTION_KEYS``), else its credit."""
    details = turn.get("details") if isinstance(turn.get("details"), dict) else {}
    for key in CONTRIBUTION_KEYS:
        if finite(details.get(key)):
            return float(details[key])
    return float(turn["credit"])


def decisive(turns: list[dict[str, Any]], level: str | None) -> Decisive:
    """The decisive turn(s) or agent(s) of an episode under credit ``level`` (see the module doc)."""
    counted = [i for i, t in enumerate(turns)
               if finite(t.get("credit")) and (t.get("details") or {}).get("trained") is not False]  # left out: no signal
    credit = {i: float(turns[i]["credit"]) for i in counted}
    if level in ("episode", "statistics") or all(_same(c, 0.0) for c in credit.values()):
        return Decisive()  # nothing to single out; credit 0 everywhere: nothing earned or lost
    value = {i: contribution(turns[i]) for i in counted}
    by_agent: dict[str, list[int]] = {}
    for i in counted:
        by_agent.setdefault(str(turns[i].get("agent")), []).append(i)
    if level is None:  # read the level from the credit itself
        level = "agent" if all(all(_same(credit[i], credit[ix[0]]) for i in ix) for ix in by_agent.values()) else "turn"
    if level == "agent":
        agents = _largest({a: statistics.fmean(value[i] for i in ix) for a, ix in by_agent.items()})
        agents = {a for a in agents if any(not _same(credit[i], 0.0) for i in by_agent[a])}  # its credit 0: not decisive
        return Decisive(turns={i for a in agents for i in by_agent[a] if not _same(credit[i], 0.0)}, agents=agents)
    return Decisive(turns={i for i in _largest(value) if not _same(credit[i], 0.0)})


def unparsed(turn: dict[str, Any]) -> bool:
    """The turn's output did not parse into its agent's format (a failed tool call is not this)."""
    return turn.get("valid", True) is False and not turn.get("tool_calls")


def positive_share(turns: list[dict[str, Any]], picked: list[int]) -> float | None:
    """The ``picked`` turns' summed positive credit over all turns' (None: no positive credit)."""
    pos = [max(float(t["credit"]), 0.0) if finite(t.get("credit")) else 0.0 for t in turns]
    total = sum(pos)
    return sum(pos[i] for i in picked) / total if total > 0 else None
