"""mas.learning.logprobs: the prefix-tree packing of turns, and chunked log-probabilities.

Packed scoring must give the per-token log-probabilities and gradients that scoring every
turn on its own gives (``mas.learning.learner.token_logprobs`` over ``collate``, the reference), to
float tolerance, while running each distinct token through the model once.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch

from mas.learning.learner import TrainSample
from ppo_reference import collate, token_logprobs
from mas.learning.logprobs import distinct_tokens, pack, passes, split_model, token_logprobs_packed
from mas.models.tiny import tiny_causal_lm


# --------------------------------------------------------------------------------------------
# the prefix tree, by hand
# --------------------------------------------------------------------------------------------


def test_a_growing_conversation_is_one_path_and_each_token_is_predicted_by_its_predecessor():
    # turn 1: prompt [1,2] reply [3]; turn 2 extends it: prompt [1,2,3,4] reply [5,6]
    p = pack([[1, 2, 3], [1, 2, 3, 4, 5, 6]], starts=[2, 4], max_tokens=100)
    assert len(p.rows) == 1
    row = p.rows[0]
    assert row.tokens == [1, 2, 3, 4, 5, 6] and row.depth == [0, 1, 2, 3, 4, 5]
    assert row.parent == [-1, 0, 1, 2, 3, 4] and not row.branched
    # pairs: (sample, index) -> predicted at the position of the token before it
    assert list(zip(p.sample, p.index, p.pos, p.target)) == [(0, 0, 1, 3), (1, 0, 3, 5), (1, 1, 4, 6)]
    assert p.tokens == 6 == distinct_tokens([[1, 2, 3], [1, 2, 3, 4, 5, 6]])


def test_two_replies_to_one_prompt_share_it_and_branch():
    p = pack([[7, 8, 9], [7, 8, 5, 5]], starts=[2, 2], max_tokens=100)
    row = p.rows[0]
    # lexicographic order puts [7,8,5,5] first: 7 8 5 5 then the branch 9 under 8
    assert row.tokens == [7, 8, 5, 5, 9] and row.depth == [0, 1, 2, 3, 2] and row.parent == [-1, 0, 1, 2, 1]
    assert row.branched
    # sample 0's completion [9] is predicted at position 1 (the shared 8)
    assert [(s, pos, t) for s, pos, t in zip(p.sample, p.pos, p.target)] == [(0, 1, 9), (1, 1, 5), (1, 2, 5)]
    assert distinct_tokens([[7, 8, 9], [7, 8, 5, 5]]) == 5


def test_rows_hold_at_most_max_tokens_and_a_new_row_repeats_the_shared_prefix():
    seqs = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 6]]
    p = pack(seqs, starts=[3, 3, 3], max_tokens=5)
    assert [r.tokens for r in p.rows] == [[1, 2, 3, 4, 5], [1, 2, 3, 6]]
    assert p.tokens == 9 and distinct_tokens(seqs) == 6


def test_without_sharing_every_sequence_has_its_own_row():
    p = pack([[1, 2, 3], [1, 2, 4]], starts=[2, 2], max_tokens=100, share=False)
    assert [r.tokens for r in p.rows] == [[1, 2, 3], [1, 2, 4]] and not any(r.branched for r in p.rows)


def test_a_completion_needs_a_context():
    with pytest.raises(ValueError, match="completion start 0"):
        pack([[1, 2]], starts=[0], max_tokens=10)


def test_the_tree_mask_lets_each_position_see_exactly_its_ancestors():
    p = pack([[7, 8, 9], [7, 8, 5, 5]], starts=[2, 2], max_tokens=100)
    (g,) = passes(p, max_tokens=100)
    m = g.attention_mask[0, 0].int().tolist()
    # positions: 0:7 1:8 2:5 3:5 4:9 (9 is a child of 8)
    assert m == [[1, 0, 0, 0, 0],
                 [1, 1, 0, 0, 0],
                 [1, 1, 1, 0, 0],
                 [1, 1, 1, 1, 0],
                 [1, 1, 0, 0, 1]]
    assert g.position_ids[0].tolist() == [0, 1, 2, 3, 2]


def test_passes_group_rows_by_token_budget_and_pad_on_the_right():
    p = pack([[1, 2, 3], [4, 5], [6, 7, 8, 9]], starts=[1, 1, 1], max_tokens=100, share=False)
    gs = passes(p, max_tokens=8)  # 2 rows x 3 tokens fit, then the 4-token row alone
    assert [g.input_ids.tolist() for g in gs] == [[[1, 2, 3], [4, 5, 0]], [[6, 7, 8, 9]]]
    assert gs[0].attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert sorted(torch.cat([g.pairs for g in gs]).tolist()) == list(range(len(p.sample)))


# --------------------------------------------------------------------------------------------
# packed against per-turn scoring, on a real chat template's multi-turn conversations
# --------------------------------------------------------------------------------------------


def conversation_samples(tokenizer, episodes: int, seed: int) -> list[TrainSample]:
    """Multi-turn orchestrator-style conversations rendered with ``tokenizer``'s chat template:
    each turn's prompt is the whole conversation so far (so it extends the previous turn), and
    the episodes of one task share the system prompt and the task."""
    rng = random.Random(seed)
    out = []
    for e in range(episodes):
        messages = [{"role": "system", "content": "You are the orchestrator."},
                    {"role": "user", "content": f"Task: {1 + e % 2}+{2 + e % 2}-1"}]
        for t in range(3):
            prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            reply = rng.choice(["CALL adder: 1+2", "ANSWER: 2", "CALL subtractor: 3-1", "ANSWER: 4"])
            with_reply = tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": reply}], tokenize=False)
            full = tokenizer(with_reply, add_special_tokens=False)["input_ids"]
            assert full[: len(prompt_ids)] == prompt_ids  # the template renders the prompt as a prefix
            completion = full[len(prompt_ids):]
            out.append(TrainSample(prompt_ids, completion, [rng.uniform(-3, -0.1) for _ in completion],
                                   advantage=rng.uniform(-1, 1), temperature=rng.choice([1.0, 0.7])))
            messages = messages + [{"role": "assistant", "content": reply}, {"role": "user", "content": f"result {t}"}]
    return out


def reference(model, samples):
    """Per-turn scoring: one right-padded sequence per turn, the learner's reference path."""
    batch = collate(samples)
    logp, _ = token_logprobs(model, batch)
    return [logp[i, batch["completion_mask"][i]] for i in range(len(samples))]


