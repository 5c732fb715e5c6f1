"""Shapley machinery (credit/shapley.py): hand-derived games, the [T] axioms of CREDIT_SPEC §4.7
and §10 rows 10–11, a brute-force permutation reference, and the coalition bookkeeping SHARP
plans with."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from mas.credit.shapley import (
    exact_shapley,
    exact_shapley_from_table,
    from_mask,
    loo_marginal,
    marginal_contributions,
    mc_shapley,
    mc_shapley_from_orderings,
    permutation_orderings,
    queried_coalitions,
    resolve_kind,
    shapley_weights,
    table_game,
    to_mask,
    value_table,
)


def and_game(S):
    """Both players are needed: v({0, 1}) = 1, every other coalition 0."""
    return float(S == frozenset({0, 1}))


def weighted_majority(weights, quota):
    return lambda S: float(sum(weights[i] for i in S) >= quota)


def random_game(n: int, seed: int):
    """A random value table over all 2^n coalitions (v(∅) need not be 0)."""
    rng = random.Random(seed)
    return table_game({from_mask(m): rng.uniform(-1.0, 2.0) for m in range(1 << n)}, n)


def brute_force_shapley(n: int, v) -> list[float]:
    """Slow reference: average marginal contribution over all n! orderings."""
    phi = [0.0] * n
    perms = list(itertools.permutations(range(n)))
    for perm in perms:
        S: set[int] = set()
        for p in perm:
            phi[p] += v(frozenset(S | {p})) - v(frozenset(S))
            S.add(p)
    return [x / len(perms) for x in phi]


def brute_force_subsets(n: int, v) -> list[float]:
    """Second reference, straight from the subset formula with factorials."""
    phi = [0.0] * n
    for m in range(n):
        others = [i for i in range(n) if i != m]
        for k in range(len(others) + 1):
            for S in itertools.combinations(others, k):
                w = math.factorial(k) * math.factorial(n - k - 1) / math.factorial(n)
                phi[m] += w * (v(frozenset(S) | {m}) - v(frozenset(S)))
    return phi


# --- hand-derived -------------------------------------------------------------------------------


def test_and_game_loo_violates_efficiency_while_shapley_splits_it():
    """[T] §10 row 11: LOO gives Δ = v(N) − v(N∖{m}) = 1 − 0 for both players, sum 2, while
    v(N) − v(∅) = 1; Shapley gives ½·(v({0}) − v(∅)) + ½·(v(N) − v({1})) = ½ each."""
    loo = loo_marginal(2, and_game)
    assert loo.tolist() == [1.0, 1.0] and float(loo.sum()) == 2.0
    exact = exact_shapley(2, and_game)
    assert exact.tolist() == [0.5, 0.5] and float(exact.sum()) == and_game(frozenset({0, 1})) - and_game(frozenset())
    mc = mc_shapley(2, and_game, permutations=256, seed=0)
    assert abs(mc[0] - 0.5) < 0.1 and abs(mc[1] - 0.5) < 0.1  # MC Shapley -> 0.5
    assert float(mc.sum()) == 1.0  # every ordering telescopes: exactly efficient


def test_three_player_game_by_the_subset_formula():
    """Weights for n = 3: |S| = 0 -> 0!2!/3! = 1/3, |S| = 1 -> 1!1!/3! = 1/6, |S| = 2 -> 2!0!/3! = 1/3."""
    t = {(): 0.0, (0,): 1.0, (1,): 2.0, (2,): 0.0, (0, 1): 4.0, (0, 2): 1.0, (1, 2): 3.0, (0, 1, 2): 6.0}
    v = table_game(t, 3)
    phi0 = 1 / 3 * (1 - 0) + 1 / 6 * (4 - 2) + 1 / 6 * (1 - 0) + 1 / 3 * (6 - 3)
    phi1 = 1 / 3 * (2 - 0) + 1 / 6 * (4 - 1) + 1 / 6 * (3 - 0) + 1 / 3 * (6 - 1)
    phi2 = 1 / 3 * (0 - 0) + 1 / 6 * (1 - 1) + 1 / 6 * (3 - 2) + 1 / 3 * (6 - 4)
    torch.testing.assert_close(exact_shapley(3, v), torch.tensor([phi0, phi1, phi2], dtype=torch.float64))
    torch.testing.assert_close(shapley_weights(3), torch.tensor([1 / 3, 1 / 6, 1 / 3], dtype=torch.float64))
    # LOO by hand: v(N) − v(N∖{m})
    torch.testing.assert_close(loo_marginal(3, v), torch.tensor([6 - 3, 6 - 1, 6 - 4], dtype=torch.float64))


def test_weights_sum_to_one_over_coalitions():
    """Σ_{S ⊆ N∖{m}} w(|S|) = Σ_s C(n−1, s)·s!(n−s−1)!/n! = 1 for every n."""
    for n in range(1, 10):
        w = shapley_weights(n)
        assert math.isclose(sum(math.comb(n - 1, s) * float(w[s]) for s in range(n)), 1.0)
        assert torch.allclose(w, torch.tensor([math.factorial(s) * math.factorial(n - s - 1) / math.factorial(n) for s in range(n)], dtype=torch.float64))


# --- slow reference ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", range(1, 7))
@pytest.mark.parametrize("seed", range(3))
def test_exact_shapley_equals_brute_force_over_all_permutations(n, seed):
    v = random_game(n, 10 * n + seed)
    expected = brute_force_shapley(n, v)
    torch.testing.assert_close(exact_shapley(n, v), torch.tensor(expected, dtype=torch.float64))
    torch.testing.assert_close(exact_shapley(n, v), torch.tensor(brute_force_subsets(n, v), dtype=torch.float64))


@pytest.mark.parametrize("n", [1, 3, 5, 9])
def test_mc_estimate_equals_a_loop_over_its_own_orderings(n):
    v = random_game(n, n)
    orderings = permutation_orderings(n, 20, seed=n)
    phi = [0.0] * n
    for perm in orderings.tolist():
        S: set[int] = set()
        for p in perm:
            phi[p] += v(frozenset(S | {p})) - v(frozenset(S))
            S.add(p)
    torch.testing.assert_close(mc_shapley_from_orderings(orderings, v), torch.tensor(phi, dtype=torch.float64) / 20)
    assert sorted(map(sorted, orderings.tolist())) == [list(range(n))] * 20  # each row is a permutation


# --- [T] axioms (exact) ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", range(1, 9))
def test_efficiency(n):
    """[T] Σ_m φ_m = v(N) − v(∅)."""
    v = random_game(n, 100 + n)
    phi = exact_shapley(n, v)
    assert math.isclose(float(phi.sum()), v(frozenset(range(n))) - v(frozenset()), abs_tol=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_null_player_gets_zero(seed):
    """[T] Player 3 never changes any coalition's value: v(S ∪ {3}) = v(S) for all S, so φ_3 = 0."""
    base = random_game(3, seed)
    v = lambda S: base(S - {3})  # noqa: E731
    phi = exact_shapley(4, v)
    assert abs(float(phi[3])) < 1e-12
    torch.testing.assert_close(phi[:3], exact_shapley(3, base))  # the others are unaffected


