"""The OpenAI-compatible endpoint's server (mas/rollout/endpoint.py) against hostile clients: every
bad request gets a 4xx with OpenAI's error body and changes nothing, and the server keeps serving.
And ``mas serve``'s session under concurrent clients: their requests are generated together, and
each gets what it would get alone."""

from __future__ import annotations

import asyncio
import json
import random
import threading

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from mas.rollout.endpoint import MAX_TOKENS_LIMIT, ChatRequest, Choice, EndpointServer  # noqa: E402


class FakeSession:
    """Answers every request with one fixed reply, and counts the requests that reached it."""

    def __init__(self, loop):
        self.agents = ["solver", "checker"]
        self.loop = loop
        self.seen: list[ChatRequest] = []

    async def complete(self, req: ChatRequest) -> list[Choice]:
        self.seen.append(req)
        return [Choice("ANSWER: 5", [], "stop", [1, 2, 3], [7, 8], [-0.25, -0.5], ["ANSWER", ": 5"])
                for _ in range(req.n)]


@pytest.fixture(scope="module")
def served():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = EndpointServer(max_body_bytes=64 * 1024).start()
    session = FakeSession(loop)
    token = server.register(session)
    with httpx.Client(timeout=30) as client:
        yield server, token, session, client
    server.close()
    loop.call_soon_threadsafe(loop.stop)


def ok_body(**changes) -> dict:
    return {"model": "solver", "messages": [{"role": "user", "content": "2+3"}], **changes}


def assert_error(resp, status: int, text: str = "") -> None:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"] and text in err["message"]


