"""The package ships every data folder (templates, data samples), and building it is quiet.

``pyproject.toml`` lists each data folder in ``packages`` and ships every file of every listed
folder (``package-data "*" = ["*"]``).  The first tests keep that rule honest on the source
tree; the last builds a real wheel and looks inside it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11 (the package supports 3.10)

REPO = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
PACKAGES: list[str] = CONFIG["packages"]
PACKAGE_DIR: dict[str, str] = CONFIG["package-dir"]


def folder(package: str) -> Path:
    """Where ``package`` lives in the source tree (setuptools' package-dir rule: longest prefix)."""
    prefix = max((p for p in PACKAGE_DIR if package == p or package.startswith(p + ".")), key=len)
    rest = package[len(prefix):].lstrip(".")
    return REPO / PACKAGE_DIR[prefix] / Path(*rest.split(".")) if rest else REPO / PACKAGE_DIR[prefix]


def shipped_files(path: Path) -> list[Path]:
    """Files the ``"*"`` package-data glob takes from a folder (no dotfiles, no bytecode)."""
    return sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".") and p.suffix != ".pyc")


def is_code(path: Path) -> bool:
    return (path / "__init__.py").is_file()


def test_every_folder_of_files_under_a_package_is_listed():
    listed = {folder(p) for p in PACKAGES}
    missing = sorted({str(sub.relative_to(REPO)) for p in PACKAGES for sub in folder(p).rglob("*")
                      if sub.is_dir() and sub not in listed and "__pycache__" not in sub.parts and shipped_files(sub)})
    assert not missing, (
        f"{missing} hold files but are not in pyproject.toml's [tool.setuptools] packages, and only the files "
        f"of listed folders ship: add each as a dotted name (e.g. mas.embedded.artifact)"
    )


def test_code_folders_hold_only_python_so_the_catch_all_glob_ships_only_data():
    stray = [str(f.relative_to(REPO)) for p in PACKAGES if is_code(folder(p))
             for f in shipped_files(folder(p)) if f.suffix != ".py"]
    assert not stray, f"{stray} would ship as package data; move them into a data folder listed in pyproject.toml"
    assert all(shipped_files(folder(p)) for p in PACKAGES if not is_code(folder(p))), "an empty data folder is listed"


def setuptools_version() -> tuple[int, ...]:
    try:
        from importlib.metadata import version

        return tuple(int(x) for x in version("setuptools").split(".")[:2])
    except Exception:  # not installed, or an odd version string
        return (0,)


def source_copy(dest: Path) -> Path:
    """What a build reads, copied, so its egg-info/ and build/ stay out of the work tree."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, dest / name)
    for top in {Path(d).parts[0] for d in PACKAGE_DIR.values()}:
        shutil.copytree(REPO / top, dest / top, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


@pytest.mark.skipif(setuptools_version() < (77,), reason="building needs setuptools >= 77 in this environment")
def test_a_wheel_builds_without_warnings_and_holds_the_data_files(tmp_path):
    # --no-build-isolation: this environment's setuptools, no package index needed
    src = source_copy(tmp_path / "src")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    output = done.stdout + done.stderr
    assert "Warning" not in output and "warning:" not in output.lower(), output[-5000:]
    (wheel,) = (tmp_path / "dist").glob("mas_rl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "the project's LICENSE is not in the wheel"
    for package in PACKAGES:
        if not is_code(folder(package)):
            expected = {f"{package.replace('.', '/')}/{f.name}" for f in shipped_files(folder(package))}
            assert expected <= names, f"{package}: missing from the wheel: {sorted(expected - names)}"
    assert {"mas/agents/__init__.py", "mas/envs/math/__init__.py", "mas/embedded/build.py"} <= names


@pytest.mark.skipif(setuptools_version() < (77,), reason="building needs setuptools >= 77 in this environment")
def test_setup_installs_editable_without_setuptools_editable_warning(tmp_path):
    """scripts/setup.sh's warning filter silences setuptools' "Editable installation" notice in the
    build it runs (PEP 660's build_editable, what pip calls); the control build shows the notice is
    still there to silence."""
    import os
    import re

    found = re.search(r'^QUIET_EDITABLE="([^"]+)"$', (REPO / "scripts" / "setup.sh").read_text(), re.M)
    assert found, "scripts/setup.sh no longer sets QUIET_EDITABLE"
    src = source_copy(tmp_path / "src")
    hook = "import setuptools.build_meta as b; print(b.build_editable({!r}))"
    outputs = {}
    for label, filters in (("setup.sh", found.group(1)), ("control", "")):
        env = {**os.environ, "PYTHONWARNINGS": filters}
        done = subprocess.run([sys.executable, "-c", hook.format(str(tmp_path / label))], cwd=src, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        outputs[label] = done.stdout + done.stderr
    assert "Editable installation" in outputs["control"]
    assert "Editable installation" not in outputs["setup.sh"], outputs["setup.sh"][-3000:]


def test_a_checkout_on_pythonpath_without_installing_says_how_to_install(tmp_path):
    """PYTHONPATH=. from a checkout: one error that says to install (it was "No module named
    'mas.agents'" at the first use of a root folder).  ``-S`` skips the site hooks, so the
    editable install's finder is absent; the dependencies stay importable from site-packages."""
    import os
    import site

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *site.getsitepackages()])}
    for code in ("import mas", "import mas.cli", "from mas.agents.policy import build_policies"):
        done = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode != 0, code
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("ImportError: mas was imported from ") and "a source checkout that is not installed" in last
        assert "bash scripts/setup.sh" in last and "pip install -e ." in last
    installed = subprocess.run([sys.executable, "-c", "import mas.agents"], cwd=tmp_path, capture_output=True, text=True,
                               timeout=120)
    assert installed.returncode == 0, installed.stderr  # the installed package imports as before
