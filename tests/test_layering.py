"""Imports point down (docs/architecture.md, "Layering: imports point down").

No import cycle among mas's own modules, and no module imports from a higher layer. Every
import counts: module level, under ``TYPE_CHECKING``, and lazy ones inside functions. The
modules are the ``.py`` files of the packages pyproject.toml installs (``agents/`` installs as
``mas.agents``, ...), read with ``ast``: nothing is imported, so the test takes a second.
"""

from __future__ import annotations

import ast
import functools
import textwrap
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10: the TOML reader pytest itself depends on there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]

# The layers, bottom up (docs/architecture.md): a module may import from its own layer or below.
# The folders are the layers: each folder of mas/ and each kind folder at the repository root sits
# on one floor, and a module is placed by its folder.  The top of mas/ holds the ground floor
# (types, errors, the tool specifications, references to user code) and the commands users call.
LAYERS: dict[str, int] = {
    # 1. the ground floor: types and the episode-context protocol, errors, tool specifications and reply formats,
    #    references to user code; the process layer (pause points, memory, the tool sandbox)
    "mas.types": 1, "mas.errors": 1, "mas.version": 1, "mas.tools": 1, "mas.response_format": 1, "mas.refs": 1,
    "mas._moved": 1,
    "mas.process": 1,
    # 2. the kinds, each with its own config: credit methods, envs, topologies (and the teachers
    #    that play them); where weights come from (models) and the backends that sample them
    "mas.credit": 2, "mas.envs": 2, "mas.topologies": 2, "mas.models": 2,
    # 3. config: assembles the kinds' registries into the run config, reads and checks it
    "mas.config": 3,
    # 4. agents (policies, prompts); the embedded model a policy loads (its recipe, formats, artifact)
    "mas.agents": 4, "mas.embedded": 4,
    # 5. the engine, and the learning layer (the update math: learner, SFT, log-probs, memory plan)
    "mas.rollout": 5, "mas.learning": 5,
    # 6. runtime
    "mas.runtime": 6,
    # 7. training: the team, the trainer and its warm-up, the run it writes
    "mas.training": 7,
    # 8. the readers of runs: study, audit, reports, export, show
    "mas.study": 8, "mas.audit": 8, "mas.report": 8, "mas.export": 8, "mas.show": 8,
    # 9. cli and api (the root package re-exports the api)
    "mas.cli": 9, "mas.api": 9, "mas": 9,
}

# Modules that sit on another floor than their folder, each because the fixed repository layout
# (docs/architecture.md) puts a kind or a lower piece beside the floor that uses it.  Each is
# its own unit in the folder-pair check.  An entry whose module is gone must go.
FLOOR_EXCEPTIONS: dict[str, tuple[int, str]] = {
    "mas.agents.parsers": (2, "output parsing is a kind (register_parser), kept in agents/ with the agents that use it"),
    "mas.rollout.backends": (2, "the backends serve a policy's weights; the rollout folder holds them beside the engine"),
    "mas.config.messages": (1, "how a config problem is written: ConfigError, raised at every floor"),
    "mas.config.crossrefs": (1, "checks across sections on plain values (no schema import); the schema runs them"),
    "mas.config.safe_yaml": (1, "the bounded YAML reader"),
    "mas.config.plugins": (2, "fills the kinds' registries from entry points before the schema is built"),
    "mas.config.checks": (4, "what a config means needs the kinds, the models and the agents"),
    "mas.config.defaults": (4, "the defaults a policy's model implies read the model"),
    "mas.embedded.build": (7, "builds the embedded model: plays its teachers through a team and trains it"),
    "mas.training.signals": (9, "the stop signals `mas train` installs"),
}
LAYERS.update({module: layer for module, (layer, _) in FLOOR_EXCEPTIONS.items()})

# mas/'s folders (docs/architecture.md): a folder holds one floor of the design.  The top of mas/ is
# the ground floor and the commands users call.
FOLDERS: dict[str, str] = {
    "process": "fault points, resident memory, the tool sandbox: what every floor may call",
    "models": "where weights come from: sources, devices, the hub, GGUF, tiny in-process models",
    "config": "the schema assembled from the kinds, loading and overrides, messages, checks, plugins",
    "embedded": "the embedded model: recipe, formats, build, the shipped artifact",
    "rollout": "the engine and backends/",
    "learning": "the update math: learner, SFT, log-probs of packed turns, the memory plan",
    "runtime": "where policies live: in-process, data-parallel, Ray actors",
    "training": "team, trainer and warm-up, checkpoint, metrics, callbacks, run directory",
    "report": "mas report", "study": "mas study",
}
TOP_MODULES = {"__init__", "_moved", "types", "errors", "version", "tools", "response_format", "refs", "api", "cli", "audit", "show", "export"}

