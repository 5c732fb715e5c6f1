"""The OpenAI-compatible endpoint's server (mas/rollout/endpoint.py) against hostile clients: every
bad request gets a 4xx with OpenAI's error body and changes nothing, and the server keeps serving."""

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


def test_random_bytes_never_crash_the_server(served):
    server, token, session, client = served
    rng = random.Random(0)
    pieces = [b"{", b"}", b"[", b"]", b'"model"', b'"solver"', b":", b",", b'"messages"', b"null", b"1e999", b'"\\ud800"',
              b'{"role": "user", "content": "x"}', b"\x00", b"\xc3"]
    for _ in range(200):
        body = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        resp = client.post(f"{server.url(token)}/chat/completions", content=body)
        assert resp.status_code in (200, 400, 404), (body, resp.text)
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
