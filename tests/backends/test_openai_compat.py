"""The OpenAI-compatible chat backend against a real HTTP server on 127.0.0.1 (never any other address)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mas.agents.prompts import PLAIN_GENERATION_PROMPT, PLAIN_MESSAGE, render_prompt
from mas.rollout.backends.base import GenRequest, RoutedBackend
from mas.rollout.backends.openai_compat import ChatOnlyTokenizer, EndpointError, OpenAICompatBackend


class ChatServer:
    """A local /v1/chat/completions endpoint; ``respond(body) -> (status, payload)`` is set per test.

    ``payload`` may also be a callable ``write(handler)`` that writes the raw reply itself
    (for replies that trickle or never end)."""

    def __init__(self):
        self.calls: list[dict] = []  # {"path", "headers", "body"}
        self.lock = threading.Lock()
        self.respond = lambda body: (200, reply(f"echo {body['messages'][-1]['content']}"))
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server API
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                body = json.loads(raw)
                with server.lock:
                    server.calls.append({"path": self.path, "headers": dict(self.headers), "body": body})
                status, payload = server.respond(body)
                if callable(payload):
                    try:
                        payload(self)
                    except (BrokenPipeError, ConnectionResetError):
                        pass
                    return
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (the timeout test)

            def log_message(self, *args):  # keep test output clean
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def reply(text, finish="stop") -> dict:
    return {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}]}


@pytest.fixture()
def server():
    s = ChatServer()
    yield s
    s.close()


def request(content="hi", **kw) -> GenRequest:
    msgs = [{"role": "system", "content": "You judge."}, {"role": "user", "content": content}]
    base = dict(policy="critic", prompt_ids=[1, 2], temperature=0.0, top_p=0.9, top_k=20, max_new_tokens=33, agent="critic:critic", messages=msgs)
    return GenRequest(**{**base, **kw})


def test_posts_the_chat_messages_and_reads_the_reply(server, monkeypatch):
    monkeypatch.setenv("MAS_TEST_KEY", "sk-test-123")
    backend = OpenAICompatBackend(server.base_url, "judge-model", api_key_env="MAS_TEST_KEY", extra_body={"top_k": 20})
    [res] = backend.generate_batch([request("score this")])
    assert res.text == "echo score this" and res.finish_reason == "stop"
    assert res.completion_ids == [] and res.logprobs == []  # a remote policy is never trained
    call = server.calls[0]
    assert call["path"] == "/v1/chat/completions"
    assert call["headers"]["Authorization"] == "Bearer sk-test-123" and call["headers"]["Content-Type"] == "application/json"
    assert call["body"] == {
        "model": "judge-model",
        "messages": [{"role": "system", "content": "You judge."}, {"role": "user", "content": "score this"}],
        "max_tokens": 33,
        "temperature": 0.0,
        "top_p": 0.9,
        "n": 1,
        "top_k": 20,
    }
    assert "sk-test" not in repr(backend)


def test_no_key_means_no_authorization_header_and_top_k_is_not_sent(server, monkeypatch):
    monkeypatch.delenv("MAS_TEST_KEY", raising=False)
    OpenAICompatBackend(server.base_url + "/", "m", api_key_env="MAS_TEST_KEY").generate_batch([request()])
    call = server.calls[0]
    assert "Authorization" not in call["headers"] and "top_k" not in call["body"]
    assert call["path"] == "/v1/chat/completions"  # a trailing slash on base_url is fine


def test_a_forced_start_is_sent_as_an_assistant_message_to_continue(server):
    start = '<tool_call>{"name": "'
    [res] = OpenAICompatBackend(server.base_url, "m").generate_batch([request("call a tool", prefix=start)])
    body = server.calls[0]["body"]
    assert body["messages"][-1] == {"role": "assistant", "content": start} and len(body["messages"]) == 3
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False  # vLLM's chat extensions
    assert res.text == f"echo {start}"  # what the server wrote (this one echoes the last message)
    OpenAICompatBackend(server.base_url, "m").generate_batch([request("no start")])
    assert "continue_final_message" not in server.calls[1]["body"] and len(server.calls[1]["body"]["messages"]) == 2


@pytest.mark.parametrize("finish,expected", [("stop", "stop"), ("length", "length"), ("content_filter", "stop"), (None, "stop"), ("tool_calls", "stop")])
def test_finish_reason(server, finish, expected):
    server.respond = lambda body: (200, reply("t", finish))
    assert OpenAICompatBackend(server.base_url, "m").generate_batch([request()])[0].finish_reason == expected


def test_concurrent_requests_come_back_in_request_order(server):
    """Later requests answer first (the server sleeps less for them); results keep request order."""
    active, peak = [0], [0]

    def respond(body):
        i = int(body["messages"][-1]["content"])
        with server.lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.02 * (6 - i))
        with server.lock:
            active[0] -= 1
        return 200, reply(f"r{i}")

    server.respond = respond
    backend = OpenAICompatBackend(server.base_url, "m", max_concurrency=6)
    out = backend.generate_batch([request(str(i)) for i in range(6)])
    assert [r.text for r in out] == [f"r{i}" for i in range(6)]
    assert peak[0] > 1 and backend.requests == 6


def test_transient_errors_are_retried(server):
    status = iter([503, 429, 200])
    server.respond = lambda body: (s := next(status), reply("ok") if s == 200 else {"error": "busy"})
    backend = OpenAICompatBackend(server.base_url, "m", max_retries=2, retry_backoff_s=0.001)
    assert backend.generate_batch([request()])[0].text == "ok" and len(server.calls) == 3


def test_persistent_and_client_errors_raise_naming_the_endpoint(server):
    server.respond = lambda body: (503, {"error": "down"})
    with pytest.raises(EndpointError, match=r"HTTP 503.*after 2 attempts"):
        OpenAICompatBackend(server.base_url, "m", max_retries=1, retry_backoff_s=0.001).generate_batch([request()])
    server.calls.clear()
    server.respond = lambda body: (400, {"error": {"message": "unknown model 'm'"}})
    with pytest.raises(EndpointError, match=r"127\.0\.0\.1.*HTTP 400.*unknown model") as info:
        OpenAICompatBackend(server.base_url, "m", max_retries=3).generate_batch([request()])
    assert len(server.calls) == 1  # a client error is not retried
    assert "/chat/completions" in str(info.value)


@pytest.mark.parametrize("payload", [b"not json", {"choices": []}, {"choices": [{"message": {}}]}, {"error": "x"}])
def test_malformed_replies_raise(server, payload):
    server.respond = lambda body: (200, payload)
    with pytest.raises(EndpointError):
        OpenAICompatBackend(server.base_url, "m").generate_batch([request()])


def test_a_timeout_is_an_endpoint_error(server):
    server.respond = lambda body: (time.sleep(0.5), (200, reply("late")))[1]
    with pytest.raises(EndpointError, match="after 1 attempts"):
        OpenAICompatBackend(server.base_url, "m", timeout_s=0.1, max_retries=0).generate_batch([request()])


# --- endpoint faults: bounded retries, then one clear error naming the endpoint -----------------------


def _hang(handler):
    time.sleep(3)  # far past the client's limit (bounded, so the server thread ends)


def _trickle(handler):
    """Headers at once, then one byte every 50 ms: no single read waits past the limit."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", "100000")
    handler.end_headers()
    for _ in range(200):
        handler.wfile.write(b" ")
        handler.wfile.flush()
        time.sleep(0.05)


