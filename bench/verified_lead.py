"""How much of the turn verifiers' lead does each outcome-only credit method recover?

Reads a study's ``study.json`` (``mas study ... --methods grpo,...,verified``) and prints, per
method: the final held-out accuracy (mean of seeds), the gain over the start with its bootstrap
95% CI (as the study computes it), the steps to GRPO's final, the per-agent signal at step 0,
(a seed that never gets there counts as the steps it ran, as in the study's
scaling view), the mean verified accuracy of the agents before and after, and the share of verified's lead
over GRPO that the method recovers: (final - GRPO's final) / (verified's final - GRPO's final).

    python bench/verified_lead.py studies/relay/n8 [--ceiling verified] [--baseline grpo]

The baseline defaults to the study's own (``mas study --baseline``; GRPO where it was studied).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mas.study.analysis import lead_share


def rows(study: dict, ceiling: str, baseline: str) -> list[dict]:
    table = {r["method"]: r for r in study["table"]}
    points = study.get("scaling", {}).get("points", {})
    base, top = table[baseline]["final_mean"], table[ceiling]["final_mean"]
    out = []
    for method, r in table.items():
        p = (points.get(method) or [{}])[0]
        gain, signal = p.get("gain", {}), p.get("signal", {})
        v = r.get("verified") or {}
        out.append({
            "method": method, "final": r["final_mean"], "finals": r["finals"],
            "gain": gain.get("mean"), "gain_ci": gain.get("ci95"),
            "steps_to_baseline": (p.get("steps_to_target") or {}).get("mean"),
            "reached": (p.get("steps_to_target") or {}).get("reached"), "signal": signal.get("mean"),
            "verified_before": (v.get("before") or {}).get("team"), "verified_final": (v.get("final") or {}).get("team"),
            "lead_recovered": None if method in (ceiling, baseline) else lead_share(r["final_mean"], base, top),
        })
    return out


def fmt(x, spec=".3f"):
    return "-" if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("study", type=Path, help="a one-config study directory (holds study.json)")
    ap.add_argument("--ceiling", default="verified")
    ap.add_argument("--baseline", default=None, help="default: the study's baseline")
    args = ap.parse_args(argv)
    study = json.loads((args.study / "study.json").read_text())
    baseline = args.baseline or study.get("baseline") or "grpo"
    print(f"| method | finals | final | gain, points (95% CI) | steps to {baseline}'s final | signal at step 0 | "
          "verified accuracy before → final | share of verified's lead recovered |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows(study, args.ceiling, baseline):
        ci = r["gain_ci"]
        gain = "-" if r["gain"] is None else f"{100 * r['gain']:+.1f} ({100 * ci[0]:.0f} to {100 * ci[1]:.0f})"
        share = "-" if r["lead_recovered"] is None else f"{100 * r['lead_recovered']:.0f}%"
        print(f"| {r['method']} | {', '.join(f'{x:.2f}' for x in r['finals'])} | {r['final']:.3f} | {gain} | "
              f"{fmt(r['steps_to_baseline'], '.1f')} ({r['reached']} of {len(r['finals'])}) | {fmt(r['signal'], '.2f')} | "
              f"{fmt(r['verified_before'])} → {fmt(r['verified_final'])} | {share} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
