"""The embedded offline model: teacher transcripts, determinism, cache, quickstart roles."""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from mas.embedded import ROLES, Recipe, Teacher, _parse_chain, build_embedded, embedded_path, teacher_transcripts
from mas.tiny import train_tokenizer

ROOT = Path(__file__).parents[1]
SMALL = Recipe(tasks=40, steps=3, hidden_size=32, num_layers=1, num_heads=2, vocab_size=300)


def test_parse_chain_computes_left_to_right_steps():
    assert _parse_chain("3+4-2") == [(3, "+", 4, 7), (7, "-", 2, 5)]
    assert _parse_chain("-3+4") == [(-3, "+", 4, 1)]
    assert _parse_chain("12-15") == [(12, "-", 15, -3)]


def test_teacher_transcripts_follow_the_orchestrator_protocol():
    tok = train_tokenizer([" ".join(ROLES.values())], vocab_size=300)
    turns = teacher_transcripts(Recipe(tasks=60, p_direct=0.5), tok)
    orch = [(m, c) for m, c in turns if m[0]["content"] == ROLES["orchestrator"]]
    first = [c for m, c in orch if len(m) == 2]
    assert len(first) == 60
    direct = sum(c.startswith("ANSWER") for c in first)
    assert 15 <= direct <= 45  # about p_direct of the first moves answer at once
    calls = [c for c in first if c.startswith("CALL")]
    assert all(c.split(":")[0] in ("CALL adder", "CALL subtractor") for c in calls)
    for m, c in turns:
        if m[0]["content"] == ROLES["adder"]:
            a, op, b, r = _parse_chain(m[-1]["content"])[0]
            assert op == "+" and c == f"ANSWER: {r}"  # specialists only ever see their own operator


def test_teacher_is_deterministic_for_a_seed():
    from mas.backends.base import GenRequest

    def first_moves(seed):
        t = Teacher(0.5, seed)
        req = GenRequest("p", [1], 1.0, 1.0, 0, 8, agent="orchestrator",
                         messages=[{"role": "system", "content": "x"}, {"role": "user", "content": "Task: 1+2-3"}])
        return [t(req) for _ in range(20)]

    assert first_moves(0) == first_moves(0) and first_moves(0) != first_moves(1)


def test_build_is_deterministic_and_cached(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    build_embedded(SMALL, tmp_path / "a", log=lambda *_: None)
    build_embedded(SMALL, tmp_path / "b", log=lambda *_: None)
    from safetensors.torch import load_file

    wa, wb = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (tmp_path / "b" / "tokenizer.json").read_text()
    monkeypatch.setenv("MAS_CACHE_DIR", str(tmp_path / "cache"))
    built = []
    monkeypatch.setattr("mas.embedded.build_embedded", lambda r, out, log: (built.append(out), out.mkdir(parents=True), (out / "recipe.json").write_text("{}")))
    p1 = embedded_path(SMALL)
    p2 = embedded_path(SMALL)
    assert p1 == p2 and len(built) == 1 and str(p1).startswith(str(tmp_path / "cache"))
    assert embedded_path(Recipe(seed=1)) != p1  # a different recipe is a different cache entry


def test_quickstart_uses_the_roles_the_embedded_model_was_trained_on():
    cfg = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())
    roles = {a["name"]: a["role"] for a in cfg["agents"]}
    assert roles == ROLES
    assert all(p["model"] == "embedded" for p in cfg["policies"].values())