BAD = [  # (body as sent, status, words of the message)
    (b"{not json", 400, "not valid JSON"),
    (b"\xff\xfe", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (json.dumps({"messages": []}).encode(), 400, "model must be a string"),
    (json.dumps(ok_body(model=3)).encode(), 400, "model must be a string"),
    (json.dumps(ok_body(model="gpt-4o")).encode(), 404, "no agent 'gpt-4o'"),
    (json.dumps(ok_body(messages="hi")).encode(), 400, "messages must be"),
    (json.dumps(ok_body(messages=[{"role": "wizard", "content": "x"}])).encode(), 400, "role"),
    (json.dumps(ok_body(messages=[{"role": "user", "content": [{"type": "image_url"}]}])).encode(), 400, "only text"),
    (json.dumps(ok_body(messages=[{"role": "tool", "content": "x"}])).encode(), 400, "tool_call_id"),
    (json.dumps(ok_body(temperature="hot")).encode(), 400, "temperature"),
    (json.dumps(ok_body(temperature=9)).encode(), 400, "temperature"),
    (json.dumps(ok_body(top_p=True)).encode(), 400, "top_p"),
    (json.dumps(ok_body(n=0)).encode(), 400, "n must be"),
    (json.dumps(ok_body(n=1.5)).encode(), 400, "n must be"),
    (json.dumps(ok_body(max_tokens=-1)).encode(), 400, "max_tokens"),
    (json.dumps(ok_body(max_tokens=MAX_TOKENS_LIMIT + 1)).encode(), 400, "max_tokens"),
    (json.dumps(ok_body(max_tokens=4, max_completion_tokens=4)).encode(), 400, "not both"),
    (json.dumps(ok_body(stop=[1])).encode(), 400, "stop"),
    (json.dumps(ok_body(stream="yes")).encode(), 400, "stream"),
    (json.dumps(ok_body(tools={"name": "x"})).encode(), 400, "tools must be a list"),
    (json.dumps(ok_body(tools=[{"type": "function"}])).encode(), 400, "tools[0]"),
    (json.dumps(ok_body(tool_choice=7)).encode(), 400, "tool_choice"),
    (json.dumps(ok_body(tool_choice={"type": "function"})).encode(), 400, "tool_choice must be"),
    (json.dumps(ok_body(tool_choice="required")).encode(), 400, "offers no tools"),
    (json.dumps(ok_body(tools=[{"type": "function", "function": {"name": "add"}}],
                        tool_choice={"type": "function", "function": {"name": "mul"}})).encode(), 400, "not among the request's tools ['add']"),
    (json.dumps(ok_body(tools=[{"type": "function", "function": {"name": "add"}}],
                        tool_choice={"type": "allowed_tools", "allowed_tools": {"mode": "any", "tools": []}})).encode(), 400, "allowed_tools"),
    (json.dumps(ok_body(response_format={"type": "json_schema"})).encode(), 400, "response_format must be"),
    (json.dumps(ok_body(response_format={"type": "xml"})).encode(), 400, "response_format must be"),
    (json.dumps(ok_body(response_format="json")).encode(), 400, "response_format must be"),
    (b"x" * (64 * 1024 + 1), 413, "over the limit"),
]


@pytest.mark.parametrize("body,status,words", BAD, ids=[f"{i}-{s}" for i, (_, s, _) in enumerate(BAD)])
def test_a_bad_request_gets_a_4xx_with_a_message_and_reaches_no_agent(served, body, status, words):
    server, token, session, client = served
    before = len(session.seen)
    resp = client.post(f"{server.url(token)}/chat/completions", content=body, headers={"content-type": "application/json"})
    assert_error(resp, status, words)
    assert len(session.seen) == before
    assert client.post(f"{server.url(token)}/chat/completions", json=ok_body()).status_code == 200  # still serving


def test_an_unknown_token_or_route_is_a_404_and_a_wrong_method_a_405(served):
    server, token, session, client = served
    before = len(session.seen)
    assert_error(client.post(f"{server.url('no-such-token')}/chat/completions", json=ok_body()), 404, "no live episode")
    assert_error(client.get(f"{server.url('no-such-token')}/models"), 404, "no live episode")
    assert_error(client.get(f"http://127.0.0.1:{server.port}/v1/models"), 404, "no such route")
    assert_error(client.get(f"{server.url(token)}/chat/completions"), 405)
    assert len(session.seen) == before


def test_a_huge_body_without_a_length_is_cut_at_the_limit(served):
    server, token, session, client = served

    def chunks():
        for _ in range(100):
            yield b"x" * 4096

    assert_error(client.post(f"{server.url(token)}/chat/completions", content=chunks()), 413, "over the limit")


def test_the_agent_is_named_by_path_header_or_model(served):
    server, token, session, client = served
    client.post(f"{server.url(token, 'checker')}/chat/completions", json=ok_body(model="gpt-4o"))
    client.post(f"{server.url(token)}/chat/completions", json=ok_body(model="gpt-4o"), headers={"X-Mas-Agent": "checker"})
    client.post(f"{server.url(token)}/chat/completions", json=ok_body(model="solver"))
    assert [r.agent for r in session.seen[-3:]] == ["checker", "checker", "solver"]
    models = client.get(f"{server.url(token)}/models").json()
    assert [m["id"] for m in models["data"]] == ["solver", "checker"]


RESPONSES_BAD = [  # the Responses route: (body as sent, status, words, param)
    (b"{not json", 400, "not valid JSON", None),
    (json.dumps({"model": "gpt-4o", "input": "2+3"}).encode(), 404, "no agent 'gpt-4o'", "model"),
    (json.dumps({"model": "solver"}).encode(), 400, "input must be", "input"),
    (json.dumps({"model": "solver", "input": "x", "previous_response_id": "resp_1"}).encode(), 400, "keeps no responses",
     "previous_response_id"),
    (json.dumps({"model": "solver", "input": "x", "max_output_tokens": MAX_TOKENS_LIMIT + 1}).encode(), 400,
     "max_output_tokens", "max_output_tokens"),
    (json.dumps({"model": "solver", "input": "x", "temperature": "hot"}).encode(), 400, "temperature", "temperature"),
    (json.dumps({"model": "solver", "input": [{"type": "input_file"}]}).encode(), 400, "'input_file' are not served", "input[0]"),
    (json.dumps({"model": "solver", "input": "x", "tools": [{"type": "function", "name": "add"}],
                 "tool_choice": {"type": "function", "name": "mul"}}).encode(), 400, "not among the request's tools", "tool_choice"),
    (json.dumps({"model": "solver", "input": "x", "tools": [{"type": "function", "name": "add"}],
                 "tool_choice": {"type": "allowed_tools", "mode": "any", "tools": []}}).encode(), 400, "allowed_tools",
     "tool_choice"),
    (json.dumps({"model": "solver", "input": "x", "tools": [{"type": "function", "name": "add"}],
                 "tool_choice": {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "mul"}]}}
                ).encode(), 400, "offers no tools", "tool_choice"),
    (json.dumps({"model": "solver", "input": "x", "text": {"format": {"type": "xml"}}}).encode(), 400,
     "text.format: response_format must be", "text"),
]


