"""Rollout engine: batching, replay, intervention and failed episodes."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json

import pytest
from team_helpers import team_config

from mas.agents.agent import build_agents
from mas.agents.prompts import PromptCache, render_prompt
from mas.rollout.backends.scripted import ScriptedBackend
from mas.config.schema import validate_config
from mas.rollout.engine import Engine, _copy_turn
from mas.rollout.script import MASK_TEXT
from mas.training.team import build_team
from mas.topologies import build_topology
from mas.types import InterventionRequest, ReplayRequest, Task, Turn

TASKS = [Task(f"t{i}", f"{i}+1", str(i + 1)) for i in range(3)]


def scripted_engine(cfg: dict, respond, tokenizer, score=lambda ep: float(ep.answer == ep.task.answer)):
    run = validate_config(cfg)
    backend = ScriptedBackend(respond, {p: tokenizer for p in run.policies})
    engine = Engine(build_topology(run.topology), build_agents(run.agents, run.team.name), {p: tokenizer for p in run.policies},
                    {p: True for p in run.policies}, backend, score)
    return engine, backend


def chain_respond(req):
    if req.agent == "lead":
        return f"ANSWER: {req.messages[-1]['content'].split('Task: ')[1].split()[0]}"
    if req.agent == "helper":
        return "ANSWER: 7"
    return "ACCEPT"


# --- batching ---------------------------------------------------------------------------------


def test_concurrent_episodes_share_one_backend_call_per_turn(tiny_tokenizer):
    """6 orchestrator episodes x (lead, helper, lead) = 3 rounds of batched calls, not 18."""

    def respond(req):
        if req.agent == "lead":
            return "ANSWER: 2" if len(req.messages) > 2 else "CALL helper: 1+1"
        return "ANSWER: 2"

    engine, backend = scripted_engine(team_config("m", "orchestrator"), respond, tiny_tokenizer)
    groups = engine.rollout(TASKS[:2], group_size=3, seed=0)
    assert backend.calls == 3 and backend.requests == 18
    for ep in (e for g in groups for e in g.episodes):
        assert [t.agent for t in ep.turns] == ["lead", "helper", "lead"]
        assert ep.turns[1].parent == 0 and ep.answer == "2" and ep.status == "ok"


def test_a_run_renders_each_distinct_prompt_once_and_every_turn_owns_its_prompt_ids(tiny_tokenizer, monkeypatch):
    """The episodes of a run share one PromptCache: the G episodes of a task open with the same
    prompt, rendered once; every turn still holds exactly render_prompt's ids, in its own list."""
    caches = []

    class Spy(PromptCache):
        def __init__(self):
            super().__init__()
            caches.append(self)

    monkeypatch.setattr("mas.rollout.engine.PromptCache", Spy)

    def respond(req):
        if req.agent == "lead":
            return "ANSWER: 2" if len(req.messages) > 2 else "CALL helper: 1+1"
        return "ANSWER: 2"

    engine, _ = scripted_engine(team_config("m", "orchestrator"), respond, tiny_tokenizer)
    groups = engine.rollout(TASKS[:2], group_size=3, seed=0)
    turns = [t for g in groups for e in g.episodes for t in e.turns]
    assert all(t.prompt_ids == render_prompt(tiny_tokenizer, t.messages) for t in turns)
    assert len({id(t.prompt_ids) for t in turns}) == len(turns)
    distinct = {repr(t.messages) for t in turns}  # both policies use this one tokenizer
    (cache,) = caches
    assert (cache.misses, cache.hits) == (len(distinct), len(turns) - len(distinct)) and cache.hits >= 12
    engine.rollout(TASKS[:1], group_size=1, seed=1)
    assert len(caches) == 2  # one memo per run: nothing carries over to the next rollout


