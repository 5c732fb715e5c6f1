"""Tool use inside agent turns: the engine's tool loop, its records, its bound, replays and masks.

Scripted agents call the real HotpotQA tools (BM25 over the shipped sample).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from mas.agents.agent import build_agents
from mas.rollout.backends.scripted import ScriptedBackend
from mas.config.schema import ConfigError, validate_config
from mas.rollout.engine import Engine
from mas.rollout.script import MASK_TEXT
from mas.envs.research import HotpotQAConfig, HotpotQAEnv
from mas.topologies import build_topology
from mas.types import InterventionRequest, ReplayRequest, Task

TASK = Task("t0", "Which river flows through Paris?", "Seine", meta={"answers": ["Seine"], "supporting": []})
SEARCH = '<tool_call>{"name": "search", "arguments": {"query": "Shirley Temple Chief of Protocol", "k": 2}}</tool_call>'
READ = '<tool_call>{"name": "read", "arguments": {"title": "Shirley Temple"}}</tool_call>'


@pytest.fixture(scope="module")
def env():
    return HotpotQAEnv(HotpotQAConfig(name="hotpotqa"))


def research_config(topology: dict | None = None, max_tool_calls: int = 3) -> dict:
    return {
        "team": {"name": "research"},
        "policies": {"main": {"kind": "full", "model": "m", "device": "cpu"}},
        "agents": [
            {"name": "lead", "policy": "main", "role": "You lead.", "parser": "orchestrator"},
            {"name": "researcher", "policy": "main", "role": "You research.", "parser": "raw",
             "tools": ["search", "read"], "max_tool_calls": max_tool_calls},
            {"name": "answerer", "policy": "main", "role": "You answer.", "parser": "answer"},
        ],
        "topology": topology or {"kind": "orchestrator", "orchestrator": "lead", "specialists": ["researcher", "answerer"], "max_turns": 8},
        "env": {"name": "hotpotqa"},
        "credit": {"method": "grpo"},
    }


def engine_for(cfg: dict, respond, tokenizer, env) -> Engine:
    run = validate_config(cfg)
    backend = ScriptedBackend(respond, {p: tokenizer for p in run.policies})
    return Engine(build_topology(run.topology), build_agents(run.agents, run.team.name, env.tools),
                  {p: tokenizer for p in run.policies}, {p: True for p in run.policies}, backend, env.score, tools=env.tools)


def rounds(req) -> int:
    """Tool rounds the researcher has had in this invocation (assistant messages so far)."""
    return sum(m["role"] == "assistant" for m in req.messages)


def lead_then_answer(req) -> str:
    return "ANSWER: Seine" if rounds(req) else "CALL researcher: find the river"


def scripted(researcher):
    return lambda req: researcher(req) if req.agent == "researcher" else lead_then_answer(req)


class Executions:
    """Names of the tool executions, appended to a file by the tool workers (tools run in
    worker processes, so a list in this process would never see them)."""

    def __init__(self, path):
        self.path = path
        path.write_text("")

    def __eq__(self, other) -> bool:
        return self.path.read_text().split() == other

    def __repr__(self) -> str:
        return repr(self.path.read_text().split())


def counting(engine: Engine, tmp_path) -> Executions:
    """Wrap the engine's tools so every execution is recorded."""
    ran = Executions(tmp_path / "executions.txt")

    def record(name: str, fn, **kw):
        with ran.path.open("a") as f:
            f.write(name + "\n")
        return fn(**kw)

    for name, spec in list(engine.tools.items()):
        engine.tools[name] = dataclasses.replace(spec, fn=lambda _f=spec.fn, _n=name, **kw: record(_n, _f, **kw))
    return ran


def test_tool_calls_are_recorded_with_observations_and_the_agent_is_called_again(tiny_tokenizer, env):
    engine = engine_for(research_config(), scripted(lambda r: [SEARCH, READ, "The Seine."][rounds(r)]), tiny_tokenizer, env)
    ep = engine.rollout([TASK], 1, seed=0)[0].episodes[0]
    assert ep.status == "ok", ep.error
    assert [t.agent for t in ep.turns] == ["lead", "researcher", "researcher", "researcher", "lead"]
    assert [t.parent for t in ep.turns] == [None, 0, 1, 2, None]
    search, read, report = ep.turns[1:4]
    assert search.tool_calls == [{"name": "search", "arguments": {"query": "Shirley Temple Chief of Protocol", "k": 2},
                                  "valid": True, "error": None}]
    assert search.observations[0].startswith('search("Shirley Temple Chief of Protocol", k=2): 2 result(s)\n1. Shirley Temple: ')
    assert read.observations == [env.tools["read"].fn(title="Shirley Temple")]
    assert search.parsed == {"label": "tool", "tool_calls": 1} and search.valid
    assert search.extra_rewards == {"tool_valid": 1.0} and read.extra_rewards == {"tool_valid": 1.0}
    # the next generation sees the call and its observation; the last one the remaining budget
    assert read.messages[-2] == {"role": "assistant", "content": SEARCH}
    assert read.messages[-1]["content"] == f"<tool_response>\n{search.observations[0]}\n</tool_response>\n(tool calls left: 2)"
    assert report.tool_calls == [] and report.parsed["answer"] == "The Seine." and "tool_valid" not in report.extra_rewards
    # the orchestrator gets the report only, and the tools prompt is in the researcher's system message
    assert ep.turns[4].messages[-1]["content"] == "researcher: The Seine."
    assert 'write <tool_call>, one JSON object' in search.messages[0]["content"]
    assert ep.answer == "Seine" and ep.reward == 1.0 and ep.info["scores"] == {"em": 1.0, "f1": 1.0}
    json.dumps(ep.to_dict())  # records stay JSON-serialisable (episodes.jsonl)


