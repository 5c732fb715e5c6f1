"""``mas study``: which credit method pays off for a team, at equal cost, over seeds.

    runner.py     the grid of runs (one run directory per method and seed), budgets, resume, Ray
    analysis.py   curves, the final table, the efficiency frontier and the checklist rows
    page.py       study.html (Jinja2 template in templates/, inline SVG charts)

``study(spec)`` runs what is left of the grid and writes ``study.json`` and ``study.html``.
"""

from __future__ import annotations

from pathlib import Path

from mas.study.analysis import analyse, write_study_json
from mas.study.page import render_study, write_study_html
from mas.study.runner import BUDGET_KINDS, BudgetStop, StudySpec, plan_jobs, run_job, run_study

__all__ = ["BUDGET_KINDS", "BudgetStop", "StudySpec", "analyse", "plan_jobs", "render_study", "run_job", "run_study",
           "study", "write_outputs"]


def write_outputs(out: str | Path) -> tuple[Path, Path]:
    """Analyse the study directory ``out`` and write its study.json and study.html."""
    out = Path(out)
    result = analyse(out)
    return write_study_json(result, out / "study.json"), write_study_html(result, out / "study.html")


def study(spec: StudySpec, executor: str = "local", ray_address: str | None = None, cpus_per_run: float = 1.0,
          log=print) -> tuple[Path, Path]:
    """Run (or continue) the study's grid, then write study.json and study.html."""
    run_study(spec, executor=executor, ray_address=ray_address, cpus_per_run=cpus_per_run, log=log)
    return write_outputs(spec.out)
