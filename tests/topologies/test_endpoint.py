"""kind: openai: a team written with the plain `openai` client, run against the endpoint mas serves
(mas/rollout/endpoint.py); the real client against the real server, token in and token out."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from endpoint_helpers import RECEIVED, received
from team_helpers import team_config
from test_engine import scripted_engine

from mas.agents.prompts import render_prompt
from mas.config.schema import validate_config
from mas.credit import build_credit_batch, run_credit
from mas.tools import parse_tool_calls
from mas.training.team import build_team
from mas.training.trainer import training_batches
from mas.types import ReplayRequest, Task

REPO = Path(__file__).parents[2]
pytest.importorskip("openai")
pytest.importorskip("uvicorn")


def endpoint_config(model_dir, entry: str, **topology) -> dict:
    cfg = team_config(model_dir, "chain")
    cfg["topology"] = {"kind": "openai", "entry": f"endpoint_helpers:{entry}", **topology}
    for a in cfg["agents"]:
        a["sampling"].update(temperature=1.0, top_p=1.0, top_k=0)
    return cfg


def task_of(req) -> str:
    """The task a request poses (the first line of its first user message)."""
    return next(m["content"] for m in req.messages if m["role"] == "user").splitlines()[0]


def scripted_reply(req) -> str:
    if req.agent == "checker":
        last = req.messages[-1]["content"]
        if "<tool_response>" in last:
            return "ANSWER: 5\nACCEPT"
        return '<tool_call>{"name": "lookup", "arguments": {"q": "x"}}</tool_call>'
    return f"ANSWER: {task_of(req)}"


# --- the protocol, with the real client ----------------------------------------------------------------


def test_the_openai_client_gets_choices_streams_and_tool_calls_and_each_is_a_recorded_turn(tiny_tokenizer):
    engine, backend = scripted_engine(endpoint_config("m", "protocol_team"), scripted_reply, tiny_tokenizer)
    groups = engine.rollout([Task("t0", "2+3", "5"), Task("t1", "4+4", "8")], group_size=2, seed=0)
    for ep in (e for g in groups for e in g.episodes):
        assert ep.status == "ok", ep.error
        got = RECEIVED.pop(ep.answer)  # the team returned its base_url: what its client received
        assert [t.agent for t in ep.turns] == ["lead", "lead", "helper", "checker", "checker"]
        for turn, reply in zip(ep.turns, got):
            assert reply["agent"] == turn.agent
            if reply.get("tool_calls"):
                assert reply["content"] is None and reply["finish"] == "tool_calls"
                [(cid, name, args)] = reply["tool_calls"]
                assert (name, json.loads(args)) == ("lookup", {"q": "x"}) and cid == f"call_{turn.index}_0"
            else:
                assert reply["content"] == turn.text and reply["finish"] == "stop"
            if "logprobs" in reply:  # the sampled ids and logprobs, token by token (stream included)
                assert reply["logprobs"] == turn.logprobs
                assert reply["tokens"] == [tiny_tokenizer.decode([i]) for i in turn.completion_ids]
        assert ep.turns[0].text == f"ANSWER: {ep.task.prompt}"
        tool_turn, final = ep.turns[3], ep.turns[4]
        assert "lookup(q: str)" in tool_turn.messages[0]["content"]  # described to a template without tools
        assert tool_turn.tool_calls[0]["valid"] and tool_turn.observations == ["42"] and tool_turn.parsed["label"] == "tool"
        assert final.parent == tool_turn.index and "<tool_response>\n42\n</tool_response>" in final.messages[-1]["content"]
        assert parse_tool_calls(final.messages[-2]["content"])[0].name == "lookup"  # the model's own call text, read back
    assert backend.calls == 4 and backend.requests == 4 * 5  # the 4 episodes' requests were batched together
    assert engine.take_faults()[0]["agent_error"] == 0


def test_an_async_team_and_the_per_request_settings(tiny_tokenizer):
    engine, _ = scripted_engine(endpoint_config("m", "async_echo"), scripted_reply, tiny_tokenizer)
    [group] = engine.rollout([Task("t0", "2+3", "5")], group_size=2, seed=0)
    assert [ep.answer for ep in group.episodes] == ["2+3", "2+3"]  # ANSWER: 2+3 read as the team's answer


@pytest.mark.parametrize("request_sampling", [False, True])
def test_a_requests_stop_cuts_the_recorded_ids_and_its_sampling_applies_where_the_config_says(tiny_tokenizer,
                                                                                             request_sampling):
    cfg = endpoint_config("m", "with_settings", request_sampling=request_sampling)
    engine, _ = scripted_engine(cfg, lambda req: "ANSWER: 5 ACCEPT now", tiny_tokenizer)
    [group] = engine.rollout([Task("t0", "2+3", "5")], group_size=1, seed=0)
    ep = group.episodes[0]
    [reply] = RECEIVED.pop(ep.answer)
    [turn] = ep.turns
    assert reply["content"] == turn.text == "ANSWER: 5" and reply["finish"] == "stop"
    ids = tiny_tokenizer.encode("ANSWER: 5 ACCEPT now", add_special_tokens=False)
    assert turn.completion_ids == ids[:len(turn.completion_ids)] and len(turn.logprobs) == len(turn.completion_ids)
    assert " ACCEPT" in tiny_tokenizer.decode(turn.completion_ids)  # cut after the token that holds the stop
    assert " ACCEPT" not in tiny_tokenizer.decode(turn.completion_ids[:-1])
    assert (turn.temperature, turn.top_p) == ((0.3, 0.5) if request_sampling else (1.0, 1.0))


def test_a_chat_template_that_renders_tools_gets_them_and_the_system_message_stays_as_sent(tiny_tokenizer):
    import copy

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = ("{% if tools %}TOOLS {% for t in tools %}{{ t.function.name }} {% endfor %}\n{% endif %}"
                         "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>")
    engine, _ = scripted_engine(endpoint_config("m", "protocol_team"), scripted_reply, tok)
    [group] = engine.rollout([Task("t0", "2+3", "5")], group_size=1, seed=0)
    ep = group.episodes[0]
    RECEIVED.pop(ep.answer)
    tool_turn = ep.turns[3]
    assert tool_turn.agent == "checker" and tool_turn.tool_calls[0]["name"] == "lookup"
    assert "lookup(q: str)" not in tool_turn.messages[0]["content"]  # not described: the template renders the tools
    tools = [{"type": "function", "function": {"name": "lookup", "description": "Look a number up.",
                                               "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                                                              "required": ["q"]}}}]
    assert tool_turn.prompt_ids == render_prompt(tok, tool_turn.messages, tools)
    assert tok.decode(tool_turn.prompt_ids).startswith("TOOLS lookup")


def test_tool_choice_forces_the_start_of_a_call_and_only_what_follows_is_sampled(tiny_tokenizer):
    from mas.tools import tool_call_start

    seen = {}

    def reply(req):  # each writes the start it was forced to; helper's named call never closes its JSON
        seen[req.agent] = req.prefix
        return {"lead": '<tool_call>{"name": "lookup", "arguments": {"q": "x"}}</tool_call>',
                "helper": '<tool_call>{"name": "lookup", "arguments": {"q": ',
                "checker": '<tool_call>{"name": "note", "arguments": {"text": "ok"}}</tool_call>'}[req.agent]

    engine, _ = scripted_engine(endpoint_config("m", "forced_tools"), reply, tiny_tokenizer)
    [group] = engine.rollout([Task("t0", "2+3", "5")], group_size=2, seed=0)
    # required with one tool: that tool's call up to its arguments; a named one the same; required with two: the name's start
    assert seen == {"lead": tool_call_start("lookup"), "helper": tool_call_start("lookup"), "checker": tool_call_start()}
    for ep, pairs in received([group], ["lead", "helper", "checker"]):
        assert [(r["content"], r["calls"]) for _, r in pairs] == [
            (None, ["lookup"]), ("", []), (None, ["note"])]  # the broken call block is not content
        for turn, _ in pairs:  # the forced start ends the prompt; the completion is the model's own part only
            start = tiny_tokenizer(seen[turn.agent], add_special_tokens=False)["input_ids"]
            assert turn.prompt_ids[-len(start):] == start and turn.text.startswith(seen[turn.agent])
            own = tiny_tokenizer(turn.text[len(seen[turn.agent]):], add_special_tokens=False)["input_ids"]
            assert turn.completion_ids == own + [tiny_tokenizer.eos_token_id]
            assert turn.prompt_ids[:-len(start)] == render_prompt(tiny_tokenizer, turn.messages)
    counts, messages = engine.take_faults()
    assert counts["tool_choice_unmet"] == 2  # helper's unclosed call, once an episode: the reply stands, counted
    assert messages["tool_choice_unmet"].startswith("agent 'helper', turn 1: tool_choice asked for a call of 'lookup'")


def test_a_json_response_format_is_asked_in_the_system_message_and_starts_the_reply(tiny_tokenizer):
    from endpoint_helpers import ANSWER_SCHEMA

    seen = {}

    def reply(req):  # lead answers in the schema; helper calls its tool (a JSON reply is not forced there); checker misses
        seen[req.agent] = (req.prefix, req.messages[0]["content"])
        return {"lead": '{"answer": "5"}', "helper": '<tool_call>{"name": "lookup", "arguments": {"q": "x"}}</tool_call>',
                "checker": '{"verdict": "ok"}'}[req.agent]

    engine, _ = scripted_engine(endpoint_config("m", "json_replies"), reply, tiny_tokenizer)
    [group] = engine.rollout([Task("t0", "2+3", "5")], group_size=2, seed=0)
    assert {a: start for a, (start, _) in seen.items()} == {"lead": "{", "helper": "", "checker": "{"}
    lead_system = seen["lead"][1]
    assert lead_system.startswith("You are the lead.\n\n") and lead_system.endswith(  # the role, then the format's instruction
        "Reply with one JSON object and nothing else, following this JSON schema (Answer):\n" + json.dumps(ANSWER_SCHEMA))
    assert "Reply with one JSON object and nothing else." in seen["helper"][1]
    for ep, pairs in received([group], ["lead", "helper", "checker"]):
        assert [(r["content"], r["calls"]) for _, r in pairs] == [
            ('{"answer": "5"}', []), (None, ["lookup"]), ('{"verdict": "ok"}', [])]
        lead = pairs[0][0]
        assert lead.completion_ids == tiny_tokenizer('"answer": "5"}', add_special_tokens=False)["input_ids"] + [
            tiny_tokenizer.eos_token_id]  # the forced "{" ends the prompt; the rest was the model's
    counts, messages = engine.take_faults()
    assert counts["response_format_unmet"] == 2 and counts["tool_choice_unmet"] == 0  # checker's reply, once an episode
    assert messages["response_format_unmet"] == ("agent 'checker', turn 2: the reply's JSON object lacks ['answer'], which "
                                                 "the response_format schema 'Answer' requires")


def test_what_a_json_reply_misses_is_said():
    from mas.response_format import unmet_response_format

    fmt = {"type": "json_schema", "name": "A", "schema": {"required": ["a"]}}
    assert unmet_response_format(None, "hi") is None and unmet_response_format(fmt, ' {"a": 1} ') is None
    assert "is not JSON" in unmet_response_format(fmt, '{"a": 1} and more')
    assert "is a list" in unmet_response_format({"type": "json_object"}, "[1]")
    assert unmet_response_format({"type": "json_object"}, '{"b": 2}') is None
    odd = {"type": "json_schema", "name": "A", "schema": {"required": True}}  # a client's malformed schema: no crash
    assert unmet_response_format(odd, '{"b": 2}') is None and "is not JSON" in unmet_response_format(odd, "x")


def test_a_script_that_ignores_the_forced_start_fails_with_the_reason(tiny_tokenizer):
    from mas.rollout.backends.base import GenRequest
    from mas.rollout.backends.scripted import ScriptedBackend

    backend = ScriptedBackend(lambda req: "ANSWER: 5", {"p": tiny_tokenizer})
    req = GenRequest(policy="p", prompt_ids=[1], temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=8, agent="lead",
                     prefix='<tool_call>{"name": "')
    with pytest.raises(ValueError, match="does not start with the start the request forced"):
        backend.generate_batch([req])


def test_tool_choice_is_read_against_the_requests_tools():
    from mas.rollout.endpoint import EndpointError, check_request
    from mas.tools import unmet_tool_choice

    add, mul = ({"type": "function", "function": {"name": n}} for n in ("add", "mul"))
    body = {"model": "lead", "messages": [{"role": "user", "content": "x"}], "tools": [add, mul]}
    req = check_request({**body, "tool_choice": {"type": "allowed_tools",
                                                 "allowed_tools": {"mode": "required", "tools": [mul]}}}, ["lead"])
    assert req.tool_choice == "required" and [t["name"] for t in req.tools] == ["mul"]  # only the tools it allows
    named = check_request({**body, "tool_choice": {"type": "function", "function": {"name": "add"}}}, ["lead"])
    assert unmet_tool_choice(named.tool_choice, ["add"]) is None
    assert unmet_tool_choice(named.tool_choice, ["mul"]) == "tool_choice asked for a call of 'add', and the reply called 'mul'"
    assert unmet_tool_choice("required", ["add"]) is None and unmet_tool_choice("auto", []) is None
    assert "called none" in unmet_tool_choice("required", [])
    with pytest.raises(EndpointError, match="not among the request's tools"):
        check_request({**body, "tools": [add], "tool_choice": {"type": "function", "function": {"name": "mul"}}}, ["lead"])


def test_the_cap_on_model_calls_ends_a_team_that_never_stops(tiny_tokenizer):
    engine, _ = scripted_engine(endpoint_config("m", "chatty", max_model_calls=3), scripted_reply, tiny_tokenizer)
    [group] = engine.rollout([Task("t0", "2+3", "5")], group_size=2, seed=0)
    for ep in group.episodes:
        assert ep.status == "error" and "model call limit" in ep.error and len(ep.turns) == 3
    assert engine.take_faults()[0]["model_call_limit"] == 2


def test_the_episode_timeout_ends_the_team_and_its_later_requests_find_no_episode(tiny_tokenizer):
    import asyncio

    from endpoint_helpers import FIRST_CALL_DONE

    async def after_the_first_call(_seconds):  # the clock: the limit passes once the first call has its reply
        while not FIRST_CALL_DONE.is_set():
            await asyncio.sleep(0.01)

    FIRST_CALL_DONE.clear()
    engine, _ = scripted_engine(endpoint_config("m", "slow"), scripted_reply, tiny_tokenizer)
    engine.episode_timeout, engine.sleep = 30.0, after_the_first_call
    [group] = engine.rollout([Task("t0", "2+3", "5")], group_size=1, seed=0)
    ep = group.episodes[0]
    assert ep.status == "error" and "timeout" in ep.error and len(ep.turns) == 1
    assert engine.take_faults()[0]["episode_timeout"] == 1


def test_a_replay_reruns_the_entry_with_the_frozen_turns_served_from_the_record(tiny_tokenizer):
    calls = []

    def respond(req):
        calls.append(req.agent)
        return "ANSWER: 5" if req.agent == "lead" else "ACCEPT"

    engine, _ = scripted_engine(endpoint_config("m", "solver_checker"), respond, tiny_tokenizer)
    [group] = engine.rollout([Task("t0", "2+3", "5")], group_size=1, seed=0)
    source = group.episodes[0]
    calls.clear()
    [replay] = engine.execute([ReplayRequest("r", source, freeze_upto=1)], seed=1)["r"]
    assert replay.status == "ok" and calls == ["checker"]  # the lead's turn came from the record
    assert replay.turns[0].replayed and replay.turns[0].prompt_ids == source.turns[0].prompt_ids
    assert not replay.turns[1].replayed and replay.turns[1].text == "ACCEPT"


def test_concurrent_episodes_are_never_cross_wired(tiny_tokenizer):
    engine, backend = scripted_engine(endpoint_config("m", "two_agents"), scripted_reply, tiny_tokenizer)
    tasks = [Task(f"t{i}", f"{i}+{i}", str(2 * i)) for i in range(50)]
    groups = engine.rollout(tasks, group_size=2, seed=0)
    for ep in (e for g in groups for e in g.episodes):
        assert ep.status == "ok", ep.error
        got = RECEIVED.pop(ep.answer)
        assert [r["content"] for r in got] == [t.text for t in ep.turns] == [f"ANSWER: {ep.task.prompt}"] * 2
    assert backend.requests == 200 and backend.calls == 2  # 100 episodes, two batched rounds


# --- token in, token out: what the learner trains is what the endpoint sampled -------------------------


def test_the_recorded_ids_are_the_rendered_prompt_and_the_sampled_completion(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    with build_team(validate_config(endpoint_config(tiny_model_dir, "two_agents"))) as team:
        groups = team.engine.rollout([Task("t0", "2+3", "5")], group_size=2, seed=0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
        tok = team.runtime.tokenizers["main"]
        turns = []
        for ep, pairs in received(groups, ["lead", "helper"]):
            for turn, reply in pairs:
                assert turn.prompt_ids == render_prompt(tok, turn.messages)  # the ids the server rendered
                assert reply["logprobs"] == turn.logprobs and reply["tokens"] == [tok.decode([i]) for i in turn.completion_ids]
                ids = torch.tensor([turn.prompt_ids + turn.completion_ids])
                with torch.no_grad():
                    logits = model(ids).logits[0, len(turn.prompt_ids) - 1:-1] / turn.temperature
                again = torch.log_softmax(logits.float(), -1).gather(-1, ids[0, len(turn.prompt_ids):, None])[:, 0]
                assert torch.allclose(again, torch.tensor(turn.logprobs), atol=1e-5)
                turns.append(turn)
            assert len(ep.turns[1].completion_ids) <= 3  # the request's max_tokens
        credit = run_credit(build_credit_batch(groups, team.cfg.agent_names), team.cfg.credit)
        samples, _ = training_batches(team, groups, credit, {"main": team.learners["main"]})
        main = [t for t in turns if t.policy == "main"]
        assert [(s.prompt_ids, s.completion_ids, s.old_logprobs) for s in samples["main"]] == \
               [(t.prompt_ids, t.completion_ids, t.logprobs) for t in main]


def test_a_forced_tool_call_start_is_prompt_and_the_model_samples_what_follows(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from mas.tools import forced_call_start as forced_start

    with build_team(validate_config(endpoint_config(tiny_model_dir, "forced_tools"))) as team:
        groups = team.engine.rollout([Task("t0", "2+3", "5")], group_size=2, seed=0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
        tok = team.runtime.tokenizers["main"]
        starts = {"lead": forced_start("required", ["lookup"]), "checker": forced_start("required", ["lookup", "note"]),
                  "helper": forced_start({"function": {"name": "lookup"}}, ["lookup", "note"])}
        for ep, pairs in received(groups, ["lead", "helper", "checker"]):
            for turn, _ in pairs:
                start = tok(starts[turn.agent], add_special_tokens=False)["input_ids"]
                assert turn.text.startswith(starts[turn.agent]) and turn.prompt_ids[-len(start):] == start
                ids = torch.tensor([turn.prompt_ids + turn.completion_ids])
                with torch.no_grad():
                    logits = model(ids).logits[0, len(turn.prompt_ids) - 1:-1] / turn.temperature
                again = torch.log_softmax(logits.float(), -1).gather(-1, ids[0, len(turn.prompt_ids):, None])[:, 0]
                assert torch.allclose(again, torch.tensor(turn.logprobs), atol=1e-5)  # sampled after the start
                assert tok.decode(turn.completion_ids, skip_special_tokens=True) == turn.text[len(starts[turn.agent]):]


# --- the shipped config trains, and `mas serve` answers the real client ---------------------------------


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """`mas train configs/openai_team.yaml` for one step, from a fresh process at the repository root."""
    run = tmp_path_factory.mktemp("openai-team") / "run"
    env = {**os.environ, "PYTHONPATH": ""}  # nothing but the current directory makes `examples` importable
    cmd = [sys.executable, "-m", "mas.cli", "train", "configs/openai_team.yaml", "trainer.steps=1", "trainer.batch_size=1",
           "trainer.group_size=2", "trainer.eval_size=0", "logging.progress=false", "trainer.warmup.steps=0",
           "--run-dir", str(run)]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return run


def test_the_shipped_openai_team_trains_one_step_from_the_repository_root(trained_run):
    rows = [json.loads(line) for line in (trained_run / "metrics.jsonl").read_text().splitlines()]
    row = [r for r in rows if r.get("kind", "step") == "step" and "eval" not in r][-1]
    assert row["step"] == 0 and row["episodes"]["errors"] == 0, row["episodes"]
    assert set(row["policies"]) == {"solve", "check"} and all(math.isfinite(p["loss"]) for p in row["policies"].values())


def test_mas_serve_answers_the_openai_client_with_the_trained_policies(trained_run):
    from openai import OpenAI

    proc = subprocess.Popen([sys.executable, "-m", "mas.cli", "serve", str(trained_run)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("base_url: http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() is not None else "")
        client = OpenAI(base_url=line.split(": ", 1)[1].strip(), api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["solver", "checker"]
        messages = [{"role": "user", "content": "2+3"}]
        a = client.chat.completions.create(model="solver", messages=messages, logprobs=True)
        b = client.chat.completions.create(model="solver", messages=messages, logprobs=True)
        assert a.choices[0].message.content == b.choices[0].message.content  # greedy by default
        assert a.choices[0].logprobs.content and a.usage.completion_tokens <= 8  # the agent's budget
        r = client.responses.create(model="solver", input="2+3")  # the Responses API: the same greedy reply
        assert r.output_text == (a.choices[0].message.content or "") and r.usage.output_tokens == a.usage.completion_tokens
        with pytest.raises(Exception, match="no agent 'gpt-4o'"):
            client.chat.completions.create(model="gpt-4o", messages=messages)
    finally:
        # SIGTERM, not SIGINT: a child started where SIGINT is ignored (a pytest-xdist worker) inherits
        # that, and Python then never raises KeyboardInterrupt; communicate reads both pipes as it ends
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "stopped" in err, err[-2000:]
