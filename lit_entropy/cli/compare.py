"""``lit-entropy-compare`` / ``scripts/compare.py``: overlay chosen metrics across runs, one panel per
metric and one line per run, plus a Markdown table.

    lit-entropy-compare logs/sweep/multiruns/<time>            # every job of a multirun
    lit-entropy-compare logs/a/runs/<time> logs/b/runs/<time> \\
        [--metrics rollout/entropy,rollout/accuracy,...] [--smooth N] [--out DIR] [--name NAME] [--title T]

Reads the TensorBoard events of every run (run folders, Hydra multirun folders, or folders above
them). Runs are labelled by what differs between them (below). Writes to --out (default ``compare/`` in the current folder):

* ``NAME.png`` (default ``compare.png``) — one panel per metric, one line per run. Per-iteration
  metrics (one value per RL iteration, e.g. ``rollout/*``) are drawn against the iteration (the logged
  ``epoch``), so runs with different numbers of optimizer steps per iteration line up; per-step metrics
  (``train/*``) against the optimizer step. ``--smooth N`` draws a trailing N-point moving average over
  a faint raw line. The ``rollout/entropy`` panel shades a run's controller band
  (``control/band_low``..``control/band_high``) or draws its target (``control/target_entropy``) when
  the run logged one.
* ``NAME.md`` — a table with one row per run and, per metric, its final value and, where the metric has a
  direction, its best (the highest accuracy, reward, pass@k or mean@k; the lowest loss or error; entropy and
  lengths have none). The table is computed on the raw, unsmoothed values. The table is also printed.

Runs are labelled by the settings that differ between them (group choices such as ``callbacks/entropy``, the
algo, seed, learning rate, ...; read from each run's ``.hydra/``), else by their overrides. A metric no run
logged is named with the nearest tags the runs did log.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lit_entropy.analysis.compare import DEFAULT_METRICS, compare_runs
from lit_entropy.analysis.runs import find_runs_or_say


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), write the figure and the table; 0 on success."""
    ap = argparse.ArgumentParser(prog="lit-entropy-compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+", type=Path, help="run folders or Hydra multirun folders")
    ap.add_argument("--metrics", default=DEFAULT_METRICS, help="comma-separated TensorBoard tags")
    ap.add_argument("--smooth", type=int, default=1, help="trailing moving-average window for the plot (1 = off)")
    ap.add_argument("--out", type=Path, default=Path("compare"), help="folder for NAME.png / NAME.md")
    ap.add_argument("--name", default="compare", help="file stem of the figure and the table")
    ap.add_argument("--title", default=None, help="the figure's title (default: Run comparison)")
    args = ap.parse_args(argv)
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    if not metrics:
        ap.error("--metrics is empty")
    if args.smooth < 1:
        ap.error("--smooth must be >= 1")
    runs = find_runs_or_say(args.dirs)
    if not runs:
        return 1
    text, missing = compare_runs(runs, metrics, args.smooth, args.out, name=args.name, title=args.title)
    for warning in missing:
        print(f"warning: {warning}", file=sys.stderr)
    print(text)
    print(f"wrote {args.out / (args.name + '.png')} and {args.out / (args.name + '.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
