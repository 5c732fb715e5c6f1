"""The memory plan's generation term (mas.learning.memory_plan): the largest hf generate call of a
run, from a step's rollout and a held-out evaluation's greedy and sampled passes, as the backend
cuts them into calls, with the prompts the context check's bound gives; sizes by hand on a tiny model."""

from __future__ import annotations

from team_helpers import team_config
from transformers import AutoConfig

from mas.config.schema import validate_config
from mas.learning.memory_plan import context_bounds, generation_passes, longest_prompts, plan_run


def shape(model_dir):
    c = AutoConfig.from_pretrained(model_dir)
    head_dim = c.hidden_size // c.num_attention_heads
    kv = (getattr(c, "num_key_value_heads", None) or c.num_attention_heads) * head_dim
    return c, kv


def call_bytes(model_dir, rows: int, prompt: int, new: int, size: int = 4) -> int:
    """One generate call by hand: the prefill (keys, values and one layer's activations a prompt
    token) or the decoding (the KV cache of prompts and replies, and new x vocabulary float32
    logits a row), whichever is larger."""
    c, kv = shape(model_dir)
    per_prompt = size * (2 * c.num_hidden_layers * kv + 8 * c.hidden_size + 6 * c.intermediate_size)
    kv_token = size * 2 * c.num_hidden_layers * kv
    return max(rows * prompt * per_prompt, rows * (prompt + new) * kv_token + rows * new * c.vocab_size * 4)


def policy(plans, name):
    return next(p for d in plans for p in d.policies if p.name == name)


def test_a_steps_rollout_asks_with_every_episode_at_once(tiny_model_dir):
    cfg = validate_config(team_config(tiny_model_dir, "chain"))  # eval_size 0: the rollout only
    main = policy(plan_run(cfg, device="cpu:4GB", prompt_tokens=100), "main")
    rows = cfg.trainer.batch_size * cfg.trainer.group_size  # a chain asks one agent of an episode at a time
    assert main.generation == call_bytes(tiny_model_dir, rows, 100, 6)
    assert any(f"{rows} of {rows} rows of up to 100 prompt tokens" in n for n in main.notes)


def test_an_evaluations_sampled_pass_asks_for_eval_size_times_k_episodes(tiny_model_dir):
    data = team_config(tiny_model_dir, "chain")
    for agent in data["agents"]:
        agent["sampling"]["temperature"] = 0.7
    data["trainer"].update(eval_size=50, eval_sampled_k=4)
    cfg = validate_config(data)
    assert [(what, n, greedy) for what, n, greedy in generation_passes(cfg, ["main"])] == [
        ("a step's rollout", 8, False), ("an evaluation, greedy", 50, True), ("an evaluation, sampled (4 a task)", 200, False)]
    main = policy(plan_run(cfg, device="cpu:4GB", prompt_tokens=100), "main")
    assert main.generation == call_bytes(tiny_model_dir, 200, 100, 6)
    # greedy agents: the team does not train by sampling, so its evaluations are greedy only
    data["agents"] = [{**a, "sampling": {**a["sampling"], "temperature": 0.0}} for a in data["agents"]]
    cfg = validate_config(data)
    assert [n for _, n, _ in generation_passes(cfg, ["main"])] == [8, 50]
    assert policy(plan_run(cfg, device="cpu:4GB", prompt_tokens=100), "main").generation == call_bytes(tiny_model_dir, 50, 100, 6)


def test_rollout_batch_tokens_cuts_the_calls(tiny_model_dir):
    data = team_config(tiny_model_dir, "chain")
    data["trainer"].update(batch_size=8, group_size=8)  # 64 episodes
    data["policies"]["main"]["rollout_batch_tokens"] = 1000  # 10 prompts of 100 tokens a call
    main = policy(plan_run(validate_config(data), device="cpu:4GB", prompt_tokens=100), "main")
    assert main.generation == call_bytes(tiny_model_dir, 10, 100, 6)
    assert any("10 of 64 rows" in n for n in main.notes)


def test_the_call_budget_cuts_the_calls_as_the_backend_does(tiny_model_dir, monkeypatch):
    """The plan's largest call is the one the hf backend would make: as many rows as keep one call's
    memory within the call budget (1 GiB on the CPU; here shrunk to 7 rows' worth)."""
    import mas.learning.memory_plan as memory_plan

    data = team_config(tiny_model_dir, "chain")
    data["trainer"].update(batch_size=8, group_size=8)  # 64 episodes
    monkeypatch.setattr(memory_plan, "default_call_budget", lambda device: 7 * call_bytes(tiny_model_dir, 1, 100, 6) + 1)
    main = policy(plan_run(validate_config(data), device="cpu:4GB", prompt_tokens=100), "main")
    assert main.generation == call_bytes(tiny_model_dir, 7, 100, 6)
    assert any("7 of 64 rows" in n for n in main.notes)


def test_a_debates_debaters_of_one_policy_ask_together(tiny_model_dir):
    data = team_config(tiny_model_dir, "debate")
    cfg = validate_config(data)
    debaters = [d for d in cfg.topology.debaters if cfg.agent(d).policy == "main"]
    assert len(debaters) >= 2
    main = policy(plan_run(cfg, device="cpu:4GB", prompt_tokens=100), "main")
    rows = cfg.trainer.batch_size * cfg.trainer.group_size * len(debaters)
    new = max(cfg.agent(d).sampling.max_new_tokens for d in debaters)
    assert main.generation == call_bytes(tiny_model_dir, rows, 100, new)


def test_without_a_prompt_length_the_plan_takes_each_policys_longest_prompt(tiny_model_dir):
    from transformers import AutoTokenizer

    from mas.envs import build_env

    cfg = validate_config(team_config(tiny_model_dir, "chain"))
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = context_bounds(cfg, lambda p: tok, lambda p: 1 << 30, build_env(cfg.env))
    want = {}
    for r in rows:
        want[r["policy"]] = max(want.get(r["policy"], 0), r["bound"] - r["max_new_tokens"])
    assert longest_prompts(cfg) == want and want["main"] > 0
    main = policy(plan_run(cfg, device="cpu:4GB"), "main")
    assert main.generation == call_bytes(tiny_model_dir, 8, want["main"], 6)


def test_a_debaters_later_rounds_show_it_the_others_answers(tiny_model_dir):
    from mas.learning.memory_plan import heard_tokens as debate_heard
    from mas.topologies.debate import Debate

    DEBATE_FRAME_TOKENS, DEBATE_LINE_TOKENS = Debate.FRAME_TOKENS, Debate.LINE_TOKENS

    data = team_config(tiny_model_dir, "debate")
    cfg = validate_config(data)
    heard = debate_heard(cfg)
    replies = {d: cfg.agent(d).sampling.max_new_tokens for d in cfg.topology.debaters}
    for d in cfg.topology.debaters:
        assert heard[d] == DEBATE_FRAME_TOKENS + sum(n + DEBATE_LINE_TOKENS for o, n in replies.items() if o != d)
    data["topology"]["rounds"] = 1  # one round: nobody hears anybody
    assert debate_heard(validate_config(data)) == {}
    assert debate_heard(validate_config(team_config(tiny_model_dir, "chain"))) == {}
