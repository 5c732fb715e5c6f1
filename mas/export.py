"""``mas export``: a run's trained policies as plain Hugging Face models, optionally pushed to the hub.

For each trainable policy of a checkpoint (the run's latest unless one is named):

- ``full``: the checkpoint's ``policies/<name>/`` is already a transformers model with its
  tokenizer; it is copied;
- ``lora``: with ``merge_lora`` the adapter is loaded onto its base model with peft and
  merged into the weights (``merge_and_unload``), giving a standalone model; without it the
  adapter folder is copied as it is (``adapter_config.json`` names the base model);
- ``frozen``: never trained, so there is nothing to export (the base model is the policy).

With ``gguf`` ('f16' or 'f32') each policy is also written as one GGUF file,
``<policy>/<policy>.<dtype>.gguf``, for llama.cpp, Ollama and LM Studio, tokenizer and chat
template included (``mas.models.gguf.write_gguf``; llama and qwen2 architectures).  A GGUF file is
one standalone model, so ``gguf`` merges LoRA adapters as ``merge_lora`` does: the folder and
the file then hold the same weights (an adapter folder beside a merged file would also make
transformers read the folder's adapter instead of the file).

Each export gets a short model card (``README.md``: base model, team, agents, credit method).
``push_to_hub`` uploads the exported folder with huggingface_hub: one policy goes to the
repository root, several go into one sub-folder each (``from_pretrained(repo, subfolder=name)``).

The base model a LoRA checkpoint records (``base_model_name_or_path``) is the hub id,
``embedded``, or a path relative to the run directory (never a machine's absolute path);
``base_model_of`` turns it back into something ``from_pretrained`` loads.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mas.config.loading import load_config
from mas.models.files import weight_file_problems
from mas.models.gguf import GGUF_DTYPES, GGUFError, read_header, write_gguf
from mas.models.sources import ModelLoadError, gguf_file, is_gguf_model


@dataclass
class Exported:
    policy: str
    kind: str  # full | lora (merged) | lora-adapter
    path: Path
    base_model: str
    gguf: Path | None = None  # the GGUF file, when asked for


class ExportError(ValueError):
    """A run or checkpoint that cannot be exported; the message says why."""


def base_model_of(adapter_dir: Path, run_dir: Path) -> str:
    """The loadable base model of a LoRA adapter saved in ``run_dir``: a hub id or 'embedded' as
    recorded, or the recorded run-relative path made absolute again."""
    recorded = json.loads((Path(adapter_dir) / "adapter_config.json").read_text())["base_model_name_or_path"]
    if recorded == "embedded" or not recorded:
        return "embedded"
    candidate = (Path(run_dir) / recorded).resolve()
    return str(candidate) if candidate.exists() else recorded  # a folder or a .gguf file


def export_run(run_dir: str | Path, out: str | Path, merge_lora: bool = False, checkpoint: str | None = None,
               policies: list[str] | None = None, log=print, gguf: str | None = None) -> list[Exported]:
    """Write every trainable policy of the run's checkpoint to ``out/<policy>/`` (and, with
    ``gguf`` 'f16' or 'f32', as ``out/<policy>/<policy>.<gguf>.gguf``)."""
    from mas.training.checkpoint import best_checkpoint, latest_checkpoint

    run_dir, out = Path(run_dir), Path(out)
    if not (run_dir / "config.yaml").is_file():
        raise ExportError(f"{run_dir}: no config.yaml there; is it a run directory?")
    cfg = load_config(run_dir / "config.yaml")
    if checkpoint:
        ckpt = run_dir / "checkpoints" / checkpoint
    elif best_checkpoint(run_dir) is not None:  # trainer.keep_best: the best greedy held-out accuracy of the run
        ckpt = best_checkpoint(run_dir)
        best = json.loads((ckpt / "trainer_state.json").read_text())["summary"].get("best") or {}
        log(f"exporting checkpoints/best (trainer.keep_best): greedy held-out accuracy {best.get('accuracy', float('nan')):.3f}"
            f", {'the start' if best.get('step', 0) < 0 else 'after step ' + str(best.get('step'))}; "
            "--checkpoint step_N exports another")
    else:
        ckpt = latest_checkpoint(run_dir)
    if ckpt is None or not (ckpt / "policies").is_dir():
        raise ExportError(f"{run_dir}: no complete checkpoint to export" + (f" ({checkpoint})" if checkpoint else ""))
    saved = sorted(p.name for p in (ckpt / "policies").iterdir() if p.is_dir())
    chosen = policies or saved
    unknown = [p for p in chosen if p not in saved]
    if unknown:
        raise ExportError(f"{ckpt}: no trained policy {unknown}; valid: {saved}")
    if gguf is not None and gguf not in GGUF_DTYPES:
        raise ExportError(f"GGUF dtype {gguf!r}; valid: {list(GGUF_DTYPES)}")
    if out.exists() and any(out.iterdir()):
        raise ExportError(f"{out} exists and is not empty; choose another --out")
    # written into a folder beside ``out`` and renamed into place when complete: a failed export
    # (a model that cannot be merged or written as GGUF) leaves nothing that would refuse the retry
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        done = _export_policies(cfg, run_dir, ckpt, chosen, work, out, merge_lora, gguf, log)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    if out.exists():
        out.rmdir()  # empty (checked above)
    os.replace(work, out)
    return [dataclasses.replace(e, path=out / e.path.relative_to(work),
                                gguf=out / e.gguf.relative_to(work) if e.gguf is not None else None) for e in done]


def _export_policies(cfg, run_dir: Path, ckpt: Path, chosen: list[str], out: Path, shown: Path, merge_lora: bool,
                     gguf: str | None, log) -> list[Exported]:
    """Write each chosen policy of checkpoint ``ckpt`` into ``out/<policy>/`` (logged as under ``shown``,
    where it will be)."""
    done = []
    for name in chosen:  # every file first: a damaged one is named before anything is written
        problems = weight_file_problems(ckpt / "policies" / name)
        if problems:
            others = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.is_dir() and p != ckpt
                            and not p.name.endswith((".tmp", ".pruned")))
            raise ExportError(f"policy {name!r}: the checkpoint {ckpt} is damaged: " + "; ".join(problems)
                              + (f"; export another with --checkpoint (this run has {', '.join(others)})" if others else ""))
    for name in chosen:
        pcfg = cfg.policies[name]
        src, dst = ckpt / "policies" / name, out / name
        if pcfg.kind == "lora":
            base = base_model_of(src, run_dir)
            if merge_lora or gguf is not None:
                _merge_lora(src, base, pcfg, dst)
                kind = "lora (merged)"
            else:
                shutil.copytree(src, dst)
                kind = "lora-adapter"
        else:
            base = pcfg.model
            shutil.copytree(src, dst)
            kind = "full"
        gguf_path = None
        if gguf is not None:
            gguf_path = _write_gguf(name, dst, base, dst / f"{name}.{gguf}.gguf", gguf, f"{cfg.team.name}-{name}")
            log(f"{name}: GGUF ({gguf}, {gguf_path.stat().st_size / 1e6:.1f} MB) -> {shown / gguf_path.relative_to(out)}")
        _write_card(dst, cfg, name, kind, base, ckpt, gguf_path)
        log(f"{name}: {kind} -> {shown / name}")
        done.append(Exported(name, kind, dst, base, gguf_path))
    return done


def _merge_lora(adapter_dir: Path, base: str, pcfg, dst: Path) -> None:
    """Load ``base``, apply the adapter, merge it into the weights and save a standalone model."""
    from peft import PeftModel

    from mas.agents.policy import load_model_and_tokenizer, peft_quietly

    model, tok = load_model_and_tokenizer(base, pcfg.dtype, "cpu", pcfg.trust_remote_code)
    with peft_quietly():
        merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(str(dst))
    tok.save_pretrained(str(dst))


def _write_gguf(name: str, folder: Path, base: str, path: Path, dtype: str, title: str) -> Path:
    """Write the standalone model in ``folder`` (full, or LoRA merged) as the GGUF file ``path``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(folder))
    try:
        return write_gguf(model, tok, path, dtype=dtype, name=title, tokenizer_pre=_gguf_pre(base))
    except GGUFError as e:
        raise ExportError(f"policy {name!r}: cannot be written as GGUF: {e}") from e


