"""The documentation site: `mkdocs build --strict` over docs/ succeeds, and fails on a link to
a missing page or a missing heading (mkdocs.yml turns those into warnings, strict into errors)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(project: Path, site: Path) -> subprocess.CompletedProcess:
    """``python -m mkdocs build --strict`` of the project at ``project``, with this venv's python."""
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(project / "mkdocs.yml"),
                           "--site-dir", str(site)], cwd=project, capture_output=True, text=True, timeout=300)


def copy_of_the_docs(dest: Path) -> Path:
    dest.mkdir()
    shutil.copytree(ROOT / "docs", dest / "docs")
    shutil.copy(ROOT / "mkdocs.yml", dest / "mkdocs.yml")
    return dest


def test_the_site_builds_in_strict_mode(tmp_path):
    done = build(ROOT, tmp_path / "site")
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "benchmarks" / "index.html").exists()


def test_a_link_to_a_missing_heading_fails_the_build(tmp_path):
    project = copy_of_the_docs(tmp_path / "project")
    with (project / "docs" / "setup.md").open("a") as page:
        page.write("\nSee [the credit methods](credit.md#no-such-heading-anywhere).\n")
    done = build(project, tmp_path / "site")
    output = done.stdout + done.stderr
    assert done.returncode != 0, f"a broken anchor passed the strict build:\n{output}"
    assert "no-such-heading-anywhere" in output, output


def test_a_link_to_a_missing_page_fails_the_build(tmp_path):
    project = copy_of_the_docs(tmp_path / "project")
    with (project / "docs" / "benchmarks" / "index.md").open("a") as page:
        page.write("\nSee [a page that is not there](no_such_page.md).\n")
    done = build(project, tmp_path / "site")
    output = done.stdout + done.stderr
    assert done.returncode != 0, f"a link to a missing page passed the strict build:\n{output}"
    assert "no_such_page.md" in output, output
