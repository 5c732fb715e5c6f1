"""Shapley machinery for coalition credit: exact, Monte-Carlo permutation and leave-one-out.

Pure functions of a cooperative game with ``n`` players ``0..n-1``.  A game is a value
function ``v(S) -> float`` over coalitions ``S`` (frozensets of player indices);
``table_game`` builds one from a hand-written table, so tests and benchmarks can use
known games, and SHARP (``sharp.py``) builds one that reads the engine's counterfactual
episodes.  Internally a coalition is a bitmask (player i is bit ``1 << i``).

    exact   φ_m = Σ_{S ⊆ N∖{m}} |S|!(n−|S|−1)!/n! · [v(S ∪ {m}) − v(S)]       (2^n values)
    mc      φ_m ≈ (1/P) Σ_p [v(pre_p(m) ∪ {m}) − v(pre_p(m))], pre_p(m) = the players
            before m in ordering p; P orderings drawn uniformly from a seeded generator.
            Unbiased; each ordering telescopes, so Σ_m φ_m = v(N) − v(∅) exactly.
    loo     Δ_m = v(N) − v(N∖{m}): the single-mask marginal SHARP reportedly uses
            (CREDIT_SPEC §4.2).  Not Shapley unless v is additive: in the AND game
            (v = 1 only for both players) Δ = (1, 1) sums to 2, Shapley gives (½, ½).

``marginal_contributions`` dispatches on the kind (exact falls back to mc above
``max_exact_players``); ``queried_coalitions`` returns exactly the coalitions that call
would evaluate, found by running the same estimator against a recording game, so a
planner and the estimator can never disagree about which coalitions are needed.  An MC
ordering revisits coalitions other orderings already used; each distinct coalition is
evaluated once (``_evaluate`` deduplicates the masks before calling ``v``).

Shapes: n players, M = 2^n coalitions (exact table), P orderings, U distinct coalitions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Callable, Literal

import torch

Coalition = frozenset[int]
ValueFn = Callable[[Coalition], float]
MarginalKind = Literal["exact", "mc", "loo"]
MAX_PLAYERS = 62  # coalitions are int64 bitmasks


# --- coalitions and games ------------------------------------------------------------------


def to_mask(coalition: Iterable[int]) -> int:
    """Bitmask of a coalition (player i is bit ``1 << i``)."""
    mask = 0
    for i in coalition:
        mask |= 1 << int(i)
    return mask


def from_mask(mask: int) -> Coalition:
    """Coalition (frozenset of player indices) of a bitmask."""
    mask = int(mask)
    return frozenset(i for i in range(mask.bit_length()) if mask >> i & 1)


def _check_players(n: int) -> None:
    if not 0 <= n <= MAX_PLAYERS:
        raise ValueError(f"number of players must be in 0..{MAX_PLAYERS}, got {n}")


def table_game(table: Mapping[Iterable[int], float] | torch.Tensor, n: int | None = None) -> ValueFn:
    """A value function from a table of coalition values.

    ``table`` is either a mapping from coalitions (any iterable of player indices: tuples,
    sets, frozensets) to values, or a tensor [2^n] indexed by bitmask.  Asking for a
    coalition the table lacks is a KeyError naming it (with ``n``, also one outside
    players ``0..n-1``).
    """
    if isinstance(table, torch.Tensor):
        size = table.numel()
        if table.dim() != 1 or size & (size - 1):
            raise ValueError(f"a value table tensor must be 1-d with 2^n entries, got shape {tuple(table.shape)}")
        values = table.to(torch.float64).tolist()
        return lambda S: values[to_mask(S)]
    by_mask = {to_mask(S): float(v) for S, v in table.items()}
    full = (1 << n) - 1 if n is not None else None

    def value(S: Coalition) -> float:
        mask = to_mask(S)
        if (full is not None and mask & ~full) or mask not in by_mask:
            raise KeyError(f"coalition {sorted(S)} is not in the value table")
        return by_mask[mask]

    return value


def _evaluate(masks: torch.Tensor, value: ValueFn) -> torch.Tensor:
    """v at each mask of ``masks`` (any shape), calling ``value`` once per distinct coalition."""
    uniq, inverse = torch.unique(masks.flatten(), return_inverse=True)  # [U], [numel]
    vals = torch.tensor([float(value(from_mask(m))) for m in uniq.tolist()], dtype=torch.float64)  # [U]
    return vals[inverse].view(masks.shape)


def value_table(n: int, value: ValueFn) -> torch.Tensor:
    """v(S) for all 2^n coalitions, indexed by bitmask.  [M] float64"""
    _check_players(n)
    return _evaluate(torch.arange(1 << n, dtype=torch.long), value)  # [M]


# --- exact Shapley -------------------------------------------------------------------------


def shapley_weights(n: int) -> torch.Tensor:
    """w[s] = s!(n−s−1)!/n! = 1/(n·C(n−1, s)) for coalition sizes s = 0..n−1.  [n] float64"""
    return torch.tensor([1.0 / (n * math.comb(n - 1, s)) for s in range(n)], dtype=torch.float64)


def exact_shapley_from_table(table: torch.Tensor) -> torch.Tensor:
    """Exact Shapley values from a value table [M = 2^n] indexed by bitmask.  [n] float64

    Vectorised over coalitions and players: for every (S, m) with m ∉ S the term
    w[|S|]·(v(S ∪ {m}) − v(S)); terms with m ∈ S get weight 0.
    """
    M = table.numel()
    if table.dim() != 1 or M == 0 or M & (M - 1):
        raise ValueError(f"a value table must be 1-d with 2^n entries, got shape {tuple(table.shape)}")
    n = M.bit_length() - 1
    v = table.to(torch.float64)  # [M]
    if n == 0:
        return torch.zeros(0, dtype=torch.float64)
    masks = torch.arange(M, dtype=torch.long)  # [M]
    bits = 1 << torch.arange(n, dtype=torch.long)  # [n]
    has = (masks[:, None] & bits) != 0  # [M, n]  m ∈ S
    size = has.sum(dim=1)  # [M] |S|
    w = shapley_weights(n)[size.clamp(max=n - 1)]  # [M] (unused where |S| = n: has is all True there)
    gain = v[masks[:, None] | bits] - v[:, None]  # [M, n] v(S ∪ {m}) − v(S)
    return torch.where(has, torch.zeros_like(gain), w[:, None] * gain).sum(dim=0)  # [n]


def exact_shapley(n: int, value: ValueFn) -> torch.Tensor:
    """Exact Shapley values of an n-player game (evaluates all 2^n coalitions).  [n] float64"""
    return exact_shapley_from_table(value_table(n, value))


# --- Monte-Carlo permutation Shapley -------------------------------------------------------


def permutation_orderings(n: int, permutations: int, seed: int) -> torch.Tensor:
    """P uniformly random orderings of the n players from a generator seeded with ``seed``.  [P, n] long"""
    _check_players(n)
    if permutations < 1:
        raise ValueError(f"permutations must be >= 1, got {permutations}")
    gen = torch.Generator().manual_seed(int(seed) % (1 << 63))
    return torch.rand(permutations, n, generator=gen, dtype=torch.float64).argsort(dim=1)  # [P, n]


def _prefix_masks(orderings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Coalition before and after each position of each ordering.  ([P, n], [P, n]) long"""
    bit = 1 << orderings  # [P, n] (distinct bits within a row, so cumsum is a running OR)
    after = bit.cumsum(dim=1)  # [P, n] pre_p(m) ∪ {m}
    return after - bit, after  # [P, n] pre_p(m), [P, n]