def test_malformed_tool_call_gives_an_observation_saying_what_was_wrong(tiny_tokenizer, env):
    bad = '<tool_call>{"name": "search", "arguments": {"query": "Paris"</tool_call>'
    engine = engine_for(research_config(), scripted(lambda r: [bad, "I found nothing."][rounds(r)]), tiny_tokenizer, env)
    ep = engine.rollout([TASK], 1, seed=0)[0].episodes[0]
    assert ep.status == "ok"
    turn = ep.turns[1]
    assert not turn.valid and turn.extra_rewards == {"tool_valid": 0.0}
    assert turn.tool_calls[0]["valid"] is False and "not valid JSON" in turn.tool_calls[0]["error"]
    assert turn.observations[0].startswith("error: the tool call is not valid JSON")
    assert "not valid JSON" in ep.turns[2].messages[-1]["content"]  # the agent is told, then replies


def test_tool_calls_stop_at_the_bound_and_the_last_generation_must_reply(tiny_tokenizer, env, tmp_path):
    two = SEARCH + "\n" + READ
    engine = engine_for(research_config(max_tool_calls=3), scripted(lambda r: two), tiny_tokenizer, env)
    ran = counting(engine, tmp_path)
    ep = engine.rollout([TASK], 1, seed=0)[0].episodes[0]
    turns = [t for t in ep.turns if t.agent == "researcher"]
    assert len(turns) == 3  # 2 calls, then 1 call run + 1 over the bound, then the final generation
    assert ran == ["search", "read", "search"]
    assert turns[1].tool_calls[1]["error"].startswith("the limit of 3 tool calls") and turns[1].observations[1].startswith("not run")
    assert turns[1].extra_rewards["tool_valid"] == 0.5
    last = turns[2]
    assert "You have used all your tool calls" in last.messages[-1]["content"]
    assert last.parsed["label"] == "answer" and all(not c["valid"] for c in last.tool_calls)  # recorded, not run
    assert ep.turns[-1].agent == "lead" and ep.status == "ok"


def test_an_agent_without_tools_never_runs_one(tiny_tokenizer, env, tmp_path):
    def respond(req):
        return SEARCH if req.agent == "answerer" else ("ANSWER: x" if rounds(req) else "CALL answerer: q")

    engine = engine_for(research_config(), respond, tiny_tokenizer, env)
    ran = counting(engine, tmp_path)
    ep = engine.rollout([TASK], 1, seed=0)[0].episodes[0]
    assert ran == [] and ep.turns[1].tool_calls == [] and [t.agent for t in ep.turns] == ["lead", "answerer", "lead"]


def test_replay_reuses_recorded_observations_and_never_reruns_the_tools(tiny_tokenizer, env, tmp_path):
    engine = engine_for(research_config(), scripted(lambda r: [SEARCH, READ, "The Seine."][rounds(r)]), tiny_tokenizer, env)
    src = engine.rollout([TASK], 1, seed=0)[0].episodes[0]
    ran = counting(engine, tmp_path)
    for name, spec in engine.tools.items():  # the tools now answer differently: a replay must not notice
        engine.tools[name] = dataclasses.replace(spec, fn=lambda **kw: "CHANGED")
    out = engine.execute([ReplayRequest("r", src, freeze_upto=3)], seed=1)["r"][0]
    assert out.status == "ok", out.error
    assert ran == []
    for t, s in zip(out.turns[:3], src.turns[:3]):
        assert t.replayed and t.tool_calls == s.tool_calls and t.observations == s.observations
    fresh = out.turns[3]  # sampled afresh, from a prompt built on the recorded observations
    assert not fresh.replayed and fresh.prompt_ids == src.turns[3].prompt_ids
    assert "CHANGED" not in json.dumps(fresh.messages)
    # a replay frozen only up to the first tool turn samples the next one, whose tools do run
    out = engine.execute([ReplayRequest("r1", src, freeze_upto=2)], seed=1)["r1"][0]
    assert out.turns[2].observations == ["CHANGED"] and not out.turns[2].replayed


