"""kind: autogen: real AutoGen AgentChat teams (YAML or a factory) whose model calls are mas turns.

Scripted agents (``ScriptedBackend``) where a test needs exact replies (tool calls, handoffs);
the embedded model where the team trains (round robin with GRPO and SHARP).
"""

from __future__ import annotations

import copy
import math
import random

import pytest
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination, TextMentionTermination
from autogen_agentchat.teams import RoundRobinGroupChat, SelectorGroupChat
from autogen_core.tools import FunctionTool
from team_helpers import team_config
from test_engine import scripted_engine

from mas.config.checks import meaning_errors
from mas.config.schema import ConfigError, validate_config
from mas.credit.registry import plan_credit
from mas.rollout.script import MASK_TEXT
from mas.training.team import build_team
from mas.topologies.autogen_client import MasModelClient, NotInEpisodeError
from mas.types import InterventionRequest, ReplayRequest, Task

TASKS = [Task("t0", "2+3", "5"), Task("t1", "4+4", "8")]
ADDS: list[tuple[int, int]] = []  # calls the FunctionTool below actually ran


def add(a: int, b: int) -> int:
    """Add two integers."""
    ADDS.append((a, b))
    return a + b


def tool_team(clients):
    """A factory as a user writes it: a calculator with a FunctionTool, then a checker."""
    calc = AssistantAgent("lead", clients["lead"], tools=[FunctionTool(add, description="Add two integers.")],
                          system_message="You solve with the add tool.", reflect_on_tool_use=True)
    check = AssistantAgent("checker", clients["checker"], system_message="You check.")
    return RoundRobinGroupChat([calc, check], termination_condition=TextMentionTermination("ACCEPT") | MaxMessageTermination(6))


def forced_team(clients):
    """tool_team, its calculator's client asked for a call whenever tools are offered (tool_choice='required')."""
    client = clients["lead"]
    create = client.create

    async def required(messages, **kw):
        if kw.get("tools") and kw.get("tool_choice", "auto") == "auto":
            kw["tool_choice"] = "required"
        return await create(messages, **kw)

    client.create = required
    return tool_team(clients)


def random_team(clients):
    """Routes on a random number, not on the messages: not replayable."""
    a = AssistantAgent("lead", clients["lead"], system_message="You solve.")
    b = AssistantAgent("helper", clients["helper"], system_message="You help.")
    return SelectorGroupChat([a, b], clients["checker"], selector_func=lambda thread: random.choice(["lead", "helper"]),
                             termination_condition=MaxMessageTermination(2))


def autogen_config(model: str = "m", **topology) -> dict:
    cfg = team_config(model, "chain")
    cfg["topology"] = {"kind": "autogen", **topology}
    return cfg


def tool_respond(req):
    if req.agent == "lead":
        if "<tool_response>" in req.messages[-1]["content"]:
            return "ANSWER: 5"
        return 'I add. <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    return "ACCEPT"


# --- factory teams ---------------------------------------------------------------------------------


def test_a_factory_teams_function_tool_call_and_its_observation_are_on_the_turn(tiny_tokenizer):
    ADDS.clear()
    engine, backend = scripted_engine(autogen_config(factory="test_autogen:tool_team"), tool_respond, tiny_tokenizer)
    ep = engine.rollout(TASKS[:1], 1, seed=0)[0].episodes[0]
    assert ep.status == "ok", ep.error
    assert [t.agent for t in ep.turns] == ["lead", "lead", "checker"] and ADDS == [(2, 3)]
    call, reply, check = ep.turns
    assert call.tool_calls == [{"id": "call_0_0", "name": "add", "arguments": {"a": 2, "b": 3}, "valid": True, "error": None}]
    assert call.observations == ["5"] and call.extra_rewards["tool_valid"] == 1.0 and call.parsed["label"] == "tool"
    assert "add(a: int, b: int): Add two integers." in call.messages[0]["content"]  # the tool is described
    assert reply.parent == call.index and reply.messages[-1]["content"] == "<tool_response>\n5\n</tool_response>"
    assert reply.messages[-2] == {"role": "assistant", "content": call.text}  # the model's own words, call included
    assert check.messages[-1]["content"] == "2+3\nlead: ANSWER: 5" and ep.answer == "5" and ep.reward == 1.0