# Packages not placed yet, and why; their imports are still checked for cycles.
UNPLACED: dict[str, str] = {}

# Imports that still point up, by (importing package or module, imported one): each is a debt,
# listed with why it is there.  An entry that no import matches any more must go.  The config's
# entries are one debt: the schema is built from the registries of the envs, credit methods and
# parsers that plugins extend; paying it means keeping those registries (names and section
# classes) below the config, filled before the schema is built.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module of the project
    path: Path  # the importing file
    line: int

    def __str__(self) -> str:
        try:
            where = self.path.relative_to(ROOT)
        except ValueError:
            where = self.path
        return f"{self.source} -> {self.target}  ({where}:{self.line})"


# --------------------------------------------------------------------------------------------
# reading the imports
# --------------------------------------------------------------------------------------------


def package_dirs(root: Path) -> dict[str, Path]:
    """Each installed package and its folder, from pyproject's ``packages`` and ``package-dir``."""
    setup = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    mapped = setup.get("package-dir", {})
    out = {}
    for package in setup["packages"]:
        parts = package.split(".")
        for i in range(len(parts), -1, -1):  # the nearest mapped ancestor ("" is the root)
            parent = ".".join(parts[:i])
            if parent in mapped or i == 0:
                out[package] = root / mapped.get(parent, "") / Path(*parts[i:])
                break
    return out


def project_modules(root: Path) -> dict[str, Path]:
    """Module name -> source file, for every module of the installed packages."""
    modules = {}
    for package, folder in package_dirs(root).items():
        for path in sorted(folder.glob("*.py")):
            modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return modules


def _known_prefix(dotted: str, known: dict[str, Path]) -> str | None:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in known:
            return ".".join(parts[:i])
    return None


def imports_of(module: str, path: Path, known: dict[str, Path]) -> list[Import]:
    """Every import of a project module in ``path`` (anywhere in the file), relative ones resolved.
    ``from p import x`` imports the module ``p.x`` if there is one, else (an attribute of) ``p``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [_known_prefix(alias.name, known) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else _known_prefix(base, known) for a in node.names]
        else:
            continue
        found += [Import(module, t, path, node.lineno) for t in targets if t is not None and t != module]
    return found


def project_imports(root: Path) -> list[Import]:
    modules = project_modules(root)
    return list(dict.fromkeys(imp for name, path in modules.items() for imp in imports_of(name, path, modules)))


# --------------------------------------------------------------------------------------------
# cycles
# --------------------------------------------------------------------------------------------


def find_cycles(imports: list[Import]) -> list[list[Import]]:
    """One shortest cycle through each strongly connected group of modules (Tarjan's algorithm,
    iterative), as the imports along it."""
    edges: dict[str, dict[str, Import]] = {}
    for imp in imports:
        edges.setdefault(imp.source, {}).setdefault(imp.target, imp)  # the first import of a pair stands for it
        edges.setdefault(imp.target, {})
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(group)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return [_shortest_cycle(min(group), group, edges) for group in groups]


def _shortest_cycle(start: str, group: set[str], edges: dict[str, dict[str, Import]]) -> list[Import]:
    """Breadth-first from ``start`` back to it, inside its group (which is strongly connected)."""
    came_from: dict[str, Import] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for target in sorted(edges[node]):
                if target not in group:
                    continue
                if target == start:
                    path = [edges[node][target]]
                    while path[0].source != start:
                        path.insert(0, came_from[path[0].source])
                    return path
                if target not in came_from:
                    came_from[target] = edges[node][target]
                    nxt.append(target)
        frontier = nxt
    raise AssertionError(f"{sorted(group)} is not strongly connected")


def describe_cycle(cycle: list[Import]) -> str:
    return f"import cycle through {len(cycle)} modules:\n" + "\n".join(f"  {imp}" for imp in cycle)


# --------------------------------------------------------------------------------------------
# layers
# --------------------------------------------------------------------------------------------


def layer_of(module: str, layers: dict[str, int]) -> int | None:
    """The layer of ``module``'s longest listed prefix; a root package counts only for itself."""
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in layers and (i > 1 or i == len(parts)):
            return layers[prefix]
    return None


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def upward_imports(imports: list[Import], layers: dict[str, int]) -> list[Import]:
    """Imports from a lower layer to a higher one (both modules placed)."""
    out = []
    for imp in imports:
        src, dst = layer_of(imp.source, layers), layer_of(imp.target, layers)
        if src is not None and dst is not None and dst > src:
            out.append(imp)
    return out


