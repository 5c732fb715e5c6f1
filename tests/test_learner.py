"""mas.learning.learner: the PPO-clip surrogate, the packed path against the padded reference (tests/ppo_reference.py),
batching, micro-batch/padding invariance, schedules, resume."""

from __future__ import annotations

import copy
import io
import math
import statistics
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

import pytest
import torch
from torch import nn

from mas.learning.learner import (
    LOSS_AGGS,
    Learner,
    TrainSample,
    build_scheduler,
    draws_random_numbers,
    kl_penalty,
    loss_norm,
    ppo_clip_tokens,
    rollout_is_weights,
)
from mas.models.tiny import tiny_causal_lm
from ppo_reference import collate, ppo_clip_loss, slow_ppo_loss, token_logprobs

try:
    from mas.config.schema import OptimConfig
except ImportError:  # mas.config.schema imports packages still being written; same fields and defaults

    @dataclass(frozen=True)
    class OptimConfig:  # type: ignore[no-redef]
        lr: float = 1e-6
        weight_decay: float = 0.0
        betas: tuple[float, float] = (0.9, 0.999)
        eps: float = 1e-8
        max_grad_norm: float = 1.0
        schedule: Literal["constant", "linear", "cosine"] = "constant"
        warmup_steps: int = 0
        micro_batch_size: int = 8


# --------------------------------------------------------------------------------------------
# test double and helpers
# --------------------------------------------------------------------------------------------


@dataclass
class TinyPolicy:
    """The slice of a PolicyHandle the learner uses, around an in-process tiny model."""

    model: nn.Module
    ref_model: nn.Module | None = None
    name: str = "tiny-policy"
    device: str = "cpu"
    updates: int = 0
    activations: int = 0
    log: list[str] = field(default_factory=list)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    @contextmanager
    def activate(self):
        self.activations += 1
        yield self.model

    @contextmanager
    def reference(self):
        self.log.append("reference")
        yield self.ref_model

    def mark_updated(self) -> None:
        self.updates += 1


def slow_logprobs(model: nn.Module, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    """Reference: one unpadded forward per sample, log-softmax read position by position."""
    t = temperature if temperature > 0 else 1.0
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0] / t
    lp = torch.log_softmax(logits.double(), dim=-1)
    return [float(lp[len(prompt) + j - 1, tok]) for j, tok in enumerate(completion)]


