"""The Python API: load a team, train it, evaluate it (docs/python_api.md).

    import mas

    team = mas.load_team("configs/quickstart.yaml", ["trainer.steps=5"])
    summary = mas.train(team, "runs/quickstart", callbacks=[MyCallback()])
    print(mas.evaluate(team, 100)["accuracy"])

These are the functions ``mas train`` and ``mas eval`` call; a run started here writes the
same run directory (metrics, episodes, checkpoints, report data) and resumes the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mas.training.callbacks import Callback, RunControl
from mas.config.checks import meaning_errors
from mas.config.loading import apply_overrides, load_config, validate_config
from mas.config.schema import RunConfig
from mas.training.team import Team, build_team, check_eval_size

__all__ = ["evaluate", "load_team", "train"]


def load_team(source: str | Path | Mapping[str, Any] | RunConfig, overrides: Sequence[str] = ()) -> Team:
    """Validate a config and build the team: models, backend, engine, env and one learner per
    trainable policy.

    ``source``: a YAML path, a dict with the YAML's structure, or a ``RunConfig``.
    ``overrides``: ``"key.sub=value"`` strings, as on the command line (``trainer.steps=5``,
    ``agents.solver.sampling.temperature=0.7``).  A bad config raises ``mas.config.schema.ConfigError``
    with every problem and its YAML path, before any model loads.
    """
    if isinstance(source, RunConfig):
        data = apply_overrides(source.model_dump(mode="json", by_alias=True), list(overrides))
        cfg = validate_config(data, "<RunConfig>", check=meaning_errors)
    elif isinstance(source, Mapping):
        cfg = validate_config(apply_overrides(dict(source), list(overrides)), "<dict>", check=meaning_errors)
    else:
        cfg = load_config(source, list(overrides), check=meaning_errors)
    return build_team(cfg)


def train(
    team: Team,
    run_dir: str | Path | None = None,
    callbacks: Iterable[Callback] = (),
    resume: bool = False,
    control: RunControl | None = None,
) -> dict:
    """Train ``team`` (or continue it with ``resume=True``); returns the run's summary.

    ``run_dir`` defaults to the config's ``logging.run_dir``.  Each callback may implement
    ``on_step_end(step, metrics, groups, credit)``, ``on_eval(name, metrics)`` and
    ``on_checkpoint(step, path)`` (``mas.training.callbacks``); a truthy ``on_step_end``/``on_eval``
    return stops the run after that step with a checkpoint, and ``summary["stopped"]`` says why.
    ``control.request_stop(reason)`` does the same from elsewhere (another thread, a signal).
    """
    from mas.training.trainer import train as run_training

    run_dir = Path(run_dir) if run_dir is not None else Path(team.cfg.logging.run_dir.replace("{team}", team.cfg.team.name))
    return run_training(team, run_dir, resume=resume, callbacks=callbacks, control=control)


def evaluate(team: Team, n: int | None = None, seed: int | None = None) -> dict:
    """Held-out evaluation of ``n`` tasks (default ``trainer.eval_size``, or 100 when it is 0): ``accuracy``
    (the greedy team's mean reward), the env's named scores and tool calls per agent, and where the team trains
    by sampling, ``sampled`` (avg@k, pass@k at each agent's own settings; ``trainer.eval_sampled_k``)."""
    from mas.training.evaluation import evaluate as run_eval

    cfg = team.cfg
    size = n if n is not None else (cfg.trainer.eval_size or 100)
    check_eval_size(team.env, size, "evaluate(n)")
    return run_eval(team, size, cfg.trainer.seed if seed is None else seed)
