"""The shipped embedded model: built from the current recipe, verified before use, never used when
stale or corrupt (then rebuilt into the cache), and used before a cached build of its key."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

from mas.embedded import ARTIFACT_DIR, EmbeddedUnavailable, Recipe, embedded_path
from mas.embedded.artifact import MANIFEST, cache_folder, problem, write_manifest
from mas.embedded.build import ensure_embedded


@pytest.fixture()
def empty_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MAS_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_shipped_artifact_is_the_current_recipe_and_verifies():
    """Fails when a format, a teacher's knob or a recipe number changed and the artifact was not
    rebuilt: run `mas build-embedded --ship` (docs/embedded.md)."""
    manifest = json.loads((ARTIFACT_DIR / MANIFEST).read_text())
    assert manifest["recipe_key"] == Recipe().key(), (
        f"the shipped embedded model was built from recipe {manifest['recipe_key']}, the recipe is now "
        f"{Recipe().key()}: rebuild it with `mas build-embedded --ship`")
    assert problem(ARTIFACT_DIR, Recipe().key()) is None


def test_a_fresh_machine_uses_the_shipped_artifact(empty_cache):
    assert embedded_path() == ARTIFACT_DIR
    assert ensure_embedded(log=lambda *_: None) == ARTIFACT_DIR  # nothing to build


def test_a_variant_of_the_project_recipe_is_never_taken_for_the_shipped_artifact(empty_cache):
    variant = Recipe().varied(["research_steps=2000"])
    assert variant.key() != Recipe().key() and variant.base().key() == Recipe().base().key()  # the same two-stage base
    with pytest.raises(EmbeddedUnavailable, match="variant of the project's recipe"):
        embedded_path(variant)


def copy_of_artifact(dest: Path) -> Path:
    shutil.copytree(ARTIFACT_DIR, dest)
    return dest


def test_a_corrupt_file_is_refused_with_its_name(tmp_path):
    folder = copy_of_artifact(tmp_path / "model")
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF  # one flipped byte in the weights
    (folder / "model.safetensors").write_bytes(bytes(data))
    assert problem(folder, Recipe().key()) == "model.safetensors does not match the manifest's sha256 (corrupt or edited)"
    (folder / "tokenizer.json").unlink()
    assert "missing ['tokenizer.json']" in problem(folder, Recipe().key())


def test_a_stale_manifest_is_refused_naming_both_keys(tmp_path):
    folder = copy_of_artifact(tmp_path / "model")
    assert problem(folder, "0123456789ab") == f"it was built from recipe {Recipe().key()}, and the recipe is now 0123456789ab"
    (folder / MANIFEST).unlink()
    assert problem(folder, Recipe().key()) == "it has no manifest.json"


def test_a_corrupt_cached_copy_is_never_used_and_is_rebuilt(empty_cache, monkeypatch):
    cached = copy_of_artifact(cache_folder(Recipe()))
    (cached / "config.json").write_text("{}")  # edited after the build
    monkeypatch.setattr("mas.embedded.artifact.ARTIFACT_DIR", empty_cache / "no-artifact")  # as if none shipped
    with pytest.raises(EmbeddedUnavailable, match=r"cached copy .* was refused: config.json does not match"):
        embedded_path()
    built = []

    def fake_build(recipe, out, log, progress):  # stands in for the 6-minute build: a sealed folder
        built.append(out)
        shutil.copytree(ARTIFACT_DIR, out)
        write_manifest(out, recipe)

    monkeypatch.setattr("mas.embedded.build.build_embedded", fake_build)
    said = []
    assert ensure_embedded(log=said.append) == cached and built == [cached]
    assert problem(cached, Recipe().key()) is None and "config.json does not match" in said[0]


def rebuilt_copy(dest: Path) -> Path:
    """A verified build of the current recipe with other weights, as a rebuild on another machine gives."""
    folder = copy_of_artifact(dest)
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (folder / "model.safetensors").write_bytes(bytes(data))
    write_manifest(folder, Recipe())
    assert problem(folder, Recipe().key()) is None
    return folder


def test_the_shipped_artifact_wins_over_a_cached_build_of_its_key_and_says_so_once(empty_cache):
    cached = rebuilt_copy(cache_folder(Recipe()))
    with pytest.warns(UserWarning, match=r"cached build .* differs from the shipped artifact \(model.safetensors\)") as said:
        assert embedded_path() == ARTIFACT_DIR
    assert str(cached) in str(said[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second lookup is silent
        assert embedded_path() == ARTIFACT_DIR


def test_a_cached_build_identical_to_the_shipped_one_is_not_warned_about(empty_cache):
    copy_of_artifact(cache_folder(Recipe()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert embedded_path() == ARTIFACT_DIR


def test_a_verified_cached_build_is_used_when_the_shipped_artifact_is_refused(empty_cache, monkeypatch):
    cached = rebuilt_copy(cache_folder(Recipe()))
    monkeypatch.setattr("mas.embedded.artifact.ARTIFACT_DIR", empty_cache / "no-artifact")  # as if none shipped
    assert embedded_path() == cached


@pytest.mark.parametrize("cached_state", ["verified", "corrupt"])
def test_ship_takes_the_measured_cached_build_and_rebuilds_only_a_refused_one(empty_cache, tmp_path, monkeypatch, cached_state):
    cached = copy_of_artifact(cache_folder(Recipe()))
    (cached / "marker.txt").write_text("the measured build")
    write_manifest(cached, Recipe())  # sealed with the marker among its files
    if cached_state == "corrupt":
        (cached / "marker.txt").write_text("edited")
    target = tmp_path / "shipped" / "artifact"
    target.parent.mkdir()
    monkeypatch.setattr("mas.embedded.build.ARTIFACT_DIR", target)
    built = []

    def fake_build(recipe, out, log, progress):
        built.append(out)
        shutil.copytree(ARTIFACT_DIR, out)
        write_manifest(out, recipe)

    monkeypatch.setattr("mas.embedded.build.build_embedded", fake_build)
    from mas.embedded.build import ship

    assert ship(log=lambda _: None) == target
    assert problem(target, Recipe().key()) is None
    if cached_state == "verified":
        assert built == [] and (target / "marker.txt").read_text() == "the measured build"
    else:
        assert len(built) == 1 and not (target / "marker.txt").exists()


def test_the_embedded_tokenizer_has_one_id_per_row_of_the_models_vocabulary():
    """AutoTokenizer would load it as a Qwen2 tokenizer, adding <|endoftext|> as id 384 beyond the
    model's 384 embeddings; loaded as its tokenizer.json defines it, every id has a row."""
    import torch
    from tokenizers import Tokenizer

    from mas.embedded import load_embedded

    model, tok = load_embedded()
    rows = model.get_input_embeddings().weight.shape[0]
    assert len(tok) == rows == model.config.vocab_size == 384
    assert max(tok.get_vocab().values()) == rows - 1
    own = Tokenizer.from_file(str(ARTIFACT_DIR / "tokenizer.json"))  # the file's own pipeline, nothing added
    for text in ("Task: 3+4-2. CALL adder: 3+4", "x:y(z)!? ünïcödé", "<|endoftext|> and <eos>"):
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == own.encode(text, add_special_tokens=False).ids and max(ids) < rows
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))  # every id has an embedding
