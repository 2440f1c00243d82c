"""Summarise a controller study: per run, how closely rollout/entropy held its target, accuracy and dose.

    python scripts/study_table.py logs/study/multiruns/<time> [--target 0.45] [--out study.md]

Reads the TensorBoard events of every run under the directory (a Hydra multirun folder, or several
run folders) and prints a Markdown table: the controller, the mean |rollout/entropy − target| over
the second half of the iterations, the final entropy, the final and last-5 mean rollout/accuracy and the
controller's dose (studies/dose.py; "not tested at this dose" under its threshold).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the checkout this script sits in, before any installed copy
    sys.path.insert(0, str(ROOT))

from lit_entropy.analysis.runs import find_runs  # noqa: E402
from studies.study import study_table  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--target", type=float, default=0.45)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    table = study_table(find_runs(args.dirs), args.target)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