def _huge(handler):
    from mas.rollout.backends.openai_compat import MAX_REPLY_BYTES

    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.end_headers()
    chunk = b" " * 65536
    for _ in range(MAX_REPLY_BYTES // len(chunk) + 2):
        handler.wfile.write(chunk)


@pytest.mark.parametrize(
    "fault, payload, message",
    [
        ("500s", (500, {"error": "internal"}), "HTTP 500"),
        ("malformed JSON", (200, b'{"choices": [{"message": '), "reply is not JSON"),
        ("empty choices", (200, {"choices": []}), "no choices"),
        ("no content", (200, {"choices": [{"message": {"role": "assistant"}}]}), "no choices"),
        ("hang", (200, _hang), "timeout"),
        ("trickle", (200, _trickle), "timeout"),
    ],
)
def test_endpoint_faults_are_retried_a_bounded_number_of_times_then_name_the_endpoint(server, fault, payload, message):
    server.respond = lambda body: payload
    backend = OpenAICompatBackend(server.base_url, "m", timeout_s=0.3, max_retries=2, retry_backoff_s=0.01)
    with pytest.raises(EndpointError) as info:
        backend.generate_batch([request()])
    text = str(info.value)
    assert backend.url in text and message in text and "after 3 attempts" in text, text
    assert len(server.calls) == 3  # one attempt and two retries, no more


def test_a_reply_larger_than_the_limit_is_refused_without_retries(server):
    server.respond = lambda body: (200, _huge)
    with pytest.raises(EndpointError, match="larger than"):
        OpenAICompatBackend(server.base_url, "m", timeout_s=30, max_retries=2, retry_backoff_s=0.01).generate_batch([request()])
    assert len(server.calls) == 1


def test_a_closed_port_is_a_bounded_endpoint_error():
    import socket

    with socket.socket() as s:  # a port nobody listens on (bound, never listening)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(EndpointError, match=rf"127\.0\.0\.1:{port}/v1/chat/completions: Connect.*after 2 attempts"):
            OpenAICompatBackend(f"http://127.0.0.1:{port}/v1", "m", timeout_s=1, max_retries=1, retry_backoff_s=0.01).generate_batch([request()])


def test_a_transient_fault_that_clears_costs_only_a_retry(server):
    replies = iter([(200, b"garbage"), (200, {"choices": []}), (200, reply("fine"))])
    server.respond = lambda body: next(replies)
    assert OpenAICompatBackend(server.base_url, "m", max_retries=2, retry_backoff_s=0.01).generate_batch([request()])[0].text == "fine"


def test_requests_without_messages_and_training_are_refused():
    backend = OpenAICompatBackend("http://127.0.0.1:9/v1", "m")
    with pytest.raises(ValueError, match="no chat messages"):
        backend.generate_batch([request(messages=None)])
    with pytest.raises(RuntimeError, match="kind: frozen"):
        backend.sync_weights("critic")
    with pytest.raises(ValueError, match="http"):
        OpenAICompatBackend("127.0.0.1:8000", "m")


def test_constructor_takes_the_proposed_endpoint_config_fields(server):
    """The YAML ``endpoint`` section proposed for PolicyConfig maps 1:1 onto the constructor."""
    endpoint = {"base_url": server.base_url, "api_key_env": "OPENAI_API_KEY", "timeout_s": 30, "max_concurrency": 4,
                "max_retries": 1, "retry_backoff_s": 0.5, "extra_body": {}}
    assert OpenAICompatBackend(model="judge-model", **endpoint).generate_batch([request("x")])[0].text == "echo x"


def test_chat_only_tokenizer_renders_plain_prompts_as_utf8_bytes():
    tok = ChatOnlyTokenizer()
    msgs = [{"role": "user", "content": "Größe?"}]
    ids = render_prompt(tok, msgs)
    assert bytes(ids).decode("utf-8") == PLAIN_MESSAGE.format(role="user", content="Größe?") + PLAIN_GENERATION_PROMPT
    assert render_prompt(tok, msgs) == ids and render_prompt(tok, [{"role": "user", "content": "other"}]) != ids


# --- through the engine: a remote critic and a remote frozen agent ---------------------------------------------


def test_a_remote_critic_and_a_remote_frozen_agent_through_the_engine(server, tiny_tokenizer):
    """Agents lead/helper on a scripted backend, checker and the critic on the HTTP endpoint (one
    'judge' policy), routed by policy; the critic's replies become MAPPA scores; a 500 from the
    endpoint becomes an empty reply, i.e. a counted parse failure."""
    from mas.agents.agent import build_agents
    from mas.rollout.backends.scripted import ScriptedBackend
    from mas.config.schema import validate_config
    from mas.credit import build_credit_batch, plan_credit, run_credit
    from mas.rollout.engine import Engine
    from mas.topologies import build_topology
    from mas.types import Task

    def respond(body):
        content = body["messages"][-1]["content"]
        if "**Current agent being evaluated:**" in content:
            if "\nhelper\n" in content:
                return 500, {"error": "critic overloaded"}
            return 200, reply("PROCESS_SCORE: 7")
        return 200, reply("ACCEPT")  # the checker agent

    server.respond = respond
    cfg = {
        "team": {"name": "remote"},
        "policies": {"main": {"kind": "full", "model": "m", "device": "cpu"}, "judge": {"kind": "frozen", "model": "m", "device": "cpu"}},
        "agents": [
            {"name": "lead", "policy": "main", "role": "Lead.", "parser": "orchestrator"},
            {"name": "helper", "policy": "main", "role": "Help.", "parser": "answer"},
            {"name": "checker", "policy": "judge", "role": "Check.", "parser": "verdict"},
        ],
        "topology": {"kind": "chain", "sequence": ["lead", "helper", "checker"]},
        "env": {"name": "synthetic_math", "num_ops": 1, "seed": 0},
        "credit": {"method": "critic", "critic": "judge", "normaliser": "none"},
    }
    run = validate_config(cfg)
    scripted = ScriptedBackend(lambda req: "ANSWER: 2" if req.agent == "lead" else "ANSWER: 7", {"main": tiny_tokenizer})
    remote = OpenAICompatBackend(server.base_url, "judge-model", max_retries=0)
    backend = RoutedBackend({"main": scripted, "judge": remote})
    engine = Engine(build_topology(run.topology), build_agents(run.agents, run.team.name),
                    {"main": tiny_tokenizer, "judge": ChatOnlyTokenizer()}, {"main": True, "judge": False}, backend,
                    score=lambda ep: 1.0)
    groups = engine.rollout([Task("t0", "1+1", "2")], group_size=2, seed=0)
    for ep in groups[0].episodes:
        checker = ep.turns[2]
        assert checker.text == "ACCEPT" and checker.completion_ids == [] and not checker.trainable and ep.reward == 1.0
    results = engine.execute(plan_credit(groups, run.credit), seed=1)
    credit = run_credit(build_credit_batch(groups, list(run.agent_names)), run.credit, results)
    assert credit.breakdown["critic_score"].tolist() == [7.0, 5.0, 7.0] * 2
    assert credit.breakdown["parse_failures"].item() == 2 and credit.breakdown["fallbacks"].item() == 2
    assert all(c["body"]["model"] == "judge-model" for c in server.calls)


def test_a_remote_critic_from_yaml_trains_a_team_step(server, tiny_model_dir, tmp_path, monkeypatch):
    """backend: openai in a config: the policy is built without weights, routed to the server,
    and the critic method's prompts reach it; the local policy trains as usual."""
    import math

    import yaml

    from mas.rollout.backends import RoutedBackend
    from mas.rollout.backends.openai_compat import OpenAICompatBackend as Remote
    from mas.config.schema import ConfigError, load_config
    from mas.training.team import build_team
    from mas.training.trainer import train_step

    server.respond = lambda body: (200, reply("PROCESS_SCORE: 7" if "helper" in body["messages"][-1]["content"] else "PROCESS_SCORE: 2"))
    data = {
        "team": {"name": "remote-critic"},
        "policies": {
            "main": {"model": str(tiny_model_dir), "device": "cpu", "optim": {"lr": 1e-2}},
            "coach": {"kind": "frozen", "backend": "openai", "model": "judge-model", "endpoint": {"base_url": server.base_url}},
        },
        "agents": [
            {"name": "lead", "policy": "main", "role": "You lead.", "sampling": {"max_new_tokens": 4}},
            {"name": "helper", "policy": "main", "role": "You help.", "sampling": {"max_new_tokens": 4}},
        ],
        "topology": {"kind": "chain", "sequence": ["lead", "helper"]},
        "env": {"name": "synthetic_math", "num_ops": 1},
        "credit": {"method": "critic", "critic": "coach"},
        "trainer": {"batch_size": 1, "group_size": 2},
    }
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(data))
    team = build_team(load_config(path))
    assert isinstance(team.backend, RoutedBackend) and isinstance(team.backend.routes["coach"], Remote)
    assert team.policies["coach"].model is None and set(team.learners) == {"main"}
    metrics = train_step(team, 0).metrics
    assert len(server.calls) == 4  # one critique per action: 2 episodes x 2 turns
    assert all(c["body"]["model"] == "judge-model" for c in server.calls)
    assert math.isfinite(metrics["policies"]["main"]["loss"]) and metrics["credit_cost"]["critiques"] == 4
    data["policies"]["coach"]["kind"] = "full"  # a remote model cannot be trained
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="kind: frozen"):
        load_config(path)


