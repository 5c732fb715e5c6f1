"""The ``mas`` command line: train, eval, validate, report, show."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# MKL's default code paths may depend on memory alignment, so two identical CPU runs can differ
# in the last bits; conditional numerical reproducibility removes that (set before torch loads).
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

from mas.config import ConfigError, RunConfig, dump_config, load_config


def _run_dir(cfg: RunConfig, override: str | None) -> Path:
    return Path(override or cfg.logging.run_dir.replace("{team}", cfg.team.name))


def cmd_validate(args: argparse.Namespace) -> int:
    status = 0
    for path in args.configs:
        try:
            cfg = load_config(path, args.overrides)
        except ConfigError as e:
            print(e, file=sys.stderr)
            status = 1
            continue
        if args.quiet:
            print(f"{path}: ok")
        else:
            print(f"# {path}: ok (resolved)\n{dump_config(cfg)}")
    return status


def cmd_train(args: argparse.Namespace) -> int:
    from mas.team import build_team
    from mas.trainer import train

    if args.resume:
        run_dir = Path(args.resume)
        cfg_path = run_dir / "config.yaml"
        if not cfg_path.exists():
            print(f"--resume {run_dir}: no config.yaml there; is it a run directory?", file=sys.stderr)
            return 2
        cfg = load_config(cfg_path, args.overrides)
    else:
        if args.config is None:
            print("mas train: give a CONFIG or --resume RUN_DIR", file=sys.stderr)
            return 2
        cfg = load_config(args.config, args.overrides)
        run_dir = _run_dir(cfg, args.run_dir)
    from mas.runtime import PolicyActorDied

    team = build_team(cfg, run_dir=run_dir)
    try:  # a Ray runtime's actors (and a Ray instance it started) are freed however the run ends
        summary = train(team, run_dir, resume=bool(args.resume), stop_after=args.stop_after)
    except PolicyActorDied as e:
        print(f"{e}\nthe run stopped; its last checkpoint is intact: continue with mas train --resume {run_dir}", file=sys.stderr)
        return 3
    finally:
        team.close()
    before = summary.get("eval_before", {}).get("accuracy")
    after = summary.get("eval_after", {}).get("accuracy")
    if before is not None and after is not None:
        name = {"f1": "F1", "em": "EM"}.get(getattr(cfg.env, "reward", ""), "accuracy")  # research envs: their reward
        print(f"held-out team {name}: before {before:.3f} -> after {after:.3f} ({100 * (after - before):+.1f} points)")
    print(f"run directory: {run_dir}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """Greedy held-out evaluation: accuracy (the env's reward), research EM/F1, tool calls per agent."""
    from mas.checkpoint import latest_checkpoint
    from mas.team import build_team
    from mas.trainer import evaluate

    cfg = load_config(args.config, args.overrides)
    size = args.size or cfg.trainer.eval_size or 100
    with build_team(cfg, eval_size=(size, "--size" if args.size else "trainer.eval_size (or 100 when 0)")) as team:
        if args.checkpoint:
            ckpt = Path(args.checkpoint)
            if (ckpt / "checkpoints").is_dir():  # a run directory: take its latest checkpoint
                ckpt = latest_checkpoint(ckpt) or ckpt
            loaded = [name for name in cfg.policies if (ckpt / "policies" / name).is_dir()]
            if not loaded:
                print(f"--checkpoint {args.checkpoint}: no policy weights found there "
                      f"(expected policies/<name>/ for one of {sorted(cfg.policies)})", file=sys.stderr)
                return 2
            team.runtime.load_policies(ckpt, loaded, learner_state=False)
            print(f"loaded {', '.join(loaded)} from {ckpt}", file=sys.stderr)
        result = evaluate(team, size, cfg.trainer.seed)
    print(json.dumps(result, indent=2))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from mas.report import NotARunError, write_compare, write_report

    try:
        if args.compare:
            runs = [*args.run_dirs, *args.compare]
            if len(runs) < 2:
                print("mas report --compare: give two or more run directories", file=sys.stderr)
                return 2
            path = write_compare(runs, args.out or "compare.html")
        else:
            if len(args.run_dirs) != 1:
                print("mas report: give one RUN_DIR (or --compare RUN_A RUN_B ...)", file=sys.stderr)
                return 2
            path = write_report(args.run_dirs[0], args.out)
    except NotARunError as e:
        print(e, file=sys.stderr)
        return 2
    print(f"report: {path} ({path.stat().st_size / 1e6:.2f} MB)")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from mas.show import team_text, topology_svg

    cfg = load_config(args.config, args.overrides)
    print(team_text(cfg))
    if args.svg:
        Path(args.svg).write_text(topology_svg(cfg), encoding="utf-8")
        print(f"topology picture: {args.svg}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mas", description="Train teams of LLM agents with RL.")
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="train a team from a YAML config")
    t.add_argument("config", nargs="?", help="team YAML")
    t.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. trainer.steps=5")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    t.add_argument("--run-dir", help="where to write the run (default: logging.run_dir)")
    t.add_argument("--stop-after", type=int, help="stop after this many steps in total (checkpointing there)")
    t.set_defaults(fn=cmd_train)

    e = sub.add_parser("eval", help="greedy held-out evaluation of a team (accuracy or EM/F1, tool calls per agent)")
    e.add_argument("config")
    e.add_argument("overrides", nargs="*")
    e.add_argument("--checkpoint", help="a checkpoint directory or a run directory (its latest checkpoint)")
    e.add_argument("--size", type=int, help="held-out tasks (default: trainer.eval_size or 100)")
    e.set_defaults(fn=cmd_eval)

    r = sub.add_parser("report", help="write a self-contained HTML report of a run (or compare runs)")
    r.add_argument("run_dirs", nargs="*", metavar="RUN_DIR")
    r.add_argument("--compare", nargs="+", metavar="RUN_DIR", help="overlay the curves of these runs (with any RUN_DIR given before)")
    r.add_argument("--out", help="output file (default: RUN_DIR/report.html, or compare.html with --compare)")
    r.set_defaults(fn=cmd_report)

    s = sub.add_parser("show", help="print a team and its topology as a text graph; optionally draw it as SVG")
    s.add_argument("config")
    s.add_argument("overrides", nargs="*")
    s.add_argument("--svg", metavar="FILE", help="also write a picture of the topology")
    s.set_defaults(fn=cmd_show)

    v = sub.add_parser("validate", help="check configs; print the resolved config or every error")
    v.add_argument("configs", nargs="+")
    v.add_argument("--set", dest="overrides", action="append", default=[], help="key.sub=value override")
    v.add_argument("-q", "--quiet", action="store_true", help="print only ok / errors")
    v.set_defaults(fn=cmd_validate)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "train" and args.config and "=" in args.config and not args.resume:
        args.overrides = [args.config, *args.overrides]
        args.config = None
    if args.cmd == "train" and args.resume and args.config:  # `mas train --resume RUN key=value`
        args.overrides = [args.config, *args.overrides]
        args.config = None
    from mas.agents.policy import ModelLoadError
    from mas.metrics import MissingDependencyError

    try:
        return args.fn(args)
    except (ConfigError, ModelLoadError, FileNotFoundError, MissingDependencyError) as e:
        print(e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