def make_samples(
    model: nn.Module,
    n: int,
    seed: int,
    noise: float = 0.3,
    completion_lens: list[int] | None = None,
    temperatures: tuple[float, ...] = (1.0, 0.7),
) -> list[TrainSample]:
    """Samples of different lengths; old logprobs = the model's own, shifted by ``noise``."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    out = []
    model.eval()
    for i in range(n):
        p = int(torch.randint(2, 7, (1,), generator=g))
        c = completion_lens[i] if completion_lens else int(torch.randint(1, 8, (1,), generator=g))
        prompt = torch.randint(5, vocab, (p,), generator=g).tolist()
        completion = torch.randint(5, vocab, (c,), generator=g).tolist()
        temp = temperatures[i % len(temperatures)]
        lp = slow_logprobs(model, prompt, completion, temp)
        lp = [x + noise * float(torch.randn(1, generator=g)) for x in lp]
        adv = float(torch.randn(1, generator=g))
        out.append(TrainSample(prompt, completion, lp, adv, temp))
    return out


def learner(
    policy, total_steps=10, clip_low=0.2, clip_high=0.28, kl_coef=0.0, loss_agg="token_mean", ppo_epochs=1, max_tokens=8, **optim
):
    optim.setdefault("lr", 1e-3)
    return Learner(policy, OptimConfig(**optim), total_steps, clip_low, clip_high, kl_coef, loss_agg, ppo_epochs, max_tokens=max_tokens)


def grads(model: nn.Module) -> list[torch.Tensor]:
    return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()]


def params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def ratios_to_logprobs(r: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """[1, 4] logprobs and old logprobs with exp(logp - old) = r."""
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0]], dtype=torch.float64)
    logp = (old + torch.log(torch.tensor([r], dtype=torch.float64))).requires_grad_(True)
    return logp, old


# --------------------------------------------------------------------------------------------
# the loss, by hand
# --------------------------------------------------------------------------------------------

R = [1.1, 1.5, 0.7, 0.9]  # inside, above and below [1 - 0.2, 1 + 0.28], inside
LO, HI = 0.2, 0.28


def test_ppo_clip_loss_positive_advantage_by_hand():
    A = 2.0
    logp, old = ratios_to_logprobs(R)
    mask = torch.ones(1, 4, dtype=torch.bool)
    loss, stats = ppo_clip_loss(logp, old, torch.tensor([A]), mask, LO, HI, "token_mean")
    # objective per token: min(r*A, clip(r, 1-LO, 1+HI)*A); A > 0 clips only r above 1+HI
    obj = [1.1 * A, min(1.5 * A, (1 + HI) * A), min(0.7 * A, (1 - LO) * A), 0.9 * A]  # [2.2, 2.56, 1.4, 1.8]
    assert obj == pytest.approx([2.2, 2.56, 1.4, 1.8])
    assert loss.item() == pytest.approx(-sum(obj) / 4)
    assert stats["clip_frac"] == pytest.approx(1 / 4)  # token 1 only: r = 0.7 keeps the lower r*A
    assert stats["ratio"] == pytest.approx(sum(R) / 4)
    assert stats["kl"] == 0.0 and stats["pg_loss"] == pytest.approx(-sum(obj) / 4)
    # d loss / d logp_j = -r_j * A / 4 where unclipped, 0 where the clipped branch is active
    loss.backward()
    expected = [-1.1 * A / 4, 0.0, -0.7 * A / 4, -0.9 * A / 4]
    assert logp.grad[0].tolist() == pytest.approx(expected)


def test_ppo_clip_loss_negative_advantage_by_hand():
    A = -1.0
    logp, old = ratios_to_logprobs(R)
    mask = torch.ones(1, 4, dtype=torch.bool)
    loss, stats = ppo_clip_loss(logp, old, torch.tensor([A]), mask, LO, HI, "token_mean")
    # A < 0 clips only r below 1-LO: min(-0.7, -0.8) = -0.8 is the clipped branch
    obj = [1.1 * A, min(1.5 * A, (1 + HI) * A), min(0.7 * A, (1 - LO) * A), 0.9 * A]  # [-1.1, -1.5, -0.8, -0.9]
    assert obj == pytest.approx([-1.1, -1.5, -0.8, -0.9])
    assert loss.item() == pytest.approx(-sum(obj) / 4)  # 1.075
    assert stats["clip_frac"] == pytest.approx(1 / 4)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([1.1 / 4, 1.5 / 4, 0.0, 0.9 / 4])


def test_ppo_clip_loss_aggregations_and_norm_by_hand():
    # row 0: ratios R, A = +2, 4 completion tokens; row 1: ratios 1.1, 1.5, A = -1, 2 tokens
    logp0, old0 = ratios_to_logprobs(R)
    logp = torch.cat([logp0.detach(), logp0.detach()])
    old = torch.cat([old0, old0])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([2.0, -1.0])
    row0 = [2.2, min(3.0, 2 * (1 + HI)), 1.4, 1.8]  # sum 7.8
    row1 = [-1.1, min(-1.5, -(1 + HI))]  # sum -2.6
    tok, s_tok = ppo_clip_loss(logp, old, adv, mask, LO, HI, "token_mean")
    seq, s_seq = ppo_clip_loss(logp, old, adv, mask, LO, HI, "seq_mean")
    assert float(tok) == pytest.approx(-(sum(row0) + sum(row1)) / 6)
    assert float(seq) == pytest.approx(-(sum(row0) / 4 + sum(row1) / 2) / 2)
    assert float(tok) != pytest.approx(float(seq))
    # an explicit norm replaces the count: the micro-batch divides by the whole batch's
    tok_n, _ = ppo_clip_loss(logp, old, adv, mask, LO, HI, "token_mean", norm=10.0)
    seq_n, _ = ppo_clip_loss(logp, old, adv, mask, LO, HI, "seq_mean", norm=4.0)
    assert float(tok_n) == pytest.approx(-(sum(row0) + sum(row1)) / 10)
    assert float(seq_n) == pytest.approx(-(sum(row0) / 4 + sum(row1) / 2) / 4)
    # clip_frac counts tokens, whatever the aggregation: only row 0, token 1 is clipped
    assert s_tok["clip_frac"] == s_seq["clip_frac"] == pytest.approx(1 / 6)
    assert s_tok["tokens"] == 6
    # verl seq-mean-token-sum: each turn's token SUM, averaged over the 2 turns
    sts, s_sts = ppo_clip_loss(logp, old, adv, mask, LO, HI, "seq_mean_token_sum")
    assert float(sts) == pytest.approx(-(sum(row0) + sum(row1)) / 2)
    assert s_sts["pg_loss"] == pytest.approx(float(sts))
    # TRL dr_grpo: the token sum over (2 turns x L_max = 5): a constant, whatever the lengths
    dr, _ = ppo_clip_loss(logp, old, adv, mask, LO, HI, "dr_grpo", max_tokens=5)
    assert float(dr) == pytest.approx(-(sum(row0) + sum(row1)) / (2 * 5))
    with pytest.raises(ValueError, match="max_tokens"):
        ppo_clip_loss(logp, old, adv, mask, LO, HI, "dr_grpo")
    # the divisors of a whole batch: tokens 6, turns 2, turns x L_max 10 (the empty turn counts in none)
    assert [loss_norm([4, 2, 0], a, 5) for a in ("token_mean", "seq_mean", "seq_mean_token_sum", "dr_grpo")] == [6, 2, 2, 10]


def test_dr_grpo_and_seq_mean_token_sum_do_not_normalise_by_length():
    """Doubling a turn's tokens (same per-token loss) doubles its contribution under the two
    sum-based aggregations, and leaves it unchanged under seq_mean (Dr. GRPO's length bias)."""
    old = torch.zeros(1, 8, dtype=torch.float64)
    logp = old.clone()  # ratio 1: per-token loss -A
    adv = torch.tensor([1.0])
    short = torch.tensor([[1, 1, 0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    long = torch.tensor([[1, 1, 1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    for agg, ratio in (("seq_mean_token_sum", 2.0), ("dr_grpo", 2.0), ("seq_mean", 1.0)):
        a = float(ppo_clip_loss(logp, old, adv, short, LO, HI, agg, max_tokens=8)[0])
        b = float(ppo_clip_loss(logp, old, adv, long, LO, HI, agg, max_tokens=8)[0])
        assert b == pytest.approx(ratio * a), agg
    assert float(ppo_clip_loss(logp, old, adv, long, LO, HI, "dr_grpo", max_tokens=8)[0]) == pytest.approx(-4 / 8)


def test_ppo_clip_loss_k3_kl_by_hand():
    A, kl_coef = 2.0, 0.5
    logp, old = ratios_to_logprobs(R)
    d = torch.tensor([[0.1, -0.2, 0.3, 0.0]], dtype=torch.float64)  # ref - logp
    ref = logp.detach() + d
    mask = torch.ones(1, 4, dtype=torch.bool)
    loss, stats = ppo_clip_loss(logp, old, torch.tensor([A]), mask, LO, HI, "token_mean", ref, kl_coef)
    k3 = [math.exp(x) - x - 1 for x in [0.1, -0.2, 0.3, 0.0]]  # exp(d) - d - 1, 0 where d = 0
    pg = -(2.2 + 2.56 + 1.4 + 1.8) / 4
    assert stats["kl"] == pytest.approx(sum(k3) / 4)
    assert stats["pg_loss"] == pytest.approx(pg)
    assert loss.item() == pytest.approx(pg + kl_coef * sum(k3) / 4)
    # d k3 / d logp = 1 - exp(d): the KL pulls logp towards ref
    loss.backward()
    pg_grad = [-1.1 * A / 4, 0.0, -0.7 * A / 4, -0.9 * A / 4]
    kl_grad = [kl_coef * (1 - math.exp(x)) / 4 for x in [0.1, -0.2, 0.3, 0.0]]
    assert logp.grad[0].tolist() == pytest.approx([a + b for a, b in zip(pg_grad, kl_grad)])


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean", "seq_mean_token_sum", "dr_grpo"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ppo_clip_loss_matches_loop_reference(agg, seed):
    g = torch.Generator().manual_seed(seed)
    n, s = 2 + seed, 6
    logp = -torch.rand(n, s, generator=g, dtype=torch.float64) * 3
    old = logp + 0.4 * torch.randn(n, s, generator=g, dtype=torch.float64)
    ref = logp + 0.3 * torch.randn(n, s, generator=g, dtype=torch.float64)
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    mask = torch.rand(n, s, generator=g) > 0.3
    mask[0, 2] = True
    mask[-1] = False  # a turn with no completion token counts for nothing
    loss, _ = ppo_clip_loss(logp, old, adv, mask, 0.2, 0.28, agg, ref, 0.1, max_tokens=9)
    expected = slow_ppo_loss(
        logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), 0.2, 0.28, agg, ref.tolist(), 0.1, max_tokens=9
    )
    assert float(loss) == pytest.approx(expected, rel=1e-9)


# --------------------------------------------------------------------------------------------
# the packed path against the padded reference (tests/ppo_reference.py)
# --------------------------------------------------------------------------------------------


def ragged_batch(n: int, seed: int) -> tuple[torch.Tensor, ...]:
    """[N, S] logprobs, old and reference logprobs and a completion mask of ragged turns (prompts of
    1-3 tokens, 0-8 completion tokens: the first turn has some, the last of several none), [N] advantages."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1, 4, (n,), generator=g).tolist()
    lengths = torch.randint(0, 9, (n,), generator=g).tolist()
    lengths[0] = max(lengths[0], 1)
    if n > 1:
        lengths[-1] = 0  # a turn with no completion token counts for nothing
    s = max(p + c for p, c in zip(prompts, lengths))
    mask = torch.zeros(n, s, dtype=torch.bool)
    for i, (p, c) in enumerate(zip(prompts, lengths)):
        mask[i, p : p + c] = True
    logp = -torch.rand(n, s, generator=g, dtype=torch.float64) * 3
    old = logp + 0.4 * torch.randn(n, s, generator=g, dtype=torch.float64)
    ref = logp + 0.3 * torch.randn(n, s, generator=g, dtype=torch.float64)
    return logp, old, ref, torch.randn(n, generator=g, dtype=torch.float64), mask


@pytest.mark.parametrize("agg", LOSS_AGGS)
@pytest.mark.parametrize("n", [1, 3, 8])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("micro", [1, 5, None], ids=lambda m: f"micro={m}")
@pytest.mark.parametrize("kind", ["k3", "abs"])
def test_packed_tokens_match_the_padded_reference(agg, n, seed, micro, kind):
    """``ppo_clip_tokens`` over the flat completion tokens, called on any split of them (``micro``
    tokens a call, in any order) with the whole batch's per-token weights, adds up to the padded
    reference's loss, gradient and stats, and (k3) to the loop's loss."""
    logp, old, ref, adv, mask = ragged_batch(n, seed)
    leaf = logp.clone().requires_grad_(True)
    expected, want = ppo_clip_loss(leaf, old, adv, mask, LO, HI, agg, ref, 0.1, max_tokens=9, kl_estimator=kind)
    (grad_expected,) = torch.autograd.grad(expected, leaf)

    lengths = mask.sum(-1)  # [N]
    turn = mask.nonzero()[:, 0]  # [K]  each completion token's turn
    weights = torch.full(turn.shape, 1.0 / loss_norm(lengths.tolist(), agg, 9), dtype=torch.float64)  # [K]
    if agg == "seq_mean":
        weights = weights / lengths[turn]
    packed = logp.clone().requires_grad_(True)
    flat = {"logp": packed[mask], "old": old[mask], "ref": ref[mask], "adv": adv[turn], "w": weights}  # [K] each
    order = torch.randperm(len(turn), generator=torch.Generator().manual_seed(seed))
    total, stats = 0.0, {"pg_loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "ratio": 0.0, "tokens": 0.0}
    for part in order.split(micro or len(turn)):
        x = {k: v[part] for k, v in flat.items()}
        loss, st = ppo_clip_tokens(x["logp"], x["old"], x["adv"], x["w"], LO, HI, x["ref"], 0.1, kind)
        total = total + loss
        stats["pg_loss"] += st["pg_loss"]
        stats["tokens"] += st["tokens"]
        for k in ("kl", "clip_frac", "ratio"):  # token means: weighted by each call's tokens
            stats[k] += st[k] * st["tokens"]
    for k in ("kl", "clip_frac", "ratio"):
        stats[k] /= stats["tokens"]
    (grad_packed,) = torch.autograd.grad(total, packed)

    assert float(total.detach()) == pytest.approx(float(expected.detach()), rel=1e-12, abs=1e-12)
    torch.testing.assert_close(grad_packed, grad_expected, rtol=1e-12, atol=1e-12)
    assert stats == pytest.approx(want, rel=1e-12, abs=1e-12)
    if kind == "k3":
        loop = slow_ppo_loss(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), LO, HI, agg, ref.tolist(), 0.1, 9)
        assert float(total.detach()) == pytest.approx(loop, rel=1e-9)


@pytest.mark.parametrize("agg", LOSS_AGGS)
@pytest.mark.parametrize("lens", [[3], [1, 7, 0, 4], [2, 2, 5, 1, 6, 7, 3]], ids=lambda c: f"lens={c}")
@pytest.mark.parametrize("seed", [0, 1])
def test_the_learner_matches_the_padded_reference(tiny_model, tiny_tokenizer, agg, lens, seed):
    """An update's gradient and metrics, scored packed in passes of at most 16 tokens, equal the padded
    reference's: every turn a right-padded row scored whole, ``ppo_clip_loss`` with the KL term, backward."""
    ref_model = tiny_causal_lm(tiny_tokenizer, seed=1)
    samples = make_samples(tiny_model, len(lens), seed=seed, completion_lens=lens, temperatures=(1.0, 0.7, 0.0))
    got = learner(TinyPolicy(tiny_model, ref_model=ref_model), kl_coef=0.1, loss_agg=agg,
                  micro_batch_tokens=16).compute_gradients(samples)
    packed_grads = grads(tiny_model)
    tiny_model.zero_grad(set_to_none=True)
    batch = collate(samples)
    logp, entropy = token_logprobs(tiny_model, batch)
    with torch.no_grad():
        ref, _ = token_logprobs(ref_model, batch)
    mask = batch["completion_mask"]
    loss, stats = ppo_clip_loss(logp, batch["old_logprobs"], batch["advantages"], mask, 0.2, 0.28, agg, ref, 0.1, max_tokens=8)
    loss.backward()
    assert sum(float(g.abs().sum()) for g in packed_grads) > 0
    for a, b in zip(packed_grads, grads(tiny_model)):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-4)
    assert got["loss"] == pytest.approx(float(loss.detach()), abs=1e-6)
    assert {k: got[k] for k in stats} == pytest.approx(stats, abs=1e-6)
    assert got["entropy"] == pytest.approx(float(entropy[mask].mean()), abs=1e-5)


# --------------------------------------------------------------------------------------------
# batches and logprobs
# --------------------------------------------------------------------------------------------


def test_collate_right_pads_and_aligns_to_predicted_token():
    samples = [
        TrainSample([5, 6], [7, 8, 9], [-0.1, -0.2, -0.3], 1.5, temperature=0.7),
        TrainSample([5], [7], [-0.4], -2.0, temperature=0.0),
    ]
    b = collate(samples, pad_id=3)
    assert b["input_ids"].tolist() == [[5, 6, 7, 8, 9], [5, 7, 3, 3, 3]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert b["completion_mask"].tolist() == [[0, 0, 1, 1, 1], [0, 1, 0, 0, 0]]
    expected_old = torch.tensor([[0, 0, -0.1, -0.2, -0.3], [0, -0.4, 0, 0, 0]])
    assert torch.allclose(b["old_logprobs"], expected_old)
    assert b["advantages"].tolist() == [1.5, -2.0]
    assert b["temperatures"].tolist() == pytest.approx([0.7, 1.0])  # greedy: logprobs at T = 1


def test_collate_rejects_bad_samples():
    with pytest.raises(ValueError, match="old_logprobs"):
        collate([TrainSample([5], [7, 8], [-0.1], 1.0)])
    with pytest.raises(ValueError, match="empty prompt"):
        collate([TrainSample([], [7], [-0.1], 1.0)])


def test_on_policy_logprobs_reproduce_sampling_logprobs(tiny_model):
    """First epoch on fresh samples: logp == old for every completion token, ratio 1, no clip."""
    samples = make_samples(tiny_model, 5, seed=0, noise=0.0, temperatures=(1.0, 0.7, 0.0, 1.3))
    batch = collate(samples)
    with torch.no_grad():
        logp, entropy = token_logprobs(tiny_model, batch)
    mask = batch["completion_mask"]
    assert torch.allclose(logp[mask], batch["old_logprobs"][mask], atol=1e-5)
    assert (entropy[mask] > 0).all() and (entropy[:, 0] == 0).all()
    _, stats = ppo_clip_loss(logp, batch["old_logprobs"], batch["advantages"], mask, 0.2, 0.2, "token_mean")
    assert stats["clip_frac"] == 0.0 and stats["ratio"] == pytest.approx(1.0, abs=1e-5)
    # through the learner (train mode, micro-batches of 2)
    metrics = learner(TinyPolicy(tiny_model), micro_batch_size=2).update(samples)
    assert metrics["clip_frac"] == 0.0 and metrics["ratio"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["tokens"] == sum(len(s.completion_ids) for s in samples)


def test_logprobs_use_the_sampling_temperature(tiny_model):
    samples = make_samples(tiny_model, 3, seed=1, noise=0.0, temperatures=(1.0,))
    hot = [TrainSample(s.prompt_ids, s.completion_ids, s.old_logprobs, s.advantage, 0.5) for s in samples]
    with torch.no_grad():
        right = token_logprobs(tiny_model, collate(samples))[0]
        wrong = token_logprobs(tiny_model, collate(hot))[0]
    mask = collate(samples)["completion_mask"]
    assert not torch.allclose(right[mask], wrong[mask], atol=1e-3)


@pytest.mark.parametrize("chunk", [1, 3, 5, 256])
def test_chunked_entropy_equals_the_unchunked_formula(tiny_model, chunk):
    """The entropy diagnostic, computed a few positions at a time, is lse - sum(softmax * logits)
    over the whole [N, S, V] tensor at once; logprobs do not depend on the chunking."""
    samples = make_samples(tiny_model, 4, seed=15, completion_lens=[7, 2, 5, 7], temperatures=(1.0, 0.7, 0.0, 1.3))
    batch = collate(samples)
    with torch.no_grad():
        logp, entropy = token_logprobs(tiny_model, batch, entropy_chunk=chunk)
        logits = tiny_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        x = logits[:, :-1].float() / batch["temperatures"][:, None, None]  # [N, S-1, V]
        lse = torch.logsumexp(x, dim=-1)
        expected = lse - (torch.softmax(x, dim=-1) * x).sum(-1)  # [N, S-1]
        expected_logp = x.gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1) - lse
    assert batch["input_ids"].shape[1] - 1 > chunk or chunk == 256  # several chunks per row
    torch.testing.assert_close(entropy[:, 1:], expected, atol=1e-6, rtol=1e-6)
    assert (entropy[:, 0] == 0).all() and (logp[:, 0] == 0).all()
    assert torch.equal(logp[:, 1:], expected_logp)
    with pytest.raises(ValueError, match="entropy_chunk"):
        token_logprobs(tiny_model, batch, entropy_chunk=0)


@pytest.mark.parametrize("temperatures", [(1.0,), (0.7, 1.0, 1.3)])
def test_logprob_gradient_equals_autograds_composition(tiny_model, temperatures):
    """token_logprobs' hand-written backward (one [N, S, V] buffer) gives, bit for bit, the values
    and parameter gradients of the plain autograd formula gather(logits / T) - logsumexp(logits / T)."""
    samples = make_samples(tiny_model, 5, seed=17, temperatures=temperatures)
    batch = collate(samples)
    weight = torch.randn(batch["input_ids"].shape, generator=torch.Generator().manual_seed(0)) * batch["completion_mask"]

    def plain(model, batch):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        x = logits[:, :-1].float() / batch["temperatures"][:, None, None]
        logp = x.gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1) - torch.logsumexp(x, dim=-1)
        return torch.cat([logp.new_zeros(logp.shape[0], 1), logp], dim=1)

    out = []
    for fn in (plain, lambda m, b: token_logprobs(m, b)[0]):
        tiny_model.zero_grad(set_to_none=True)
        logp = fn(tiny_model, batch)
        (logp * weight).sum().backward()
        out.append((logp.detach(), [p.grad.clone() for p in tiny_model.parameters()]))
    (lp_a, g_a), (lp_b, g_b) = out
    assert torch.equal(lp_a, lp_b)
    assert all(torch.equal(a, b) for a, b in zip(g_a, g_b))
    assert any(g.abs().sum() > 0 for g in g_b)


def test_half_precision_logits_are_scaled_in_place_with_the_same_result(tiny_model):
    """bf16 logits: one float32 copy, scaled in place, equals logits.float() / T."""
    samples = make_samples(tiny_model, 3, seed=16, temperatures=(0.7, 1.0, 1.3))
    batch = collate(samples)

    class Bf16Logits(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, **kw):
            out = self.inner(**kw)
            out.logits = out.logits.to(torch.bfloat16)
            return out

    model = Bf16Logits(tiny_model)
    logp, entropy = token_logprobs(model, batch)
    with torch.no_grad():
        x = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float()
        x = x / batch["temperatures"][:, None, None]
        lse = torch.logsumexp(x, dim=-1)
        expected = x.gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1) - lse
    assert torch.equal(logp[:, 1:].detach(), expected)
    torch.testing.assert_close(entropy[:, 1:], lse - (torch.softmax(x, -1) * x).sum(-1), atol=1e-6, rtol=1e-6)
    mask = batch["completion_mask"]
    logp[mask].sum().backward()  # the in-place scaling keeps the graph valid
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in tiny_model.parameters() if p.requires_grad)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean"])
def test_padding_does_not_change_loss(tiny_model, agg):
    samples = make_samples(tiny_model, 4, seed=2)
    batch = collate(samples)
    extra = 5
    g = torch.Generator().manual_seed(0)
    padded = {
        "input_ids": torch.cat([batch["input_ids"], torch.randint(5, 300, (4, extra), generator=g)], 1),
        "attention_mask": torch.cat([batch["attention_mask"], torch.zeros(4, extra, dtype=torch.long)], 1),
        "completion_mask": torch.cat([batch["completion_mask"], torch.zeros(4, extra, dtype=torch.bool)], 1),
        "old_logprobs": torch.cat([batch["old_logprobs"], torch.full((4, extra), 7.0)], 1),  # garbage, masked
        "advantages": batch["advantages"],
        "temperatures": batch["temperatures"],
    }
    tiny_model.eval()
    with torch.no_grad():
        lp, _ = token_logprobs(tiny_model, batch)
        lp_pad, _ = token_logprobs(tiny_model, padded)
        ref, ref_pad = lp + 0.1, torch.cat([lp + 0.1, torch.full((4, extra), -9.0)], 1)
    s = lp.shape[1]
    real = batch["attention_mask"].bool()
    assert torch.allclose(lp[real], lp_pad[:, :s][real], atol=1e-6)

    def loss_of(b, logp, ref_lp):
        return ppo_clip_loss(
            logp, b["old_logprobs"], b["advantages"], b["completion_mask"], 0.2, 0.28, agg, ref_lp, 0.1
        )

    loss, stats = loss_of(batch, lp, ref)
    loss_pad, stats_pad = loss_of(padded, lp_pad, ref_pad)
    assert float(loss_pad) == pytest.approx(float(loss), abs=1e-6)
    assert stats_pad == pytest.approx(stats, abs=1e-6)


# --------------------------------------------------------------------------------------------
# the learner
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
@pytest.mark.parametrize("agg", ["token_mean", "seq_mean", "seq_mean_token_sum", "dr_grpo"])
def test_micro_batches_give_the_same_gradient(tiny_model, tiny_tokenizer, agg, kl_coef):
    ref_model = tiny_causal_lm(tiny_tokenizer, seed=1)
    policy = TinyPolicy(tiny_model, ref_model=ref_model)
    samples = make_samples(tiny_model, 6, seed=3, completion_lens=[1, 7, 3, 0, 5, 2])
    results = {}
    for mbs in (1, 4, 8):
        metrics = learner(policy, kl_coef=kl_coef, loss_agg=agg, micro_batch_size=mbs).compute_gradients(samples)
        results[mbs] = (grads(tiny_model), metrics)
    g8, m8 = results[8]
    assert sum(float(x.abs().sum()) for x in g8) > 0
    for mbs in (1, 4):
        g, m = results[mbs]
        for a, b in zip(g, g8):
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)
        assert m == pytest.approx(m8, abs=1e-5)
    assert (m8["kl"] > 0) == (kl_coef > 0)
    assert policy.log.count("reference") == (3 if kl_coef > 0 else 0)  # once per call, not per micro-batch


def test_update_changes_parameters_and_restores_mode(tiny_model):
    policy = TinyPolicy(tiny_model)
    tiny_model.eval()
    before = params(tiny_model)
    metrics = learner(policy, micro_batch_size=3).update(make_samples(tiny_model, 5, seed=4))
    assert all(math.isfinite(v) for v in metrics.values())
    assert set(metrics) >= {"loss", "pg_loss", "kl", "clip_frac", "entropy", "grad_norm", "lr", "tokens", "samples"}
    assert metrics["samples"] == 5 and metrics["grad_norm"] > 0 and metrics["entropy"] > 0
    changed = [not torch.equal(a, b) for a, b in zip(before, params(tiny_model))]
    assert all(changed)  # every weight gets a gradient through the loss (tied embeddings included)
    assert policy.updates == 1 and policy.activations >= 1
    assert not tiny_model.training
    assert all(p.grad is None for p in tiny_model.parameters())  # gradient memory freed


def test_models_that_draw_random_numbers_in_training_are_recognised(tiny_tokenizer):
    model = tiny_causal_lm(tiny_tokenizer, seed=0)
    assert not draws_random_numbers(model)  # Qwen2's attention dropout defaults to 0
    model.config.attention_dropout = 0.1  # applied functionally: only the config says so
    assert draws_random_numbers(model)
    model.config.attention_dropout = 0.0
    model.lm_head = nn.Sequential(nn.Dropout(0.05), model.lm_head)
    assert draws_random_numbers(model)
    model.lm_head[0].p = 0.0
    assert not draws_random_numbers(model)


def test_a_seeded_update_of_a_model_without_dropout_leaves_the_process_rng_to_other_threads(tiny_model):
    """A Ray actor samples the next rollout in one thread from torch's process-wide generator
    while its learner updates in another (max_staleness 1).  An update that reseeded and then
    restored that generator would hand the sampler the update's numbers and, on restoring,
    replay numbers already drawn.  Here a draw made during the update (inside ``activate``)
    and one after it must continue the sampler's seeded stream."""
    model = copy.deepcopy(tiny_model)
    policy = TinyPolicy(model)
    drawn: list[float] = []

    @contextmanager
    def activate():  # runs inside the update, as the other thread's sampling would
        drawn.append(torch.rand(1).item())
        yield model

    policy.activate = activate
    samples = make_samples(model, 3, seed=8)
    torch.manual_seed(123)
    learner(policy).update(samples, seed=7)
    drawn.append(torch.rand(1).item())
    torch.manual_seed(123)
    assert drawn == torch.rand(len(drawn)).tolist()


def test_zero_advantage_gives_zero_gradient_and_no_change(tiny_model):
    policy = TinyPolicy(tiny_model)
    samples = [
        TrainSample(s.prompt_ids, s.completion_ids, s.old_logprobs, 0.0, s.temperature)
        for s in make_samples(tiny_model, 4, seed=5)
    ]
    lrn = learner(policy, lr=1e-2, micro_batch_size=2)
    lrn.compute_gradients(samples)
    assert all(float(g.abs().max()) == 0.0 for g in grads(tiny_model))
    before = params(tiny_model)
    metrics = lrn.update(samples)
    assert metrics["grad_norm"] == 0.0 and metrics["loss"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, params(tiny_model)))


def test_reported_grad_norm_is_the_pre_clip_norm_and_clipping_applies(tiny_model):
    samples = make_samples(tiny_model, 4, seed=6)
    twin = copy.deepcopy(tiny_model)
    learner(TinyPolicy(twin), micro_batch_size=2).compute_gradients(samples)
    g = grads(twin)
    norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(x) for x in g])))
    max_norm, lr, eps = 1e-4, 0.5, 1.0  # (a learning rate must be < 1)
    assert norm > 10 * max_norm  # clipping is active
    before = params(tiny_model)
    lrn = learner(TinyPolicy(tiny_model), lr=lr, eps=eps, max_grad_norm=max_norm, micro_batch_size=2)
    metrics = lrn.update(samples)
    assert metrics["grad_norm"] == pytest.approx(norm, rel=1e-5)
    # AdamW's first step is -lr * g / (|g| + eps) with g the clipped gradient (bias corrections cancel)
    for p0, p1, gi in zip(before, params(tiny_model), g):
        clipped = gi * (max_norm / (norm + 1e-6))  # torch's clip_grad_norm_ coefficient
        expected = -lr * clipped / (clipped.abs() + eps)
        assert torch.allclose(p1 - p0, expected, atol=2e-3 * max_norm, rtol=0)


