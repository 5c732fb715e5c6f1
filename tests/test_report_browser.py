"""The report as a person sees it: real tiny trainings, their reports opened in headless Chromium.

Also: the legend toggles curves, and reports of hostile runs (a real training whose every model
output, tool observation and critic reply is replaced by text that would run script if it
reached the page as markup, and hand-written run files that carry it everywhere else) open
with no dialog, no script but the page's own, and nothing fetched.

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

import json
from contextlib import contextmanager
from dataclasses import replace

import pytest
import yaml
from team_helpers import team_config
from test_report import HOSTILE, NAMES, PAYLOADS, assert_inert, hostile_run, run_dir  # noqa: F401 (a fixture)

from mas.rollout.backends.hf import HFBackend
from mas.cli import main
from mas.envs.research import HotpotQAEnv
from mas.report import write_compare, write_report

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


ARGS = ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"]
# records what a page did that it should not: CSP violations (an injected script that the policy blocked)
WATCH = ("window.__csp = [];"
         "document.addEventListener('securitypolicyviolation', e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));")


@contextmanager
def chromium_page():
    """A headless Chromium page; yields (page, problems): console errors and warnings, page errors,
    failed requests, requests that are not file:, and dialogs (dismissed)."""
    chromium, sync_playwright = _browser(), _playwright()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        problems: list[str] = []
        page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
        page.on("request", lambda r: None if r.url.startswith("file:") else problems.append(f"request: {r.url}"))
        page.on("dialog", lambda d: (problems.append(f"dialog {d.type}: {d.message}"), d.dismiss()))
        page.add_init_script(WATCH)
        try:
            yield page, problems
        finally:
            browser.close()


def test_report_renders_in_headless_chromium(run_dir, tmp_path):
    report = write_report(run_dir)
    shots = Path(os.environ.get("MAS_ARTIFACTS_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)

    with chromium_page() as (page, problems):
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

        # the legend toggles curves: click hides a series and shows it again, double-click shows it alone
        card = page.locator("figure", has=page.locator("figcaption", has_text="Reward: team and per agent"))
        buttons = card.locator("button.legend-item")
        assert buttons.count() == 4  # team and three agents

        def shown():
            return [card.locator(f'svg g[data-k="{k}"] path.series').first.is_visible() for k in range(4)]

        assert shown() == [True] * 4
        buttons.nth(1).click()
        assert shown() == [True, False, True, True] and buttons.nth(1).get_attribute("aria-pressed") == "false"
        buttons.nth(1).click()
        assert shown() == [True] * 4
        buttons.nth(2).dblclick()
        assert shown() == [False, False, True, False]
        buttons.nth(2).dblclick()
        assert shown() == [True] * 4
        assert page.evaluate("window.__csp") == []

    assert not problems, problems
    width, height = _png_size(shot)
    assert width == 1400 and height > 2000
    print(f"report {report.stat().st_size / 1e6:.2f} MB opened in {load_s:.2f} s; screenshot {shot}")


# --- hostile runs -----------------------------------------------------------------------------

# short hostile texts for the real training (long ones make the tiny model's prompts slow): a script,
# an attribute breakout and a javascript: URL
SHORT = f"{PAYLOADS[0]} {PAYLOADS[2]} {PAYLOADS[5]}"
CRITIC_REPLY = f"PROCESS_SCORE: 7 {SHORT}"


def _hostile_text(request, calls: dict) -> str:
    """What the hostile backend says instead of the model: the researcher searches and reads with
    arguments that carry hostile text and then answers with it; the critic replies with it."""
    if request.agent.startswith("critic"):
        return CRITIC_REPLY
    k = calls[request.agent] = calls.get(request.agent, -1) + 1
    if request.agent == "researcher" and k % 3 == 0:
        return "<tool_call>" + json.dumps({"name": "search", "arguments": {"query": PAYLOADS[0] + " film"}}) + "</tool_call>"
    if request.agent == "researcher" and k % 3 == 1:
        return "<tool_call>" + json.dumps({"name": "read", "arguments": {"title": PAYLOADS[1]}}) + "</tool_call>"
    return f"ANSWER: {SHORT}" if k % 2 == 0 else SHORT  # answered (parsed) or not


@pytest.fixture(scope="module")
def hostile_training(tmp_path_factory, tiny_model_dir):
    """A real 2-step training (research env, real BM25 tools, LLM-critic credit) whose generated
    texts are all replaced by hostile ones after sampling, with hostile roles and description."""
    tmp = tmp_path_factory.mktemp("hostile-training")
    cfg = team_config(tiny_model_dir, "chain", credit={"method": "critic", "critic": "judge", "max_new_tokens": 8,
                                                       "tool_observation_chars": 200})
    cfg["team"]["description"] = HOSTILE
    cfg["agents"] = [
        {"name": "researcher", "policy": "main", "role": f"You research. {SHORT}", "parser": "answer",
         "tools": ["search", "read"], "max_tool_calls": 2, "sampling": {"max_new_tokens": 6}},
        {"name": "answerer", "policy": "main", "role": HOSTILE, "parser": "answer", "sampling": {"max_new_tokens": 6}},
    ]
    cfg["topology"] = {"kind": "chain", "sequence": ["researcher", "answerer"]}
    cfg["env"] = {"name": "hotpotqa", "source": "sample", "search_k": 1, "snippet_chars": 20, "read_chars": 50}
    cfg["trainer"].update(steps=2, batch_size=1, group_size=2, sample_episodes=2)
    cfg["logging"] = {"progress": False, "episodes_every": 1}
    path = tmp / "team.yaml"
    path.write_text(yaml.safe_dump(cfg))
    generate = HFBackend.generate_batch
    calls: dict[str, int] = {}

    def hostile_generate(self, requests, seed=None):
        return [replace(r, text=_hostile_text(q, calls)) for q, r in zip(requests, generate(self, requests, seed))]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(HFBackend, "generate_batch", hostile_generate)
        mp.setattr(HotpotQAEnv, "score", lambda self, ep: float(len(ep.turns) % 2))
        assert main(["train", str(path), "--run-dir", str(tmp / "run")]) == 0
    return tmp / "run"


def test_a_hostile_training_shows_as_text(hostile_training):
    """No browser needed: the page's markup is its own, and the hostile texts are its text."""
    episodes = [json.loads(line) for line in (hostile_training / "episodes.jsonl").read_text().splitlines()]
    turns = [t for ep in episodes for t in ep["turns"]]
    observations = [o for t in turns for o in t["observations"]]
    assert any(PAYLOADS[0] in o for o in observations) and any(PAYLOADS[1] in o for o in observations)  # real tool output
    assert any(t["details"].get("critic_reply") == CRITIC_REPLY for t in turns)
    assert any(not t["valid"] and not t["tool_calls"] for t in turns)  # unparsed hostile turns are flagged too
    html = write_report(hostile_training).read_text()
    page = assert_inert(html, shown=(HOSTILE, SHORT, f"You research. {SHORT}", CRITIC_REPLY, PAYLOADS[0] + " film",
                                     PAYLOADS[1]))
    assert "".join(page.text).count(SHORT) > len(turns)  # every turn's text, answers, observations, roles
    assert "unparsed output" in html


