"""Score a policy's turns: every distinct token through the model once, logits a chunk at a time.

The learner needs, for every completion token of every turn it trains on, that token's
log-probability under the current weights.  Two costs dominate on real models, and this
module removes both (docs/architecture.md, "Models: where weights come from"):

* **Re-encoding shared prefixes.**  An agent's turns within one episode share a growing
  conversation (turn t+1's prompt is turn t's prompt, its reply and the next message), and the
  G episodes of a task share the system prompt and the task.  Scored turn by turn, those
  prefixes run through the model once per turn.  ``pack`` builds the prefix tree (trie) of the
  turns' token sequences and lays it out in rows: within a row every distinct token position
  appears once, and a tree attention mask lets each position attend to exactly its ancestors,
  with its depth as its position id, so its hidden state is (up to float rounding) what its own
  sequence alone would give.  A row whose tree is one path needs no mask (plain causal
  attention, the fast kernels).  Turns whose prompts share nothing with the others (a prompt
  that is not an extension of the previous turn's conversation) simply get paths of their own:
  there is no separate fallback.

* **Full-vocabulary logits.**  A [tokens, V] float32 logits tensor for SmolLM2's V = 49,152
  and a few thousand tokens is gigabytes, and autograd would keep it for backward.
  ``token_logprobs_packed`` runs the model's decoder body, gathers the hidden state that
  predicts each completion token, and applies the output head to ``chunk`` of them at a time
  under activation checkpointing: only [chunk, V] logits exist at once, in forward and in
  backward (where each chunk's logits are recomputed).  Prompt positions never reach the head.

Vocabulary (as in ``mas.learning.learner``):
    K   completion tokens to score: one "pair" per (turn, completion position)
    B   rows in one forward pass; L their padded length; D the hidden size; V the vocabulary

Temperature: a turn sampled at temperature T is scored as ``log_softmax(logits / T)``, so an
unchanged policy reproduces its sampling logprobs (ratio 1); every pair carries its own T.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

# --------------------------------------------------------------------------------------------
# packing: the prefix tree of the turns, laid out in rows
# --------------------------------------------------------------------------------------------


@dataclass
class Row:
    """One packed sequence, in tree order (every parent before its children)."""

    tokens: list[int] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)  # position id: the token's index in its own sequence
    parent: list[int] = field(default_factory=list)  # row index of the token's parent; -1 for a root
    branched: bool = False  # some position (or the root) has two children: needs the tree mask


@dataclass
class Packing:
    """Where each completion token sits.  Pair k is completion token ``index[k]`` of sample
    ``sample[k]``: its id is ``target[k]`` and it is predicted by the hidden state at position
    ``pos[k]`` of row ``row[k]`` (the position of the token before it)."""

    rows: list[Row]
    row: list[int]  # [K]
    pos: list[int]  # [K]
    target: list[int]  # [K]
    sample: list[int]  # [K]
    index: list[int]  # [K]

    @property
    def tokens(self) -> int:
        """Token positions run through the model (the rows' lengths, padding excluded)."""
        return sum(len(r.tokens) for r in self.rows)


def pack(sequences: Sequence[Sequence[int]], starts: Sequence[int], max_tokens: int, share: bool = True) -> Packing:
    """Lay ``sequences`` out in rows of at most ``max_tokens`` tokens (a longer sequence gets a
    row of its own); sample i is prompt then completion, its completion starting at ``starts[i]``.

    ``share``: sequences with a common prefix hold it once within a row (the prefix tree).
    False gives each sequence a row of its own (per-turn scoring, the debugging switch).  Rows
    are filled in lexicographic order of the sequences, so the sequences that share most are
    neighbours, and a sequence's longest shared prefix with the row is the one it shares with
    the sequence placed just before it.
    """
    if len(sequences) != len(starts):
        raise ValueError(f"{len(sequences)} sequences but {len(starts)} completion starts")
    for i, (seq, start) in enumerate(zip(sequences, starts)):
        if not 1 <= start <= len(seq):
            raise ValueError(f"sample {i}: completion start {start} outside 1..{len(seq)} (a completion needs a context)")
    order = sorted(range(len(sequences)), key=lambda i: tuple(sequences[i])) if share else range(len(sequences))
    rows: list[Row] = []
    row_of = [0] * len(sequences)
    path_of: list[list[int]] = [[] for _ in sequences]  # sample -> the row positions of its tokens
    child: dict[tuple[int, int], int] = {}  # (parent position, token) -> position, in the last row
    children: dict[int, int] = {}  # parent position -> number of children, in the last row
    prev: int | None = None  # the sample placed last in the last row
    for i in order:
        seq = sequences[i]
        shared = 0
        if share and prev is not None:
            other = sequences[prev]
            limit = min(len(seq), len(other))
            while shared < limit and seq[shared] == other[shared]:
                shared += 1
        if not rows or not share or len(rows[-1].tokens) + len(seq) - shared > max_tokens:
            rows.append(Row())
            child, children, shared = {}, {}, 0
        row = rows[-1]
        path = path_of[prev][:shared] if shared else []
        parent = path[-1] if path else -1
        for depth in range(shared, len(seq)):
            at = len(row.tokens)
            row.tokens.append(int(seq[depth]))
            row.depth.append(depth)
            row.parent.append(parent)
            n = children.get(parent, 0)
            row.branched = row.branched or n > 0
            children[parent] = n + 1
            child[(parent, int(seq[depth]))] = at
            path.append(at)
            parent = at
        path_of[i], row_of[i], prev = path, len(rows) - 1, i
    out = Packing(rows, [], [], [], [], [])
    for i, seq in enumerate(sequences):
        path = path_of[i]
        for j in range(starts[i], len(seq)):
            out.row.append(row_of[i])
            out.pos.append(path[j - 1])
            out.target.append(int(seq[j]))
            out.sample.append(i)
            out.index.append(j - starts[i])
    return out


def distinct_tokens(sequences: Sequence[Sequence[int]]) -> int:
    """Distinct token positions of a batch: the nodes of the prefix tree of all its sequences
    (a token counts once per distinct context).  The floor of what any scorer must run."""
    ordered = sorted(tuple(s) for s in sequences)
    total, prev = 0, ()
    for seq in ordered:
        shared = 0
        limit = min(len(seq), len(prev))
        while shared < limit and seq[shared] == prev[shared]:
            shared += 1
        total += len(seq) - shared
        prev = seq
    return total


# --------------------------------------------------------------------------------------------
# forward passes over rows
# --------------------------------------------------------------------------------------------


@dataclass
class Pass:
    """The tensors of one forward pass: B right-padded rows and the pairs they score."""

    input_ids: torch.Tensor  # [B, L]
    position_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L] (every row a path) or [B, 1, L, L] bool (tree mask)
    pair_row: torch.Tensor  # [K]  row within this pass
    pair_pos: torch.Tensor  # [K]
    targets: torch.Tensor  # [K]
    pairs: torch.Tensor  # [K]  the pairs' indices in the Packing (to gather per-pair data)

    @property
    def tokens(self) -> int:
        return int(self.input_ids.numel())

    def to(self, device: torch.device | str) -> "Pass":
        return Pass(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


def passes(packing: Packing, rows_per_pass: int | None = None, max_tokens: int | None = None, pad_id: int = 0) -> list[Pass]:
    """Group the rows, in order, into right-padded forward passes: ``rows_per_pass`` rows each,
    or as many rows as keep ``rows x longest row`` within ``max_tokens`` (at least one)."""
    if (rows_per_pass is None) == (max_tokens is None):
        raise ValueError("give exactly one of rows_per_pass and max_tokens")
    if (rows_per_pass or max_tokens) < 1:
        raise ValueError(f"rows_per_pass / max_tokens must be >= 1 (found {rows_per_pass or max_tokens})")
    by_row: dict[int, list[int]] = {}
    for k, r in enumerate(packing.row):
        by_row.setdefault(r, []).append(k)
    bounds, first = [], 0
    while first < len(packing.rows):
        last, longest = first + 1, len(packing.rows[first].tokens)
        while last < len(packing.rows) and (
            last - first < rows_per_pass if rows_per_pass is not None
            else (last - first + 1) * max(longest, len(packing.rows[last].tokens)) <= max_tokens
        ):
            longest = max(longest, len(packing.rows[last].tokens))
            last += 1
        bounds.append((first, last))
        first = last
    out = []
    for first, last in bounds:
        rows = packing.rows[first:last]
        b, length = len(rows), max(len(r.tokens) for r in rows)
        input_ids = torch.full((b, length), pad_id, dtype=torch.long)  # [B, L]
        position_ids = torch.zeros((b, length), dtype=torch.long)  # [B, L]
        tree = any(r.branched for r in rows)
        if tree:
            mask = torch.zeros((b, 1, length, length), dtype=torch.bool)  # [B, 1, L, L]
            mask[:, 0].diagonal(dim1=-2, dim2=-1).fill_(True)  # padding attends to itself (no empty softmax row)
        else:
            mask = torch.zeros((b, length), dtype=torch.long)  # [B, L]
        for i, r in enumerate(rows):
            n = len(r.tokens)
            input_ids[i, :n] = torch.tensor(r.tokens, dtype=torch.long)
            position_ids[i, :n] = torch.tensor(r.depth, dtype=torch.long)
            if tree:
                m = mask[i, 0]
                for a, p in enumerate(r.parent):  # ancestors of a = ancestors of its parent, and a itself
                    if p >= 0:
                        m[a, :a] = m[p, :a]
            else:
                mask[i, :n] = 1
        ks = [k for r in range(first, first + b) for k in by_row.get(r, [])]
        out.append(Pass(
            input_ids, position_ids, mask,
            pair_row=torch.tensor([packing.row[k] - first for k in ks], dtype=torch.long),
            pair_pos=torch.tensor([packing.pos[k] for k in ks], dtype=torch.long),
            targets=torch.tensor([packing.target[k] for k in ks], dtype=torch.long),
            pairs=torch.tensor(ks, dtype=torch.long),
        ))
    return out


def _tree_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean [B, 1, L, L] "may attend" mask as the additive float mask every attention
    implementation accepts (0 where allowed, the dtype's minimum elsewhere)."""
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill_(~mask, torch.finfo(dtype).min)


# --------------------------------------------------------------------------------------------
# log-probabilities
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Heads:
    """A causal LM split where the logits are made: ``body(input_ids, ...) -> [B, L, D]`` hidden
    states and ``head(h) -> [.., V]`` logits (the output embedding, then any final soft-capping)."""

    body: Callable[..., Any]
    head: Callable[[torch.Tensor], torch.Tensor]


def split_model(model: nn.Module) -> Heads | None:
    """The decoder body and output head of a transformers causal LM (or a peft model around
    one), or None when the model is not laid out that way (it is then scored whole).

    The split is what ``XForCausalLM.forward`` does: ``lm_head(model(...).last_hidden_state)``,
    plus Gemma-style ``final_logit_softcapping`` and Cohere-style ``logit_scale`` where a
    config sets them.  LoRA layers inside the body or on the head apply as in a full forward.
    """
    hf = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft -> transformers
    get_decoder = getattr(hf, "get_decoder", None)
    get_head = getattr(hf, "get_output_embeddings", None)
    if get_decoder is None or get_head is None:
        return None
    body, lm_head = get_decoder(), get_head()
    if body is None or lm_head is None or body is hf:
        return None
    cfg = getattr(hf, "config", None)
    cap = getattr(cfg, "final_logit_softcapping", None)
    scale = getattr(cfg, "logit_scale", None)

    def head(h: torch.Tensor) -> torch.Tensor:
        logits = lm_head(h)
        if scale is not None:
            logits = logits * scale
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    return Heads(body, head)


SHARDED_SCORE = "mas_token_logprobs_packed"  # the scoring method a sharded model carries (mas.runtime.sharding)


def token_logprobs_packed(
    model: nn.Module,
    batch: Pass,
    temperatures: torch.Tensor,
    chunk: int | None = 1024,
    heads: Heads | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability and entropy of every pair of ``batch`` ([K] each; entropy detached); see
    ``packed_logprobs``.  A model sharded with FSDP (``mas.runtime.sharding``) is scored through
    the method it carries, registered as a forward method of its root, so that the body and the
    head, called apart, still gather their shards and reduce their gradients."""
    method = getattr(model, SHARDED_SCORE, None)
    if method is not None:
        return method(batch, temperatures, chunk, heads)
    return packed_logprobs(model, batch, temperatures, chunk, heads)


def packed_logprobs(
    model: nn.Module,
    batch: Pass,
    temperatures: torch.Tensor,
    chunk: int | None = 1024,
    heads: Heads | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability and entropy of every pair of ``batch`` ([K] each; entropy detached).

    ``temperatures``: [K], each pair's sampling temperature (greedy turns: 1).  ``chunk``: pairs
    whose logits are made at once, under activation checkpointing; None makes all [K, V] logits
    at once and keeps them for backward (the unchunked reference).  ``heads``: the model's
    ``split_model`` (None: the whole model's logits, for models that cannot be split).
    """
    mask = batch.attention_mask
    if mask.dim() == 4:
        param = next(model.parameters())
        mask = _tree_mask(mask, param.dtype if param.is_floating_point() else torch.float32)
    kwargs = dict(input_ids=batch.input_ids, position_ids=batch.position_ids, attention_mask=mask, use_cache=False)
    temps = temperatures.to(device=batch.input_ids.device, dtype=torch.float32)  # [K]
    if heads is None:  # no split: whole-vocabulary logits of every position, then the pairs
        logits = model(**kwargs).logits[batch.pair_row, batch.pair_pos]  # [K, V]
        return _logprob_entropy(logits, batch.targets, temps)
    hidden = heads.body(**kwargs).last_hidden_state  # [B, L, D]
    h = hidden[batch.pair_row, batch.pair_pos]  # [K, D]  the states that predict the completion tokens

    def fn(x: torch.Tensor, t: torch.Tensor, tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _logprob_entropy(heads.head(x), t, tau)

    if chunk is None:
        return fn(h, batch.targets, temps)
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1 or None (found {chunk})")
    parts = []
    for i in range(0, h.shape[0], chunk):
        args = (h[i : i + chunk], batch.targets[i : i + chunk], temps[i : i + chunk])
        parts.append(_checkpointed(fn, *args) if h.requires_grad else fn(*args))
    if not parts:
        return h.new_zeros(0, dtype=torch.float32), h.new_zeros(0, dtype=torch.float32)
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def _checkpointed(fn: Callable, *args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``fn(*args)`` without keeping its [chunk, V] intermediates for backward (recomputed there)."""
    return checkpoint(fn, *args, use_reentrant=False)


def _logprob_entropy(logits: torch.Tensor, targets: torch.Tensor, temps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[K] logprobs of ``targets`` under ``logits / temps`` (float32), and the detached entropy."""
    logits = logits.float()
    if bool((temps != 1.0).any()):
        logits = logits / temps[:, None]
    logp, lse = TokenLogprob.apply(logits, targets)  # [K] each
    with torch.no_grad():
        p = torch.softmax(logits, dim=-1)  # [K, V]
        entropy = lse - torch.einsum("kv,kv->k", p, logits)  # [K]  row dot products: no [K, V] product buffer
    return logp, entropy


class TokenLogprob(torch.autograd.Function):
    """``logits.gather(-1, targets) - logsumexp(logits, -1)`` and the (non-differentiable) lse.

    Same values and, bit for bit, the same gradient as autograd's composition
    (``-g * exp(logits - lse)``, plus ``g`` scattered onto each target), but the backward
    builds it in a single [..., V] buffer rather than the softmax, its product with the
    gradient, the gather's zero-filled scatter and their sum.  Saves ``logits`` (no copy).
    """

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lse = torch.logsumexp(logits, dim=-1)  # [...]
        logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse  # [...]
        ctx.save_for_backward(logits, targets, lse)
        ctx.mark_non_differentiable(lse)
        return logp, lse

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _grad_lse: torch.Tensor | None) -> tuple[torch.Tensor, None]:
        logits, targets, lse = ctx.saved_tensors
        out = (logits - lse.unsqueeze(-1)).exp_()  # [..., V]  softmax
        out.mul_(grad.neg().unsqueeze(-1))  # logsumexp's share: -g * softmax
        out.scatter_add_(-1, targets.unsqueeze(-1), grad.unsqueeze(-1))  # gather's share: +g at the target
        return out, None


def turn_logprobs(
    model: nn.Module,
    turns: Sequence[tuple[Sequence[int], Sequence[int]]],
    temperatures: Sequence[float],
    max_tokens: int = 4096,
) -> list[list[float]]:
    """Each turn's completion-token logprobs under ``model`` as the learner scores them (packed
    prefix tree, ``token_logprobs_packed``), without gradients: what a rollout backend's
    sampling logprobs must equal for the PPO ratio to start at 1.  ``turns``: (prompt_ids,
    completion_ids) pairs; ``temperatures``: each turn's (0 = greedy, scored at T = 1)."""
    seqs = [list(p) + list(c) for p, c in turns]
    packing = pack(seqs, [len(p) for p, _ in turns], max_tokens)
    temps = torch.tensor([t if t > 0 else 1.0 for t in temperatures], dtype=torch.float32)[
        torch.tensor(packing.sample, dtype=torch.long)]  # [K]
    device = next(model.parameters()).device
    out = [[0.0] * len(c) for _, c in turns]
    heads = split_model(model)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for group in passes(packing, max_tokens=max_tokens):
                logp, _ = token_logprobs_packed(model, group.to(device), temps[group.pairs], chunk=None, heads=heads)
                for k, v in zip(group.pairs.tolist(), logp.float().cpu().tolist()):
                    out[packing.sample[k]][packing.index[k]] = v
    finally:
        model.train(was_training)
    return out