def test_hf_backend_batches_concurrent_requests_into_one_generate_per_policy(tiny_model_dir, monkeypatch):
    team = build_team(validate_config(team_config(tiny_model_dir, "debate")))
    calls = []
    for name, policy in team.policies.items():
        orig = policy.model.generate

        def counted(*a, _orig=orig, _name=name, **kw):
            calls.append((_name, kw["input_ids"].shape[0]))
            return _orig(*a, **kw)

        monkeypatch.setattr(policy.model, "generate", counted)
    team.engine.rollout(TASKS[:2], group_size=3, seed=0)
    # 2 rounds; per round: one call for 'main' (lead+helper x 6 episodes), one for 'judge' (checker x 6)
    assert sorted(calls) == [("judge", 6), ("judge", 6), ("main", 12), ("main", 12)]


def test_a_policys_rollout_batch_tokens_reaches_its_generate_calls(tiny_model_dir, monkeypatch):
    """The config field is plumbed to the backend of the team that is built: with room for one
    prompt per call, each of the policy's generate calls holds one row."""
    cfg = team_config(tiny_model_dir, "debate")
    cfg["policies"]["main"]["rollout_batch_tokens"] = 1
    team = build_team(validate_config(cfg))
    assert team.runtime.backend.batch_tokens == {"main": 1, "judge": None}
    rows = []
    orig = team.policies["main"].model.generate

    def counted(*a, **kw):
        rows.append(kw["input_ids"].shape[0])
        return orig(*a, **kw)

    monkeypatch.setattr(team.policies["main"].model, "generate", counted)
    team.engine.rollout(TASKS[:2], group_size=3, seed=0)
    assert rows and set(rows) == {1} and len(rows) == 24  # 2 rounds x 12 requests, one per call


@pytest.mark.parametrize("topology", ["debate", "chain"])
def test_greedy_evaluation_gives_the_same_episodes_when_its_calls_are_cut_by_tokens(tiny_model_dir, monkeypatch, topology):
    """The default call budget (HFBackend.call_budgets) cuts an evaluation's greedy calls into
    several; every episode is the same as with every task in one call."""
    import mas.rollout.backends.hf as hf

    tasks = [Task(f"e{i}", f"{i}+{i % 3}", str(i + i % 3)) for i in range(10)]

    def evaluate(budget_rows: int | None):
        if budget_rows is not None:  # room for this many rows of 40-token prompts and 6 new tokens per call
            monkeypatch.setattr(hf, "default_call_budget", lambda device: budget_rows * row_bytes)
        team = build_team(validate_config(team_config(tiny_model_dir, topology)))
        rows: list[int] = []
        for policy in team.policies.values():
            orig = policy.model.generate

            def counted(*a, _orig=orig, **kw):
                rows.append(kw["input_ids"].shape[0])
                return _orig(*a, **kw)

            monkeypatch.setattr(policy.model, "generate", counted)
        episodes = team.engine.evaluate(tasks, seed=0)
        return [(ep.reward, [(t.agent, t.prompt_ids, t.completion_ids, t.text) for t in ep.turns]) for ep in episodes], rows

    team = build_team(validate_config(team_config(tiny_model_dir, topology)))
    row_bytes = hf.generate_bytes(team.policies["main"].model, 1, 40, 6)
    whole, whole_rows = evaluate(None)
    cut, cut_rows = evaluate(3)
    assert max(whole_rows) >= 10 and max(cut_rows) < 10 and len(cut_rows) > len(whole_rows)  # the bound did cut
    assert cut == whole


# --- replay -----------------------------------------------------------------------------------