def test_a_required_tool_choice_forces_the_start_of_the_call(tiny_tokenizer):
    from mas.topologies.autogen_client import _openai_choice

    starts = []

    def respond(req):
        starts.append((req.agent, req.prefix))
        return tool_respond(req)[len("I add. "):] if req.prefix else tool_respond(req)

    ADDS.clear()
    engine, _ = scripted_engine(autogen_config(factory="test_autogen:forced_team"), respond, tiny_tokenizer)
    ep = engine.rollout(TASKS[:1], 1, seed=0)[0].episodes[0]
    assert ep.status == "ok", ep.error
    start = '<tool_call>{"name": "add", "arguments": '  # the one tool: its call, up to the arguments
    assert starts == [("lead", start), ("lead", ""), ("checker", "")] and ADDS == [(2, 3)]  # the reflection: tool_choice none
    call = ep.turns[0]
    assert call.text.startswith(start) and call.tool_calls[0]["valid"]
    assert call.prompt_ids[-len(tiny_tokenizer(start, add_special_tokens=False)["input_ids"]):] == \
        tiny_tokenizer(start, add_special_tokens=False)["input_ids"]
    mul = FunctionTool(add, name="mul", description="Another tool.")
    assert _openai_choice(mul, ["add", "mul"]) == {"type": "function", "function": {"name": "mul"}}
    assert _openai_choice("required", ["add"]) == "required"
    with pytest.raises(ValueError, match="not among the tools of the call"):
        _openai_choice(mul, ["add"])


def test_a_malformed_tool_call_is_recorded_invalid_and_the_reply_stands(tiny_tokenizer):
    def respond(req):
        return "<tool_call>{not json}</tool_call> ANSWER: 5" if req.agent == "lead" else "ACCEPT"

    engine, _ = scripted_engine(autogen_config(factory="test_autogen:tool_team"), respond, tiny_tokenizer)
    ep = engine.rollout(TASKS[:1], 1, seed=0)[0].episodes[0]
    call = ep.turns[0]
    assert [t.agent for t in ep.turns] == ["lead", "checker"]
    assert not call.tool_calls[0]["valid"] and "not valid JSON" in call.tool_calls[0]["error"]
    assert call.extra_rewards["tool_valid"] == 0.0 and ep.answer == "5"


def test_factory_replays_reuse_recorded_turns_and_masks_keep_positions(tiny_tokenizer):
    engine, backend = scripted_engine(autogen_config(factory="test_autogen:tool_team"), tool_respond, tiny_tokenizer)
    src = engine.rollout(TASKS[:1], 1, seed=0)[0].episodes[0]
    n = backend.requests
    replay = engine.execute([ReplayRequest("r", src, freeze_upto=3)], seed=1)["r"][0]
    assert backend.requests == n  # every turn came from the record
    assert all(t.replayed and t.completion_ids == s.completion_ids for t, s in zip(replay.turns, src.turns))
    assert replay.turns[0].observations == ["5"] and replay.status == "ok"
    masked = engine.execute([InterventionRequest("m", src, agents=("lead",))], seed=1)["m"][0]
    assert [t.finish_reason for t in masked.turns[:2]] == ["removed", "masked"] and masked.turns[1].text == MASK_TEXT
    assert masked.turns[2].agent == "checker" and masked.turns[2].replayed  # the checker's turn keeps its position


def test_a_team_routing_on_a_random_number_gets_replay_divergence_naming_the_agent(tiny_tokenizer):
    engine, _ = scripted_engine(autogen_config(factory="test_autogen:random_team"), lambda req: "ANSWER: 5", tiny_tokenizer)
    random.seed(0)
    episodes = engine.rollout(TASKS[:1], 8, seed=0)[0].episodes
    random.seed(1)
    out = engine.execute([ReplayRequest(f"r{i}", ep, freeze_upto=1) for i, ep in enumerate(episodes)], seed=0)
    failed = [(ep, out[f"r{i}"][0]) for i, ep in enumerate(episodes) if out[f"r{i}"][0].status == "error"]
    assert failed, "a random router diverges on some replay"
    for src, ep in failed:  # the engine's own error, not AutoGen's wrapper, naming agent and turn
        other = {"lead": "helper", "helper": "lead"}[src.turns[0].agent]
        assert ep.error.startswith("ReplayDivergence: turn 0: the team asked for agent") and repr(other) in ep.error