def test_hostile_reports_run_no_script_in_chromium(hostile_training, run_dir, tmp_path):
    """Every hostile page opens in Chromium with no dialog, no script of its own, no CSP violation,
    nothing fetched, and the hostile texts visible as text, even after opening every episode."""
    pages = [write_report(hostile_training), write_report(hostile_run(run_dir, tmp_path / "files")),
             write_compare([hostile_training, tmp_path / "files"], tmp_path / "cmp.html")]
    shots = Path(os.environ.get("MAS_ARTIFACTS_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    with chromium_page() as (page, problems):
        for i, path in enumerate(pages):
            page.goto(path.resolve().as_uri(), wait_until="load")
            page.evaluate("() => document.querySelectorAll('details').forEach(d => d.open = true)")
            for turn in page.locator(".turn").all()[:6]:  # hover turns and focus buttons: no handler may fire
                turn.hover()
            page.keyboard.press("Tab")
            state = page.evaluate("""() => ({pwned: window.__mas_pwned === undefined ? null : window.__mas_pwned,
                csp: window.__csp, scripts: document.scripts.length, text: document.body.textContent,
                handlers: [...document.querySelectorAll('*')].flatMap(e => [...e.attributes].map(a => a.name))
                          .filter(n => n.startsWith('on')).length,
                loads: document.querySelectorAll('img, iframe, object, embed, base, a[href^="javascript"]').length})""")
            assert state["pwned"] is None and state["csp"] == [] and state["scripts"] == 1, (path, state["csp"])
            assert state["handlers"] == 0 and state["loads"] == 0
            assert HOSTILE in state["text"] and (i != 1 or NAMES["lead"] in state["text"]), path
            if i == 0:
                page.screenshot(path=str(shots / "report_hostile.png"), full_page=False)
    assert not problems, problems