def test_masking_a_tool_using_agent_keeps_the_other_turns_at_their_positions(tiny_tokenizer, env):
    engine = engine_for(research_config(), scripted(lambda r: [SEARCH, READ, "The Seine."][rounds(r)]), tiny_tokenizer, env)
    src = engine.rollout([TASK], 1, seed=0)[0].episodes[0]
    masked = engine.execute([InterventionRequest("m", src, agents=("researcher",))], seed=0)["m"][0]
    assert [t.finish_reason for t in masked.turns[1:4]] == ["removed", "removed", "masked"]
    assert masked.turns[3].text == MASK_TEXT and all(t.tool_calls == [] for t in masked.turns[1:4])
    assert masked.turns[4].agent == "lead" and masked.turns[4].replayed  # kept: same position as recorded
    removed = engine.execute([InterventionRequest("x", src, agents=("researcher",), mode="remove")], seed=0)["x"][0]
    assert [t.finish_reason for t in removed.turns[1:4]] == ["removed"] * 3
    assert removed.turns[4].replayed and removed.turns[4].index == 4


def test_chain_transcripts_show_tool_results_to_the_next_agent(tiny_tokenizer, env):
    cfg = research_config({"kind": "chain", "sequence": ["researcher", "answerer"]})
    cfg["agents"] = cfg["agents"][1:]  # no lead in a chain (an unused agent is a config error)

    def respond(req):
        if req.agent == "researcher":
            return [READ, "Shirley Temple was Chief of Protocol."][rounds(req)]
        return "ANSWER: Chief of Protocol"

    engine = engine_for(cfg, respond, tiny_tokenizer, env)
    ep = engine.rollout([TASK], 1, seed=0)[0].episodes[0]
    seen = ep.turns[-1].messages[-1]["content"]
    assert f"researcher: {READ}\n<tool_response>\nShirley Temple: Shirley Temple Black" in seen
    assert "researcher: Shirley Temple was Chief of Protocol." in seen


def test_tools_must_be_offered_by_the_env():
    cfg = research_config()
    cfg["agents"][1]["tools"] = ["search", "browse", "search"]
    with pytest.raises(ConfigError) as e:
        validate_config(cfg)
    msg = str(e.value)
    assert "agents[1].tools[1]: env 'hotpotqa' offers no such tool; valid: ['search', 'read'] (found 'browse')" in msg
    assert "agents[1].tools[2]: listed twice (found 'search')" in msg
    cfg = research_config()
    cfg["env"] = {"name": "gsm8k"}
    with pytest.raises(ConfigError, match=r"agents\[1\].tools\[0\]: env 'gsm8k' offers no tools"):
        validate_config(cfg)


def test_an_engine_without_the_named_tools_refuses_to_start(tiny_tokenizer, env):
    run = validate_config(research_config())
    agents = build_agents(run.agents, run.team.name, env.tools)
    with pytest.raises(ValueError, match="does not offer"):
        Engine(build_topology(run.topology), agents, {"main": tiny_tokenizer}, {"main": True},
               ScriptedBackend(lambda r: "", {"main": tiny_tokenizer}), env.score, tools={})
    with pytest.raises(ValueError, match="offers no tool"):
        build_agents(run.agents, run.team.name, {})


def test_a_rendered_call_is_what_the_parser_reads_back_with_its_text_literal():
    """``tool_call_text`` is the one renderer (teachers, framework adapters, prompt examples):
    the parser gets the name and arguments back, and a non-ASCII title stays as it reads."""
    from mas.tools import parse_tool_calls, tool_call_text

    text = tool_call_text("read", {"title": "Émile Zola", "k": 2})
    assert text == '<tool_call>{"name": "read", "arguments": {"title": "Émile Zola", "k": 2}}</tool_call>'
    (call,) = parse_tool_calls(text)
    assert (call.name, call.arguments, call.error) == ("read", {"title": "Émile Zola", "k": 2}, None)


def test_a_forced_start_forces_the_first_generation_of_a_call_not_its_tool_rounds(tiny_tokenizer, env):
    from mas.types import Outcome

    start = '<tool_call>{"name": "search", "arguments": '
    forced = []

    class Forced:  # a team whose code asks the researcher for a search call (as a request's tool_choice does)
        async def run(self, ctx):
            turn = await ctx.call("researcher", [{"role": "user", "content": ctx.task.prompt}], prefix=start)
            return Outcome(answer=turn.text)

    def researcher(req):
        forced.append(req.prefix)
        return SEARCH if rounds(req) == 0 else "The Seine."

    engine = engine_for(research_config(), scripted(researcher), tiny_tokenizer, env)
    engine.topology = Forced()
    ep = engine.rollout([TASK], 1, seed=0)[0].episodes[0]
    assert ep.status == "ok", ep.error
    assert forced == [start, ""]  # the tool round after the call is the agent's own
    call, report = ep.turns
    ids = tiny_tokenizer(start, add_special_tokens=False)["input_ids"]
    assert call.prompt_ids[-len(ids):] == ids and call.text == SEARCH and call.tool_calls[0]["valid"]
    assert call.completion_ids == tiny_tokenizer(SEARCH[len(start):], add_special_tokens=False)["input_ids"] + [
        tiny_tokenizer.eos_token_id]  # only what followed the start is the model's to learn
    assert report.text == "The Seine." and report.messages[-2] == {"role": "assistant", "content": SEARCH}