@pytest.mark.parametrize("topology,freeze", [("chain", 2), ("debate", 3), ("orchestrator", 1)])
def test_replay_reuses_frozen_turns_exactly_and_resamples_after(tiny_model_dir, topology, freeze):
    team = build_team(validate_config(team_config(tiny_model_dir, topology)))
    src = team.engine.rollout(TASKS[:1], group_size=1, seed=0)[0].episodes[0]
    assert len(src.turns) > freeze
    res = team.engine.execute([ReplayRequest("r", src, freeze_upto=freeze, num_samples=4)], seed=123)["r"]
    assert len(res) == 4
    changed_after = 0
    for ep in res:
        assert ep.status != "error", ep.error
        for t, s in zip(ep.turns[:freeze], src.turns[:freeze]):
            assert t.replayed and not t.trainable
            assert t.prompt_ids == s.prompt_ids and t.completion_ids == s.completion_ids and t.text == s.text
        t = ep.turns[freeze]
        assert not t.replayed and t.agent == src.turns[freeze].agent
        changed_after += t.completion_ids != src.turns[freeze].completion_ids
    assert changed_after >= 3  # a random model at T=1 resamples: (almost) all differ from the source


def test_replay_of_a_tampered_episode_is_detected_and_marked(tiny_tokenizer):
    engine, _ = scripted_engine(team_config("m", "chain"), chain_respond, tiny_tokenizer)
    src = engine.rollout(TASKS[:1], 1, seed=0)[0].episodes[0]
    src.turns[1].prompt_ids = src.turns[1].prompt_ids[:-1]  # no longer what the topology renders
    ep = engine.execute([ReplayRequest("r", src, freeze_upto=2)], seed=0)["r"][0]
    assert ep.status == "error" and "ReplayDivergence" in ep.error and ep.reward == 0.0


# --- intervention -----------------------------------------------------------------------------


def test_mask_replaces_the_agents_message_and_keeps_the_others(tiny_tokenizer):
    engine, _ = scripted_engine(team_config("m", "chain"), chain_respond, tiny_tokenizer)
    src = engine.rollout(TASKS[:1], 1, seed=0)[0].episodes[0]
    assert [t.text for t in src.turns] == ["ANSWER: 0+1", "ANSWER: 7", "ACCEPT"]
    out = engine.execute([InterventionRequest("m", src, agents=("helper",), mode="mask")], seed=0)["m"][0]
    helper, checker = out.turns[1], out.turns[2]
    assert helper.text == MASK_TEXT and helper.finish_reason == "masked" and not helper.trainable
    assert f"helper: {MASK_TEXT}" in checker.messages[-1]["content"]
    assert checker.replayed and checker.text == "ACCEPT"  # keep_others reuses the realised output
    assert out.turns[0].replayed and out.answer == "0+1"


def test_remove_drops_the_message_from_what_others_see(tiny_tokenizer):
    engine, _ = scripted_engine(team_config("m", "chain"), chain_respond, tiny_tokenizer)
    src = engine.rollout(TASKS[:1], 1, seed=0)[0].episodes[0]
    out = engine.execute([InterventionRequest("x", src, agents=("helper",), mode="remove", keep_others=False)], seed=0)["x"][0]
    assert out.turns[1].finish_reason == "removed" and out.turns[1].text == ""
    assert "helper" not in out.turns[2].messages[-1]["content"]
    assert not out.turns[2].replayed  # sampled afresh without keep_others


# --- failures ---------------------------------------------------------------------------------


def test_failed_episode_is_marked_scored_zero_and_the_rest_go_on(tiny_tokenizer):
    def respond(req):
        if "Task: 1+1" in req.messages[-1]["content"] and req.agent == "lead":
            raise RuntimeError("backend exploded")
        return chain_respond(req)

    engine, _ = scripted_engine(team_config("m", "chain"), respond, tiny_tokenizer, score=lambda ep: 1.0)
    groups = engine.rollout(TASKS[:3], 2, seed=0)
    status = {(g.task.task_id, e.sample_id): (e.status, e.reward) for g in groups for e in g.episodes}
    assert status[("t1", 0)] == ("error", 0.0) and status[("t1", 1)] == ("error", 0.0)
    assert status[("t0", 0)] == ("ok", 1.0) and status[("t2", 1)] == ("ok", 1.0)
    assert "backend exploded" in groups[1].episodes[0].error
    assert groups[1].episodes[0].info["failure"] == "backend_error"  # not the team's doing: trainer.train_failed never trains it
    assert "failure" not in groups[0].episodes[0].info