CASES = {
    # warm-up 2, total 6, multipliers of the peak lr for updates k = 0..6 (transformers.get_scheduler:
    # k/W during warm-up, so update 0 runs at lr 0)
    "constant": [0 / 2, 1 / 2, 1, 1, 1, 1, 1],
    "linear": [0 / 2, 1 / 2, 1 - 0 / 4, 1 - 1 / 4, 1 - 2 / 4, 1 - 3 / 4, 0.0],
    "cosine": [0 / 2, 1 / 2] + [0.5 * (1 + math.cos(math.pi * j / 4)) for j in range(5)],
}


@pytest.mark.parametrize("schedule", sorted(CASES))
def test_schedule_values(tiny_model, schedule):
    lrn = learner(TinyPolicy(tiny_model), total_steps=6, lr=0.01, schedule=schedule, warmup_steps=2)
    seen = []
    for _ in range(7):
        seen.append(lrn.optimizer.param_groups[0]["lr"])
        lrn.optimizer.step()  # no gradients: a no-op, keeps torch's call-order check quiet
        lrn.scheduler.step()
    assert seen == pytest.approx([0.01 * m for m in CASES[schedule]], abs=1e-12)


def test_schedules_are_transformers_get_scheduler():
    from transformers import get_scheduler

    for schedule, hf in (("constant", "constant_with_warmup"), ("linear", "linear"), ("cosine", "cosine")):
        ours = build_scheduler(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0), schedule, 3, 9)
        theirs = get_scheduler(hf, torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0), num_warmup_steps=3, num_training_steps=9)
        assert [ours.lr_lambdas[0](k) for k in range(10)] == [theirs.lr_lambdas[0](k) for k in range(10)]