# --------------------------------------------------------------------------------------------
# the project
# --------------------------------------------------------------------------------------------


@functools.cache
def _our_imports() -> tuple[Import, ...]:
    return tuple(project_imports(ROOT))  # parsed once for the tests below


def test_no_import_cycles_among_the_projects_modules():
    imports = list(_our_imports())
    assert len({imp.source for imp in imports}) > 50  # the packages were found (agents/ as mas.agents, ...)
    cycles = find_cycles(imports)
    assert not cycles, "imports must point down (docs/architecture.md, Layering):\n" + "\n".join(map(describe_cycle, cycles))


def test_every_module_has_a_layer():
    unplaced = [m for m in project_modules(ROOT)
                if layer_of(m, LAYERS) is None and not any(_under(m, p) for p in UNPLACED)]
    assert not unplaced, f"place these modules in LAYERS (docs/architecture.md's layers): {unplaced}"


def test_no_module_imports_a_higher_layer_beyond_the_known_debts():
    upward = upward_imports(list(_our_imports()), LAYERS)
    new = [imp for imp in upward if not any(_under(imp.source, s) and _under(imp.target, t) for s, t in KNOWN_UPWARD)]
    assert not new, "imports that point up (move the responsibility up, or pass the dependency in):\n" + "\n".join(
        f"  {imp}  (layer {layer_of(imp.source, LAYERS)} -> {layer_of(imp.target, LAYERS)})" for imp in new)
    paid = [pair for pair in KNOWN_UPWARD if not any(_under(i.source, pair[0]) and _under(i.target, pair[1]) for i in upward)]
    assert not paid, f"these debts are paid: remove them from KNOWN_UPWARD: {paid}"


def unit_of(module: str, layers: dict[str, int]) -> str | None:
    """The entry of ``layers`` that places ``module`` (its folder, or its floor exception)."""
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in layers and (i > 1 or i == len(parts)):
            return prefix
    return None


def two_way_units(imports: list[Import], layers: dict[str, int]) -> list[tuple[Import, Import]]:
    """Pairs of units (folders, floor exceptions) that import each other: one import each way."""
    first: dict[tuple[str, str], Import] = {}
    for imp in imports:
        a, b = unit_of(imp.source, layers), unit_of(imp.target, layers)
        if a and b and a != b:
            first.setdefault((a, b), imp)
    return [(first[(a, b)], first[(b, a)]) for (a, b) in sorted(first) if a < b and (b, a) in first]


def test_no_two_folders_import_each_other():
    """A folder's modules and another folder's never import each other both ways: each floor only
    reaches down (the floor exceptions count as units of their own)."""
    pairs = two_way_units(list(_our_imports()), LAYERS)
    assert not pairs, "folders that import each other:\n" + "\n".join(f"  {a}\n  {b}" for a, b in pairs)


def test_every_floor_exception_names_a_module_that_exists():
    modules = set(project_modules(ROOT))
    gone = [m for m in FLOOR_EXCEPTIONS if not any(_under(x, m) for x in modules)]
    assert not gone, f"remove these from FLOOR_EXCEPTIONS: {gone}"


def test_mas_is_grouped_by_layer_with_only_the_user_facing_and_shared_modules_at_its_top():
    mas = ROOT / "mas"
    top = {p.stem for p in mas.glob("*.py")}
    folders = {p.name for p in mas.iterdir() if (p / "__init__.py").is_file()}
    assert top == TOP_MODULES, f"a module at the top of mas/ belongs in one of its folders {sorted(FOLDERS)}: {sorted(top - TOP_MODULES)}"
    assert folders == set(FOLDERS), f"folders of mas/ not in FOLDERS (or gone): {sorted(folders ^ set(FOLDERS))}"
    installed = {p for p in package_dirs(ROOT) if p.count(".") == 1 and p.startswith("mas.")}
    assert {p for p in installed if (ROOT / "mas" / p.split(".")[1]).is_dir()} >= {f"mas.{f}" for f in FOLDERS}