def test_an_episode_whose_team_code_raises_fails_as_agent_error_with_its_turns_kept(tiny_tokenizer):
    class RaisesAfterOneCall:
        async def run(self, ctx):
            await ctx.call("lead", [{"role": "user", "content": "Task: " + ctx.task.prompt}])
            raise json.JSONDecodeError("Expecting value", "not json", 0)

    engine, _ = scripted_engine(team_config("m", "chain"), chain_respond, tiny_tokenizer, score=lambda ep: 1.0)
    engine.topology = RaisesAfterOneCall()
    (ep,) = [g.episodes[0] for g in engine.rollout(TASKS[:1], 1, seed=0)]
    assert ep.status == "error" and ep.reward == 0.0 and ep.error.startswith("JSONDecodeError: Expecting value")
    assert ep.info["failure"] == "agent_error" and len(ep.turns) == 1 and ep.turns[0].completion_ids
    assert engine.take_faults()[0]["agent_error"] == 1


def test_scorer_crash_marks_the_episode(tiny_tokenizer):
    def score(ep):
        raise ValueError("bad answer format")

    engine, _ = scripted_engine(team_config("m", "chain"), chain_respond, tiny_tokenizer, score=score)
    ep = engine.rollout(TASKS[:1], 1, seed=0)[0].episodes[0]
    assert ep.status == "error" and "bad answer format" in ep.error and ep.reward == 0.0
    assert ep.info["failure"] == "score_error"


@pytest.mark.parametrize("topology", ["orchestrator", "debate", "chain", "graph"])
def test_rollout_batches_and_samples_are_the_same_in_every_run(tiny_model_dir, topology):
    """Batch composition must not depend on timing (e.g. LangGraph's thread pool for sync code)."""
    team = build_team(validate_config(team_config(tiny_model_dir, topology)))
    sizes: list[int] = []
    generate = team.backend.generate_batch
    team.backend.generate_batch = lambda reqs, seed=None: (sizes.append(len(reqs)), generate(reqs, seed))[1]
    ids = lambda gs: [t.completion_ids for g in gs for e in g.episodes for t in e.turns]
    runs = []
    for _ in range(6):
        sizes.clear()
        runs.append((ids(team.engine.rollout(TASKS, 4, seed=5)), list(sizes)))
    assert all(r == runs[0] for r in runs)
    assert ids(team.engine.rollout(TASKS, 4, seed=6)) != runs[0][0]


def test_requests_that_could_only_be_silent_no_ops_are_rejected(tiny_tokenizer):
    engine, _ = scripted_engine(team_config("m", "chain"), chain_respond, tiny_tokenizer)
    src = engine.rollout(TASKS[:1], 1, seed=0)[0].episodes[0]
    with pytest.raises(ValueError, match="unknown agents"):
        engine.execute([InterventionRequest("x", src, agents=("nobody",))], seed=0)
    with pytest.raises(ValueError, match="freeze_upto"):
        engine.execute([ReplayRequest("r", src, freeze_upto=-1)], seed=0)


def test_replayed_turns_do_not_share_state_with_the_source(tiny_tokenizer):
    engine, _ = scripted_engine(team_config("m", "chain"), chain_respond, tiny_tokenizer)
    src = engine.rollout(TASKS[:1], 1, seed=0)[0].episodes[0]
    out = engine.execute([ReplayRequest("r", src, freeze_upto=3)], seed=0)["r"][0]
    out.turns[0].parsed["answer"] = "changed"
    out.turns[0].completion_ids.append(99)
    assert src.turns[0].parsed["answer"] == "0+1" and 99 not in src.turns[0].completion_ids