def test_schedule_without_warmup_starts_at_peak():
    opt = lambda: torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)  # noqa: E731
    assert build_scheduler(opt(), "cosine", 0, 4).lr_lambdas[0](0) == 1.0
    assert build_scheduler(opt(), "linear", 0, 4).lr_lambdas[0](2) == pytest.approx(0.5)
    assert build_scheduler(opt(), "linear", 0, 4).lr_lambdas[0](9) == 0.0  # never negative past the end
    with pytest.raises(ValueError, match="valid"):
        build_scheduler(opt(), "step", 0, 4)


def test_update_reports_its_lr_and_steps_the_schedule_once(tiny_model):
    lrn = learner(TinyPolicy(tiny_model), total_steps=6, lr=0.01, schedule="linear", warmup_steps=2, ppo_epochs=2)
    samples = make_samples(tiny_model, 3, seed=7)
    lrs = [lrn.update(samples)["lr"] for _ in range(4)]
    assert lrs == pytest.approx([0.0, 0.005, 0.01, 0.0075])
    p = next(iter(tiny_model.parameters()))
    assert int(lrn.optimizer.state[p]["step"]) == 8  # ppo_epochs optimizer steps per update


def test_state_dict_round_trip_reproduces_next_update(tiny_model, tiny_tokenizer):
    kw = dict(total_steps=5, lr=1e-2, schedule="cosine", warmup_steps=2, micro_batch_size=2, weight_decay=0.01)
    lrn = learner(TinyPolicy(tiny_model), **kw)
    first, second = make_samples(tiny_model, 4, seed=8), make_samples(tiny_model, 4, seed=9)
    lrn.update(first)
    buf = io.BytesIO()
    torch.save({"model": tiny_model.state_dict(), "learner": lrn.state_dict()}, buf)
    expected_metrics = lrn.update(second)
    expected = params(tiny_model)

    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    resumed = tiny_causal_lm(tiny_tokenizer, seed=123)
    resumed.load_state_dict(ckpt["model"])
    fresh = learner(TinyPolicy(resumed), **kw)
    fresh.load_state_dict(ckpt["learner"])
    assert fresh.update(second) == expected_metrics
    assert all(torch.equal(a, b) for a, b in zip(expected, params(resumed)))

    # without the optimizer and scheduler state the same step differs
    control = tiny_causal_lm(tiny_tokenizer, seed=123)
    control.load_state_dict(ckpt["model"])
    learner(TinyPolicy(control), **kw).update(second)
    assert not all(torch.equal(a, b) for a, b in zip(expected, params(control)))


