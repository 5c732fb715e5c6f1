"""Size and opening time of the HTML report of a 200-step run with 50 stored episodes.

Trains the quickstart team (embedded model, CPU) for 200 steps, storing one episode every 4
steps (50 episodes), builds `mas report`, and opens it in headless Chromium several times:

    python bench/report_size.py [--steps 200] [--every 4] [--opens 5] [--run-dir DIR] [--screenshot FILE]

Prints the report size, the time to build it, and the load time in Chromium (navigation start
to the load event, as the browser measures it, and wall time around page.goto).  Needs the
dev extra (playwright) and Debian's chromium (or MAS_CHROMIUM=/path/to/chrome).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=4, help="logging.episodes_every")
    ap.add_argument("--opens", type=int, default=5)
    ap.add_argument("--run-dir", help="reuse (or keep) the run here; default: a temporary directory")
    ap.add_argument("--screenshot", help="also save a full-page screenshot here")
    args = ap.parse_args()

    from mas.cli import main as mas

    run = Path(args.run_dir) if args.run_dir else Path(tempfile.mkdtemp(prefix="mas-report-bench-")) / "run"
    t0 = time.perf_counter()
    if not (run / "metrics.jsonl").exists():
        rc = mas(["train", str(ROOT / "configs" / "quickstart.yaml"), f"trainer.steps={args.steps}", "trainer.eval_size=0",
                  "trainer.sample_episodes=1", f"logging.episodes_every={args.every}", "logging.progress=false",
                  "--run-dir", str(run)])
        if rc != 0:
            return rc
    train_s = time.perf_counter() - t0

    from mas.report import write_report

    t0 = time.perf_counter()
    report = write_report(run)
    build_s = time.perf_counter() - t0
    n_steps = sum(1 for line in (run / "metrics.jsonl").read_text().splitlines() if '"eval"' not in line)
    n_eps = len((run / "episodes.jsonl").read_text().splitlines())

    chromium = os.environ.get("MAS_CHROMIUM") or shutil.which("chromium")
    if chromium is None:
        print("chromium not found: install Debian's chromium or set MAS_CHROMIUM", file=sys.stderr)
        return 1
    from playwright.sync_api import sync_playwright

    wall, nav = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"])
        for i in range(args.opens):
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            t0 = time.perf_counter()
            page.goto(report.resolve().as_uri(), wait_until="load")
            wall.append(time.perf_counter() - t0)
            nav.append(page.evaluate("() => { const e = performance.getEntriesByType('navigation')[0]; return e.loadEventEnd / 1000; }"))
            if i == 0 and args.screenshot:
                page.screenshot(path=args.screenshot, full_page=False)
            page.close()
        browser.close()

    size = report.stat().st_size
    print(f"run: {n_steps} steps, {n_eps} stored episodes (trained in {train_s:.0f} s; 0 if reused)")
    print(f"report: {size / 1e6:.2f} MB, built in {build_s:.2f} s")
    print(f"open in headless Chromium ({args.opens} loads): load event at median {statistics.median(nav):.3f} s "
          f"(max {max(nav):.3f} s); page.goto wall median {statistics.median(wall):.3f} s (max {max(wall):.3f} s)")
    print(f"limits: size < 5 MB: {'ok' if size < 5e6 else 'EXCEEDED'}; open < 3 s: {'ok' if max(wall) < 3 else 'EXCEEDED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
