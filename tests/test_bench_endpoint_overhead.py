"""bench/endpoint_overhead.py compares like with like: its entry points (the ``openai`` client, or
plain HTTP) make the chain's very calls, so every team samples the same turns, token for token, and
every call through the endpoint is paired with the engine's handling of it (no timings are checked)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from mas.config.schema import validate_config  # noqa: E402
from mas.process.team_processes import close_shared_team_processes  # noqa: E402
from mas.training.team import build_team  # noqa: E402

BENCH = Path(__file__).parents[1] / "bench"


@pytest.fixture()
def bench_teams(monkeypatch, tiny_model_dir):
    monkeypatch.syspath_prepend(str(BENCH))  # the entry points endpoint_overhead:run_team, ...
    import endpoint_overhead as bench

    teams = {name: build_team(validate_config(bench.config(topo, 6, 1, str(tiny_model_dir))))
             for name, topo in bench.topologies(1).items()}
    yield bench, teams
    for team in teams.values():
        team.close()
    close_shared_team_processes()


def test_the_endpoint_teams_sample_the_chains_turns_token_for_token(bench_teams):
    bench, teams = bench_teams
    tasks = teams[bench.IN_PROCESS].env.sample_tasks(2)
    runs = {name: team.engine.rollout(tasks, 2, seed=3) for name, team in teams.items()}
    chain = runs[bench.IN_PROCESS]
    assert [t.agent for g in chain for ep in g.episodes for t in ep.turns] == ["solver", "checker"] * 4
    for name, groups in runs.items():
        assert all(ep.status == "ok" for g in groups for ep in g.episodes), name
        assert bench.signature(groups) == bench.signature(chain), name


def test_measure_pairs_every_endpoint_call_with_the_engines_handling_of_it(bench_teams):
    bench, teams = bench_teams
    tasks = [teams[bench.IN_PROCESS].env.sample_tasks(2)]
    m = bench.measure(teams, tasks, group=2, rounds=1)
    assert m.calls == 2 * 2 * 2  # tasks x episodes x (solver, checker)
    for name in teams:
        assert len(m.rate[name]) == len(m.cpu[name]) == 1
        assert len(m.per_call[name]) == m.calls, name
        assert len(m.added[name]) == (0 if name == bench.IN_PROCESS else m.calls), name
        assert len(m.client_cpu[name]) == (0 if name == bench.IN_PROCESS else m.calls), name