# --------------------------------------------------------------------------------------------
# errors and edge cases
# --------------------------------------------------------------------------------------------


def test_empty_batch_takes_no_optimizer_step_but_steps_the_schedule(tiny_model, recwarn):
    """An update with no samples keeps the schedule in step with the trainer and reports every metric."""
    policy = TinyPolicy(tiny_model)
    lrn = learner(policy, total_steps=6, lr=0.01, schedule="linear", warmup_steps=2)
    before = params(tiny_model)
    metrics = lrn.update([])
    full = learner(TinyPolicy(copy.deepcopy(tiny_model))).update(make_samples(tiny_model, 2, seed=13))
    assert set(metrics) == set(full) == {
        "loss", "pg_loss", "kl", "clip_frac", "ratio", "entropy", "grad_norm", "lr", "tokens", "samples",
        "forward_tokens", "distinct_tokens", "mismatch_abs_mean", "mismatch_abs_max", "mismatch_kl", "first_clip_frac",
        "is_weight_mean", "is_capped_frac",
    }
    assert metrics == {**dict.fromkeys(full, 0.0), "lr": 0.0}  # warm-up step 0: 0.01 * 0/2
    assert lrn.scheduler.last_epoch == 1 and lrn.optimizer.param_groups[0]["lr"] == pytest.approx(0.005)
    assert all(torch.equal(a, b) for a, b in zip(before, params(tiny_model)))
    assert policy.updates == 0 and not lrn.optimizer.state  # no optimizer step, no AdamW state
    assert not [w for w in recwarn if "lr_scheduler" in str(w.message)]
    # the next real update runs at schedule step 1, as if the empty step had been a real one
    samples = make_samples(tiny_model, 3, seed=14)
    assert lrn.update(samples)["lr"] == pytest.approx(0.005)
    assert lrn.update([])["lr"] == pytest.approx(0.01) and lrn.update(samples)["lr"] == pytest.approx(0.0075)
    assert lrn.scheduler.last_epoch == 4 and policy.updates == 2
    p = next(iter(tiny_model.parameters()))
    assert int(lrn.optimizer.state[p]["step"]) == 2  # only the two real updates stepped AdamW