def _gguf_pre(model: str) -> str | None:
    """The base GGUF's pre-tokenizer name (``tokenizer.ggml.pre``), carried over to the export
    when the policy started from a GGUF file; None otherwise (derived from the tokenizer)."""
    if not is_gguf_model(model):
        return None
    try:
        return read_header(gguf_file(model)).metadata.get("tokenizer.ggml.pre")
    except (GGUFError, ModelLoadError):  # the base moved since training: derive it instead
        return None


def _write_card(dst: Path, cfg, name: str, kind: str, base: str, ckpt: Path, gguf_path: Path | None = None) -> None:
    agents = [a.name for a in cfg.agents if a.policy == name]
    hub_base = "" if base == "embedded" or Path(base).is_absolute() or is_gguf_model(base) else f"base_model: {base}\n"
    (dst / "README.md").write_text(
        f"---\nlibrary_name: {'peft' if kind == 'lora-adapter' else 'transformers'}\n{hub_base}tags: [mas, multi-agent, rl]\n---\n\n"
        f"# {cfg.team.name}: policy `{name}`\n\n"
        f"Trained with mas as part of the team `{cfg.team.name}` ({cfg.topology.kind} topology, "
        f"credit method `{cfg.credit.method}`), checkpoint `{ckpt.name}`.\n\n"
        f"- weights: {kind}; base model: `{base}`\n- agents using it: {', '.join(agents) or 'none'}\n"
        + (f"- GGUF for llama.cpp, Ollama, LM Studio: `{gguf_path.name}`"
           f"{' (the adapter merged into its base)' if kind.startswith('lora') else ''}\n" if gguf_path else "")
    )


def push_to_hub(exported: list[Exported], out: str | Path, repo_id: str, private: bool = False,
                commit_message: str | None = None) -> str:
    """Create ``repo_id`` if needed and upload the export; returns the repository URL."""
    from huggingface_hub import HfApi

    from mas.models.hub import require_hub

    require_hub(f"--push-to-hub {repo_id}")
    api = HfApi()
    url = api.create_repo(repo_id, private=private, exist_ok=True)
    folder = exported[0].path if len(exported) == 1 else Path(out)
    api.upload_folder(repo_id=repo_id, folder_path=str(folder),
                      commit_message=commit_message or f"mas export: {', '.join(e.policy for e in exported)}")
    return str(url)