def test_the_factory_receives_a_client_per_agent_and_clients_need_an_episode():
    import asyncio

    from autogen_core.models import UserMessage

    seen = {}

    def factory(clients):
        seen.update(clients)
        return tool_team(clients)

    from mas.topologies.autogen import ClientMap, make_team

    make_team(factory, ClientMap({n: MasModelClient(None, n) for n in ("lead", "checker")}))
    assert set(seen) == {"lead", "checker"} and seen["lead"].model_info["function_calling"]
    with pytest.raises(NotInEpisodeError, match="outside a mas episode"):
        asyncio.run(seen["lead"].create([UserMessage(content="hi", source="user")]))
    with pytest.raises(KeyError, match=r"no mas agent 'solver'; the team's agents are \['checker', 'lead'\]"):
        ClientMap(seen)["solver"]


# --- YAML teams ------------------------------------------------------------------------------------


def test_a_yaml_selector_team_records_the_selectors_calls_as_its_own_agent(tiny_tokenizer):
    cfg = autogen_config(team="selector", participants=["lead", "helper"], selector="checker",
                         termination={"text": "ANSWER", "max_messages": 4})

    def respond(req):
        if req.agent == "checker":
            assert "Read the following conversation" in req.messages[-1]["content"]  # AutoGen's selector prompt
            return "helper"
        return "ANSWER: 5"

    engine, _ = scripted_engine(cfg, respond, tiny_tokenizer)
    ep = engine.rollout(TASKS[:1], 1, seed=0)[0].episodes[0]
    assert [t.agent for t in ep.turns] == ["checker", "helper"] and ep.answer == "5" and ep.status == "ok"
    assert ep.turns[0].policy == "judge" and ep.turns[0].messages[0] == {"role": "system", "content": "You check."}


def test_a_yaml_swarm_hands_off_with_a_recorded_tool_call(tiny_tokenizer):
    cfg = autogen_config(team="swarm", participants=["lead", "checker"], handoffs={"lead": ["checker"]},
                         termination={"text": "ACCEPT", "max_messages": 6})

    def respond(req):
        if req.agent == "lead":
            return 'ANSWER: 5 <tool_call>{"name": "transfer_to_checker", "arguments": {}}</tool_call>'
        assert "lead: ANSWER: 5" in req.messages[-1]["content"]  # the handed-over context reads as the lead's
        return "ACCEPT"

    engine, _ = scripted_engine(cfg, respond, tiny_tokenizer)
    ep = engine.rollout(TASKS[:1], 1, seed=0)[0].episodes[0]
    assert [t.agent for t in ep.turns] == ["lead", "checker"] and ep.status == "ok" and ep.answer == "5"
    assert ep.turns[0].tool_calls[0]["name"] == "transfer_to_checker" and ep.turns[0].tool_calls[0]["valid"]


def test_a_yaml_team_without_its_text_mention_is_truncated(tiny_tokenizer):
    cfg = autogen_config(team="round_robin", participants=["lead", "checker"], termination={"text": "ACCEPT", "max_messages": 5})
    engine, _ = scripted_engine(cfg, lambda req: "REJECT" if req.agent == "checker" else "ANSWER: 4", tiny_tokenizer)
    ep = engine.rollout(TASKS[:1], 1, seed=0)[0].episodes[0]
    assert [t.agent for t in ep.turns] == ["lead", "checker"] * 2 and ep.status == "truncated"


