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
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

from lit_entropy.diagnostics.entropy_law import LawFit, fit_entropy_law, predict
from lit_entropy.utils.tb import find_runs, read_scalars, run_labels


def paired(scalars: dict[str, list[tuple[int, float]]], x: str, y: str) -> list[tuple[int, float, float]]:
    """(step, x, y) for every step where both tags were logged (the last value when a step repeats)."""
    xs, ys = dict(scalars.get(x, [])), dict(scalars.get(y, []))
    return [(s, xs[s], ys[s]) for s in sorted(xs.keys() & ys.keys()) if math.isfinite(xs[s] * ys[s])]


def try_fit(h: list[float], r: list[float]) -> tuple[LawFit | None, str | None]:
    try:
        return fit_entropy_law(h, r), None
    except ValueError as err:
        return None, str(err)


def plot(out: Path, runs: list[dict], fit: LawFit, x: str, y: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5.0), dpi=120)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    h_all = [h for run in runs for h in run["H"]]
    h_lo, h_hi = min(h_all), max(h_all)
    for i, run in enumerate(runs):
        c = colors[i % len(colors)]
        ax.scatter(run["H"], run["R"], s=18, alpha=0.7, color=c, label=f"{run['label']} (n={len(run['H'])})")
        ax.scatter(run["H"][-1:], run["R"][-1:], s=70, facecolors="none", edgecolors=c, linewidths=1.5)
        if len(runs) > 1 and run["fit"] is not None:
            grid = np.linspace(min(run["H"]), max(run["H"]), 100)
            ax.plot(grid, predict(LawFit(**run["fit"]), grid), color=c, lw=0.8, alpha=0.6)
    inside = np.linspace(h_lo, h_hi, 200)
    outside = np.linspace(0.0, h_lo, 100)
    label = f"fit: R = −{fit.a:.3g}·exp(H) + {fit.b:.3g}  (R² = {fit.r2:.2f})"
    ax.plot(inside, predict(fit, inside), color="black", lw=2, label=label)
    ax.plot(outside, predict(fit, outside), color="black", lw=1.5, ls=":", label="extrapolation to H = 0")
    ax.axhline(fit.ceiling, color="crimson", ls="--", lw=1.2, label=f"predicted ceiling b − a = {fit.ceiling:.3f}")
    ax.set_xlim(left=0.0, right=h_hi + 0.05 * max(h_hi, 1e-3))
    r_all = [r for run in runs for r in run["R"]]
    lo, hi = min(min(r_all), fit.ceiling), max(max(r_all), fit.ceiling)
    pad = 0.08 * max(hi - lo, 1e-3)
    ax.set_ylim(lo - pad, hi + pad)
    ax.set_xlabel(f"{x} (H, nats)")
    ax.set_ylabel(f"{y} (R)")
    ax.set_title("Entropy–performance law (Cui et al. 2025); circled: each run's last iteration", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


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

    runs_found = find_runs(args.dirs)
    if not runs_found:
        print(f"no runs found under {', '.join(map(str, args.dirs))}", file=sys.stderr)
        return 1
    labels = run_labels(runs_found)
    runs: list[dict] = []
    for run in runs_found:
        scalars = read_scalars(run)
        pts = paired(scalars, args.x, args.y)
        if not pts:
            print(f"skipping {run}: no iterations with both {args.x} and {args.y}", file=sys.stderr)
            continue
        acc = [v for _, v in scalars[args.y]]
        kept = pts[args.skip :]
        if not kept:
            print(f"skipping {run}: only {len(pts)} iterations, all dropped by --skip {args.skip}", file=sys.stderr)
            continue
        h, r = [p[1] for p in kept], [p[2] for p in kept]
        fit, why = try_fit(h, r)
        runs.append({
            "run": str(run), "label": labels[run], "steps": [p[0] for p in kept], "H": h, "R": r,
            "fit": None if fit is None else fit.to_dict(), "fit_error": why,
            "final_accuracy": acc[-1], "accuracy_last5": statistics.mean(acc[-5:]), "final_entropy": pts[-1][1],
        })
    if not runs:
        print("nothing to fit", file=sys.stderr)
        return 1
    fit, why = try_fit([h for run in runs for h in run["H"]], [r for run in runs for r in run["R"]])
    if fit is None:
        print(f"cannot fit the pooled points: {why}", file=sys.stderr)
        return 1
    for run in runs:
        run["gap"] = fit.ceiling - run["final_accuracy"]

    args.out.mkdir(parents=True, exist_ok=True)
    png, js = args.out / "entropy_law.png", args.out / "entropy_law.json"
    plot(png, runs, fit, args.x, args.y)
    summary = {
        "law": "R = -a*exp(H) + b", "x": args.x, "y": args.y, "skip": args.skip,
        **fit.to_dict(),
        "runs": runs,
    }
    js.write_text(json.dumps(summary, indent=2) + "\n")

    print(f"entropy law R = -a*exp(H) + b over {fit.n} points from {len(runs)} run(s), {args.y} vs {args.x}:")
    print(f"  a = {fit.a:.4f}   b = {fit.b:.4f}   R² = {fit.r2:.3f}   ceiling b − a = {fit.ceiling:.4f}")
    if fit.a <= 0:
        print("  note: a <= 0 — performance does not rise as entropy falls here; the ceiling means little")
    for run in runs:
        own = run["fit"]
        own_txt = (f"own fit a={own['a']:.3f} b={own['b']:.3f} R²={own['r2']:.2f} ceiling={own['ceiling']:.3f}"
                   if own else f"own fit: {run['fit_error']}")
        print(f"  {run['label']}: final acc {run['final_accuracy']:.3f} (last-5 mean {run['accuracy_last5']:.3f}), "
              f"gap to ceiling {run['gap']:+.3f}; {own_txt}")
    print(f"wrote {png} and {js}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
