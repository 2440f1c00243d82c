"""Summarise a controller study: per run, how closely rollout/entropy held its target, and accuracy.

    python scripts/study_table.py logs/study/multiruns/<time> [--target 0.45] [--out study.md]

Reads the TensorBoard events of every run under the directory (a Hydra multirun folder, or several
run folders) and prints a Markdown table: the controller, the mean |rollout/entropy − target| over
the second half of the iterations, the final entropy and the final and last-5 mean rollout/accuracy.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import yaml

from lit_entropy.utils.tb import find_runs, read_scalars, values


def scalars(run: Path) -> dict[str, list[float]]:
    """tag -> values in step order (see :func:`lit_entropy.utils.tb.read_scalars`)."""
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
    return {
        "controller": controller_name(run),
        "iterations": len(h),
        "mae": statistics.mean(abs(x - target) for x in half),
        "final_entropy": h[-1],
        "final_acc": acc[-1],
        "acc_last5": statistics.mean(acc[-5:]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--target", type=float, default=0.45)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    runs = find_runs(args.dirs)
    rows = [r for r in (summarise(run, args.target) for run in runs) if r]
    lines = [
        f"| controller | iterations | mean \\|H − {args.target}\\| (2nd half) | final H | final acc | acc (last 5) |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: r["mae"]):
        lines.append(f"| {r['controller']} | {r['iterations']} | {r['mae']:.4f} | {r['final_entropy']:.3f} | "
                     f"{r['final_acc']:.3f} | {r['acc_last5']:.3f} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