@pytest.mark.parametrize("body,status,words,param", RESPONSES_BAD, ids=[str(i) for i in range(len(RESPONSES_BAD))])
def test_a_bad_responses_request_gets_a_4xx_naming_its_field_and_reaches_no_agent(served, body, status, words, param):
    server, token, session, client = served
    before = len(session.seen)
    resp = client.post(f"{server.url(token)}/responses", content=body, headers={"content-type": "application/json"})
    assert_error(resp, status, words)
    assert resp.json()["error"]["param"] == param and len(session.seen) == before
    good = client.post(f"{server.url(token)}/responses", json={"model": "solver", "input": "2+3", "max_output_tokens": 9})
    assert good.status_code == 200 and session.seen[-1].max_tokens == 9
    reply = good.json()
    assert reply["object"] == "response" and reply["status"] == "completed"
    assert reply["output"][0]["content"][0]["text"] == "ANSWER: 5" and reply["usage"]["output_tokens"] == 2


def test_random_bytes_never_crash_the_server(served):
    server, token, session, client = served
    rng = random.Random(0)
    pieces = [b"{", b"}", b"[", b"]", b'"model"', b'"solver"', b":", b",", b'"messages"', b'"input"', b"null", b"1e999", b'"\\ud800"',
              b'{"role": "user", "content": "x"}', b"\x00", b"\xc3"]
    for _ in range(200):
        body = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        for route in ("chat/completions", "responses"):
            resp = client.post(f"{server.url(token)}/{route}", content=body)
            assert resp.status_code in (200, 400, 404), (route, body, resp.text)
            if resp.status_code != 200:
                assert resp.json()["error"]["message"]
    assert client.post(f"{server.url(token)}/chat/completions", json=ok_body()).status_code == 200


def test_an_unregistered_token_is_gone_at_once(served):
    server, _, _, client = served
    other = FakeSession(None)
    token = server.register(other)
    server.unregister(token)
    assert_error(client.post(f"{server.url(token)}/chat/completions", json=ok_body()), 404)
    assert other.seen == []


def test_a_stream_ends_with_done_and_a_client_that_leaves_early_ends_only_its_call(served):
    server, token, session, client = served
    with client.stream("POST", f"{server.url(token)}/chat/completions", json=ok_body(stream=True, n=2)) as resp:
        lines = [line for line in resp.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: "):]) for line in lines[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"][0]["index"] == 1) == "ANSWER: 5"
    with client.stream("POST", f"{server.url(token)}/chat/completions", json=ok_body(stream=True)) as resp:
        next(resp.iter_lines())  # read one event, then hang up
    assert client.post(f"{server.url(token)}/chat/completions", json=ok_body()).status_code == 200


# --- mas serve: concurrent clients are generated together (PolicySession with the hf backend) -----------


class CountingBackend:
    """The team's backend, recording each ``generate_batch`` call's rows; ``hold`` makes the next
    call wait until it returns True, so that the requests of a burst queue behind it."""

    def __init__(self, backend, poison: str | None = None):
        self.backend, self.poison = backend, poison
        self.batches: list[list] = []
        self.hold = None

    def generate_batch(self, requests, seed=None):
        hold, self.hold = self.hold, None
        if hold is not None:
            wait_for(hold)
        self.batches.append(list(requests))
        if self.poison and any(self.poison in m["content"] for r in requests for m in r.messages):
            raise ValueError(f"a row holds {self.poison}")
        return self.backend.generate_batch(requests, seed=seed)