# --------------------------------------------------------------------------------------------
# the checker itself, on a fake project
# --------------------------------------------------------------------------------------------


def _fake_project(root: Path, files: dict[str, str]) -> None:
    (root / "pyproject.toml").write_text(textwrap.dedent("""
        [tool.setuptools]
        package-dir = { "pkg" = "pkg", "pkg.plug" = "plug" }
        packages = ["pkg", "pkg.plug"]
    """))
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


FAKE = {
    "pkg/__init__.py": "",
    "pkg/low.py": """
        from typing import TYPE_CHECKING

        import json

        if TYPE_CHECKING:
            from pkg.plug.high import High  # line 7: type-only, still an import
    """,
    "pkg/mid.py": """
        from . import low  # line 2: relative, resolved to pkg.low
    """,
    "plug/__init__.py": "",
    "plug/high.py": """
        import pkg.mid as mid  # line 2


        def later():
            from ..low import json  # line 6: lazy and relative: pkg.low (json is only an attribute of it)
    """,
}


def test_the_checker_reads_every_kind_of_import_and_resolves_the_folders(tmp_path):
    _fake_project(tmp_path, FAKE)
    modules = project_modules(tmp_path)
    assert sorted(modules) == ["pkg", "pkg.low", "pkg.mid", "pkg.plug", "pkg.plug.high"]
    assert modules["pkg.plug.high"] == tmp_path / "plug" / "high.py"
    got = {(i.source, i.target, i.line) for i in project_imports(tmp_path)}
    assert got == {("pkg.low", "pkg.plug.high", 7), ("pkg.mid", "pkg.low", 2),
                   ("pkg.plug.high", "pkg.mid", 2), ("pkg.plug.high", "pkg.low", 6)}


def test_the_checker_finds_a_cycle_through_lazy_and_type_only_imports_and_names_each_line(tmp_path):
    _fake_project(tmp_path, FAKE)
    cycles = find_cycles(project_imports(tmp_path))
    assert len(cycles) == 1
    hops = [(i.source, i.target, i.path.name, i.line) for i in cycles[0]]
    # the shortest way round from the smallest name: low -> high (type-only) -> low (lazy)
    assert hops == [("pkg.low", "pkg.plug.high", "low.py", 7), ("pkg.plug.high", "pkg.low", "high.py", 6)]
    assert "plug/high.py:6" in describe_cycle(cycles[0]).replace("\\", "/")


def test_the_checker_finds_no_cycle_once_the_dependency_points_down(tmp_path):
    _fake_project(tmp_path, {**FAKE, "pkg/low.py": "import json\n"})
    assert find_cycles(project_imports(tmp_path)) == []


def test_the_pair_check_finds_two_folders_that_import_each_other(tmp_path):
    _fake_project(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from pkg.plug import b", "plug/__init__.py": "",
                             "plug/b.py": "import pkg.a"})
    imports = project_imports(tmp_path)
    layers = {"pkg.a": 1, "pkg.plug": 2, "pkg": 9}
    assert [(a.source, b.source) for a, b in two_way_units(imports, layers)] == [("pkg.a", "pkg.plug.b")]
    assert two_way_units([i for i in imports if i.source == "pkg.plug.b"], layers) == []  # one way only: fine


def test_an_import_of_a_higher_layer_is_reported_and_a_root_package_places_only_itself(tmp_path):
    _fake_project(tmp_path, {**FAKE, "pkg/low.py": "import json\n"})
    layers = {"pkg": 9, "pkg.low": 1, "pkg.mid": 2, "pkg.plug": 3}
    assert layer_of("pkg.plug.high", layers) == 3 and layer_of("pkg", layers) == 9
    assert layer_of("pkg.other", layers) is None
    assert upward_imports(project_imports(tmp_path), layers) == []
    layers["pkg.mid"] = 4  # high (3) imports mid (4): upward
    assert [(i.source, i.target, i.line) for i in upward_imports(project_imports(tmp_path), layers)] == [
        ("pkg.plug.high", "pkg.mid", 2)]