def mc_shapley_from_orderings(orderings: torch.Tensor, value: ValueFn) -> torch.Tensor:
    """Permutation estimate (1/P) Σ_p [v(pre_p(m) ∪ {m}) − v(pre_p(m))].  [n] float64"""
    P, n = orderings.shape
    if n == 0:
        return torch.zeros(0, dtype=torch.float64)
    before, after = _prefix_masks(orderings)  # [P, n] each
    vals = _evaluate(torch.stack([before, after]), value)  # [2, P, n]
    gain = vals[1] - vals[0]  # [P, n] marginal of the player at each position
    phi = torch.zeros(n, dtype=torch.float64).index_add_(0, orderings.flatten(), gain.flatten())  # [n]
    return phi / P


def mc_shapley(n: int, value: ValueFn, permutations: int, seed: int) -> torch.Tensor:
    """Monte-Carlo permutation Shapley with P seeded orderings.  [n] float64"""
    return mc_shapley_from_orderings(permutation_orderings(n, permutations, seed), value)


# --- leave-one-out masking -----------------------------------------------------------------


def loo_marginal(n: int, value: ValueFn) -> torch.Tensor:
    """Δ_m = v(N) − v(N∖{m}) (n + 1 coalitions).  [n] float64"""
    _check_players(n)
    if n == 0:
        return torch.zeros(0, dtype=torch.float64)
    full = (1 << n) - 1
    bits = 1 << torch.arange(n, dtype=torch.long)  # [n]
    vals = _evaluate(torch.cat([torch.tensor([full]), full ^ bits]), value)  # [n + 1]
    return vals[0] - vals[1:]  # [n]


# --- dispatch ------------------------------------------------------------------------------


def resolve_kind(n: int, kind: MarginalKind, max_exact_players: int) -> Literal["exact", "mc", "loo"]:
    """The estimator actually used: ``exact`` becomes ``mc`` above ``max_exact_players``."""
    if kind not in ("exact", "mc", "loo"):
        raise ValueError(f"unknown marginal kind {kind!r}; valid: ['exact', 'loo', 'mc']")
    return "mc" if kind == "exact" and n > max_exact_players else kind


def marginal_contributions(
    n: int, value: ValueFn, kind: MarginalKind = "exact", *, permutations: int = 64, seed: int = 0, max_exact_players: int = 8
) -> torch.Tensor:
    """Each player's marginal credit under ``kind`` (module docstring).  [n] float64"""
    _check_players(n)
    resolved = resolve_kind(n, kind, max_exact_players)
    if resolved == "exact":
        return exact_shapley(n, value)
    if resolved == "mc":
        return mc_shapley(n, value, permutations, seed)
    return loo_marginal(n, value)


def queried_coalitions(
    n: int, kind: MarginalKind = "exact", *, permutations: int = 64, seed: int = 0, max_exact_players: int = 8
) -> list[Coalition]:
    """The distinct coalitions ``marginal_contributions`` (same arguments) evaluates, sorted by bitmask."""
    seen: set[int] = set()

    def record(S: Coalition) -> float:
        seen.add(to_mask(S))
        return 0.0

    marginal_contributions(n, record, kind, permutations=permutations, seed=seed, max_exact_players=max_exact_players)
    return [from_mask(m) for m in sorted(seen)]