class Arrivals:
    """A session that counts the requests that reached it, then lets the real one answer."""

    def __init__(self, session):
        self.session, self.agents, self.loop, self.count = session, session.agents, session.loop, 0

    async def complete(self, req):
        self.count += 1
        return await self.session.complete(req)


def wait_for(cond, limit_s: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + limit_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.002)


@pytest.fixture(scope="module")
def policy_served():
    """``mas serve``'s session on the embedded model (hf, float32) behind a real server; two policies."""
    from team_helpers import team_config

    from mas.config.schema import validate_config
    from mas.rollout.endpoint import PolicySession
    from mas.training.team import build_team

    cfg = team_config("embedded", "chain")
    for policy in cfg["policies"].values():
        policy["dtype"] = "float32"
    for agent in cfg["agents"]:
        agent["sampling"]["max_new_tokens"] = 12
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    server = EndpointServer().start()
    with build_team(validate_config(cfg)) as team:
        backend = CountingBackend(team.backend, poison="POISON")
        arrivals = Arrivals(PolicySession(team.agents, team.runtime.tokenizers, backend, loop))
        yield server.url(server.register(arrivals)), backend, arrivals
    server.close()
    loop.call_soon_threadsafe(loop.stop)


def serve_body(i: int, **changes) -> dict:
    """Request i of a burst: agents on both policies, prompts of different lengths (left padding
    in a batch), budgets of their own."""
    agent = ["lead", "helper", "checker"][i % 3]
    text = f"Task: {i}+{i * 7}" + "".join(f"-{k}" for k in range(i))
    return {"model": agent, "messages": [{"role": "user", "content": text}], "logprobs": True,
            "max_tokens": [12, 3, 7, 1][i % 4], **changes}


def burst(url: str, bodies: list[dict], backend: CountingBackend, arrivals: Arrivals) -> list:
    """Every body at once from its own thread; the first generate_batch call waits until all have
    reached the session, so the rest queue behind it whatever the machine's speed."""
    from concurrent.futures import ThreadPoolExecutor

    before = arrivals.count
    backend.hold = lambda: arrivals.count >= before + len(bodies)
    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda b: httpx.post(f"{url}/chat/completions", json=b, timeout=120), bodies))


def reply_of(resp) -> tuple:
    """(text, finish reason, tokens, usage), and the tokens' logprobs apart."""
    assert resp.status_code == 200, resp.text
    body = resp.json()
    [choice] = body["choices"]
    tokens = [t["token"] for t in choice["logprobs"]["content"]]
    return (choice["message"]["content"], choice["finish_reason"], tokens, body["usage"]), \
        [t["logprob"] for t in choice["logprobs"]["content"]]


def assert_same_replies(got: list, expected: list) -> None:
    """The same tokens, text and finish exactly; logprobs to float32 rounding (a row's matmuls in
    a padded batch of another shape round differently in the last bits)."""
    assert [r for r, _ in got] == [r for r, _ in expected]
    for (_, lp), (_, want) in zip(got, expected):
        assert lp == pytest.approx(want, abs=1e-5)


def test_concurrent_greedy_requests_are_batched_and_get_what_sequential_ones_get(policy_served):
    url, backend, arrivals = policy_served
    bodies = [serve_body(i) for i in range(8)]
    backend.batches.clear()
    sequential = [reply_of(httpx.post(f"{url}/chat/completions", json=b, timeout=120)) for b in bodies]
    assert [len(b) for b in backend.batches] == [1] * 8  # one after another: one call each
    backend.batches.clear()
    concurrent = [reply_of(r) for r in burst(url, bodies, backend, arrivals)]
    assert_same_replies(concurrent, sequential)
    assert len({text for (text, _, _, _), _ in sequential}) >= 4  # replies that differ, not one repeated token
    assert sum(len(b) for b in backend.batches) == 8 and len(backend.batches) <= 2 < 8  # the first, then the rest
    assert any({r.policy for r in b} == {"main", "judge"} for b in backend.batches)  # both policies in one call
    for ((_, _, tokens, usage), _), body in zip(concurrent, bodies):
        assert len(tokens) == usage["completion_tokens"] <= body["max_tokens"]  # each request's own budget


