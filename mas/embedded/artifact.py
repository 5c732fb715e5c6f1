"""Where the embedded model's files are, and whether they may be used: the shipped artifact and the cache.

The model the quickstart needs ships with the package (``mas/embedded/artifact/``, about a
megabyte): what the project's own recipe (``recipe.py``) builds, so a fresh clone trains at
once instead of building it for minutes.  A model folder holds the Hugging Face files and a
``manifest.json``: the recipe key it was built from and the sha256 of every file.

A folder is used only when its manifest names the current recipe's key and every file's hash
matches; anything else (a stale artifact after the recipe changed, a truncated or edited
file) is never loaded.  Lookup, in order:

1. ``$MAS_CACHE_DIR/embedded/<key>/`` (else ``~/.cache/mas``): a model built on this machine;
2. the shipped artifact, when its key is the current one.

``embedded_path`` raises ``EmbeddedUnavailable``, saying which folder was refused and why,
when neither is usable; building (``mas build-embedded``, ``mas.embedded.build``) is the
job of a higher layer: the team builder builds into the cache when it must, and
``mas build-embedded --ship`` rewrites the shipped artifact.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from mas.sources import ModelLoadError, cache_dir

from .recipe import Recipe

ARTIFACT_DIR = Path(__file__).parent / "artifact"
MANIFEST = "manifest.json"
REBUILD = "mas build-embedded"  # builds into the cache; with --ship, into the shipped artifact


class EmbeddedUnavailable(ModelLoadError):
    """No verified embedded model for the current recipe; the message says why and what to run."""


def cache_folder(recipe: Recipe) -> Path:
    return cache_dir() / "embedded" / recipe.key()


def file_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file in ``folder`` but the manifest, by name."""
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(Path(folder).iterdir())
            if f.is_file() and f.name != MANIFEST}


def write_manifest(folder: Path, recipe: Recipe, extra: dict[str, Any] | None = None) -> None:
    """Seal ``folder``: the recipe it was built from, its key and every file's hash (written last)."""
    from dataclasses import asdict

    manifest = {"recipe_key": recipe.key(), "recipe": asdict(recipe), "files": file_hashes(folder), **(extra or {})}
    (Path(folder) / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def problem(folder: Path, key: str) -> str | None:
    """Why ``folder`` may not be used as the model of recipe ``key`` (None: it may)."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        return "it has no manifest.json"
    try:
        manifest = json.loads(path.read_text())
        found, files = manifest["recipe_key"], manifest["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        return f"its manifest.json is unreadable ({type(e).__name__}: {e})"
    if found != key:
        return f"it was built from recipe {found}, and the recipe is now {key}"
    actual = file_hashes(folder)
    if set(actual) != set(files):
        missing, extra = sorted(set(files) - set(actual)), sorted(set(actual) - set(files))
        return f"its files differ from its manifest (missing {missing}, unexpected {extra})"
    bad = sorted(name for name, digest in files.items() if actual[name] != digest)
    if bad:
        return f"{', '.join(bad)} {'does' if len(bad) == 1 else 'do'} not match the manifest's sha256 (corrupt or edited)"
    return None


def embedded_path(recipe: Recipe | None = None) -> Path:
    """The verified folder of the embedded model for ``recipe`` (default: the project's)."""
    recipe = recipe or Recipe()
    key = recipe.key()
    cached = cache_folder(recipe)
    reasons = []
    if cached.exists():
        why = problem(cached, key)
        if why is None:
            return cached
        reasons.append(f"the cached copy {cached} was refused: {why}")
    if recipe == Recipe():  # only the project's recipe ships
        why = problem(ARTIFACT_DIR, key) if ARTIFACT_DIR.exists() else "it is missing"
        if why is None:
            return ARTIFACT_DIR
        reasons.append(f"the shipped artifact {ARTIFACT_DIR} was refused: {why}")
    how = (f"`{REBUILD}` builds it into the cache (about 6 minutes on 2 cores), and `{REBUILD} --ship` rewrites the shipped one"
           if recipe == Recipe() else f"it is a variant of the project's recipe: `{REBUILD} --recipe KEY=VALUE` builds it into the cache")
    raise EmbeddedUnavailable(f"no usable embedded model for recipe {key} ({'; '.join(reasons) or 'none was built'}); {how}")


def load_embedded(recipe: Recipe | None = None):
    """(model, tokenizer) of the verified embedded model (left padding)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = embedded_path(recipe)
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    return AutoModelForCausalLM.from_pretrained(path), tok