def packed(model, samples, share=True, chunk=1024, max_tokens=4096):
    seqs = [s.prompt_ids + s.completion_ids for s in samples]
    p = pack(seqs, [len(s.prompt_ids) for s in samples], max_tokens, share=share)
    temps = torch.tensor([samples[i].temperature for i in p.sample])
    out = [torch.zeros(len(s.completion_ids)) for s in samples]
    pieces = []
    for g in passes(p, max_tokens=max_tokens):
        logp, _ = token_logprobs_packed(model, g, temps[g.pairs], chunk=chunk, heads=split_model(model))
        pieces.append((g.pairs, logp))
    flat = torch.zeros(len(p.sample))
    flat = flat.index_put((torch.cat([k for k, _ in pieces]),), torch.cat([v for _, v in pieces]))
    by_sample = [[] for _ in samples]
    for k, (i, j) in enumerate(zip(p.sample, p.index)):
        by_sample[i].append(flat[k])
    return [torch.stack(v) for v in by_sample], p


@pytest.mark.parametrize("episodes,seed", [(2, 0), (4, 1)])
def test_packed_scoring_equals_per_turn_scoring_on_a_chat_template(tiny_tokenizer, episodes, seed):
    model = tiny_causal_lm(tiny_tokenizer, seed=seed).eval()
    samples = conversation_samples(tiny_tokenizer, episodes, seed)
    got, p = packed(model, samples)
    want = reference(model, samples)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    total = sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    assert p.tokens == distinct_tokens([s.prompt_ids + s.completion_ids for s in samples]) < total / 2


def test_packed_gradients_equal_per_turn_gradients(tiny_tokenizer):
    samples = conversation_samples(tiny_tokenizer, 3, seed=5)
    weights = [torch.randn(len(s.completion_ids), generator=torch.Generator().manual_seed(i)) for i, s in enumerate(samples)]
    grads = []
    for scorer in (lambda m: packed(m, samples)[0], lambda m: reference(m, samples)):
        model = tiny_causal_lm(tiny_tokenizer, seed=3)
        loss = sum((lp * w).sum() for lp, w in zip(scorer(model), weights))
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-5, rtol=1e-4, msg=name)


