"""``mas study``: which credit method pays off for a team, at equal cost, over seeds, and how
that changes with the team's size.

    runner.py     the grid of runs (one run directory per method and seed), budgets, resume, Ray;
                  a study over team sizes is one such grid per config
    analysis.py   curves, the final table, the efficiency frontier, the checklist rows, and the
                  scaling view (steps to the baseline's final, cost and per-agent signal against N)
    page.py       study.html (Jinja2 templates in templates/, inline SVG charts)

``study(spec)`` runs what is left of the grid and writes ``study.json`` and ``study.html``;
``study(spec, configs)`` with several configs does so for every size, and writes the
scaling view over all of them to ``OUT/study.json`` and ``OUT/study.html``.
"""

from __future__ import annotations

from pathlib import Path

from mas.study.analysis import analyse, analyse_sizes, write_study_json
from mas.study.page import render_sizes, render_study, write_sizes_html, write_study_html
from mas.study.runner import SCALING_SPEC_FILE, BUDGET_KINDS, BudgetStop, StudySpec, StudyStop, plan_jobs, run_job, run_sizes, run_study

__all__ = ["BUDGET_KINDS", "BudgetStop", "StudySpec", "StudyStop", "analyse", "analyse_sizes", "plan_jobs", "render_sizes", "render_study",
           "run_job", "run_sizes", "run_study", "study", "write_outputs"]


def write_outputs(out: str | Path) -> tuple[Path, Path]:
    """Analyse the study directory ``out`` and write its study.json and study.html (for a study
    over team sizes, every size's own, then the scaling view over all of them in ``out``)."""
    out = Path(out)
    if not (out / SCALING_SPEC_FILE).exists():
        result = analyse(out)
        return write_study_json(result, out / "study.json"), write_study_html(result, out / "study.html")
    result = analyse_sizes(out)
    for size in result["sizes"]:
        d = out / size["dir"]
        write_study_json(size["study"], d / "study.json"), write_study_html(size["study"], d / "study.html")
    return write_study_json(result, out / "study.json"), write_sizes_html(result, out / "study.html")


def study(spec: StudySpec, configs: list[str] | tuple[str, ...] = (), executor: str = "local", ray_address: str | None = None,
          cpus_per_run: float = 1.0, log=print, control: StudyStop | None = None) -> tuple[Path, Path]:
    """Run (or continue) the study's grid, then write study.json and study.html.  With ``configs``
    (more than one), a study over team sizes: one grid per config (``spec.config`` is ignored).
    ``control``: a stop requested on it (Ctrl-C) checkpoints the run in progress, starts no other,
    and the pages are written from the runs so far."""
    if len(configs) > 1:
        run_sizes(spec, configs, executor=executor, ray_address=ray_address, cpus_per_run=cpus_per_run, log=log, control=control)
    else:
        run_study(spec, executor=executor, ray_address=ray_address, cpus_per_run=cpus_per_run, log=log, control=control)
    return write_outputs(spec.out)