def test_non_finite_loss_names_the_policy(tiny_model):
    policy = TinyPolicy(tiny_model, name="solver-policy")
    tiny_model.eval()
    samples = make_samples(tiny_model, 3, seed=10)
    samples[1].advantage = float("nan")
    before = params(tiny_model)
    with pytest.raises(FloatingPointError, match="solver-policy"):
        learner(policy).update(samples)
    assert all(torch.equal(a, b) for a, b in zip(before, params(tiny_model)))
    assert not tiny_model.training and policy.updates == 0


def test_frozen_policy_and_bad_options_are_rejected(tiny_model):
    for p in tiny_model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        learner(TinyPolicy(tiny_model))
    for p in tiny_model.parameters():
        p.requires_grad_(True)
    with pytest.raises(ValueError, match="valid"):
        learner(TinyPolicy(tiny_model), loss_agg="sum")


def test_second_ppo_epoch_is_off_policy(tiny_model):
    samples = make_samples(tiny_model, 4, seed=11, noise=0.0)
    one = learner(TinyPolicy(copy.deepcopy(tiny_model)), lr=1e-2).update(samples)
    two = learner(TinyPolicy(tiny_model), lr=1e-2, ppo_epochs=2).update(samples)
    assert one["ratio"] == pytest.approx(1.0, abs=1e-5)
    assert abs(two["ratio"] - 1.0) > 1e-4  # epoch 2 sees moved weights against the same old logprobs


def test_learner_does_not_depend_on_requires_grad_at_build(tiny_model):
    """A LoRA handle sets requires_grad in activate(); another adapter may be active at build time."""

    @dataclass
    class SwitchingPolicy(TinyPolicy):
        def trainable_parameters(self):
            return list(self.model.parameters())

        @contextmanager
        def activate(self):
            for p in self.model.parameters():
                p.requires_grad_(True)
            yield self.model

    samples = make_samples(tiny_model, 2, seed=12)
    for p in tiny_model.parameters():
        p.requires_grad_(False)
    before = params(tiny_model)
    learner(SwitchingPolicy(tiny_model)).update(samples)
    assert not all(torch.equal(a, b) for a, b in zip(before, params(tiny_model)))


# --------------------------------------------------------------------------------------------
# scoring switches: packing, chunked log-probabilities, gradient checkpointing, the two phases
# --------------------------------------------------------------------------------------------


