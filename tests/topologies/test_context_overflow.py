"""Prompts of custom-code teams against their model's positions, at run time (issue 54).

``mas validate``'s context check bounds what the built-in topologies render; a team that is code
(an AutoGen factory, a LangGraph graph, a team behind the OpenAI-compatible endpoint) renders
what its code decides, and a Swarm's transcript passed the embedded model's 2,048 positions
with nothing but transformers' warning, and garbage after it.  Now every generation of such a
team is fitted to its model (``mas.rollout.positions``): a reply whose budget would pass the
positions is cut to fit, and a prompt that fills them alone is named; both are counted as the
fault ``context_overflow``, with the agent, the prompt's length and the limit.

Each team below grows its transcript every call and never ends by itself (the cap on model
calls ends it); a first run without a limit records its prompts, and the limit of the second is
set between two of them.
"""

from __future__ import annotations

from typing import Annotated, TypedDict

import pytest
from langchain_core.messages import AnyMessage, HumanMessage
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from team_helpers import team_config
from test_engine import scripted_engine
from test_framework_limits import ENDLESS, TASKS, capped, guarded_rollout, hand_off

from mas.rollout.positions import fit_budget, model_positions
from mas.topologies.langgraph import MasChatModel

CALLS = 12  # the cap that ends the first (unlimited) run
BUDGET = 6  # every agent's max_new_tokens in team_config


class Chat(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    answer: str


def growing_graph() -> StateGraph:
    """One node that reads the whole conversation, replies and is asked to go on, forever."""
    model = MasChatModel(agent="lead")

    async def talk(state: Chat) -> dict:
        reply = await model.ainvoke(state["messages"])
        return {"messages": [reply, HumanMessage("go on")], "answer": reply.content}

    g = StateGraph(Chat)
    g.add_node("talk", talk)
    g.add_edge(START, "talk")
    g.add_edge("talk", "talk")
    return g


def growing_team(task: str, base_url: str, api_key: str) -> str:
    """A team written with the openai client that keeps the whole conversation and never stops."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "user", "content": task}]
    while True:
        reply = client.chat.completions.create(model="lead", messages=messages).choices[0].message.content
        messages += [{"role": "assistant", "content": reply or ""}, {"role": "user", "content": "go on"}]


def teams() -> dict[str, dict]:
    graph = team_config("m", "chain")
    graph["topology"] = {"kind": "langgraph", "builder": "test_context_overflow:growing_graph", "input_key": "messages",
                         "input_as": "messages", "recursion_limit": 1000}
    endpoint = team_config("m", "chain")
    endpoint["topology"] = {"kind": "openai", "entry": "test_context_overflow:growing_team"}
    return {"autogen_swarm": ENDLESS["swarm"], "langgraph": graph, "openai": endpoint}


def respond(req) -> str:
    return "ANSWER: 4, and on"


@pytest.mark.parametrize("kind", ["autogen_swarm", "langgraph", "openai"])
def test_a_custom_teams_reply_is_cut_to_its_models_positions_and_an_overflow_is_named(kind, tiny_tokenizer):
    if kind == "openai":
        pytest.importorskip("openai")
        pytest.importorskip("uvicorn")
    cfg = capped(teams()[kind], CALLS)
    reply = hand_off if kind == "autogen_swarm" else respond
    free, _ = scripted_engine(cfg, reply, tiny_tokenizer)
    assert free.positions == {"main": None, "judge": None}  # a tokenizer built in memory: no limit known
    (ep,) = guarded_rollout(free, TASKS[:1])
    prompts = [len(t.prompt_ids) for t in ep.turns]
    assert len(prompts) == CALLS and prompts[6] + BUDGET < prompts[-1], prompts  # the transcript grows
    limit = prompts[6] + 2  # turn 6 has room for 2 tokens; a later prompt fills the positions

    served = []

    def watched(req):
        served.append((req.agent, len(req.prompt_ids), req.max_new_tokens))
        return reply(req)

    engine, _ = scripted_engine(cfg, watched, tiny_tokenizer)
    engine.positions = {"main": limit, "judge": limit}
    (ep,) = guarded_rollout(engine, TASKS[:1])
    assert [n for _, n, _ in served] == prompts  # the same conversation (a script's replies ignore the budget)
    assert all(n + budget <= limit for _, n, budget in served if n < limit)  # no reply reaches past the positions
    assert [budget for _, n, budget in served if n < limit and n + BUDGET > limit] == [
        limit - n for n in prompts if n < limit < n + BUDGET] != []  # cut to fit, not refused
    over = [(a, n, budget) for a, n, budget in served if n >= limit]
    assert over and all(budget == BUDGET for _, _, budget in over)  # nothing fits: generated as before, and named
    faults, messages = engine.take_faults()
    assert faults["context_overflow"] == sum(n + BUDGET > limit for n in prompts)
    first = next(a for a, n, _ in served if n + BUDGET > limit)
    assert messages["context_overflow"].startswith(
        f"context overflow: agent {first!r}: its prompt of {next(n for n in prompts if n + BUDGET > limit)} tokens plus "
        f"max_new_tokens {BUDGET} passes the {limit} positions of policy ")
    assert "its reply was cut to" in messages["context_overflow"]
    assert ep.status == "error" and "model call limit" in ep.error  # ended by the cap, as without a limit


def test_a_built_in_topology_is_not_fitted_here(tiny_tokenizer):
    """The built-in topologies' prompts are bounded at validate (``mas.training.context_plan``)."""
    served = []

    def watched(req):
        served.append(req.max_new_tokens)
        return "ANSWER: 4"

    engine, _ = scripted_engine(team_config("m", "chain"), watched, tiny_tokenizer)
    engine.positions = {"main": 8, "judge": 8}
    engine.rollout(TASKS[:1], 1, seed=0)
    assert served and set(served) == {BUDGET} and engine.take_faults()[0]["context_overflow"] == 0


def test_the_budget_is_fitted_to_the_positions_by_hand():
    assert fit_budget("a", "p", 100, 28, None) == (28, None)  # no limit known
    assert fit_budget("a", "p", 100, 28, 128) == (28, None)  # 100 + 28 = 128 fits exactly
    budget, note = fit_budget("a", "p", 110, 28, 128)
    assert budget == 128 - 110 and note.startswith(
        "context overflow: agent 'a': its prompt of 110 tokens plus max_new_tokens 28 passes the 128 positions of policy 'p''s model: "
        "its reply was cut to 18 tokens")
    budget, note = fit_budget("a", "p", 128, 28, 128)
    assert budget == 28 and "its prompt of 128 tokens plus max_new_tokens 28 passes the 128 positions" in note
    assert "and the prompt alone fills them: the model reads past what it was trained on" in note


def test_the_positions_are_read_beside_the_tokenizer(tmp_path, tiny_tokenizer):
    from transformers import AutoTokenizer

    from mas.models.tiny import tiny_causal_lm

    tiny_causal_lm(tiny_tokenizer, hidden_size=16, num_layers=1, num_heads=2, max_positions=96).save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    assert model_positions(AutoTokenizer.from_pretrained(str(tmp_path))) == 96
    assert model_positions(tiny_tokenizer) is None
