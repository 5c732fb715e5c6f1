"""The report as a person sees it: a real 3-step training, its report opened in headless Chromium.

Needs Debian's ``chromium`` and the ``playwright`` package (dev extra).  ``scripts/test.sh``
installs chromium when it can and sets MAS_REQUIRE_BROWSER=1, so in CI a missing browser is a
failure, not a skip.  The screenshot goes to $MAS_ARTIFACTS_DIR (default: the test's tmp dir).
"""

from __future__ import annotations

import os
import shutil
import struct
import time
from pathlib import Path

import pytest
from test_report import train_run

from mas.report import write_report

REQUIRED = os.environ.get("MAS_REQUIRE_BROWSER") == "1"


def _browser() -> str:
    path = os.environ.get("MAS_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if REQUIRED:
            pytest.fail("MAS_REQUIRE_BROWSER=1 but no chromium found (apt-get install chromium, or set MAS_CHROMIUM)")
        pytest.skip("chromium is not installed")
    return path


def _playwright():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if REQUIRED:
            pytest.fail("MAS_REQUIRE_BROWSER=1 but playwright is not installed (pip install -e '.[dev]')")
        pytest.skip("playwright is not installed")
    return sync_playwright


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_report_renders_in_headless_chromium(tmp_path, tiny_model_dir, monkeypatch):
    chromium, sync_playwright = _browser(), _playwright()
    run = train_run(tmp_path, tiny_model_dir, monkeypatch)
    report = write_report(run)
    shots = Path(os.environ.get("MAS_ARTIFACTS_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        problems: list[str] = []
        page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        t0 = time.perf_counter()
        page.goto(report.resolve().as_uri(), wait_until="load")
        load_s = time.perf_counter() - t0

        # the three parts a person looks for are there and laid out (non-zero size)
        for sid in ("curves", "episodes", "checklist"):
            box = page.locator(f"#{sid}").bounding_box()
            assert box and box["height"] > 50, f"section #{sid} is not rendered"
        charts = page.locator("#curves svg.chart")
        assert charts.count() >= 8
        assert all(charts.nth(i).bounding_box()["width"] > 200 for i in range(charts.count()))
        assert page.locator("#curves svg.chart path.series").count() > 0
        assert page.locator("#checklist table.checklist tr").count() == 9

        # at least one turn is coloured by its credit: non-zero credit, non-white background
        coloured = page.evaluate(
            """() => [...document.querySelectorAll('details.episode[open] .turn')].filter(t => {
                   const c = parseFloat(t.dataset.credit);
                   const bg = getComputedStyle(t).backgroundColor;
                   return Number.isFinite(c) && c !== 0 && bg !== 'rgb(255, 255, 255)' && bg !== 'rgba(0, 0, 0, 0)';
               }).length"""
        )
        assert coloured >= 1
        cells = page.evaluate("() => [...document.querySelectorAll('table.heatmap td.cell')].map(td => getComputedStyle(td).backgroundColor)")
        assert any(c != "rgb(255, 255, 255)" for c in cells)

        # method details expand on click
        details = page.locator("details.episode[open] details.method").first
        details.locator("summary").click()
        assert details.locator("table.kv tr").count() >= 1

        shot = shots / "report.png"
        page.screenshot(path=str(shot), full_page=True)
        browser.close()

    assert not problems, problems
    assert all(u.startswith("file:") for u in requests), f"the report fetched {[u for u in requests if not u.startswith('file:')]}"
    width, height = _png_size(shot)
    assert width == 1400 and height > 2000
    print(f"report {report.stat().st_size / 1e6:.2f} MB opened in {load_s:.2f} s; screenshot {shot}")
