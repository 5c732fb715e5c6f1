"""Topology behaviour with scripted agents: who is called, what each one sees, the answer."""

from __future__ import annotations

from team_helpers import TOPOLOGIES, team_config
from test_engine import scripted_engine

from mas.types import Task

TASK = [Task("t", "2+3", "5")]


def run(topology: str, respond, tokenizer, **topo_overrides):
    cfg = team_config("m", topology)
    cfg["topology"] = {**TOPOLOGIES[topology], **topo_overrides}
    engine, backend = scripted_engine(cfg, respond, tokenizer)
    return engine.rollout(TASK, 1, seed=0)[0].episodes[0], backend


# --- orchestrator -------------------------------------------------------------------------------


def test_orchestrator_delegates_reads_replies_and_answers(tiny_tokenizer):
    def respond(req):
        if req.agent == "lead":
            n = sum(m["role"] == "assistant" for m in req.messages)
            return ["CALL helper: 2+3", "CALL checker: is 2+3=5?", "ANSWER: 5"][n]
        return "ANSWER: 5" if req.agent == "helper" else "ACCEPT"

    ep, _ = run("orchestrator", respond, tiny_tokenizer, max_turns=6)
    assert [t.agent for t in ep.turns] == ["lead", "helper", "lead", "checker", "lead"]
    assert ep.turns[1].messages[-1]["content"] == "2+3"  # a specialist sees only its subtask
    assert ep.turns[3].parent == 2
    last = ep.turns[4].messages
    assert last[1]["content"] == "Task: 2+3" and {"role": "user", "content": "helper: ANSWER: 5"} in last
    assert ep.answer == "5" and ep.reward == 1.0 and ep.status == "ok"


def test_orchestrator_corrects_unknown_agents_and_truncates_at_max_turns(tiny_tokenizer):
    ep, backend = run("orchestrator", lambda req: "CALL nobody: x", tiny_tokenizer, max_turns=3)
    assert [t.agent for t in ep.turns] == ["lead"] * 3
    assert "Unknown agent 'nobody'" in ep.turns[1].messages[-1]["content"]
    assert ep.status == "truncated" and ep.answer is None and ep.reward == 0.0


# --- debate --------------------------------------------------------------------------------------


def test_debate_rounds_see_the_others_previous_answers_then_majority(tiny_tokenizer):
    answers = {"lead": "ANSWER: 5", "helper": "ANSWER: 6", "checker": "ANSWER: 5"}
    ep, backend = run("debate", lambda req: answers[req.agent], tiny_tokenizer, rounds=2)
    assert [t.agent for t in ep.turns] == ["lead", "helper", "checker"] * 2
    assert backend.calls == 2  # each round's three debaters run concurrently in one batch
    r2_helper = ep.turns[4].messages[-1]["content"]
    assert "- lead: ANSWER: 5" in r2_helper and "- checker: ANSWER: 5" in r2_helper and "- helper:" not in r2_helper
    assert "Other answers" not in ep.turns[0].messages[-1]["content"]
    assert ep.answer == "5"


def test_debate_with_an_aggregator(tiny_tokenizer):
    def respond(req):
        return "ANSWER: 9" if req.agent == "checker" else "ANSWER: 4"

    ep, _ = run("debate", respond, tiny_tokenizer, debaters=["lead", "helper"], rounds=1, aggregator="checker")
    assert [t.agent for t in ep.turns] == ["lead", "helper", "checker"]
    assert "- lead: ANSWER: 4" in ep.turns[2].messages[-1]["content"]
    assert ep.answer == "9"


# --- chain ----------------------------------------------------------------------------------------


def test_chain_loops_back_on_reject_at_most_max_loops(tiny_tokenizer):
    def respond(req):
        return {"lead": "ANSWER: 4", "helper": "ANSWER: 5", "checker": "REJECT"}[req.agent]

    ep, _ = run("chain", respond, tiny_tokenizer, max_loops=2)
    assert [t.agent for t in ep.turns] == ["lead", "helper", "checker"] * 3
    assert "checker: REJECT" in ep.turns[3].messages[-1]["content"]  # the re-run sees the rejection
    assert ep.answer == "5"  # the latest parsed answer (a verdict keeps the previous one)


def test_chain_stops_on_accept(tiny_tokenizer):
    def respond(req):
        return {"lead": "ANSWER: 5", "helper": "ANSWER: 5", "checker": "ACCEPT"}[req.agent]

    ep, _ = run("chain", respond, tiny_tokenizer, max_loops=2)
    assert len(ep.turns) == 3 and ep.reward == 1.0


# --- graph -----------------------------------------------------------------------------------------


def test_graph_routes_by_parsed_label(tiny_tokenizer):
    verdicts = iter(["REJECT", "ACCEPT"])

    def respond(req):
        return {"lead": "ANSWER: 4", "helper": "ANSWER: 5"}.get(req.agent) or next(verdicts)

    ep, _ = run("graph", respond, tiny_tokenizer)
    assert [t.agent for t in ep.turns] == ["lead", "checker", "helper", "checker"]
    assert ep.answer == "5" and ep.status == "ok"


def test_graph_cycle_is_cut_at_max_turns(tiny_tokenizer):
    ep, _ = run("graph", lambda req: "REJECT" if req.agent == "checker" else "ANSWER: 1", tiny_tokenizer, max_turns=4)
    assert len(ep.turns) == 4 and ep.status == "truncated"


def test_chain_loop_can_be_decided_by_a_verifier_in_the_middle(tiny_tokenizer):
    verdicts = iter(["REJECT", "ACCEPT"])

    def respond(req):
        return {"lead": "ANSWER: 4", "checker": "ANSWER: 5"}.get(req.agent) or next(verdicts)

    # solver (lead) -> verifier (helper, verdict parser) -> reviser (checker), loop on the verifier
    cfg = team_config("m", "chain")
    cfg["topology"] = {"kind": "chain", "sequence": ["lead", "helper", "checker"], "loop_to": "lead",
                       "verdict_from": "helper", "max_loops": 2}
    cfg["agents"][1]["parser"] = "verdict"
    engine, _ = scripted_engine(cfg, respond, tiny_tokenizer)
    ep = engine.rollout(TASK, 1, seed=0)[0].episodes[0]
    assert [t.agent for t in ep.turns] == ["lead", "helper", "checker"] * 2  # one loop, then ACCEPT ends it
    assert ep.answer == "5"


def test_debate_majority_counts_equal_numbers_as_one_answer(tiny_tokenizer):
    answers = {"lead": "ANSWER: 7", "helper": "ANSWER: $5.00", "checker": "ANSWER: 5"}
    ep, _ = run("debate", lambda req: answers[req.agent], tiny_tokenizer, rounds=1)
    assert ep.answer == "$5.00"  # the first of the two equal numbers, not the lone 7


def test_orchestrator_accepts_a_capitalised_specialist_name(tiny_tokenizer):
    def respond(req):
        if req.agent == "lead":
            return "ANSWER: 5" if len(req.messages) > 2 else "CALL Helper: 2+3"
        return "ANSWER: 5"

    ep, _ = run("orchestrator", respond, tiny_tokenizer)
    assert [t.agent for t in ep.turns] == ["lead", "helper", "lead"]