def test_chunked_logprobs_equal_unchunked_in_value_and_gradient(tiny_tokenizer):
    samples = conversation_samples(tiny_tokenizer, 3, seed=2)
    out = []
    for chunk in (None, 1, 7, 4096):
        model = tiny_causal_lm(tiny_tokenizer, seed=4)
        logp, _ = packed(model, samples, chunk=chunk)
        torch.cat(logp).sum().backward()
        out.append((torch.cat(logp).detach(), model.lm_head.weight.grad.clone(), model.model.embed_tokens.weight.grad.clone()))
    for got in out[1:]:
        for a, b in zip(got, out[0]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_a_model_that_cannot_be_split_is_scored_whole(tiny_tokenizer):
    samples = conversation_samples(tiny_tokenizer, 2, seed=1)
    model = tiny_causal_lm(tiny_tokenizer, seed=1).eval()
    seqs = [s.prompt_ids + s.completion_ids for s in samples]
    p = pack(seqs, [len(s.prompt_ids) for s in samples], 4096)
    temps = torch.tensor([samples[i].temperature for i in p.sample])
    (g,) = passes(p, max_tokens=4096)
    whole, _ = token_logprobs_packed(model, g, temps[g.pairs], heads=None)
    split, _ = token_logprobs_packed(model, g, temps[g.pairs], heads=split_model(model))
    torch.testing.assert_close(whole, split, atol=1e-5, rtol=1e-5)


# the adapter sits on the tied lm_head on purpose (the split heads must apply it); peft warns that merging such an adapter needs care
@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`:UserWarning")
def test_a_lora_model_splits_with_its_adapter_applied(tiny_tokenizer):
    from peft import LoraConfig, get_peft_model

    from mas.agents.policy import peft_quietly

    base = tiny_causal_lm(tiny_tokenizer, seed=6)
    with peft_quietly():
        lora = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "lm_head"]))
    for n, prm in lora.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(prm, std=0.5)  # a non-zero adapter, so it changes the logits
    lora.eval()
    samples = conversation_samples(tiny_tokenizer, 2, seed=6)
    got, _ = packed(lora, samples)
    want = reference(lora, samples)
    base_lp = reference(base.eval(), samples)
    for g, w, b in zip(got, want, base_lp):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(torch.cat(want), torch.cat(base_lp), atol=1e-3)


# --------------------------------------------------------------------------------------------
# the same on real multi-turn batches: a rollout of the embedded model's team and of SmolLM2's
# --------------------------------------------------------------------------------------------


def rollout_samples(config: str, overrides: list[str]) -> tuple[list, dict]:
    """(the team, each policy's TrainSamples of one real rollout): turns as the trainer hands them to the learner."""
    from pathlib import Path

    from mas.config.checks import meaning_errors
    from mas.config.schema import load_config
    from mas.credit import build_credit_batch, run_credit
    from mas.training.team import build_team
    from mas.training.trainer import rollout, training_batches

    cfg = load_config(Path(__file__).parents[1] / "configs" / config, overrides, check=meaning_errors)
    team = build_team(cfg)
    done = rollout(team, 0)
    credit = run_credit(build_credit_batch(done.groups, list(team.agents)), cfg.credit, None)
    samples, _ = training_batches(team, done.groups, credit, team.learners)
    return team, {name: [s for s in got if s.completion_ids] for name, got in samples.items()}


def assert_packed_matches_per_turn(model, samples, atol: float, rtol: float, max_tokens: int = 4096):
    multi_turn = sum(1 for a in samples for b in samples if a is not b and b.prompt_ids[: len(a.prompt_ids)] == a.prompt_ids)
    assert multi_turn, "the batch should hold turns whose prompt extends another turn's (a growing conversation)"
    weights = [torch.randn(len(s.completion_ids), generator=torch.Generator().manual_seed(i)) for i, s in enumerate(samples)]
    grads, values = [], []
    for scorer in (lambda: packed(model, samples, max_tokens=max_tokens)[0], lambda: reference(model, samples)):
        model.zero_grad(set_to_none=True)
        logps = scorer()
        sum((lp * w).sum() for lp, w in zip(logps, weights)).backward()
        values.append([lp.detach() for lp in logps])
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    model.zero_grad(set_to_none=True)
    for g, w in zip(*values):
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol)
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=atol, rtol=rtol * 10, msg=name)
    _, p = packed(model, samples, max_tokens=max_tokens)
    assert p.tokens < sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)  # shared prefixes run once


def test_packed_equals_per_turn_on_a_rollout_of_the_embedded_quickstart_team():
    team, samples = rollout_samples("quickstart.yaml", ["trainer.batch_size=2", "trainer.group_size=4",
                                                       "trainer.eval_size=0", "logging.progress=false"])
    try:
        model = team.policies["planner"].model
        model.train(False)
        assert_packed_matches_per_turn(model, samples["planner"], atol=1e-5, rtol=1e-4)
    finally:
        team.close()


@pytest.mark.slow
def test_packed_equals_per_turn_on_a_rollout_of_the_smollm2_team():
    """SmolLM2 from its wheel, float32, its own chat template; the LoRA planner's turns of a real rollout."""
    overrides = ["trainer.batch_size=1", "trainer.group_size=2", "trainer.eval_size=0", "trainer.warmup.steps=0",
                 "logging.progress=false", "agents.orchestrator.sampling.max_new_tokens=8",
                 "agents.adder.sampling.max_new_tokens=6", "agents.subtractor.sampling.max_new_tokens=6", "topology.max_turns=3"]
    overrides += [f"policies.{p}.{k}={v}" for p in ("planner", "adder", "subtractor") for k, v in (("dtype", "float32"), ("device", "cpu"))]
    team, samples = rollout_samples("smol_orchestrator.yaml", overrides)
    try:
        handle = team.policies["planner"]
        with handle.activate():
            handle.model.train(False)
            assert_packed_matches_per_turn(handle.model, samples["planner"], atol=1e-4, rtol=1e-3, max_tokens=1024)
    finally:
        team.close()
