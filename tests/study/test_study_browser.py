"""study.html as a person sees it: a real (tiny) study opened in headless Chromium.

Uses tests/test_report_browser.py's browser lookup: Debian's ``chromium`` and ``playwright``;
with MAS_REQUIRE_BROWSER=1 (the test command sets it) a missing browser fails instead of skipping.
The screenshot goes to $MAS_ARTIFACTS_DIR (default: the test's tmp dir).
"""

from __future__ import annotations

import os
from pathlib import Path

from study_helpers import METHODS
from test_report_browser import _browser, _playwright  # the report's browser test: same Chromium, same rules


def test_study_page_shows_every_method_curve_and_the_frontier(tiny_study, tmp_path):
    chromium, sync_playwright = _browser(), _playwright()
    page_path = tiny_study / "study.html"
    shots = Path(os.environ.get("MAS_ARTIFACTS_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        problems: list[str] = []
        page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        page.goto(page_path.resolve().as_uri(), wait_until="load")

        for sid in ("curves", "table", "frontier", "checklist", "runs"):
            box = page.locator(f"#{sid}").bounding_box()
            assert box and box["height"] > 40, f"section #{sid} is not rendered"
        charts = page.locator("#curves svg.chart")
        assert charts.count() == 3  # against steps, tokens and wall time
        for i in range(3):
            chart = charts.nth(i)
            assert chart.bounding_box()["width"] > 200
            for method in METHODS:  # every method has a drawn curve in every chart
                curve = chart.locator(f'path.series[data-method="{method}"]')
                assert curve.count() >= 1, (i, method)
                assert curve.first.bounding_box()["width"] > 10, (i, method)
        # the frontier: one visible point per method
        for method in METHODS:
            point = page.locator(f'#frontier circle.point[data-method="{method}"]')
            assert point.count() == 1
            box = point.bounding_box()
            assert box and box["width"] > 4
        assert page.locator("#table tbody tr").count() == len(METHODS)
        assert page.locator("#checklist table.checklist tr").count() == 3
        page.screenshot(path=str(shots / "study.png"), full_page=True)
        browser.close()
    assert not problems, problems
    assert all(u.startswith("file:") for u in requests), f"the page fetched {[u for u in requests if not u.startswith('file:')]}"