@pytest.mark.parametrize("topology,path,needle", [
    ({"team": "round_robin", "factory": "x.y:z"}, "topology", "exactly one of team"),
    ({"factory": "test_autogen:no_such_thing"}, "topology.factory", "has no attribute 'no_such_thing'"),
    ({"factory": "no_such_pkg.teams:build"}, "topology.factory", "no module named 'no_such_pkg'"),
    ({"factory": "test_autogen:add"}, "topology.factory", "the factory raised"),
    ({"factory": "test_autogen:tool_team", "termination": {"max_messages": 3}}, "topology.termination", "only for team"),
    ({"team": "round_robin", "participants": ["lead", "ghost"], "termination": {"max_messages": 3}},
     "topology.participants[1]", "unknown agent"),
    ({"team": "selector", "termination": {"max_messages": 3}}, "topology.selector", "needs the agent that picks"),
    ({"team": "round_robin"}, "topology.termination", "needs a termination"),
    ({"team": "round_robin", "termination": {}}, "topology.termination", "give text, max_messages or both"),
    ({"team": "round_robin", "handoffs": {"lead": ["helper"]}, "termination": {"max_messages": 3}}, "topology.handoffs",
     "only for team: swarm"),
])
def test_autogen_config_errors_name_the_yaml_path(topology, path, needle):
    with pytest.raises(ConfigError) as info:
        validate_config(autogen_config(**topology), check=meaning_errors)
    assert any(line.startswith(path + ":") and needle in line for line in info.value.lines), info.value.lines


def test_autogen_agent_names_must_be_identifiers():
    cfg = autogen_config(team="round_robin", termination={"max_messages": 3})
    cfg["agents"][1]["name"] = "my-helper"
    with pytest.raises(ConfigError, match=r"agents\[1\].name: AutoGen agent names must be Python identifiers"):
        validate_config(cfg, check=meaning_errors)


# --- the embedded model: concurrent episodes, training with GRPO and SHARP ---------------------------


def solver_verifier(credit: str) -> dict:
    """Round robin solver -> verifier on synthetic math, each agent on its own embedded policy."""
    policy = {"kind": "full", "model": "embedded", "device": "cpu", "optim": {"lr": 1e-3, "micro_batch_size": 16}}
    return {
        "team": {"name": "autogen-rr"},
        "policies": {"solve": dict(policy), "verify": dict(policy)},
        "agents": [
            {"name": "solver", "policy": "solve", "role": "You are the adder.", "parser": "answer", "sampling": {"max_new_tokens": 8}},
            {"name": "verifier", "policy": "verify", "role": "You are the subtractor.", "parser": "verdict",
             "sampling": {"max_new_tokens": 6}},
        ],
        "topology": {"kind": "autogen", "team": "round_robin", "termination": {"max_messages": 3}},
        "env": {"name": "synthetic_math", "num_ops": 1, "seed": 0},
        "credit": {"method": credit, **({"marginal": "exact"} if credit == "sharp" else {})},
        "trainer": {"steps": 2, "batch_size": 2, "group_size": 2, "eval_size": 0, "sample_episodes": 1},
        "logging": {"progress": False},
    }


@pytest.fixture(scope="module")
def rr_team():
    return build_team(validate_config(solver_verifier("sharp")))


def test_round_robin_rollouts_record_turns_per_agent_batched_and_seeded(rr_team):
    sizes: list[int] = []
    generate = rr_team.backend.generate_batch
    rr_team.backend.generate_batch = lambda reqs, seed=None: (sizes.append(len(reqs)), generate(reqs, seed))[1]
    tasks = rr_team.env.sample_tasks(3)
    runs = []
    for _ in range(2):
        sizes.clear()
        groups = rr_team.engine.rollout(tasks, 4, seed=3)
        runs.append(([[(t.agent, t.policy, t.completion_ids) for t in ep.turns] for g in groups for ep in g.episodes], list(sizes)))
    rr_team.backend.generate_batch = generate
    assert runs[0] == runs[1]  # same seed, same batches, same tokens
    assert runs[0][1] == [12, 12]  # 12 concurrent episodes: one batch per speaker
    for turns in runs[0][0]:
        assert [(a, p) for a, p, _ in turns] == [("solver", "solve"), ("verifier", "verify")]


