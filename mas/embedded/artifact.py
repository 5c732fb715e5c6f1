"""Where the embedded model's files are, and whether they may be used: the shipped artifact and the cache.

The model the quickstart needs ships with the package (``mas/embedded/artifact/``, about a
megabyte): what the project's own recipe (``recipe.py``) builds, so a fresh clone trains at
once instead of building it for minutes.  A model folder holds the Hugging Face files and a
``manifest.json``: the recipe key it was built from and the sha256 of every file.

A folder is used only when its manifest names the current recipe's key and every file's hash
matches; anything else (a stale artifact after the recipe changed, a truncated or edited
file) is never loaded.  Lookup, in order:

1. the shipped artifact, when its manifest verifies for the current key;
2. ``$MAS_CACHE_DIR/embedded/<key>/`` (else ``~/.cache/mas``): a model built on this machine.

The shipped artifact wins over a cached build of the same key: a build depends on the machine's
floating point and thread count, so a rebuild is a different model, and the README's figures
are the shipped build's.  A cached build of the same key with other weights is therefore not
used, and a warning says so once per process (``model: <its folder>`` still uses it).

``embedded_path`` raises ``EmbeddedUnavailable``, saying which folder was refused and why,
when neither is usable; building (``mas build-embedded``, ``mas.embedded.build``) is the
job of a higher layer: the team builder builds into the cache when it must, and
``mas build-embedded --ship`` rewrites the shipped artifact.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

from mas.models.sources import ModelLoadError, cache_dir

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


_warned_other_weights: set[Path] = set()  # cached builds already named as passed over (once per process)


def _differing_files(a: Path, b: Path) -> list[str]:
    """Files whose sha256 differs between two verified folders' manifests."""
    fa, fb = (json.loads((Path(f) / MANIFEST).read_text())["files"] for f in (a, b))
    return sorted(name for name in set(fa) | set(fb) if fa.get(name) != fb.get(name))


def _warn_if_cached_differs(cached: Path, key: str) -> None:
    """Say once that a verified cached build of ``key`` with other weights is passed over."""
    if cached in _warned_other_weights or not cached.exists() or problem(cached, key) is not None:
        return
    differ = _differing_files(cached, ARTIFACT_DIR)
    if differ:
        _warned_other_weights.add(cached)
        warnings.warn(
            f"the embedded model's cached build {cached} (recipe {key}) differs from the shipped artifact "
            f"({', '.join(differ)}); the shipped one is used, since it is the build the documented figures were "
            f"measured on. To use the cached build, name its folder as the policy's model; delete it to silence this.",
            UserWarning, stacklevel=3)


def embedded_path(recipe: Recipe | None = None) -> Path:
    """The verified folder of the embedded model for ``recipe`` (default: the project's): the
    shipped artifact whenever it verifies, else a verified build in the cache."""
    recipe = recipe or Recipe()
    key = recipe.key()
    cached = cache_folder(recipe)
    reasons = []
    # only the project's recipe ships; a recipe of the same key is the same model (knobs of a stage
    # it does not have, such as the base of a second research stage keeping that stage's steps)
    project = key == Recipe().key()
    if project:
        why = problem(ARTIFACT_DIR, key) if ARTIFACT_DIR.exists() else "it is missing"
        if why is None:
            _warn_if_cached_differs(cached, key)
            return ARTIFACT_DIR
        reasons.append(f"the shipped artifact {ARTIFACT_DIR} was refused: {why}")
    if cached.exists():
        why = problem(cached, key)
        if why is None:
            return cached
        reasons.append(f"the cached copy {cached} was refused: {why}")
    how = (f"`{REBUILD}` builds it into the cache (about 85 minutes on 2 cores), and `{REBUILD} --ship` rewrites the shipped one"
           if project else f"it is a variant of the project's recipe: `{REBUILD} --recipe KEY=VALUE` builds it into the cache")
    raise EmbeddedUnavailable(f"no usable embedded model for recipe {key} ({'; '.join(reasons) or 'none was built'}); {how}")


def load_tokenizer(folder: Path):
    """The embedded model's tokenizer exactly as its ``tokenizer.json`` defines it: one id per row
    of the model's vocabulary (384), with the file's own pre-tokenizer.

    ``AutoTokenizer`` takes the class from ``config.json``'s model type (qwen2) over the generic
    one the files name, and ``Qwen2Tokenizer`` adds its unknown token ``<|endoftext|>`` as id
    384, which the model has no embedding for, and swaps in Qwen's normaliser and pre-tokenizer.
    Those gave the same ids on every teacher turn the model was built from and the same greedy
    held-out episodes on every embedded config (docs/benchmarks/embedded.md), so the shipped figures hold."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(folder)


def load_embedded(recipe: Recipe | None = None):
    """(model, tokenizer) of the verified embedded model (left padding)."""
    from transformers import AutoModelForCausalLM

    path = embedded_path(recipe)
    tok = load_tokenizer(path)
    tok.padding_side = "left"
    return AutoModelForCausalLM.from_pretrained(path), tok
