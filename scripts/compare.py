"""Overlay chosen metrics across runs: one panel per metric, one line per run, plus a Markdown table.

    python scripts/compare.py logs/sweep/multiruns/<time>            # every job of a multirun
    python scripts/compare.py logs/a/runs/<time> logs/b/runs/<time> \\
        [--metrics rollout/entropy,rollout/accuracy,...] [--smooth N] [--out DIR]

Reads the TensorBoard events of every run (run folders, Hydra multirun folders, or folders above
them). Runs are labelled by their Hydra overrides (``.hydra/overrides.yaml``) minus the overrides all
runs share, or by their folder name. Writes to --out (default ``compare/`` in the current folder):

* ``compare.png`` — one panel per metric, one line per run. Per-iteration metrics (one value per RL
  iteration, e.g. ``rollout/*``) are drawn against the iteration (the logged ``epoch``), so runs with
  different numbers of optimizer steps per iteration line up; per-step metrics (``train/*``) against
  the optimizer step. ``--smooth N`` draws a trailing N-point moving average over a faint raw line.
* ``compare.md`` — a table with one row per run and, per metric, its final value and its best value
  (best = the maximum, or the minimum for metrics whose name contains "loss" or "error"). The table is
  computed on the raw, unsmoothed values. The table is also printed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the checkout this script sits in, before any installed copy
    sys.path.insert(0, str(ROOT))

from lit_entropy.analysis.compare import DEFAULT_METRICS, compare_runs  # noqa: E402
from lit_entropy.analysis.runs import find_runs  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="run folders or Hydra multirun folders")
    ap.add_argument("--metrics", default=DEFAULT_METRICS, help="comma-separated TensorBoard tags")
    ap.add_argument("--smooth", type=int, default=1, help="trailing moving-average window for the plot (1 = off)")
    ap.add_argument("--out", type=Path, default=Path("compare"), help="folder for compare.png / compare.md")
    args = ap.parse_args(argv)
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    if not metrics:
        ap.error("--metrics is empty")
    if args.smooth < 1:
        ap.error("--smooth must be >= 1")
    runs = find_runs(args.dirs)
    if not runs:
        print(f"no runs found under {', '.join(map(str, args.dirs))}", file=sys.stderr)
        return 1
    text, missing = compare_runs(runs, metrics, args.smooth, args.out)
    for m in missing:
        print(f"warning: no run logged {m!r}", file=sys.stderr)
    print(text)
    print(f"wrote {args.out / 'compare.png'} and {args.out / 'compare.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