@pytest.mark.parametrize(
    "fault, payload",
    [("500s", (500, {"error": "overloaded"})), ("malformed JSON", (200, b"{not json")), ("empty choices", (200, {"choices": []})),
     ("hang", (200, _hang))],
)
def test_a_failing_critic_endpoint_never_stops_training(server, tiny_model_dir, tmp_path, fault, payload):
    """Every critique fails (after its bounded retries): each falls back to MAPPA's score 5, the
    run finishes, every failed critique is a counted fault, and the warning names the endpoint."""
    import math

    from mas.config.schema import validate_config
    from mas.training.team import build_team
    from mas.training.trainer import train

    server.respond = lambda body: payload
    cfg = validate_config({
        "team": {"name": "remote-critic"},
        "policies": {
            "main": {"model": str(tiny_model_dir), "device": "cpu", "optim": {"lr": 1e-2}},
            "coach": {"kind": "frozen", "backend": "openai", "model": "judge-model",
                      "endpoint": {"base_url": server.base_url, "timeout_s": 0.3, "max_retries": 1, "retry_backoff_s": 0.01}},
        },
        "agents": [
            {"name": "lead", "policy": "main", "role": "You lead.", "sampling": {"max_new_tokens": 4}},
            {"name": "helper", "policy": "main", "role": "You help.", "sampling": {"max_new_tokens": 4}},
        ],
        "topology": {"kind": "chain", "sequence": ["lead", "helper"]},
        "env": {"name": "synthetic_math", "num_ops": 1},
        "credit": {"method": "critic", "critic": "coach"},
        "trainer": {"steps": 2, "batch_size": 1, "group_size": 2, "eval_size": 0},
        "logging": {"progress": False},
    })
    team = build_team(cfg)
    train(team, tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        critiques = r["credit_cost"]["critiques"]  # 4 first-round critiques and 4 format retries
        assert critiques == 8 and r["faults"]["critic_error"] == critiques
        assert r["credit"]["fallbacks"] == 4 and math.isfinite(r["policies"]["main"]["loss"])
    assert len(server.calls) == 2 * 8 * 2  # every critique tried twice (one retry), no more
    warnings = [json.loads(line) for line in (tmp_path / "run" / "warnings.jsonl").read_text().splitlines()]
    assert {w["kind"] for w in warnings} == {"fault.critic_error"}
    assert all(server.base_url in w["message"] and "after 2 attempts" in w["message"] for w in warnings)


def test_one_failed_request_fails_alone_and_nothing_is_sent_twice(server, tiny_tokenizer):
    """Requests to an endpoint fail one by one (BatchError): the others keep their replies, the
    scripted policy's requests in the same batch are not repeated, and no request is re-sent."""
    from mas.rollout.backends.base import BatchError
    from mas.rollout.backends.scripted import ScriptedBackend

    server.respond = lambda body: (500, {"error": "x"}) if body["messages"][-1]["content"] == "bad" else (200, reply("ok"))
    scripted = ScriptedBackend(lambda req: "local", {"main": tiny_tokenizer})
    routed = RoutedBackend({"main": scripted, "judge": OpenAICompatBackend(server.base_url, "m", max_retries=1, retry_backoff_s=0.01)})
    reqs = [request("good", policy="judge"), request("bad", policy="judge"), request("x", policy="main")]
    with pytest.raises(BatchError) as info:
        routed.generate_batch(reqs)
    results, errors = info.value.results, info.value.errors
    assert [r.text if r else None for r in results] == ["ok", None, "local"]
    assert errors[0] is None and isinstance(errors[1], EndpointError) and errors[2] is None
    assert sorted(c["body"]["messages"][-1]["content"] for c in server.calls) == ["bad", "bad", "good"]  # one retry, once
    assert scripted.calls == 1


def test_a_remote_reply_counts_the_completion_tokens_its_endpoint_reports():
    """A remote endpoint returns text, no ids: the generated-token count (the compute a study's
    token budget matches) takes the reply's usage.completion_tokens, and nothing bogus from it."""
    from mas.rollout.backends.openai_compat import _result

    def body(usage):
        return {"choices": [{"message": {"content": "ACCEPT"}, "finish_reason": "stop"}], **usage}

    assert _result(body({"usage": {"completion_tokens": 5}}), "u").usage_tokens == 5
    for bad in ({}, {"usage": None}, {"usage": {"completion_tokens": -1}}, {"usage": {"completion_tokens": "5"}},
                {"usage": {"completion_tokens": True}}):
        assert _result(body(bad), "u").usage_tokens is None