def test_a_replayed_turn_is_the_deep_copy_of_its_source_with_the_changes(tiny_tokenizer):
    """The engine's copy skips the fields a replay replaces; it must equal the plain reference,
    deepcopy then replace, and share no mutable state with the source."""
    shared = {"args": {"q": [1, 2]}}
    src = Turn(agent="a", policy="p", index=2, parent=0, messages=[{"role": "user", "content": "q"}], prompt_ids=[5, 6, 7],
               completion_ids=[8, 9], logprobs=[-0.5, -0.25], text="ANSWER: 3", parsed={"answer": "3", "label": "answer"},
               tool_calls=[shared, shared], observations=["obs"], extra_rewards={"tool_valid": 1.0}, weight_version=4)
    changes = dict(messages=[{"role": "user", "content": "r"}], prompt_ids=[1], index=5, replayed=True, trainable=False)
    out = _copy_turn(src, **changes)
    assert out == dataclasses.replace(copy.deepcopy(src), **changes)
    assert out.tool_calls[0] is out.tool_calls[1]  # sharing inside the turn kept, as deepcopy keeps it
    for name in ("completion_ids", "logprobs", "parsed", "tool_calls", "observations", "extra_rewards"):
        assert getattr(out, name) is not getattr(src, name)
    assert out.tool_calls[0] is not shared and out.tool_calls[0]["args"]["q"] is not shared["args"]["q"]
    assert out.messages is changes["messages"] and out.prompt_ids is changes["prompt_ids"]


class ManualClock:
    """Time that passes only when the test says so: ``Engine(sleep=clock.sleep)``."""

    def __init__(self):
        self.now = 0.0
        self.sleepers: list[tuple[float, asyncio.Future]] = []

    async def sleep(self, seconds: float) -> None:
        fut = asyncio.get_running_loop().create_future()
        self.sleepers.append((self.now + seconds, fut))
        await fut

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for due, fut in self.sleepers:
            if due <= self.now and not fut.done():
                fut.set_result(None)


def test_an_episode_over_its_time_limit_is_marked_and_the_rest_finish(tiny_tokenizer):
    """Time passes only when task 1's episode loops back (after the others are done), so the
    limit is reached by that episode alone however busy the machine is."""
    clock = ManualClock()
    loop_backs = []

    def respond(req):
        content = req.messages[-1]["content"]
        if "Task: 1+1" in content and req.agent == "checker" and "REJECT" not in content:
            return "REJECT"  # task 1 loops back once: three more turns after the others are done
        if "Task: 1+1" in content and "REJECT" in content:
            loop_backs.append(req.agent)
            clock.advance(0.15)  # ... and each of them takes 0.15 s of the episode's 0.2 s
        return chain_respond(req)

    engine, _ = scripted_engine(team_config("m", "chain"), respond, tiny_tokenizer, score=lambda ep: 1.0)
    engine.episode_timeout = 0.2
    engine.sleep = clock.sleep
    groups = engine.rollout(TASKS[:3], 1, seed=0)
    status = [g.episodes[0].status for g in groups]
    assert status[1] == "error" and "timeout" in groups[1].episodes[0].error
    assert status[0] == status[2] == "ok"
    assert len(loop_backs) == 2  # the second slow turn crossed the limit; the third never ran
    assert engine.take_faults()[0]["episode_timeout"] == 1


def rollout_in_thread(engine, tasks) -> list:
    """``engine.rollout(tasks, 1)``'s episodes, in a thread joined with a guard: a hang fails the test."""
    import threading

    out: dict = {}
    worker = threading.Thread(target=lambda: out.setdefault("groups", engine.rollout(tasks, 1, seed=0)), daemon=True)
    worker.start()
    worker.join(timeout=120)  # a guard against a hang, not a speed assertion
    assert not worker.is_alive(), "the rollout waited forever for a stopped episode"
    return [g.episodes[0] for g in out["groups"]]


