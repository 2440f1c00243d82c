"""Check that two runs logged the same scalars, bit for bit: the check a refactoring that must not change behaviour
passes (the redesign of issue 49 runs the default run and the collapse preset before and after, and compares).

    python scripts/same_scalars.py RUN_A RUN_B [--ignore 'time/*,...']

Every tag of either run, except wall-clock ones (``time/*`` and the rest of ``--ignore``'s patterns), must be in
both with the same steps and the same float values. Prints one line per differing tag (its first differing point)
and exits 1, or prints how many tags and points matched and exits 0.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the checkout this script sits in, before any installed copy
    sys.path.insert(0, str(ROOT))

from lit_entropy.analysis.runs import read_scalars  # noqa: E402

WALL_CLOCK = ("time/*",)
"""Tags that measure the machine (seconds), not the run: never compared."""


def differences(a: dict[str, list[tuple[int, float]]], b: dict[str, list[tuple[int, float]]],
                ignore: tuple[str, ...] = WALL_CLOCK) -> list[str]:
    """One line per tag whose points differ between ``a`` and ``b`` (missing on one side included)."""
    out = []
    for tag in sorted(set(a) | set(b)):
        if any(fnmatch.fnmatch(tag, pattern) for pattern in ignore):
            continue
        if tag not in a or tag not in b:
            out.append(f"{tag}: only in {'the first' if tag in a else 'the second'} run")
            continue
        xs, ys = a[tag], b[tag]
        if xs == ys:
            continue
        first = next((i for i, (x, y) in enumerate(zip(xs, ys, strict=False)) if x != y), min(len(xs), len(ys)))
        x, y = (f"{s[first]}" if first < len(s) else "nothing" for s in (xs, ys))
        out.append(f"{tag}: {len(xs)} against {len(ys)} points; point {first}: {x} against {y}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_a", type=Path)
    ap.add_argument("run_b", type=Path)
    ap.add_argument("--ignore", default=",".join(WALL_CLOCK), help="comma-separated tag patterns left out")
    args = ap.parse_args(argv)
    a, b = read_scalars(args.run_a), read_scalars(args.run_b)
    if not a or not b:
        print(f"no scalars under {args.run_a if not a else args.run_b}")
        return 1
    ignore = tuple(filter(None, args.ignore.split(",")))
    diff = differences(a, b, ignore)
    for line in diff:
        print(line)
    if diff:
        return 1
    kept = [t for t in a if not any(fnmatch.fnmatch(t, p) for p in ignore)]
    print(f"the same: {len(kept)} tags, {sum(len(a[t]) for t in kept)} points, bit for bit")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
