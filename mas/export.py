"""``mas export``: a run's trained policies as plain Hugging Face models, optionally pushed to the hub.

For each trainable policy of a checkpoint (the run's latest unless one is named):

- ``full``: the checkpoint's ``policies/<name>/`` is already a transformers model with its
  tokenizer; it is copied;
- ``lora``: with ``merge_lora`` the adapter is loaded onto its base model with peft and
  merged into the weights (``merge_and_unload``), giving a standalone model; without it the
  adapter folder is copied as it is (``adapter_config.json`` names the base model);
- ``frozen``: never trained, so there is nothing to export (the base model is the policy).

Each export gets a short model card (``README.md``: base model, team, agents, credit method).
``push_to_hub`` uploads the exported folder with huggingface_hub: one policy goes to the
repository root, several go into one sub-folder each (``from_pretrained(repo, subfolder=name)``).

The base model a LoRA checkpoint records (``base_model_name_or_path``) is the hub id,
``embedded``, or a path relative to the run directory (never a machine's absolute path);
``base_model_of`` turns it back into something ``from_pretrained`` loads.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from mas.config import load_config


@dataclass
class Exported:
    policy: str
    kind: str  # full | lora (merged) | lora-adapter
    path: Path
    base_model: str


class ExportError(ValueError):
    """A run or checkpoint that cannot be exported; the message says why."""


def base_model_of(adapter_dir: Path, run_dir: Path) -> str:
    """The loadable base model of a LoRA adapter saved in ``run_dir``: a hub id or 'embedded' as
    recorded, or the recorded run-relative path made absolute again."""
    recorded = json.loads((Path(adapter_dir) / "adapter_config.json").read_text())["base_model_name_or_path"]
    if recorded == "embedded" or not recorded:
        return "embedded"
    candidate = (Path(run_dir) / recorded).resolve()
    return str(candidate) if candidate.is_dir() else recorded


def export_run(run_dir: str | Path, out: str | Path, merge_lora: bool = False, checkpoint: str | None = None,
               policies: list[str] | None = None, log=print) -> list[Exported]:
    """Write every trainable policy of the run's checkpoint to ``out/<policy>/``."""
    from mas.checkpoint import latest_checkpoint

    run_dir, out = Path(run_dir), Path(out)
    if not (run_dir / "config.yaml").is_file():
        raise ExportError(f"{run_dir}: no config.yaml there; is it a run directory?")
    cfg = load_config(run_dir / "config.yaml")
    ckpt = run_dir / "checkpoints" / checkpoint if checkpoint else latest_checkpoint(run_dir)
    if ckpt is None or not (ckpt / "policies").is_dir():
        raise ExportError(f"{run_dir}: no complete checkpoint to export" + (f" ({checkpoint})" if checkpoint else ""))
    saved = sorted(p.name for p in (ckpt / "policies").iterdir() if p.is_dir())
    chosen = policies or saved
    unknown = [p for p in chosen if p not in saved]
    if unknown:
        raise ExportError(f"{ckpt}: no trained policy {unknown}; valid: {saved}")
    if out.exists() and any(out.iterdir()):
        raise ExportError(f"{out} exists and is not empty; choose another --out")
    done = []
    for name in chosen:
        pcfg = cfg.policies[name]
        src, dst = ckpt / "policies" / name, out / name
        if pcfg.kind == "lora":
            base = base_model_of(src, run_dir)
            if merge_lora:
                _merge_lora(src, base, pcfg, dst)
                kind = "lora (merged)"
            else:
                shutil.copytree(src, dst)
                kind = "lora-adapter"
        else:
            base = pcfg.model
            shutil.copytree(src, dst)
            kind = "full"
        _write_card(dst, cfg, name, kind, base, ckpt)
        log(f"{name}: {kind} -> {dst}")
        done.append(Exported(name, kind, dst, base))
    return done


def _merge_lora(adapter_dir: Path, base: str, pcfg, dst: Path) -> None:
    """Load ``base``, apply the adapter, merge it into the weights and save a standalone model."""
    from peft import PeftModel

    from mas.agents.policy import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(base, pcfg.dtype, "cpu", pcfg.trust_remote_code)
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(str(dst))
    tok.save_pretrained(str(dst))


def _write_card(dst: Path, cfg, name: str, kind: str, base: str, ckpt: Path) -> None:
    agents = [a.name for a in cfg.agents if a.policy == name]
    hub_base = "" if base == "embedded" or Path(base).is_absolute() else f"base_model: {base}\n"
    (dst / "README.md").write_text(
        f"---\nlibrary_name: {'peft' if kind == 'lora-adapter' else 'transformers'}\n{hub_base}tags: [mas, multi-agent, rl]\n---\n\n"
        f"# {cfg.team.name}: policy `{name}`\n\n"
        f"Trained with mas as part of the team `{cfg.team.name}` ({cfg.topology.kind} topology, "
        f"credit method `{cfg.credit.method}`), checkpoint `{ckpt.name}`.\n\n"
        f"- weights: {kind}; base model: `{base}`\n- agents using it: {', '.join(agents) or 'none'}\n"
    )


def push_to_hub(exported: list[Exported], out: str | Path, repo_id: str, private: bool = False,
                commit_message: str | None = None) -> str:
    """Create ``repo_id`` if needed and upload the export; returns the repository URL."""
    from huggingface_hub import HfApi

    from mas.hub import require_hub

    require_hub(f"--push-to-hub {repo_id}")
    api = HfApi()
    url = api.create_repo(repo_id, private=private, exist_ok=True)
    folder = exported[0].path if len(exported) == 1 else Path(out)
    api.upload_folder(repo_id=repo_id, folder_path=str(folder),
                      commit_message=commit_message or f"mas export: {', '.join(e.policy for e in exported)}")
    return str(url)
