"""A controller study's table: per run, how closely rollout/entropy held its target, and accuracy.

For each run: the controller (from the run's ``.hydra/config.yaml``), the mean |rollout/entropy − target|
over the second half of the iterations, the final entropy, the final and last-5 mean rollout/accuracy, and the
controller's dose (:mod:`studies.dose`: e.g. REPO's mean |λ|, Entrocraft's fraction of iterations
with m ≠ 0), marked *not tested at this dose* under its threshold.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import yaml

from lit_entropy.analysis.runs import read_scalars, values
from studies.dose import dose_cell, dose_metrics, method_dose, method_from_config, run_config


def scalars(run: Path) -> dict[str, list[float]]:
    """tag -> values in step order (see :func:`lit_entropy.analysis.runs.read_scalars`)."""
    return {tag: values(points) for tag, points in read_scalars(run).items()}


def controller_name(run: Path) -> str:
    cfg_file = run / ".hydra" / "config.yaml"
    if not cfg_file.exists():
        return run.name
    cfg = yaml.safe_load(cfg_file.read_text())
    node = (cfg.get("callbacks") or {}).get("entropy") or {}
    target = node.get("_target_", "none")
    label = node.get("variant") or node.get("mode")  # REPO's r/d, Entrocraft's paper/hard
    return target.rsplit(".", 1)[-1] + (f" ({label})" if label else "")


def summarise(run: Path, target: float) -> dict | None:
    s = scalars(run)
    h, acc = s.get("rollout/entropy"), s.get("rollout/accuracy")
    if not h or not acc:
        return None
    half = h[len(h) // 2 :]
    cfg = run_config(run)
    method = method_from_config(cfg)
    return {
        "method": method,
        "dose": method_dose(method, dose_metrics(s, cfg)),
        "controller": controller_name(run),
        "iterations": len(h),
        "mae": statistics.mean(abs(x - target) for x in half),
        "final_entropy": h[-1],
        "final_acc": acc[-1],
        "acc_last5": statistics.mean(acc[-5:]),
    }


def study_table(runs: list[Path], target: float) -> str:
    """The Markdown table of the runs that logged both tags, closest to the target first."""
    rows = [r for r in (summarise(run, target) for run in runs) if r]
    lines = [
        f"| controller | iterations | mean \\|H − {target}\\| (2nd half) | final H | final acc | acc (last 5) | dose |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: r["mae"]):
        lines.append(f"| {r['controller']} | {r['iterations']} | {r['mae']:.4f} | {r['final_entropy']:.3f} | "
                     f"{r['final_acc']:.3f} | {r['acc_last5']:.3f} | {dose_cell(r['method'], [r['dose']])} |")
    return "\n".join(lines)
