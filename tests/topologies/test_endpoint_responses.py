"""The Responses API on the endpoint (``POST /v1/responses``, mas/rollout/responses.py): translated
onto chat completions, so each request is a recorded turn like any other, with the real `openai`
client and the OpenAI Agents SDK's ``OpenAIResponsesModel``."""

from __future__ import annotations

import json

import pytest
from endpoint_helpers import RECEIVED
from test_endpoint import endpoint_config, scripted_reply
from test_engine import scripted_engine

from mas.rollout.endpoint import check_request
from mas.rollout.responses import BadRequest, chat_body
from mas.tools import parse_tool_calls
from mas.types import Task

pytest.importorskip("openai")
pytest.importorskip("uvicorn")


def test_a_responses_input_is_the_chat_it_means():
    body = {
        "model": "checker", "instructions": "Be brief.", "max_output_tokens": 7, "temperature": 0.5,
        "tool_choice": {"type": "function", "name": "lookup"},
        "tools": [{"type": "function", "name": "lookup", "description": "d", "parameters": {"type": "object"}, "strict": True}],
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "2+"}, {"type": "input_text", "text": "3"}]},
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
             "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "lookup", "arguments": "{\"q\": \"x\"}"},
            {"type": "function_call", "call_id": "call_b", "name": "lookup", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_a", "output": "42"},
            {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "7"}]},
        ],
    }
    assert chat_body(body) == {
        "model": "checker", "stream": None, "temperature": 0.5, "top_p": None, "max_tokens": 7, "logprobs": False,
        "tool_choice": {"type": "function", "function": {"name": "lookup"}},
        "tools": [{"type": "function", "function": {"name": "lookup", "description": "d", "parameters": {"type": "object"}}}],
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "2+3"},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\": \"x\"}"}},
                {"id": "call_b", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_a", "content": "42"},
            {"role": "tool", "tool_call_id": "call_b", "content": "7"},
        ],
    }
    assert chat_body({"model": "lead", "input": "hi"})["messages"] == [{"role": "user", "content": "hi"}]
    tool = {"type": "function", "name": "other", "parameters": {"type": "object"}}
    allowed = check_request(chat_body({**body, "tools": [*body["tools"], tool], "tool_choice": {
        "type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "other"}]}}), [body["model"]])
    assert allowed.tool_choice == "required" and [t["name"] for t in allowed.tools] == ["other"]  # only those it allows


def test_a_text_format_is_chats_response_format_and_is_echoed():
    from mas.rollout.responses import response_body

    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    fmt = {"type": "json_schema", "name": "Answer", "schema": schema, "strict": True}
    body = {"model": "lead", "input": "2+3", "text": {"format": fmt}}
    req = check_request(chat_body(body), ["lead"])
    assert req.response_format == {"type": "json_schema", "name": "Answer", "schema": schema}
    assert check_request(chat_body({**body, "text": {"format": {"type": "json_object"}}}), ["lead"]).response_format == {
        "type": "json_object"}
    assert check_request(chat_body({**body, "text": {"format": {"type": "text"}}}), ["lead"]).response_format is None

    class Choice:
        finish_reason, prompt_ids, completion_ids, content, tool_calls, tokens, logprobs = "stop", [1], [2], "{}", [], [], []

    assert response_body(body, "lead", Choice(), "resp_1", 0)["text"] == {"format": fmt}
    assert response_body({"model": "lead"}, "lead", Choice(), "resp_1", 0)["text"] == {"format": {"type": "text"}}


@pytest.mark.parametrize("body, param, words", [
    ({"model": "lead", "input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "keeps no responses"),
    ({"model": "lead", "input": []}, "input", "non-empty"),
    ({"model": "lead", "input": [{"type": "reasoning", "summary": []}]}, "input[0]", "'reasoning' are not served"),
    ({"model": "lead", "input": [{"role": "wizard", "content": "x"}]}, "input[0]", "role"),
    ({"model": "lead", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}, "input[0]",
     "only text parts"),
    ({"model": "lead", "input": [{"type": "function_call", "name": "f"}]}, "input[0]", "call_id, name and arguments"),
    ({"model": "lead", "input": "x", "tools": [{"type": "web_search"}]}, "tools[0]", "only function tools"),
    ({"model": "lead", "input": "x", "tool_choice": 3}, "tool_choice", "tool_choice must be"),
    ({"model": "lead", "input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image"}]}]},
     "input[0]", r"input\[0\]\.output\[0\]: only text parts"),
])
def test_what_the_translation_cannot_serve_is_refused_naming_the_responses_field(body, param, words):
    with pytest.raises(BadRequest, match=words) as err:
        chat_body(body)
    assert err.value.param == param


def test_the_openai_clients_responses_plain_streamed_and_with_a_tool_round_are_recorded_turns(tiny_tokenizer):
    engine, backend = scripted_engine(endpoint_config("m", "responses_team"), scripted_reply, tiny_tokenizer)
    groups = engine.rollout([Task("t0", "2+3", "5"), Task("t1", "4+4", "8")], group_size=2, seed=0)
    for ep in (e for g in groups for e in g.episodes):
        assert ep.status == "ok", ep.error
        lead, helper, call, answer = RECEIVED.pop(ep.answer)
        assert [t.agent for t in ep.turns] == ["lead", "helper", "checker", "checker"]
        t_lead, t_helper, t_call, t_answer = ep.turns
        assert t_lead.messages[0] == {"role": "system", "content": "You lead."}
        assert lead["content"] == t_lead.text and lead["status"] == "completed"
        assert lead["logprobs"] == t_lead.logprobs  # include: message.output_text.logprobs, the sampled ones
        assert lead["tokens"] == [tiny_tokenizer.decode([i]) for i in t_lead.completion_ids]
        assert lead["usage"] == (len(t_lead.prompt_ids), len(t_lead.completion_ids))
        assert helper["content"] == helper["final"] == t_helper.text
        assert helper["kinds"] == ["response.created", "response.in_progress", "response.output_item.added",
                                   "response.content_part.added", "response.output_text.delta", "response.output_text.done",
                                   "response.content_part.done", "response.output_item.done", "response.completed"]
        [(cid, name, args)] = call["tool_calls"]
        assert call["content"] is None and (name, json.loads(args)) == ("lookup", {"q": "x"})
        assert t_call.tool_calls[0]["valid"] and t_call.observations == ["42"]  # the function_call_output, recorded
        assert t_answer.parent == t_call.index and "<tool_response>\n42\n</tool_response>" in t_answer.messages[-1]["content"]
        assert parse_tool_calls(t_answer.messages[-2]["content"])[0].name == "lookup"  # the model's own call, read back
        assert answer["content"] == t_answer.text
    assert backend.calls == 4  # the 4 episodes' requests batched together, as through chat completions
    assert engine.take_faults()[0]["agent_error"] == 0


def test_an_agents_sdk_team_on_the_responses_api_hands_off_and_each_agent_is_a_recorded_turn(tiny_tokenizer):
    pytest.importorskip("agents.run")  # the OpenAI Agents SDK (the serve extra)

    def reply(req):
        if req.agent == "lead":  # the triage agent hands off by the task's operation
            tutor = "addition_tutor" if "+" in req.messages[-1]["content"] else "subtraction_tutor"
            return f'<tool_call>{{"name": "transfer_to_{tutor}", "arguments": {{}}}}</tool_call>'
        return "ANSWER: 5"

    cfg = endpoint_config("m", "triage_team")
    cfg["topology"]["entry"] = "sdk_responses_helpers:triage_team"
    engine, _ = scripted_engine(cfg, reply, tiny_tokenizer)
    groups = engine.rollout([Task("t0", "2+3", "5"), Task("t1", "9-4", "5")], group_size=1, seed=0)
    for group, tutor in zip(groups, ("helper", "checker")):
        [ep] = group.episodes
        assert ep.status == "ok", ep.error
        assert [t.agent for t in ep.turns] == ["lead", tutor] and ep.answer == "5"
        handoff, answer = ep.turns
        name = "Addition Tutor" if tutor == "helper" else "Subtraction Tutor"
        assert handoff.tool_calls[0]["valid"] and handoff.tool_calls[0]["name"].startswith("transfer_to_")
        # the tutor is sent the task, the handoff call as the triage model wrote it, and the SDK's output
        assert [m["role"] for m in answer.messages] == ["system", "user", "assistant", "user"]
        assert answer.messages[1]["content"] == ep.task.prompt and answer.messages[2]["content"] == handoff.text
        assert answer.messages[3]["content"] == f'<tool_response>\n{{"assistant": "{name}"}}\n</tool_response>'
        assert answer.text == "ANSWER: 5"


def test_a_reply_cut_at_its_token_budget_is_an_incomplete_response_in_body_items_and_stream():
    from mas.rollout.endpoint import Choice
    from mas.rollout.responses import response_body, response_events

    cut = Choice("ANSWER: 1", [], "length", [1, 2, 3], [7, 8], [-0.5, -0.25], [])
    body = response_body({"model": "lead", "max_output_tokens": 2}, "lead", cut, "resp_1", 0)
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete" and body["output"][0]["content"][0]["logprobs"] == []
    assert body["usage"]["input_tokens"] == 3 and body["usage"]["output_tokens"] == 2
    events = [json.loads(e.split("data: ", 1)[1]) for e in response_events({"model": "lead"}, "lead", cut, "resp_1", 0)]
    assert events[0]["type"] == "response.created" and events[0]["response"]["usage"] is None
    assert events[-1]["type"] == "response.incomplete" and events[-1]["response"]["status"] == "incomplete"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