class _Stubborn:
    """A topology that ignores its first cancellation (as a framework's clean-up may: AutoGen's
    waits for its agents) and waits on; the second cancellation ends it."""

    def __init__(self):
        self.cancelled = 0

    async def run(self, ctx):
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                if self.cancelled > 1:
                    raise


def test_a_timed_out_episode_that_ignores_its_cancellation_is_left_behind_not_waited_for(tiny_tokenizer):
    async def deadline_passes(seconds):  # an injected clock: the limit, and the grace after it, are up at once
        return None

    engine, _ = scripted_engine(team_config("m", "chain"), chain_respond, tiny_tokenizer, score=lambda ep: 1.0)
    stubborn = engine.topology = _Stubborn()
    engine.episode_timeout, engine.sleep = 20.0, deadline_passes
    (ep,) = rollout_in_thread(engine, TASKS[:1])
    assert ep.status == "error" and ep.error.startswith("timeout: episode exceeded 20.0s")
    assert engine.take_faults()[0]["episode_timeout"] == 1
    assert stubborn.cancelled == 2  # cancelled once by the timeout, once more by the run's clean-up, which ended it


class _Persistent:
    """A topology that goes on calling its model through its cancellation (as AutoGen's clean-up
    does: it waits for agents that call their models), and answers once a call is refused."""

    async def run(self, ctx):
        from mas.rollout.engine import EpisodeStopped
        from mas.types import Outcome

        calls = 0
        while True:
            try:
                await ctx.call("lead", [{"role": "user", "content": f"Task: {calls}"}])
                calls += 1
            except asyncio.CancelledError:
                ctx.episode.info["cancelled"] = True
            except EpisodeStopped as exc:
                ctx.episode.info["refused"] = str(exc)
                return Outcome(answer="1")


def test_after_the_deadline_every_model_call_raises_and_the_episode_fails_even_if_the_team_answers(tiny_tokenizer):
    clock = ManualClock()
    served = []

    def respond(req):
        served.append(req)
        if len(served) == 3:
            clock.advance(1.0)
        return "ANSWER: 1"

    engine, backend = scripted_engine(team_config("m", "chain"), respond, tiny_tokenizer, score=lambda ep: 1.0)
    engine.topology = _Persistent()
    engine.episode_timeout, engine.sleep = 1.0, clock.sleep
    (ep,) = rollout_in_thread(engine, TASKS[:1])
    assert ep.info["cancelled"] and ep.info["refused"].startswith("timeout: episode exceeded 1.0s")  # ctx.call refused
    assert ep.status == "error" and ep.reward == 0.0 and backend.requests == 3 and len(ep.turns) == 3
    assert ep.info["failure"] == "episode_timeout"
    faults, _ = engine.take_faults()
    assert faults["episode_timeout"] == 1 and faults["agent_error"] == faults["backend_error"] == 0


def test_without_a_time_limit_no_timer_runs(tiny_tokenizer):
    clock = ManualClock()
    engine, _ = scripted_engine(team_config("m", "chain"), chain_respond, tiny_tokenizer, score=lambda ep: 1.0)
    engine.sleep = clock.sleep
    groups = engine.rollout(TASKS[:2], 1, seed=0)
    assert all(g.episodes[0].status == "ok" for g in groups) and clock.sleepers == []


def test_a_backend_that_loses_results_fails_the_episodes_instead_of_hanging(tiny_tokenizer):
    engine, backend = scripted_engine(team_config("m", "chain"), chain_respond, tiny_tokenizer)
    real = backend.generate_batch
    backend.generate_batch = lambda reqs, seed=None: real(reqs, seed)[:-1]
    groups = engine.rollout(TASKS[:2], 1, seed=0)
    assert all(g.episodes[0].status == "error" for g in groups)