def test_sharp_coalitions_reuse_the_recorded_turns_token_for_token(rr_team):
    groups = rr_team.engine.rollout(rr_team.env.sample_tasks(2), 2, seed=4)
    # exclude nobody: both agents are players, so no agent is re-sampled and every unmasked turn is kept
    requests = plan_credit(groups, rr_team.cfg.credit.model_copy(update={"exclude": ()}))
    assert requests and all(isinstance(r, InterventionRequest) for r in requests)
    results = rr_team.engine.execute(requests, seed=5)
    kept = 0
    for req in requests:
        ep = results[req.key][0]
        assert ep.status != "error", ep.error
        for turn, src in zip(ep.turns, req.source.turns):
            if turn.agent in req.agents:
                assert turn.text == MASK_TEXT and turn.finish_reason == "masked"
            else:  # frozen: the recorded response, token for token
                assert turn.replayed and not turn.trainable
                assert turn.completion_ids == src.completion_ids and turn.logprobs == src.logprobs
                kept += 1
    assert kept >= len(requests) // 2


@pytest.mark.parametrize("credit", ["grpo", "sharp"])
def test_round_robin_team_trains_two_steps(credit, tmp_path):
    from mas.training.trainer import train

    cfg = solver_verifier(credit)
    cfg["trainer"].update(batch_size=4, group_size=4)  # enough episodes that some group's rewards differ in both steps
    team = build_team(validate_config(cfg))
    before = {n: copy.deepcopy(p.model.state_dict()) for n, p in team.policies.items()}
    rows = []
    train(team, tmp_path / "run", callbacks=[type("Rec", (), {"on_step_end": lambda self, s, m, g, c: rows.append(m)})()])
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        for name in ("solve", "verify"):
            assert math.isfinite(r["policies"][name]["loss"]) and r["policies"][name]["samples"] > 0
    if credit == "sharp":
        assert all(r["credit_cost"]["interventions"] > 0 for r in rows)
    for name, p in team.policies.items():
        assert any(not v.equal(before[name][k]) for k, v in p.model.state_dict().items()), name


def test_a_yaml_agents_env_tools_run_as_autogen_tools_and_are_recorded(tiny_tokenizer):
    from test_engine_tools import SEARCH, engine_for, research_config

    from mas.envs.research import HotpotQAConfig, HotpotQAEnv

    env = HotpotQAEnv(HotpotQAConfig(name="hotpotqa"))
    cfg = research_config({"kind": "autogen", "team": "round_robin", "participants": ["researcher", "answerer"],
                           "termination": {"max_messages": 3}})

    def respond(req):
        if req.agent == "researcher":
            return "Shirley Temple." if "<tool_response>" in req.messages[-1]["content"] else SEARCH
        return "ANSWER: Shirley Temple"

    engine = engine_for(cfg, respond, tiny_tokenizer, env)
    ep = engine.rollout([Task("q", "Who was Chief of Protocol?", "Shirley Temple", meta={"answers": ["Shirley Temple"]})], 1,
                        seed=0)[0].episodes[0]
    assert ep.status == "ok", ep.error
    assert [t.agent for t in ep.turns] == ["researcher", "researcher", "answerer"]
    call = ep.turns[0]
    assert call.tool_calls[0]["name"] == "search" and call.tool_calls[0]["valid"]
    assert "Shirley Temple" in call.observations[0] and call.extra_rewards["tool_valid"] == 1.0
    assert call.messages[0]["content"].count("You can call these tools") == 1  # described once, by the role
    assert ep.turns[1].parent == call.index and ep.answer == "Shirley Temple"


def test_autogen_warnings_do_not_print_between_the_progress_lines():
    """AutoGen's selector fallback warning (one per episode where the selector names nobody) is
    counted as the selector's parse failure; with logging unconfigured it must not reach stderr,
    and a configured root handler must still get it."""
    import subprocess
    import sys

    code = ("import logging, mas.topologies.autogen; "
            "logging.getLogger('autogen_agentchat').warning('Model failed to select a speaker')")
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert quiet.stderr == ""
    configured = subprocess.run([sys.executable, "-c", "import logging; logging.basicConfig(); " + code],
                                capture_output=True, text=True, check=True)
    assert "Model failed to select a speaker" in configured.stderr
