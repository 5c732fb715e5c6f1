"""Configs fuzzed with hypothesis: every file is a valid config or a ConfigError that names where.

Cases are the shipped configs (and a graph team) mutated the way people and tools break
YAML: keys deleted or misspelt, unknown keys, values of the wrong type, huge and non-finite
numbers, references to agents and policies that do not exist, graph edges that make cycles,
anchors and aliases (also self-referencing ones and "billion laughs" expansions), text cut
short, and non-UTF-8 bytes.  Each goes through the CLI path (``mas validate`` -> ``load_config``)
and must give a RunConfig or a ``ConfigError`` whose every line starts with a YAML path (a key
of the file, ``<root>``) or a line number; never another exception.

The examples are derandomised, but not fixed: Hypothesis also draws constants it finds in the
modules already imported, so a full suite run can meet cases that this file run alone does not
(CI once met a HotpotQA config whose deleted env.source fell back to the 50-question sample).
The oracle therefore asks what ``mas validate`` asks: the config's meaning, then its data.
Set ``MAS_FUZZ_SEED`` to explore new cases.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import re
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mas.config.checks import data_issues, meaning_errors
from mas.cli import main
from mas.config.schema import ConfigError, RunConfig, issue_lines, load_config
from mas.config.safe_yaml import MAX_NODES

CONFIGS = sorted((Path(__file__).parents[1] / "configs").glob("*.yaml"))
BASES = [yaml.safe_load(p.read_text()) for p in CONFIGS]
GRAPH = {
    "team": {"name": "g"},
    "policies": {"p": {"model": "embedded"}},
    "agents": [{"name": n, "policy": "p", "role": "r", "parser": "verdict"} for n in ("a", "b", "c")],
    "topology": {"kind": "graph", "entry": "x", "max_turns": 6,
                 "nodes": [{"name": "x", "agent": "a"}, {"name": "y", "agent": "b"}, {"name": "z", "agent": "c"}],
                 "edges": [{"from": "x", "to": "y"}, {"from": "y", "to": "END", "when": "accept"}, {"from": "y", "to": "z"},
                           {"from": "z", "to": "y"}]},
    "env": {"name": "synthetic_math"},
    "credit": {"method": "grpo"},
}
BASES.append(GRAPH)
SEED = os.environ.get("MAS_FUZZ_SEED")
FUZZ = settings(max_examples=500, deadline=None, database=None, derandomize=SEED is None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([10**400, -(10**4000) // 7, 2**63, float("nan"), float("inf"), -float("inf"), 1e308, -0.0, 1e-320]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["", " ", "embedded", "lora", "frozen", "END", "a", "p", "ANSWER", "2024-13-45", "\u0000", "\ud800x", "yes", "~"]),
)
junk = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                     st.dictionaries(st.one_of(st.text(max_size=8), st.integers(), st.booleans()), kids, max_size=4)),
                    max_leaves=12)


def paths(data, prefix=()):
    """Every (path, value) in a nested dict/list config."""
    yield prefix, data
    if isinstance(data, dict):
        for k, v in data.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from paths(v, prefix + (i,))


def at(data, path):
    for p in path:
        data = data[p]
    return data


@st.composite
def mutated(draw) -> dict:
    data = copy.deepcopy(draw(st.sampled_from(BASES)))
    names = [a["name"] for a in data.get("agents", []) if isinstance(a, dict) and "name" in a]
    for _ in range(draw(st.integers(1, 4))):
        every = list(paths(data))[1:]
        if not every:
            break
        path, value = draw(st.sampled_from(every))
        parent, key = at(data, path[:-1]), path[-1]
        op = draw(st.sampled_from(["delete", "replace", "unknown_key", "dangling", "wrap", "stringify", "cycle"]))
        if op == "delete":
            del parent[key]
        elif op == "replace":
            parent[key] = draw(junk)
        elif op == "unknown_key" and isinstance(value, dict):
            value[draw(st.sampled_from(["lr", "stepz", "agent", "kind", "name", "Model", "x"]))] = draw(junk)
        elif op == "dangling" and isinstance(value, str):
            parent[key] = draw(st.sampled_from(["ghost", "", "planner ", names[0].upper() if names else "X", "END"]))
        elif op == "wrap":
            parent[key] = draw(st.sampled_from([[value], {"value": value}, {"kind": value}]))
        elif op == "stringify":
            parent[key] = str(value)
        elif op == "cycle" and isinstance(data.get("topology"), dict):
            topo = data["topology"]
            if topo.get("kind") == "graph":
                nodes = [n.get("name") for n in topo.get("nodes", []) if isinstance(n, dict)] or ["x"]
                topo["edges"] = [{"from": draw(st.sampled_from(nodes)), "to": draw(st.sampled_from(nodes + ["END"]))}
                                 for _ in range(draw(st.integers(1, 4)))]
                if draw(st.booleans()):
                    topo.pop("max_turns", None)
            elif topo.get("kind") == "chain":
                topo["loop_to"] = draw(st.sampled_from(names + ["ghost"]))
                topo["max_loops"] = draw(st.sampled_from([0, 1, 10**9, -1]))
    return data


def dump(data) -> str:
    try:
        return yaml.safe_dump(data, allow_unicode=True, sort_keys=False)
    except (yaml.YAMLError, UnicodeEncodeError):
        return yaml.safe_dump(data, sort_keys=False)


@st.composite
def yaml_text(draw) -> bytes:
    """A mutated config as YAML bytes, sometimes edited as text: anchors and aliases, cuts, bad bytes."""
    text = dump(draw(mutated()))
    edit = draw(st.sampled_from(["none", "none", "anchors", "laughs", "self_alias", "cut", "bytes", "tabs"]))
    if edit == "anchors":  # reuse a whole section through an alias
        text = text.replace("policies:\n", "policies: &pol\n", 1) + "extra: *pol\n"
    elif edit == "laughs":
        lines = ["lol0: &l0 [a, a, a, a, a, a, a, a, a, a]"]
        lines += [f"lol{i}: &l{i} [{', '.join(f'*l{i - 1}' for _ in range(10))}]" for i in range(1, draw(st.integers(2, 9)))]
        text = "\n".join(lines) + "\n" + text
    elif edit == "self_alias":
        text = text.replace("trainer:\n", "trainer: &t\n  again: *t\n", 1)
    elif edit == "cut":
        text = text[: draw(st.integers(0, len(text)))]
    elif edit == "tabs":
        text = text.replace("  ", "\t", draw(st.integers(1, 3)))
    raw = text.encode("utf-8", "surrogatepass")
    if edit == "bytes":
        pos = draw(st.integers(0, len(raw)))
        raw = raw[:pos] + draw(st.binary(min_size=1, max_size=4)) + raw[pos:]
    return raw


LOCATION = re.compile(r"^(<root>|line \d+|YAML syntax:)")


def check(raw: bytes) -> RunConfig | ConfigError:
    """The property: a RunConfig, or a ConfigError whose lines each start with a YAML path or a line."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "team.yaml"
        path.write_bytes(raw)
        try:
            cfg = load_config(path, check=meaning_errors)  # as the commands load it
        except ConfigError as e:
            error = e
        else:
            assert isinstance(cfg, RunConfig)
            error = None
            data = data_issues(cfg)  # validate also reads the data, as train does before models load
            if data:
                error = ConfigError(str(path), issue_lines(data))
        printed = io.StringIO()
        with contextlib.redirect_stderr(printed), contextlib.redirect_stdout(io.StringIO()):
            status = main(["validate", "-q", str(path)])
        assert status == (1 if error else 0)  # the CLI prints the error, no traceback
        if error:
            assert str(error) in printed.getvalue()
        else:  # a valid config may get warnings (what it probably does not mean), nothing else
            assert all(": warning: " in line for line in printed.getvalue().splitlines()), printed.getvalue()
    if error is None:
        return cfg
    try:
        top = yaml.safe_load(raw.decode("utf-8"))
    except Exception:  # noqa: BLE001 - unreadable: only line-located errors are possible
        top = None
    keys = [str(k) for k in top] if isinstance(top, dict) else []
    keys += list(RunConfig.model_fields)  # a missing section is named too
    assert error.lines
    for line in error.lines:
        named = LOCATION.match(line) or any(line.startswith((f"{k}.", f"{k}[", f"{k}:")) for k in keys)
        assert named, f"error line names no YAML path: {line!r}"
        assert len(line) < 2000, f"error line floods the terminal: {line[:300]!r}..."
    return error