def test_critiques_run_batched_with_replays_and_equal_keys_run_once(tiny_tokenizer):
    from mas.types import CritiqueRequest

    seen = []

    def respond(req):
        seen.append(req.agent)
        if req.agent.startswith("critic:"):
            return f"PROCESS_SCORE: {len(req.messages[-1]['content'])}"
        return chain_respond(req)

    engine, backend = scripted_engine(team_config("m", "chain"), respond, tiny_tokenizer)
    src = engine.rollout(TASKS[:1], 1, seed=0)[0].episodes[0]
    seen.clear()
    ask = CritiqueRequest("c1", "judge", (("system", "Score it."), ("user", "abcd")))
    replay = ReplayRequest("r", src, freeze_upto=2)
    out = engine.execute([ask, replay, ask, ReplayRequest("r", src, freeze_upto=2)], seed=0)
    assert out["c1"] == ["PROCESS_SCORE: 4"] and len(out["r"]) == 1
    assert seen.count("critic:judge") == 1 and seen.count("checker") == 1  # each key evaluated once
    with pytest.raises(ValueError, match="unknown policy"):
        engine.execute([CritiqueRequest("c2", "nobody", (("user", "x"),))], seed=0)


def test_intervention_can_resample_the_synthesiser_while_keeping_the_others(tiny_tokenizer):
    def respond(req):
        if req.agent == "checker":  # the synthesiser: its verdict depends on what it can read
            return "REJECT" if "[masked]" in req.messages[-1]["content"] else "ACCEPT"
        return chain_respond(req)

    engine, _ = scripted_engine(team_config("m", "chain"), respond, tiny_tokenizer)
    src = engine.rollout(TASKS[:1], 1, seed=0)[0].episodes[0]
    kept = engine.execute([InterventionRequest("k", src, agents=("helper",))], seed=0)["k"][0]
    fresh = engine.execute([InterventionRequest("f", src, agents=("helper",), resample=("checker",))], seed=0)["f"][0]
    assert kept.turns[2].text == "ACCEPT" and kept.turns[2].replayed  # realised output reused
    assert fresh.turns[2].text == "REJECT" and not fresh.turns[2].replayed  # re-read the masked team
    assert fresh.turns[0].replayed  # the lead still keeps its realised output


def test_resampled_agents_replay_their_turns_before_the_first_masked_message(tiny_tokenizer):
    """An orchestrator planning before any masked turn keeps its recorded plan (nothing changed yet)."""
    calls = []

    def respond(req):
        calls.append(req.agent)
        if req.agent == "lead":
            n = sum(m["role"] == "assistant" for m in req.messages)
            return ["CALL helper: 1+1", "ANSWER: 2"][min(n, 1)]
        return "ANSWER: 2"

    engine, _ = scripted_engine(team_config("m", "orchestrator"), respond, tiny_tokenizer)
    src = engine.rollout(TASKS[:1], 1, seed=0)[0].episodes[0]
    calls.clear()
    out = engine.execute([InterventionRequest("x", src, agents=("helper",), resample=("lead",))], seed=0)["x"][0]
    assert out.turns[0].replayed and out.turns[1].finish_reason == "masked"
    assert not out.turns[2].replayed and calls == ["lead"]  # only the turn after the masked one is re-sampled


def test_a_bug_in_the_batch_server_stops_the_rollout_with_its_error_instead_of_hanging(tiny_tokenizer):
    """If serving a batch raises outside the backend (here: counting its tokens), the episodes
    waiting on it are released and the rollout raises that error; before, they waited forever."""
    import threading

    engine, _ = scripted_engine(team_config("m", "chain"), chain_respond, tiny_tokenizer)

    def broken_count(req, res):
        raise ValueError("token count exploded")

    engine._generated_tokens = broken_count
    out: dict = {}

    def run():
        try:
            out["groups"] = engine.rollout(TASKS[:3], 2, seed=0)
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            out["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=120)  # a guard against the old hang, not a speed assertion
    assert not worker.is_alive(), "the rollout hung on a dead batch server"
    assert isinstance(out.get("error"), ValueError) and "token count exploded" in str(out["error"])