def conversation(model: nn.Module, seed: int) -> list[TrainSample]:
    """Turns that share prefixes: three growing conversations of four turns on one prompt."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    base = torch.randint(5, vocab, (6,), generator=g).tolist()
    out = []
    for e in range(3):
        prompt = base + torch.randint(5, vocab, (2,), generator=g).tolist()
        for t in range(4):
            completion = torch.randint(5, vocab, (3,), generator=g).tolist()
            temp = (1.0, 0.7)[t % 2]
            lp = [x - 0.1 for x in slow_logprobs(model, prompt, completion, temp)]
            out.append(TrainSample(list(prompt), completion, lp, float(torch.randn(1, generator=g)), temp))
            prompt = prompt + completion + torch.randint(5, vocab, (2,), generator=g).tolist()
    return out


@pytest.mark.parametrize("switches", [
    {"packing": False},
    {"logprob_chunk": None},
    {"logprob_chunk": 2},
    {"gradient_checkpointing": True},
    {"packing": False, "logprob_chunk": None, "gradient_checkpointing": False, "micro_batch_size": 2},
    {"micro_batch_tokens": 16},
], ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean"])
def test_every_scoring_switch_gives_the_same_gradient(tiny_model, switches, loss_agg):
    """Each off switch (for debugging) and each setting agrees with the defaults to float tolerance."""
    samples = conversation(tiny_model, seed=7)
    got = []
    for opts in ({}, switches):
        model = copy.deepcopy(tiny_model)
        lrn = learner(TinyPolicy(model), loss_agg=loss_agg, **opts)
        metrics = lrn.compute_gradients(samples)
        got.append((grads(model), metrics))
    for a, b in zip(got[0][0], got[1][0]):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-4)
    assert got[0][1]["loss"] == pytest.approx(got[1][1]["loss"], rel=1e-5, abs=1e-7)


def test_packing_runs_each_distinct_token_once(tiny_model):
    samples = conversation(tiny_model, seed=3)
    packed = learner(TinyPolicy(copy.deepcopy(tiny_model))).update(samples)
    per_turn = learner(TinyPolicy(copy.deepcopy(tiny_model)), packing=False).update(samples)
    assert packed["forward_tokens"] == packed["distinct_tokens"] == per_turn["distinct_tokens"]
    assert per_turn["forward_tokens"] > 2 * packed["forward_tokens"]


def test_a_started_update_changes_no_weight_before_its_result(tiny_model):
    """start_update computes the gradients; the optimizer steps only when result() is asked for,
    so a trainer can still drop the step after every policy's gradients are in."""
    policy = TinyPolicy(tiny_model)
    lrn = learner(policy)
    before = params(tiny_model)
    handle = lrn.start_update(make_samples(tiny_model, 4, seed=2))
    assert all(torch.equal(a, b) for a, b in zip(before, params(tiny_model))) and policy.updates == 0
    assert any(p.grad is not None for p in tiny_model.parameters())
    handle.result()
    assert not all(torch.equal(a, b) for a, b in zip(before, params(tiny_model))) and policy.updates == 1
    assert handle.span.work is not None and handle.span.seconds == handle.span.work


def test_an_abort_between_micro_batches_drops_the_update(tiny_model):
    from mas.types import StepAbandoned

    policy = TinyPolicy(tiny_model)
    lrn = learner(policy, packing=False, micro_batch_size=1)
    before = params(tiny_model)
    asked = []

    def abort() -> bool:
        asked.append(1)
        return len(asked) >= 3  # the third micro-batch is not started

    with pytest.raises(StepAbandoned, match="before micro-batch 3 of 4"):
        lrn.start_update(make_samples(tiny_model, 4, seed=5), abort=abort)
    assert all(torch.equal(a, b) for a, b in zip(before, params(tiny_model))) and policy.updates == 0
    assert all(p.grad is None for p in tiny_model.parameters())
    assert lrn.scheduler.last_epoch == 0  # nothing of the update happened


# --------------------------------------------------------------------------------------------
# the KL estimators (CREDIT_SPEC.md §8c)
# --------------------------------------------------------------------------------------------


def verl_kl(logp: float, ref: float, kind: str) -> float:
    """verl's ``kl_penalty`` as its formulas read (core_algos.py), one token at a time."""
    if kind == "k1":  # "kl"
        return logp - ref
    if kind == "abs":
        return abs(logp - ref)
    if kind == "k2":  # "mse"
        return 0.5 * (logp - ref) ** 2
    kl = ref - logp
    if kind == "low_var_kl":
        kl = min(max(kl, -20.0), 20.0)
        return min(max(math.exp(kl) - kl - 1.0, -10.0), 10.0)
    return math.exp(kl) - kl - 1.0  # k3, unclamped


def test_kl_estimators_by_hand():
    d = torch.tensor([-0.5], dtype=torch.float64)  # logp - ref
    logp, ref = d, torch.zeros(1, dtype=torch.float64)
    assert float(kl_penalty(logp, ref, "k1")) == -0.5
    assert float(kl_penalty(logp, ref, "abs")) == 0.5
    assert float(kl_penalty(logp, ref, "k2")) == 0.125
    assert float(kl_penalty(logp, ref, "k3")) == pytest.approx(0.148721, abs=1e-6)  # e^0.5 - 1.5
    assert float(kl_penalty(logp, ref, "low_var_kl")) == pytest.approx(0.148721, abs=1e-6)  # inside the clamps
    far = torch.tensor([-30.0], dtype=torch.float64)  # ref 30 nats above logp
    assert float(kl_penalty(far, ref, "low_var_kl")) == 10.0  # verl's clamp
    assert float(kl_penalty(far, ref, "k3")) == pytest.approx(math.exp(30) - 31)
    with pytest.raises(ValueError, match="unknown kl_estimator 'k4'"):
        kl_penalty(logp, ref, "k4")


@pytest.mark.parametrize("kind", ["k1", "abs", "k2", "k3", "low_var_kl"])
def test_kl_estimators_equal_verls_formulas(kind):
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(64, generator=g, dtype=torch.float64) * 6
    ref = logp + torch.randn(64, generator=g, dtype=torch.float64) * torch.linspace(0.01, 25, 64, dtype=torch.float64)
    got = kl_penalty(logp, ref, kind).tolist()
    assert got == pytest.approx([verl_kl(a, b, kind) for a, b in zip(logp.tolist(), ref.tolist())], rel=1e-12, abs=1e-12)


def test_k3_is_non_negative_zero_only_at_ref_with_k2s_curvature():
    d = torch.linspace(-5, 5, 101, dtype=torch.float64)
    k3 = kl_penalty(d, torch.zeros_like(d), "k3")
    assert bool((k3 >= 0).all()) and bool((k3[d.abs() > 1e-6] > 0).all())
    assert float(kl_penalty(torch.tensor([-1.5]), torch.tensor([-1.5]), "k3")) == 0.0  # logp = ref
    x = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(kl_penalty(x, torch.zeros(1, dtype=torch.float64), "k3").sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), x)
    assert float(g) == 0.0 and float(h) == pytest.approx(1.0)  # like k2 = d^2/2 at d = 0


@pytest.mark.parametrize("kind", ["k1", "k2", "low_var_kl"])
def test_ppo_clip_loss_with_each_estimator_by_hand(kind):
    A, kl_coef = 2.0, 0.5
    logp, old = ratios_to_logprobs(R)
    d = [0.1, -0.2, 0.3, 0.0]  # ref - logp
    ref = logp.detach() + torch.tensor([d], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.bool)
    loss, stats = ppo_clip_loss(logp, old, torch.tensor([A]), mask, LO, HI, "token_mean", ref, kl_coef, kl_estimator=kind)
    per = {"k1": [-x for x in d], "k2": [x * x / 2 for x in d], "low_var_kl": [math.exp(x) - x - 1 for x in d]}[kind]
    pg = -(2.2 + 2.56 + 1.4 + 1.8) / 4
    assert stats["kl"] == pytest.approx(sum(per) / 4)
    assert loss.item() == pytest.approx(pg + kl_coef * sum(per) / 4)