@pytest.mark.parametrize("seed", range(4))
def test_symmetric_players_get_equal_credit(seed):
    """[T] Players 1 and 2 are interchangeable (v depends on S only through S with 1 and 2 swapped
    being equal), so φ_1 = φ_2; an asymmetric game breaks it."""
    rng = random.Random(seed)
    table = {}
    for m in range(1 << 4):
        S = from_mask(m)
        swapped = frozenset({1: 2, 2: 1}.get(i, i) for i in S)
        key = min(to_mask(S), to_mask(swapped))
        table.setdefault(key, rng.uniform(-1, 1))
    v = lambda S: table[min(to_mask(S), to_mask(frozenset({1: 2, 2: 1}.get(i, i) for i in S)))]  # noqa: E731
    phi = exact_shapley(4, v)
    assert math.isclose(float(phi[1]), float(phi[2]), abs_tol=1e-12)
    asym = random_game(4, seed)
    phi_a = exact_shapley(4, asym)
    assert not math.isclose(float(phi_a[1]), float(phi_a[2]), abs_tol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_additivity(seed):
    """[T] φ(v + w) = φ(v) + φ(w)."""
    v, w = random_game(5, seed), random_game(5, 50 + seed)
    both = lambda S: v(S) + w(S)  # noqa: E731
    torch.testing.assert_close(exact_shapley(5, both), exact_shapley(5, v) + exact_shapley(5, w))


def test_loo_equals_shapley_on_additive_games_only():
    """For additive v(S) = Σ_{i∈S} a_i both give a_i; in the AND game they differ (above)."""
    a = [0.5, -1.0, 2.0, 0.25]
    v = lambda S: sum(a[i] for i in S)  # noqa: E731
    torch.testing.assert_close(loo_marginal(4, v), torch.tensor(a, dtype=torch.float64))
    torch.testing.assert_close(exact_shapley(4, v), torch.tensor(a, dtype=torch.float64))


# --- Monte-Carlo permutation Shapley ------------------------------------------------------------------


def random_unit_game(n: int, seed: int):
    """A random value table with values in [0, 1] (a bounded, non-monotone game)."""
    rng = random.Random(seed)
    return table_game({from_mask(m): rng.random() for m in range(1 << n)}, n)


SIX_PLAYER_GAMES = [
    ("weighted majority [4,3,2,2,1,1] quota 7", weighted_majority([4, 3, 2, 2, 1, 1], 7)),
    ("random [0,1] table", random_unit_game(6, 7)),
]


@pytest.mark.parametrize("name,game", SIX_PLAYER_GAMES)
def test_mc_within_005_of_exact_at_256_orderings_on_6_players(name, game):
    """[T] §10 row 11 / issue acceptance 1: |φ_MC − φ| < 0.05 for every player at P = 256, seed 0.

    The per-player standard error here is about 0.025, so the max over 6 players stays under
    0.05 for most seeds but not all (about 4 in 5 for the majority game): the seed is fixed, and
    the next test checks the estimator's bias and typical error over many seeds."""
    exact = exact_shapley(6, game)
    mc = mc_shapley(6, game, permutations=256, seed=0)
    assert float((mc - exact).abs().max()) < 0.05, (name, mc, exact)
    assert exact.abs().max() > 0.1  # a non-trivial game


@pytest.mark.parametrize("name,game", SIX_PLAYER_GAMES)
def test_mc_is_unbiased_over_seeds(name, game):
    """Mean of 64 independent P = 256 estimates is within 0.01 of exact (standard error ≈ 0.003),
    and the mean max error of one estimate is below 0.05."""
    exact = exact_shapley(6, game)
    runs = torch.stack([mc_shapley(6, game, permutations=256, seed=s) for s in range(64)])  # [64, 6]
    assert float((runs.mean(0) - exact).abs().max()) < 0.01, name
    assert float((runs - exact).abs().max(dim=1).values.mean()) < 0.05, name


def test_mc_is_exactly_efficient_and_seeded():
    v = random_game(7, 3)
    a = mc_shapley(7, v, permutations=10, seed=5)
    assert math.isclose(float(a.sum()), v(frozenset(range(7))) - v(frozenset()), abs_tol=1e-9)
    assert torch.equal(a, mc_shapley(7, v, permutations=10, seed=5))
    assert not torch.equal(permutation_orderings(7, 10, 5), permutation_orderings(7, 10, 6))


# --- coalition bookkeeping -------------------------------------------------------------------------


def counting(v):
    calls: list[frozenset] = []

    def f(S):
        calls.append(S)
        return v(S)

    return f, calls


@pytest.mark.parametrize("kind,n,count", [("exact", 4, 16), ("loo", 4, 5), ("exact", 0, 1), ("loo", 1, 2)])
def test_queried_coalitions_of_exact_and_loo(kind, n, count):
    q = queried_coalitions(n, kind)
    assert len(q) == len(set(q)) == count
    if kind == "loo" and n:
        full = frozenset(range(n))
        assert set(q) == {full} | {full - {m} for m in range(n)}


def test_each_coalition_is_evaluated_once_and_is_one_the_plan_named():
    """256 orderings of 3 players visit 256·4 prefix coalitions, only 8 of them distinct: the value
    function is called once per distinct coalition, and those are exactly queried_coalitions."""
    v, calls = counting(random_game(3, 0))
    marginal_contributions(3, v, "mc", permutations=256, seed=1)
    assert len(calls) == len(set(calls)) == 8
    assert sorted(map(to_mask, calls)) == sorted(map(to_mask, queried_coalitions(3, "mc", permutations=256, seed=1)))
    for kind in ("exact", "loo"):
        v, calls = counting(random_game(5, 0))
        marginal_contributions(5, v, kind)
        assert len(calls) == len(set(calls)) and set(calls) == set(queried_coalitions(5, kind))


def test_mc_with_few_orderings_asks_for_fewer_coalitions_than_exact():
    q = queried_coalitions(10, "mc", permutations=4, seed=0)
    assert len(q) <= 4 * 10 + 1 < 2**10
    assert frozenset() in q and frozenset(range(10)) in q


def test_exact_falls_back_to_mc_above_max_exact_players():
    assert resolve_kind(8, "exact", 8) == "exact" and resolve_kind(9, "exact", 8) == "mc"
    assert resolve_kind(20, "loo", 8) == "loo" and resolve_kind(2, "mc", 8) == "mc"
    v = random_game(5, 1)
    torch.testing.assert_close(marginal_contributions(5, v, "exact", max_exact_players=4, permutations=16, seed=3), mc_shapley(5, v, 16, 3))
    torch.testing.assert_close(marginal_contributions(5, v, "exact"), exact_shapley(5, v))
    with pytest.raises(ValueError, match="unknown marginal kind"):
        resolve_kind(3, "banzhaf", 8)


def test_table_game_from_mapping_and_tensor():
    t = {(): 0.0, (0,): 1.0, (1,): 0.0, (1, 0): 3.0}  # key order inside a coalition does not matter
    v = table_game(t, 2)
    assert v(frozenset({0, 1})) == 3.0 and v({0}) == 1.0
    tensor = value_table(2, v)
    assert tensor.tolist() == [0.0, 1.0, 0.0, 3.0]  # indexed by bitmask
    torch.testing.assert_close(exact_shapley_from_table(tensor), exact_shapley(2, table_game(tensor)))
    with pytest.raises(KeyError, match=r"\[2\]"):
        table_game(t, 2)(frozenset({2}))
    with pytest.raises(ValueError, match="2\\^n"):
        table_game(torch.zeros(3))
    assert exact_shapley(0, v).numel() == 0 and loo_marginal(0, v).numel() == 0
    assert mc_shapley(0, v, 4, 0).numel() == 0