@FUZZ
@given(raw=yaml_text())
def test_fuzzed_configs_validate_or_name_the_bad_path(raw):
    check(raw)


@settings(max_examples=100, deadline=None, database=None, derandomize=SEED is None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=junk)
def test_random_documents_are_errors_never_tracebacks(data):
    assert isinstance(check(dump(data).encode()), ConfigError)


def test_shipped_configs_pass_the_same_check():
    for p in CONFIGS:
        assert isinstance(check(p.read_bytes()), RunConfig)


def test_a_config_whose_held_out_split_is_too_small_is_an_error_that_names_eval_size():
    """The case CI found: without env.source a HotpotQA config reads the shipped sample, whose
    held-out split (50) is smaller than trainer.eval_size (200); validate refuses it, so must the oracle."""
    data = yaml.safe_load((Path(__file__).parents[1] / "configs" / "hotpotqa_orchestrator_mgrpo.yaml").read_text())
    del data["env"]["source"]
    error = check(dump(data).encode())
    assert isinstance(error, ConfigError)
    assert any(line.startswith("trainer.eval_size: 200 is too many") and "has 50" in line for line in error.lines), error.lines


@pytest.mark.parametrize("levels", [4, 9])
def test_a_billion_laughs_file_is_refused_before_anything_walks_it(levels):
    lines = ["team: {name: t}", "lol0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"lol{i}: &l{i} [{', '.join(f'*l{i - 1}' for _ in range(10))}]" for i in range(1, levels)]
    error = check("\n".join(lines).encode())
    assert isinstance(error, ConfigError)
    if 10**levels > MAX_NODES:
        assert "aliases expanded" in str(error)


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"a: &a [*a]\n", "recursive"),
        (b"team: {name: \xff\xfe}\n", "not UTF-8"),
        (b"trainer: {steps: " + b"9" * 5000 + b"}\n", "cannot be read"),
        (b"team: {name: x}\nwhen: 2024-13-45\n", "cannot be read"),
        (b"[" * 5000 + b"]" * 5000, "nested deeper"),
        (b"x: " + b"{a: " * 100 + b"1" + b"}" * 100, "nested deeper"),
        (b"# " + b"x" * 2_000_000, "bytes"),
        (b"trainer:\n  steps: 20\n  lr: 0.1\n  steps: 200\n", "line 4, column 3: the key 'steps' is given twice"),
        (b"team: {name: a}\nteam: {name: b}\n", "(first at line 1, column 1)"),
    ],
)
def test_hostile_files_get_one_clear_error(raw, message):
    error = check(raw)
    assert isinstance(error, ConfigError) and message in str(error)


def test_a_merge_key_may_still_be_overridden_and_equal_keys_in_different_mappings_are_fine():
    from mas.config.safe_yaml import load_yaml_bytes

    doc = load_yaml_bytes(b"base: &b {steps: 1, lr: 0.1}\nrun:\n  <<: *b\n  steps: 5\nother: {steps: 1}\n")
    assert doc["run"] == {"steps": 5, "lr": 0.1} and doc["other"] == {"steps": 1}