@pytest.mark.parametrize("kind", ["k1", "abs", "k2", "k3", "low_var_kl"])
def test_the_learner_uses_its_estimator_in_packed_and_padded_losses_alike(tiny_model, tiny_tokenizer, kind):
    """The packed learner (ppo_clip_tokens) gives ppo_clip_loss's value for every estimator."""
    ref_model = tiny_causal_lm(tiny_tokenizer, seed=1)
    samples = make_samples(tiny_model, 4, seed=5)
    got = Learner(TinyPolicy(tiny_model, ref_model=ref_model), OptimConfig(lr=1e-3), 10, 0.2, 0.28, 0.3, "token_mean",
                  kl_estimator=kind).compute_gradients(samples)
    batch = collate(samples)
    lp, _ = token_logprobs(tiny_model, batch)
    ref, _ = token_logprobs(ref_model, batch)
    _, stats = ppo_clip_loss(lp, batch["old_logprobs"], batch["advantages"], batch["completion_mask"], 0.2, 0.28,
                             "token_mean", ref, 0.3, kl_estimator=kind)
    assert got["kl"] == pytest.approx(stats["kl"], abs=1e-5)
    with pytest.raises(ValueError, match="unknown kl_estimator"):
        Learner(TinyPolicy(tiny_model), OptimConfig(lr=1e-3), 10, 0.2, 0.28, 0.3, "token_mean", kl_estimator="k9")


# --------------------------------------------------------------------------------------------
# old logprobs: the rollout's or the learner's, truncated importance weights, the mismatch
# --------------------------------------------------------------------------------------------


def test_truncated_importance_weights_by_hand():
    old = torch.tensor([math.log(3.0), 0.0, math.log(0.5), math.log(1.5), math.log(1.2)], dtype=torch.float64)
    roll = torch.zeros(5, dtype=torch.float64)
    turn = torch.tensor([0, 0, 1, 2, 2])
    tok = rollout_is_weights(old, roll, turn, "token", 2.0)
    assert tok.tolist() == pytest.approx([2.0, 1.0, 0.5, 1.5, 1.2])  # exp(log 3) = 3 capped at C = 2
    seq = rollout_is_weights(old, roll, turn, "sequence", 2.0)
    assert seq.tolist() == pytest.approx([2.0, 2.0, 0.5, 1.8, 1.8])  # one weight per turn: exp of its summed log-ratio
    g = torch.Generator().manual_seed(0)
    big = torch.randn(200, generator=g, dtype=torch.float64) * 3
    for level in ("token", "sequence"):
        assert float(rollout_is_weights(big, torch.zeros(200, dtype=torch.float64), torch.arange(200) // 7, level, 1.5).max()) <= 1.5
    with pytest.raises(ValueError, match="unknown rollout_is level"):
        rollout_is_weights(old, roll, turn, "episode", 2.0)


def test_unit_weights_leave_the_loss_bit_for_bit():
    g = torch.Generator().manual_seed(1)
    logp = -torch.rand(12, generator=g)
    old = logp + 0.3 * torch.randn(12, generator=g)
    adv, w = torch.randn(12, generator=g), torch.full((12,), 1 / 12)
    plain, _ = ppo_clip_tokens(logp, old, adv, w, 0.2, 0.28)
    weighted, _ = ppo_clip_tokens(logp, old, adv, w, 0.2, 0.28, is_weights=rollout_is_weights(old, old, torch.zeros(12, dtype=torch.long), "token", 2.0))
    assert torch.equal(plain, weighted)
    halved, _ = ppo_clip_tokens(logp, old, adv, w, 0.2, 0.28, is_weights=torch.full((12,), 0.5))
    assert float(halved) == pytest.approx(0.5 * float(plain))  # the weight scales the surrogate


def perturbed(samples, seed, scale=0.3):
    """The samples with the rollout's logprobs moved off the model's (a backend whose logprobs differ)."""
    g = torch.Generator().manual_seed(seed)
    return [TrainSample(s.prompt_ids, s.completion_ids, [x + scale * float(torch.randn(1, generator=g)) for x in s.old_logprobs],
                        s.advantage, s.temperature) for s in samples]


def test_recomputed_old_logprobs_give_ratio_1_on_the_first_pass_and_record_the_mismatch(tiny_model):
    exact = make_samples(tiny_model, 6, seed=2, noise=0.0)  # the model's own logprobs: what an exact backend returns
    samples = perturbed(exact, seed=3)
    diffs = [b - a for s, e in zip(samples, exact) for a, b in zip(e.old_logprobs, s.old_logprobs)]
    truth = {"abs_mean": statistics.fmean(abs(d) for d in diffs), "abs_max": max(abs(d) for d in diffs),
             "kl": statistics.fmean(math.exp(d) - d - 1 for d in diffs)}
    for old, clipped in (("learner", False), ("rollout", True)):
        lrn = Learner(TinyPolicy(copy.deepcopy(tiny_model)), OptimConfig(lr=1e-3), 10, 0.2, 0.2, 0.0, "token_mean",
                      old_logprobs=old)
        m = lrn.update(samples)
        assert m["mismatch_abs_mean"] == pytest.approx(truth["abs_mean"], abs=1e-5)
        assert m["mismatch_abs_max"] == pytest.approx(truth["abs_max"], abs=1e-5)
        assert m["mismatch_kl"] == pytest.approx(truth["kl"], abs=1e-5)
        if old == "learner":
            assert m["ratio"] == pytest.approx(1.0, abs=1e-6) and m["first_clip_frac"] == 0.0 and m["clip_frac"] == 0.0
        else:  # the backend's logprobs as old: the ratio is off 1 before any step, and tokens are clipped
            assert m["first_clip_frac"] > 0.05 and m["first_clip_frac"] == m["clip_frac"]
        assert m["is_weight_mean"] == 1.0 and m["is_capped_frac"] == 0.0  # no correction asked


def test_recompute_with_an_exact_backend_changes_nothing(tiny_model):
    """The model's own logprobs as the rollout's: recomputing them gives the same loss and gradient."""
    samples = make_samples(tiny_model, 5, seed=4, noise=0.0)
    got = {}
    for old in ("rollout", "learner"):
        m = Learner(TinyPolicy(tiny_model), OptimConfig(lr=1e-3), 10, 0.2, 0.2, 0.0, "token_mean",
                    old_logprobs=old).compute_gradients(samples)
        got[old] = (grads(tiny_model), m["loss"])
    assert got["rollout"][1] == pytest.approx(got["learner"][1], abs=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got["rollout"][0], got["learner"][0]))


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_rollout_importance_weights_in_an_update(tiny_model, level):
    samples = perturbed(make_samples(tiny_model, 6, seed=5, noise=0.0), seed=6, scale=0.8)
    lrn = Learner(TinyPolicy(copy.deepcopy(tiny_model)), OptimConfig(lr=1e-3), 10, 0.2, 0.2, 0.0, "token_mean",
                  old_logprobs="learner", rollout_is=level, rollout_is_cap=1.5)
    batch = lrn._prepare(samples)
    pt = batch.per_token
    expected = rollout_is_weights(pt["old_logprobs"], pt["rollout_logprobs"], pt["turn"], level, 1.5)
    assert torch.equal(pt["is_weights"], expected)
    m = lrn.update(samples)
    assert m["is_weight_mean"] == pytest.approx(float(expected.mean()), abs=1e-6)
    assert m["is_capped_frac"] == pytest.approx(float((expected >= 1.5).float().mean()), abs=1e-6) and m["is_capped_frac"] > 0
    with pytest.raises(ValueError, match="needs old_logprobs 'learner'"):
        Learner(TinyPolicy(tiny_model), OptimConfig(lr=1e-3), 10, 0.2, 0.2, 0.0, "token_mean", rollout_is=level)