def test_each_requests_sampling_settings_reach_the_backend_in_a_shared_batch(policy_served):
    url, backend, arrivals = policy_served
    bodies = [serve_body(0), serve_body(1, temperature=0.7, top_p=0.9), serve_body(2, temperature=1.3, n=3),
              serve_body(3, max_tokens=2)]
    backend.batches.clear()
    replies = burst(url, bodies, backend, arrivals)
    assert [r.status_code for r in replies] == [200] * 4
    assert [len(r.json()["choices"]) for r in replies] == [1, 1, 3, 1]
    rows = [r for b in backend.batches for r in b]
    assert len(backend.batches) <= 2 and len(rows) == 6
    seen = {(r.agent, r.temperature, r.top_p, r.max_new_tokens) for r in rows}
    assert seen == {("lead", 0.0, 1.0, 12), ("helper", 0.7, 0.9, 3), ("checker", 1.3, 1.0, 7), ("lead", 0.0, 1.0, 2)}
    for resp, body in zip(replies, bodies):
        assert all(len(c["logprobs"]["content"]) <= body["max_tokens"] for c in resp.json()["choices"])


def test_a_request_the_backend_cannot_serve_fails_alone_and_the_others_of_its_batch_are_answered(policy_served):
    url, backend, arrivals = policy_served
    bodies = [serve_body(i) for i in range(4)]
    bad = serve_body(4, messages=[{"role": "user", "content": "POISON"}])
    alone = [reply_of(httpx.post(f"{url}/chat/completions", json=b, timeout=120)) for b in bodies]
    replies = burst(url, bodies[:2] + [bad] + bodies[2:], backend, arrivals)
    assert replies[2].status_code == 500 and "POISON" in replies[2].json()["error"]["message"]
    assert_same_replies([reply_of(r) for r in replies[:2] + replies[3:]], alone)
    assert_same_replies([reply_of(httpx.post(f"{url}/chat/completions", json=bodies[0], timeout=120))], alone[:1])


def test_mas_serve_forces_the_call_that_tool_choice_asks_for(policy_served):
    url, backend, _ = policy_served
    lookup = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    body = serve_body(0, tools=[lookup], tool_choice={"type": "function", "function": {"name": "lookup"}}, max_tokens=4)
    backend.batches.clear()
    resp = httpx.post(f"{url}/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    [row] = [r for b in backend.batches for r in b]
    start = '<tool_call>{"name": "lookup", "arguments": '
    assert row.prefix == start  # the backend continues the call's start, which ends the prompt ids
    tok = backend.backend.policies["main"].tokenizer
    ids = tok(start, add_special_tokens=False)["input_ids"]
    assert row.prompt_ids[-len(ids):] == ids
    [choice] = resp.json()["choices"]
    sampled = [t["token"] for t in choice["logprobs"]["content"]]
    # 4 sampled tokens cannot close the call: the reply is the start and what the model wrote after it
    assert 0 < len(sampled) <= 4 and choice["message"]["content"] == start + "".join(sampled)


def test_mas_serve_starts_a_json_reply_and_asks_for_it_in_the_system_message(policy_served):
    url, backend, _ = policy_served
    backend.batches.clear()
    resp = httpx.post(f"{url}/chat/completions", json=serve_body(0, response_format={"type": "json_object"}, max_tokens=4),
                      timeout=120)
    assert resp.status_code == 200, resp.text
    [row] = [r for b in backend.batches for r in b]
    assert row.prefix == "{" and row.messages[0]["content"].endswith("Reply with one JSON object and nothing else.")
    [choice] = resp.json()["choices"]
    assert choice["message"]["content"] == "{" + "".join(t["token"] for t in choice["logprobs"]["content"])
