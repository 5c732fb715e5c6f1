"""The ``mas`` command line: train, eval, validate, report, show, export, study, audit, serve.

Every command that reads a config takes ``key.sub=value`` overrides as bare arguments after it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path

# MKL's default code paths may depend on memory alignment, so two identical CPU runs can differ
# in the last bits; conditional numerical reproducibility removes that (set before torch loads).
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

from mas.process.memory import huge_pages_for_large_tensors  # noqa: E402  (no torch: it must come first)

# torch's CPU allocator pages-aligns tensors of 2 MiB or more, so a learner's passes reuse glibc's
# heap instead of growing it (mas.process.memory; read once, as torch loads)
huge_pages_for_large_tensors()

from mas.config.loading import dump_config, load_config
from mas.config.messages import ConfigError, issue_lines
from mas.config.schema import RunConfig


def _run_dir(cfg: RunConfig, override: str | None) -> Path:
    return Path(override or cfg.logging.run_dir.replace("{team}", cfg.team.name))


def split_overrides(items: list[str]) -> tuple[list[str], list[str]]:
    """(files, key.sub=value overrides) of a command's positional arguments: one syntax for every
    command; an argument with '=' that is not an existing file is an override."""
    files = [it for it in items if "=" not in it or Path(it).exists()]
    return files, [it for it in items if it not in files]


def cmd_validate(args: argparse.Namespace) -> int:
    """Each config: every error (exit 1), or the resolved config; warnings go to stderr."""
    from mas.config.checks import config_warnings, data_issues, machine_issues, machine_warnings, meaning_errors
    from mas.config.defaults import resolve_default_lrs
    from mas.training.context_plan import context_issues

    status = 0
    files, overrides = split_overrides(args.configs)
    overrides = [*args.overrides, *overrides]
    if not files:
        print("mas validate: give one or more config files", file=sys.stderr)
        return 2
    for path in files:
        try:
            cfg = load_config(path, overrides, check=meaning_errors)
            data = data_issues(cfg)
            if data:
                raise ConfigError(path, issue_lines(data))
        except ConfigError as e:
            print(e, file=sys.stderr)
            status = 1
            continue
        warnings = issue_lines(config_warnings(cfg)) + [f"{line} [on this machine]"
                                                         for line in issue_lines(machine_issues(cfg) + machine_warnings(cfg))]
        warnings += context_issues(cfg)  # conversations longer than a model's positions (research teams on small models)
        for line in warnings:
            print(f"{path}: warning: {line}", file=sys.stderr)
        if args.strict and warnings:
            status = 1
        cfg, notes = resolve_default_lrs(cfg, local_only=True)
        if args.quiet:
            print(f"{path}: ok" + (f" ({len(warnings)} warning(s))" if warnings else ""))
        else:
            defaults = "".join(f"# {key}: {note}\n" for key, note in notes.items())
            print(f"# {path}: ok (resolved)\n{defaults}{dump_config(cfg)}")
        if args.plan:
            status = max(status, print_plan(path, cfg, args))
    return status


def print_plan(path: str, cfg, args: argparse.Namespace) -> int:
    """``mas validate --plan``: the memory plan (``mas.learning.memory_plan``); 1 where it does not fit."""
    from mas.models.sources import ModelLoadError
    from mas.learning.memory_plan import PROMPT_TOKENS, plan_run, render

    try:
        plans = plan_run(cfg, device=args.device, devices=args.devices, prompt_tokens=args.prompt_tokens or PROMPT_TOKENS)
    except (ValueError, OSError, ModelLoadError) as e:
        print(f"{path}: --plan: {e}", file=sys.stderr)
        return 1
    print(f"# {path}: memory plan" + (f" on {args.device}" if args.device else " on this machine's devices")
          + (f", {args.devices} of them" if args.devices else ""))
    print(render(plans, cfg, args.devices))
    return 1 if any(p.fits is False for p in plans) else 0


def cmd_train(args: argparse.Namespace) -> int:
    from mas.training.callbacks import RunControl
    from mas.config.checks import machine_issues, meaning_errors
    from mas.training.rundir import check_fresh, move_aside
    from mas.runtime import PolicyActorDied
    from mas.training.signals import StopOnSignal, abandon_message, mas_command
    from mas.training.team import build_team
    from mas.training.trainer import train

    configs, overrides = split_overrides(args.items)
    if args.resume:
        if args.overwrite:
            print("mas train: --resume continues a run and --overwrite starts a new one; give one of them", file=sys.stderr)
            return 2
        run_dir = Path(args.resume)
        cfg_path = run_dir / "config.yaml"
        if configs:
            print(f"mas train --resume: the run's own config.yaml is used; got {configs} too "
                  "(give key.sub=value overrides only)", file=sys.stderr)
            return 2
        if not cfg_path.exists():
            print(f"--resume {run_dir}: no config.yaml there; is it a run directory?", file=sys.stderr)
            return 2
        cfg = load_config(cfg_path, overrides, check=meaning_errors)
    else:
        if len(configs) != 1:
            print("mas train: give one CONFIG (or --resume RUN_DIR), then any key.sub=value overrides", file=sys.stderr)
            return 2
        cfg = load_config(configs[0], overrides, check=meaning_errors)
        run_dir = _run_dir(cfg, args.run_dir)
        if args.overwrite:
            moved = move_aside(run_dir)
            if moved is not None:
                print(f"--overwrite: moved the old run to {moved}", file=sys.stderr)
        check_fresh(run_dir, resume_hint=f" ({mas_command()} train --resume {shlex.quote(str(run_dir))})")
    machine = machine_issues(cfg)
    if machine:
        raise ConfigError(str(args.resume or configs[0]), issue_lines(machine))
    team = build_team(cfg, run_dir=run_dir)
    # This process holds one team until it exits: move what exists now (torch, transformers, the
    # models: ~500k objects) out of the cyclic garbage collector's reach, which otherwise scans it
    # all every few rollouts (0.25 s each) though a rollout leaves no cycles in it; ~0.3 ms a turn.
    gc.collect()
    gc.freeze()
    for key, note in team.defaults.items():
        print(f"{key} = {note}", file=sys.stderr)
    resume_cmd = f"{mas_command()} train --resume {shlex.quote(str(run_dir))}"
    control = RunControl()
    try:  # a Ray runtime's actors (and a Ray instance it started) are freed however the run ends
        with StopOnSignal(control, lambda: abandon_message(run_dir, resume_cmd), cleanup=team.close) as stop:
            summary = train(team, run_dir, resume=bool(args.resume), stop_after=args.stop_after, control=control)
    except PolicyActorDied as e:
        print(f"{e}\nthe run stopped; its last checkpoint is intact: continue with {resume_cmd}", file=sys.stderr)
        return 3
    finally:
        team.close()
    if "stopped" in summary:
        if summary["stopped"]["after_step"] is None:
            print("stopped before the first step: nothing was trained, nothing to resume", file=sys.stderr)
        else:
            print(f"resume with: {resume_cmd}", file=sys.stderr)
        if stop.exit_code is not None:
            return stop.exit_code
    for line in summary_lines(summary, {"f1": "F1", "em": "EM"}.get(getattr(cfg.env, "reward", ""), "accuracy")):
        print(line)
    print(f"run directory: {run_dir}")
    return 0


def summary_lines(summary: dict, name: str) -> list[str]:
    """The end of a run for the terminal: the greedy held-out result (the team a user deploys)
    before -> after, or before -> after warm-up -> after RL with RL's gain from the warm-up
    (``held_out_story``), the sampled avg@k / pass@k beside it, and whether the greedy team regressed."""
    from mas.training.metrics import held_out_story, story_line

    after = summary.get("eval_after")
    before = summary.get("eval_warmup") or summary.get("eval_before")  # where RL started, for the sampled line
    story = summary.get("held_out") or held_out_story(summary.get("eval_before"), summary.get("eval_warmup"), after)
    if not before or not after or story is None:
        return []
    lines = [story_line(story, name)]
    b, a = before.get("sampled"), after.get("sampled")
    if b and a:
        since = " (from the warm-up)" if summary.get("eval_warmup") else ""
        lines.append(f"held-out team {name}, sampled{since}: avg@{a['k']} {b['avg']:.3f} -> {a['avg']:.3f}, "
                     f"pass@{a['k']} {b['pass']:.3f} -> {a['pass']:.3f}")
    if "train" in after:
        lines.append(f"training tasks {name} (greedy): {after['train']['accuracy']:.3f} against held-out {after['accuracy']:.3f}")
    worse = summary.get("greedy_regression")
    if worse:
        lines.append(f"warning: the greedy team regressed: {worse['start']:.3f} at the start -> {worse['now']:.3f} after step "
                     f"{worse['step']} (noise floor ±{worse['floor']:.3f})")
    best = summary.get("best")
    if best:
        where = "the start (before RL)" if best["step"] < 0 else f"after step {best['step']}"
        lines.append(f"best greedy checkpoint: {best['accuracy']:.3f}, {where} (checkpoints/best; mas export uses it)")
    if story.get("ceiling"):
        lines.append(f"note: {story['ceiling']}")
    return lines


def cmd_eval(args: argparse.Namespace) -> int:
    """Greedy held-out evaluation: accuracy (the env's reward), research EM/F1, tool calls per agent."""
    from mas.training.checkpoint import check_policy_files, latest_checkpoint
    from mas.config.checks import meaning_errors
    from mas.training.team import build_team
    from mas.training.evaluation import evaluate

    cfg = load_config(args.config, args.overrides, check=meaning_errors)
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
            check_policy_files(ckpt, loaded)  # a damaged file is named, not a safetensors traceback
            team.runtime.load_policies(ckpt, loaded, learner_state=False)
            print(f"loaded {', '.join(loaded)} from {ckpt}", file=sys.stderr)
            base = sorted(n for n, p in cfg.policies.items() if p.kind != "frozen" and n not in loaded)
            if base:  # a trainable policy the checkpoint does not hold is evaluated as it starts
                print(f"warning: {ckpt} holds no weights for {', '.join(base)}: evaluated at their initial weights",
                      file=sys.stderr)
        result = evaluate(team, size, cfg.trainer.seed, progress=cfg.logging.progress, label="eval")
    print(json.dumps(result, indent=2))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """The team's policies behind the OpenAI-compatible endpoint (``mas.rollout.endpoint``) until Ctrl-C:
    a run directory's best checkpoint (else its latest), or a config's policies as they start."""
    import asyncio
    import threading

    from mas.config.checks import meaning_errors
    from mas.rollout.endpoint import EndpointServer, PolicySession
    from mas.training.checkpoint import check_policy_files, latest_checkpoint
    from mas.training.team import build_team

    source, ckpt = Path(args.source), None
    if source.is_dir():
        if not (source / "config.yaml").is_file():
            print(f"{source}: no config.yaml there; give a run directory or a config file", file=sys.stderr)
            return 2
        ckpt = source / "checkpoints" / "best" if (source / "checkpoints" / "best").is_dir() else latest_checkpoint(source)
        source = source / "config.yaml"
    cfg = load_config(source, args.overrides, check=meaning_errors)
    loaded = [name for name in cfg.policies if ckpt is not None and (ckpt / "policies" / name).is_dir()]
    if ckpt is not None:
        check_policy_files(ckpt, loaded)  # a damaged file is named (CheckpointError), before any model loads
    with build_team(cfg, eval_size=(0, "mas serve")) as team:
        if ckpt is not None:
            team.runtime.load_policies(ckpt, loaded, learner_state=False)
            print(f"loaded {', '.join(loaded) or 'no policy'} from {ckpt}", file=sys.stderr)
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="mas-serve", daemon=True).start()
        server = EndpointServer(port=args.port).start()
        token = server.register(PolicySession(team.agents, team.runtime.tokenizers, team.backend, loop))
        print(f"base_url: {server.url(token)}\nmodels (agents): {', '.join(team.agents)}\n"
              f"greedy unless a request sends a temperature; Ctrl-C (or SIGTERM) stops", flush=True)

        def stop(signum: int, frame: object) -> None:  # SIGTERM, what a service manager sends, stops it as Ctrl-C does
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGTERM, stop)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            print("stopped", file=sys.stderr)
        finally:
            signal.signal(signal.SIGTERM, previous)
            server.close()
            loop.call_soon_threadsafe(loop.stop)
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
    from mas.config.checks import meaning_errors
    from mas.show import team_text, topology_mermaid, topology_svg

    cfg = load_config(args.config, args.overrides, check=meaning_errors)
    print(team_text(cfg))
    if args.svg:
        Path(args.svg).write_text(topology_svg(cfg), encoding="utf-8")
        print(f"topology picture: {args.svg}")
    if args.mermaid:
        mermaid = topology_mermaid(cfg)
        if mermaid is None:
            print(f"no Mermaid drawing: {cfg.topology.kind!r} teams are not LangGraph graphs", file=sys.stderr)
            return 2
        Path(args.mermaid).write_text(mermaid, encoding="utf-8")
        print(f"LangGraph's drawing of the compiled graph (Mermaid): {args.mermaid}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from mas.export import ExportError, export_run, push_to_hub

    try:
        exported = export_run(args.run_dir, args.out, merge_lora=args.merge_lora, checkpoint=args.checkpoint,
                              policies=args.policy, log=lambda msg: print(msg, file=sys.stderr),
                              gguf=args.gguf_dtype if args.gguf else None)
    except ExportError as e:
        print(e, file=sys.stderr)
        return 2
    if not exported:
        print(f"{args.run_dir}: the checkpoint holds no trained policy", file=sys.stderr)
        return 2
    print(f"exported {len(exported)} polic{'y' if len(exported) == 1 else 'ies'} to {args.out}")
    if args.push_to_hub:
        from huggingface_hub.errors import HfHubHTTPError

        try:
            url = push_to_hub(exported, args.out, args.push_to_hub, private=args.private)
        except (HfHubHTTPError, OSError) as e:  # no network, no token, no permission: the export stays in --out
            print(f"push to {args.push_to_hub} failed: {e}\nthe export is complete in {args.out}", file=sys.stderr)
            return 1
        print(f"pushed to {url}")
    return 0


def cmd_study(args: argparse.Namespace) -> int:
    """Run (or continue) a grid of credit methods x seeds at a matched budget; write study.html/json.
    Several configs (one per team size) make a study over team sizes."""
    from mas.study import StudySpec, StudyStop, study, write_outputs
    from mas.training.signals import StopOnSignal, mas_command

    configs, overrides = split_overrides(args.items)
    if not configs:
        print("mas study: give a team YAML (or one per team size), e.g. mas study configs/team_relay_n4.yaml --methods grpo,c3 "
              "--out studies/relay", file=sys.stderr)
        return 2
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    if not methods:
        print("mas study: --methods needs at least one credit method, e.g. --methods grpo,dr_mas,sharp", file=sys.stderr)
        return 2
    kind, budget = ("steps", None)
    if args.budget:
        kind = args.budget[0]
        try:
            budget = float(args.budget[1])
        except ValueError:
            print(f"mas study: --budget {kind} {args.budget[1]!r}: the amount must be a number", file=sys.stderr)
            return 2
    spec = StudySpec(config=configs[0], methods=methods, seeds=args.seeds, out=args.out, budget_kind=kind, budget=budget,
                     overrides=tuple(overrides), credit_sets=tuple(args.credit_set), eval_every=args.eval_every,
                     baseline=args.baseline, metric=args.metric)
    if args.report_only:
        json_path, html_path = write_outputs(args.out)
        print(f"study: {html_path} and {json_path}")
        return 0
    executor = args.executor or _default_executor(configs[0], overrides)
    # Ctrl-C / SIGTERM: the run in progress stops as under `mas train` (checkpointed at its step's
    # next safe point), no other starts, and the same command resumes it (Ray tasks: not caught)
    control = StudyStop()
    again = " ".join(shlex.quote(a) for a in sys.argv[1:])
    with StopOnSignal(control, lambda: f"abandoned the run in progress at once; its last checkpoint stays. "
                                       f"continue with: {mas_command()} {again}") as stop:
        json_path, html_path = study(spec, configs, executor=executor, ray_address=args.ray_address,
                                     cpus_per_run=args.cpus_per_run, control=control)
    print(f"study: {html_path} and {json_path}")
    return stop.exit_code or 0


def cmd_audit(args: argparse.Namespace) -> int:
    """Credit fidelity of a run: its credit against exact Shapley values from coalition re-runs."""
    from mas.audit import AuditError, run_audit, summary_lines

    exclude = None if args.exclude is None else tuple(a for a in args.exclude.split(",") if a)
    try:
        report = run_audit(args.run_dir, step=args.checkpoint, episodes=args.episodes, max_generations=args.max_generations,
                           fresh=args.fresh, exclude=exclude, permutations=args.permutations, seed=args.seed)
    except AuditError as e:
        print(f"mas audit: {e}", file=sys.stderr)
        return 2
    print("\n".join(summary_lines(report)))
    print(f"audit: {Path(args.run_dir) / 'audit' / ('step_%06d.json' % report['checkpoint_step'])}")
    return 0


def _default_executor(config: str, overrides: list[str]) -> str:
    """Runs go out as Ray tasks when the team's runtime is Ray, else one after another."""
    return "ray" if getattr(load_config(config, overrides).runtime, "kind", "local") == "ray" else "local"


def cmd_build_embedded(args: argparse.Namespace) -> int:
    """Build the embedded model: into the cache (used when the shipped artifact is stale), or
    with --ship as the shipped artifact, after a change to its recipe (formats, teachers)."""
    from mas.embedded.build import build_embedded, ship
    from mas.embedded.artifact import cache_folder
    from mas.embedded.recipe import Recipe

    log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    if args.ship and args.recipe:
        print("--ship takes the project's recipe (mas/embedded/recipe.py); a --recipe variant is built into the cache "
              "and used by its folder", file=sys.stderr)
        return 2
    if args.ship:
        print(f"shipped artifact: {ship(log=log)}")
        return 0
    try:
        recipe = Recipe().varied(args.recipe)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    out = cache_folder(recipe)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    build_embedded(recipe, out, log=log)
    print(f"cached: {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from mas.version import __version__

    p = argparse.ArgumentParser(prog="mas", description="Train teams of LLM agents with RL.")
    p.add_argument("--version", action="version", version=f"mas {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="train a team from a YAML config")
    t.add_argument("items", nargs="*", metavar="CONFIG [key.sub=value ...]",
                   help="team YAML, then overrides, e.g. trainer.steps=5 (with --resume: overrides only)")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    t.add_argument("--overwrite", action="store_true",
                   help="start afresh even if the run directory holds a run (the old run is moved aside, not deleted)")
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
    s.add_argument("--mermaid", metavar="FILE", help="also write LangGraph's Mermaid drawing of the compiled graph")
    s.set_defaults(fn=cmd_show)

    x = sub.add_parser("export", help="write a run's trained policies as Hugging Face models (optionally also GGUF); optionally push them to the hub")
    x.add_argument("run_dir", metavar="RUN_DIR")
    x.add_argument("--out", required=True, help="output folder (one sub-folder per policy)")
    x.add_argument("--merge-lora", action="store_true", help="merge LoRA adapters into their base model (standalone models)")
    x.add_argument("--checkpoint", metavar="STEP_DIR", help="a checkpoint of the run, e.g. step_000019 (default: checkpoints/best where trainer.keep_best kept one, else the latest)")
    x.add_argument("--policy", action="append", help="export only this policy (repeatable; default: every trained one)")
    x.add_argument("--gguf", action="store_true", help="also write each policy as one GGUF file for llama.cpp / Ollama / "
                   "LM Studio (LoRA merged; llama and qwen2 architectures)")
    x.add_argument("--gguf-dtype", choices=["f16", "f32"], default="f16", help="with --gguf: f16 (default, half the size) "
                   "or f32 (exact)")
    x.add_argument("--push-to-hub", metavar="REPO", help="upload the export to this hub repository (created if missing)")
    x.add_argument("--private", action="store_true", help="with --push-to-hub: create the repository private")
    x.set_defaults(fn=cmd_export)

    st = sub.add_parser("study", help="compare credit methods over seeds at a matched budget (study.html, study.json); "
                        "with a config per team size, also across team sizes")
    st.add_argument("items", nargs="+", metavar="CONFIG [CONFIG ...] [key.sub=value ...]",
                    help="team YAML, or one per team size (e.g. configs/team_relay_n2.yaml configs/team_relay_n4.yaml), then "
                    "key.sub=value overrides for every run, e.g. trainer.steps=6")
    st.add_argument("--methods", required=True, help="comma-separated credit methods, e.g. grpo,dr_mas,sharp,c3")
    st.add_argument("--seeds", type=int, default=3, help="seeds per method (default 3, the survey's minimum)")
    st.add_argument("--out", required=True, help="study directory (re-run the same command to continue it)")
    st.add_argument("--budget", nargs=2, metavar=("KIND", "N"),
                    help="steps N, tokens N (generated tokens, credit generations included) or seconds N (training time); "
                    "default: steps = trainer.steps")
    st.add_argument("--eval-every", type=int, help="held-out evaluation every K steps (default: the config's trainer.eval_every, "
                    "else every 2 steps where that costs no more episodes than the training, else about five per run)")
    st.add_argument("--credit-set", action="append", default=[], metavar="METHOD.key=value",
                    help="a credit option for one method, e.g. sharp.marginal=loo (repeatable)")
    st.add_argument("--baseline", help="the method others are compared with (default: grpo if studied, else the first)")
    st.add_argument("--metric", choices=("greedy", "sampled"), default="greedy",
                    help="what methods are ranked by: greedy held-out accuracy (the deployed team; default), or sampled "
                         "avg@k at the agents' own temperatures (labelled so)")
    st.add_argument("--executor", choices=["local", "ray"], help="local: one run after another; ray: runs as Ray tasks "
                    "(default: ray when runtime.kind is ray)")
    st.add_argument("--ray-address", help="Ray cluster address (default: a local Ray instance)")
    st.add_argument("--cpus-per-run", type=float, default=1.0, help="CPUs each Ray task reserves (default 1)")
    st.add_argument("--report-only", action="store_true", help="only (re)write study.html and study.json from the runs so far")
    st.set_defaults(fn=cmd_study)

    au = sub.add_parser("audit", help="credit fidelity of a run: Spearman between its credit and exact Shapley values")
    au.add_argument("run_dir", metavar="RUN_DIR")
    au.add_argument("--checkpoint", type=int, metavar="STEP", help="the checkpoint's step (default: the latest)")
    au.add_argument("--episodes", type=int, default=32, help="episodes to audit (default 32)")
    au.add_argument("--max-generations", type=int, help="upper bound on the coalition re-runs' generations; fewer episodes are audited to stay within it")
    au.add_argument("--fresh", action="store_true", help="audit new rollouts of the checkpoint (credited by the run's method) instead of stored episodes")
    au.add_argument("--exclude", help="comma-separated agents that are not players (default: the agent that answers; '' for nobody)")
    au.add_argument("--permutations", type=int, default=64, help="Monte-Carlo orderings P beyond 8 players (default 64)")
    au.add_argument("--seed", type=int, default=0, help="seed of the re-runs and the bootstrap")
    au.set_defaults(fn=cmd_audit)

    b = sub.add_parser("build-embedded", help="build the embedded model from the project's recipe (about 85 minutes on 2 cores, "
                            "80 of them its research stage)")
    b.add_argument("--ship", action="store_true",
                   help="write it as the shipped artifact (mas/embedded/artifact/) instead of into the cache")
    b.add_argument("--recipe", action="append", default=[], metavar="KEY=VALUE",
                   help="a variant of the recipe, built into its own cache folder (a model folder for policies' "
                        "`model:`): steps=8000, seed=1, lr=0.002, formats.graph=1600, extend.saboteur_solver=0, extend_steps=900, "
                        "research_steps=3000 or research.facts=9600; repeatable")
    b.set_defaults(fn=cmd_build_embedded)

    sv = sub.add_parser("serve", help="serve a trained team's agents behind an OpenAI-compatible endpoint on 127.0.0.1 "
                        "(each agent is a model; greedy by default) until Ctrl-C")
    sv.add_argument("source", metavar="RUN_DIR_OR_CONFIG", help="a run directory (its best, else latest, checkpoint) or a config")
    sv.add_argument("overrides", nargs="*", metavar="key.sub=value")
    sv.add_argument("--port", type=int, default=0, help="port to bind on 127.0.0.1 (default: a free one)")
    sv.set_defaults(fn=cmd_serve)

    v = sub.add_parser("validate", help="check configs; print the resolved config or every error")
    v.add_argument("configs", nargs="+", metavar="CONFIG [key.sub=value ...]",
                   help="config files, and overrides applied to each")
    v.add_argument("--set", dest="overrides", action="append", default=[], help="key.sub=value override (same as a bare one)")
    v.add_argument("-q", "--quiet", action="store_true", help="print only ok / errors")
    v.add_argument("--strict", action="store_true", help="warnings fail too (exit 1)")
    v.add_argument("--plan", action="store_true", help="also print the memory plan: per policy and device, weights, "
                   "gradients, optimizer, one learner pass, the generation cache, the peak, and what to change if it does not fit")
    v.add_argument("--device", metavar="KIND:SIZE", help="--plan for this device instead of the config's own, e.g. cuda:80GB")
    v.add_argument("--devices", type=int, metavar="N", help="--plan: N such devices (sizes the sharding advice)")
    v.add_argument("--prompt-tokens", type=int, default=None, metavar="N",
                   help="--plan: a rollout prompt's length in tokens, for the generation cache (default: each policy's longest prompt, estimated from the config)")
    v.set_defaults(fn=cmd_validate)
    return p


# the positional list of each command that takes key.sub=value overrides
_POSITIONALS = {"train": "items", "validate": "configs", "eval": "overrides", "show": "overrides", "study": "items",
                "serve": "overrides"}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # options may come between CONFIG and its overrides: argparse leaves what follows them over
    stray, unknown = [x for x in extra if not x.startswith("-")], [x for x in extra if x.startswith("-")]
    if unknown or (stray and args.cmd not in _POSITIONALS):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if stray:
        getattr(args, _POSITIONALS[args.cmd]).extend(stray)
    from mas.errors import CheckpointError, MissingDependencyError, ModelLoadError

    try:
        return args.fn(args)
    except (ConfigError, ModelLoadError, CheckpointError, FileNotFoundError, FileExistsError, MissingDependencyError) as e:
        print(e, file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C outside training (loading models, evaluating): nothing to save
        print("interrupted", file=sys.stderr)
        return 130


def exit_watchdog(code: int, grace_s: float = 30.0) -> None:
    """Make sure the process ends with ``code`` once the command is done.  A framework node that
    never returned (a LangGraph ``def`` node, an AutoGen tool) keeps its worker thread, and
    Python's exit waits for every such thread, forever, after the run has finished and saved
    everything.  A daemon thread (it lives on while the interpreter shuts down) gives the normal
    exit ``grace_s`` seconds, then names the threads still running and ends the process."""
    import threading

    def watch() -> None:
        time.sleep(grace_s)
        hung = [t.name for t in threading.enumerate()
                if t is not threading.main_thread() and not t.daemon and t.is_alive()]
        os.write(2, (f"mas: the command finished, but {len(hung)} worker thread(s) did not end within {grace_s:g}s "
                     f"({', '.join(hung[:5]) or 'the interpreter shutdown'}): a framework node or tool that never "
                     "returned; exiting without waiting for them\n").encode())
        os._exit(code)

    threading.Thread(target=watch, name="mas-exit-watchdog", daemon=True).start()


def entry() -> None:
    """The ``mas`` console command: ``main``, and an exit that a hung worker thread cannot block."""
    code = main()
    sys.stdout.flush()
    exit_watchdog(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
