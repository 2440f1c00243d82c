"""The entropy-performance law R = -a*exp(H) + b fitted to finished runs, and its plot.

Each run's per-iteration values of an entropy tag (H) and a performance tag (R) are paired by logged
step; the law is fitted over all runs' points together (pooled) and over each run alone. The fit is
:func:`lit_entropy.diagnostics.entropy_law.fit_entropy_law`; see docs/entropy_law.md for how to read the
ceiling.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np

from lit_entropy.analysis.runs import read_scalars, run_labels
from lit_entropy.diagnostics.entropy_law import LawFit, fit_entropy_law, predict


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


def collect(run_dirs: list[Path], x: str, y: str, skip: int) -> tuple[list[dict], list[str]]:
    """Per run: its (H, R) points after the first ``skip`` iterations, its own fit and its final accuracy;
    and a line for each run left out (no paired points, or all dropped by ``skip``)."""
    labels = run_labels(run_dirs)
    runs: list[dict] = []
    skipped: list[str] = []
    for run in run_dirs:
        scalars = read_scalars(run)
        pts = paired(scalars, x, y)
        if not pts:
            skipped.append(f"skipping {run}: no iterations with both {x} and {y}")
            continue
        acc = [v for _, v in scalars[y]]
        kept = pts[skip:]
        if not kept:
            skipped.append(f"skipping {run}: only {len(pts)} iterations, all dropped by --skip {skip}")
            continue
        h, r = [p[1] for p in kept], [p[2] for p in kept]
        fit, why = try_fit(h, r)
        runs.append({
            "run": str(run), "label": labels[run], "steps": [p[0] for p in kept], "H": h, "R": r,
            "fit": None if fit is None else fit.to_dict(), "fit_error": why,
            "final_accuracy": acc[-1], "accuracy_last5": statistics.mean(acc[-5:]), "final_entropy": pts[-1][1],
        })
    return runs, skipped


def pooled_fit(runs: list[dict]) -> tuple[LawFit | None, str | None]:
    """The law over every run's points together (or why it cannot be fitted); sets each run's ``gap``,
    the pooled ceiling minus its final accuracy."""
    fit, why = try_fit([h for run in runs for h in run["H"]], [r for run in runs for r in run["R"]])
    if fit is not None:
        for run in runs:
            run["gap"] = fit.ceiling - run["final_accuracy"]
    return fit, why


def write_fit(out: Path, runs: list[dict], fit: LawFit, x: str, y: str, skip: int) -> tuple[Path, Path]:
    """``OUT/entropy_law.png`` (the plot) and ``OUT/entropy_law.json`` (pooled fit and runs)."""
    out.mkdir(parents=True, exist_ok=True)
    png, js = out / "entropy_law.png", out / "entropy_law.json"
    plot(png, runs, fit, x, y)
    summary = {"law": "R = -a*exp(H) + b", "x": x, "y": y, "skip": skip, **fit.to_dict(), "runs": runs}
    js.write_text(json.dumps(summary, indent=2) + "\n")
    return png, js


def summary_lines(runs: list[dict], fit: LawFit, x: str, y: str) -> list[str]:
    """A short human summary: the pooled fit, then each run's final accuracy, gap and own fit."""
    lines = [f"entropy law R = -a*exp(H) + b over {fit.n} points from {len(runs)} run(s), {y} vs {x}:",
             f"  a = {fit.a:.4f}   b = {fit.b:.4f}   R² = {fit.r2:.3f}   ceiling b − a = {fit.ceiling:.4f}"]
    if fit.a <= 0:
        lines.append("  note: a <= 0 — performance does not rise as entropy falls here; the ceiling means little")
    for run in runs:
        own = run["fit"]
        own_txt = (f"own fit a={own['a']:.3f} b={own['b']:.3f} R²={own['r2']:.2f} ceiling={own['ceiling']:.3f}"
                   if own else f"own fit: {run['fit_error']}")
        lines.append(f"  {run['label']}: final acc {run['final_accuracy']:.3f} (last-5 mean "
                     f"{run['accuracy_last5']:.3f}), gap to ceiling {run['gap']:+.3f}; {own_txt}")
    return lines
