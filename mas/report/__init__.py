"""``mas report``: one self-contained HTML page per run, or a comparison of several runs.

    run.py        read a run directory
    charts.py     inline SVG line and stacked charts
    episodes.py   the episode browser (turns coloured by credit, method details)
    checklist.py  the credit-assignment reporting checklist and the per-agent table
    methods.py    what each credit method's share means; the decisive turn or agent
    page.py       page assembly: what goes on the page
    render.py     Jinja2 (autoescape on), the toggle script and the Content-Security-Policy
    templates/    the markup, styles and script (package data)
"""

from __future__ import annotations

from pathlib import Path

from mas.report.page import render_compare, render_report
from mas.report.run import NotARunError, RunData, load_run

__all__ = ["NotARunError", "RunData", "load_run", "write_compare", "write_report"]


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of ``run_dir`` to ``out`` (default: ``run_dir/report.html``)."""
    run = load_run(run_dir)
    path = Path(out) if out else Path(run_dir) / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(run), encoding="utf-8")
    return path


def write_compare(run_dirs: list[str | Path], out: str | Path) -> Path:
    """Overlay the curves of several runs in one page at ``out``.

    Runs are named by their team; runs of the same team (e.g. one config trained with two
    credit methods) are named by their directory instead.
    """
    runs = [load_run(d) for d in run_dirs]
    names = [r.name for r in runs]
    if len(set(names)) < len(names):
        names = [Path(d).name for d in run_dirs]
    if len(set(names)) < len(names):
        names = [str(d) for d in run_dirs]
    for r, n in zip(runs, names):
        r.name = n
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_compare(runs), encoding="utf-8")
    return path
