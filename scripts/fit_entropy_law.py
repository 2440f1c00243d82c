"""Fit the entropy–performance law R = −a·exp(H) + b (Cui et al. 2025) to finished runs and plot it.

    python scripts/fit_entropy_law.py logs/<task>/runs/<time> [more runs or multirun folders]
        [--x rollout/entropy] [--y rollout/accuracy] [--skip N] [--out DIR]

Reads the TensorBoard events of every run (a run folder, several, or a Hydra multirun folder), pairs
the per-iteration values of --x (H) and --y (R) by logged step, drops each run's first --skip
iterations, and fits the law over all points together and over each run alone. Writes to --out
(default: the current folder):

* ``entropy_law.png`` — the points of each run, the pooled fit (solid over the observed entropies,
  dotted where it extrapolates to H = 0) and the predicted ceiling b − a as a dashed line;
* ``entropy_law.json`` — a, b, r2, ceiling, n of the pooled fit, and per run: its points, its own fit,
  its final accuracy (last value of --y), the mean of its last 5 values, and the gap ceiling − final.

Prints a short summary. See docs/entropy_law.md for how to read the ceiling.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the checkout this script sits in, before any installed copy
    sys.path.insert(0, str(ROOT))

from lit_entropy.analysis.entropy_law_fit import collect, pooled_fit, summary_lines, write_fit  # noqa: E402
from lit_entropy.analysis.runs import find_runs_or_say  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="run folders or a Hydra multirun folder")
    ap.add_argument("--x", default="rollout/entropy", help="entropy tag (H)")
    ap.add_argument("--y", default="rollout/accuracy", help="performance tag (R)")
    ap.add_argument("--skip", type=int, default=0, help="drop each run's first N iterations")
    ap.add_argument("--out", type=Path, default=Path("."), help="folder for entropy_law.png / .json")
    args = ap.parse_args(argv)
    if args.skip < 0:
        ap.error("--skip must be >= 0")
    found = find_runs_or_say(args.dirs)
    if not found:
        return 1
    runs, skipped = collect(found, args.x, args.y, args.skip)
    for line in skipped:
        print(line, file=sys.stderr)
    if not runs:
        print("nothing to fit", file=sys.stderr)
        return 1
    fit, why = pooled_fit(runs)
    if fit is None:
        print(f"cannot fit the pooled points: {why}", file=sys.stderr)
        return 1
    png, js = write_fit(args.out, runs, fit, args.x, args.y, args.skip)
    print("\n".join(summary_lines(runs, fit, args.x, args.y)))
    print(f"wrote {png} and {js}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
