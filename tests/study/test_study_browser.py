"""study.html as a person sees it: a real (tiny) study opened in headless Chromium, and the
scaling view of a study over team sizes (hand-written runs: no training).

Uses tests/test_report_browser.py's browser lookup: Debian's ``chromium`` and ``playwright``;
with MAS_REQUIRE_BROWSER=1 (the test command sets it) a missing browser fails instead of skipping.
The screenshot goes to $MAS_ARTIFACTS_DIR (default: the test's tmp dir).
"""

from __future__ import annotations

import os
from pathlib import Path

from study_helpers import METHODS, SCALING_METHODS, hand_scaling_study
from test_report_browser import _browser, _playwright  # the report's browser test: same Chromium, same rules

from mas.study import write_outputs


def _open(p, path: Path):
    """A page on ``path`` in headless Chromium, collecting console problems and every request."""
    browser = p.chromium.launch(executable_path=_browser(), args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"])
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(path.resolve().as_uri(), wait_until="load")
    return browser, page, problems, requests


def test_study_page_shows_every_method_curve_and_the_frontier(tiny_study, tmp_path):
    sync_playwright = _playwright()
    shots = Path(os.environ.get("MAS_ARTIFACTS_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser, page, problems, requests = _open(p, tiny_study / "study.html")

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
        # the scaling view of a one-size study: one visible point per method in each of its four charts
        scaling = page.locator("#scaling svg.chart.scaling")
        assert scaling.count() == 4
        for i in range(4):
            for method in METHODS:
                point = scaling.nth(i).locator(f'circle.point[data-method="{method}"]')
                assert point.count() == 1 and point.bounding_box()["width"] > 4, (i, method)
        page.screenshot(path=str(shots / "study.png"), full_page=True)
        browser.close()
    assert not problems, problems
    assert all(u.startswith("file:") for u in requests), f"the page fetched {[u for u in requests if not u.startswith('file:')]}"


def test_scaling_view_draws_a_line_per_method_across_team_sizes(tmp_path):
    """Sizes 2 and 4, three methods: in each of the four charts a line per method through a visible point at each
    size, censored points hollow, CI whiskers, the signal and cost tables, what does not apply."""
    root = hand_scaling_study(tmp_path / "study")
    _, html_path = write_outputs(root)
    sync_playwright = _playwright()
    shots = Path(os.environ.get("MAS_ARTIFACTS_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser, page, problems, requests = _open(p, html_path)
        charts = page.locator("#scaling svg.chart.scaling")
        assert charts.count() == 4  # steps to the baseline's final, the gain, extra tokens, credit time
        for i in range(4):
            chart = charts.nth(i)
            assert chart.bounding_box()["width"] > 200
            for method in SCALING_METHODS:
                line = chart.locator(f'polyline.series[data-method="{method}"]')
                assert line.count() == 1 and line.bounding_box()["width"] > 50, (i, method)  # spans N = 2 to N = 4
                for n in (2, 4):
                    point = chart.locator(f'circle.point[data-method="{method}"][data-n="{n}"]')
                    assert point.count() == 1 and point.bounding_box()["width"] > 4, (i, method, n)
        steps = page.locator("#scaling-steps")
        # grpo at N = 2: one seed never reached its own final (hollow); c3 reached it in both (filled)
        assert steps.locator('circle.point[data-method="grpo"][data-n="2"]').get_attribute("fill") == "#fff"
        assert steps.locator('circle.point[data-method="c3"][data-n="2"]').get_attribute("fill") != "#fff"
        assert steps.locator('line.whisker[data-method="c3"]').count() == 2
        assert page.locator("#scaling table.signal tbody tr").count() == len(SCALING_METHODS)
        assert "0.35 (0.30 to 0.40); 1 undefined" in page.locator('#scaling table.signal tr[data-method="grpo"]').inner_text()
        assert "15 coalitions per episode" in page.locator('#scaling table.cost tr[data-method="sharp"]').inner_text()
        assert page.locator('#scaling ul.skipped li[data-method="ccpo"]').count() == 2
        links = page.locator("#sizes a")
        assert [links.nth(i).get_attribute("href") for i in range(links.count())] == ["n2/study.html", "n4/study.html"]
        page.screenshot(path=str(shots / "study_scaling.png"), full_page=True)
        browser.close()
    assert not problems, problems
    assert all(u.startswith("file:") for u in requests), f"the page fetched {[u for u in requests if not u.startswith('file:')]}"
