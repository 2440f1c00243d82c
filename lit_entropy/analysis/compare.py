"""Chosen metrics overlaid across runs: one panel per metric, one line per run, plus a Markdown table.

Per-iteration metrics (one value per RL iteration, e.g. ``rollout/*``) are drawn against the iteration k
(1 for the first; 0 for the evaluation of the starting policy), so runs with different numbers of optimizer
steps per iteration line up; per-step metrics (``train/*``) against the optimizer step. A run that logged the
``iteration`` marker wrote its per-iteration metrics at step k already (lit_entropy/utils/log_steps.py); an older run
wrote everything at the optimizer step, and its per-iteration values are placed through the logged ``epoch``
(the value written at the end of epoch e is iteration e + 1), so old and new runs line up in one figure.

The table holds, per run and metric, the final value and, where a metric has a direction (:func:`direction`:
higher is better for accuracy, reward, pass@k and mean@k, lower for losses and errors), the best, computed on the
raw, unsmoothed values; entropy, lengths and the rest have no best, only their final value. The ``rollout/entropy``
panel also shows what an entropy controller aimed at: its band (``control/band_low``..``control/band_high``) shaded,
or its target (``control/target_entropy``) dashed, in the run's colour, each with its own legend entry. The x axes
have integer ticks; every run's line carries its own marker shape, so runs that coincide stay visible.
"""

from __future__ import annotations

import math
from pathlib import Path

from lit_entropy.analysis.runs import read_scalars, run_labels
from lit_entropy.utils.log_steps import ITERATION, on_optimizer_step

DEFAULT_METRICS = "rollout/entropy,rollout/accuracy,rollout/reward_mean,rollout/response_len_mean"
ENTROPY = "rollout/entropy"
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
HIGHER = ("accuracy", "reward", "pass@", "mean@", "distinct_correct")


def direction(metric: str) -> str | None:
    """``"min"`` for losses and errors, ``"max"`` for accuracy, reward, pass@k and mean@k, ``None`` for a metric
    whose extreme is no achievement (entropy, lengths, times, knobs)."""
    name = metric.lower()
    if "loss" in name or "error" in name:
        return "min"
    return "max" if any(h in name for h in HIGHER) else None


def lower_is_better(metric: str) -> bool:
    return direction(metric) == "min"


def best(metric: str, values: list[float]) -> float:
    """The best finite value of ``metric`` (:func:`direction`); NaN where it has no direction or no value."""
    finite = [v for v in values if math.isfinite(v)]
    kind = direction(metric)
    if not finite or kind is None:
        return math.nan
    return min(finite) if kind == "min" else max(finite)


def against_iteration(points: list[tuple[int, float]], epoch_of: dict[int, float],
                      at_start: bool = False) -> list[tuple[float, float]] | None:
    """A run logged before the ``iteration`` marker (every value at the optimizer step): the points re-indexed by
    iteration through the logged ``epoch`` when the metric has at most one value per iteration, else None. A value
    written in epoch e belongs to iteration e + 1; with ``at_start`` (an ``eval/*`` metric) a value at step 0 before
    epoch 0 ended is the starting policy's (``callbacks.eval.at_start``), iteration 0."""
    if not epoch_of or any(s not in epoch_of for s, _ in points):
        return None
    start = at_start and 0 in epoch_of and epoch_of.get(1) == epoch_of[0]  # step 0 is not epoch 0's last step
    its = [0 if start and s == 0 else epoch_of[s] + 1 for s, _ in points]
    if len(set(its)) != len(its):
        return None
    return [(it, v) for it, (_, v) in zip(its, points, strict=True)]


def by_iteration(metric: str, scalars: dict, epoch_of: dict[int, float] | None = None
                 ) -> list[tuple[float, float]] | None:
    """One run's ``metric`` against the iteration, or None when it is a per-step metric (drawn against the optimizer
    step). A run with the ``iteration`` marker logged its per-iteration metrics at the iteration: their steps are
    used as they are (never mapped through ``epoch``, whose steps are optimizer steps). ``epoch_of``: step -> logged
    ``epoch`` of an older run (read from ``scalars`` when not given)."""
    points = scalars.get(metric, [])
    if ITERATION in scalars:
        iterations = {s for s, _ in scalars[ITERATION]} | {0}  # 0: the evaluation at start
        if on_optimizer_step(metric) or any(s not in iterations for s, _ in points):
            return None
        return [(s, v) for s, v in points]
    if epoch_of is None:
        epoch_of = {s: v for s, v in scalars.get("epoch", [])}
    return against_iteration(points, epoch_of, at_start=metric.startswith("eval/"))


def moving_average(values: list[float], n: int) -> list[float]:
    out, window, total = [], [], 0.0
    for v in values:
        window.append(v)
        total += v
        if len(window) > n:
            total -= window.pop(0)
        out.append(total / len(window))
    return out


def draw_controller_aim(ax, scalars: dict, epoch_of: dict[int, float], color: str,
                        label: str | None = None) -> tuple[str, object] | None:
    """The band (shaded) or the target (dashed) a controller logged, against the iteration when it can; returns
    which one was drawn ("band" or "target") and its artist (labelled ``label``'s band or target), or None."""

    def xy(tag: str) -> tuple[list[float], list[float]]:
        points = scalars.get(tag, [])
        pts = by_iteration(tag, scalars, epoch_of) or points
        return [p[0] for p in pts], [p[1] for p in pts]

    low, high = xy("control/band_low"), xy("control/band_high")
    if low[0] and low[0] == high[0]:
        artist = ax.fill_between(low[0], low[1], high[1], color=color, alpha=0.15, lw=0,
                                 label=f"{label}: band" if label else None)
        return "band", artist
    target = xy("control/target_entropy")
    if target[0]:
        lines = ax.plot(target[0], target[1], color=color, lw=1.0, ls="--", alpha=0.8,
                        label=f"{label}: target" if label else None)
        return "target", lines[0] if lines else None
    return None


def fmt(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v:.4g}"


def table(runs: list[Path], labels: dict[Path, str], data: dict[Path, dict], metrics: list[str]) -> str:
    """One row per run: the final value of each metric, and its best where it has a direction."""
    def kinds(m: str) -> tuple[str, ...]:
        return ("final", "best") if direction(m) else ("final",)

    head = ["run", "folder"] + [f"{m} {kind}" for m in metrics for kind in kinds(m)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in runs:
        cells = [labels[run].replace("|", "\\|"), run.name]
        for m in metrics:
            vals = [v for _, v in data[run].get(m, [])]
            row = [fmt(vals[-1]), fmt(best(m, vals))] if vals else ["—", "—"]
            cells += row[: len(kinds(m))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(out: Path, runs: list[Path], labels: dict[Path, str], data: dict[Path, dict], metrics: list[str],
         smooth: int, title: str | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    ncols = 1 if len(metrics) == 1 else 2
    nrows = math.ceil(len(metrics) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.2 * ncols, 3.6 * nrows + 0.4 + 0.25 * len(runs)),
                             dpi=110, squeeze=False, layout="constrained")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    handles = {}
    for k, metric in enumerate(metrics):
        ax = axes[k // ncols][k % ncols]
        x_names, aims = set(), set()
        for i, run in enumerate(runs):
            points = data[run].get(metric, [])
            if not points:
                continue
            epoch_of = {s: v for s, v in data[run].get("epoch", [])}
            by_it = by_iteration(metric, data[run], epoch_of)
            x_names.add("iteration" if by_it is not None else "step")
            xy = by_it if by_it is not None else points
            xs, ys = [p[0] for p in xy], [p[1] for p in xy]
            c = colors[i % len(colors)]
            if metric == ENTROPY:
                aim = draw_controller_aim(ax, data[run], epoch_of, c, labels[run])
                aims.add(aim[0] if aim else None)
                if aim:
                    handles.setdefault(f"{labels[run]}: {aim[0]}", aim[1])
            if smooth > 1:
                ax.plot(xs, ys, color=c, alpha=0.25, lw=0.8)
                ys = moving_average(ys, smooth)
            # a marker shape per run (at most ~20 on a line), so runs that coincide stay visible
            (line,) = ax.plot(xs, ys, color=c, lw=1.5, label=labels[run], marker=MARKERS[i % len(MARKERS)],
                              ms=4.5 - 0.4 * (i % 3), markevery=max(1, len(xs) // 20),
                              markerfacecolor="none" if i % 2 else c)
            handles.setdefault(labels[run], line)
        aim = {"band": "  (shaded: the controller's band)", "target": "  (dashed: the controller's target)"}
        ax.set_title(metric + ("  (lower is better)" if lower_is_better(metric) else "")
                     + (aim[next(iter(aims))] if len(aims) == 1 and None not in aims else ""), fontsize=10)
        ax.set_xlabel(" / ".join(sorted(x_names)) or "iteration")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # iterations and steps are whole numbers
        ax.grid(alpha=0.3)
        if not x_names:
            ax.text(0.5, 0.5, "not logged by any run", ha="center", va="center", transform=ax.transAxes)
    for k in range(len(metrics), nrows * ncols):
        axes[k // ncols][k % ncols].set_visible(False)
    if len(handles) > 1:  # one run without a band: its folder name says nothing the title does not
        fig.legend(list(handles.values()), list(handles.keys()), loc="outside lower center",
                   ncol=1 if len(handles) > 4 or max(map(len, handles)) > 40 else len(handles), fontsize=8)
    title = (title or "Run comparison") + (f" (moving average over {smooth})" if smooth > 1 else "")
    fig.suptitle(title, fontsize=11)
    fig.savefig(out)
    plt.close(fig)


TABLE_NOTE = ('final = last logged value; best = the highest accuracy, reward, pass@k or mean@k, the lowest loss '
              'or error (other metrics have no best); raw values (no smoothing).')


def compare_runs(runs: list[Path], metrics: list[str], smooth: int, out: Path, name: str = "compare",
                 title: str | None = None) -> tuple[str, list[str]]:
    """Write ``OUT/NAME.png`` and ``OUT/NAME.md`` for ``runs``; return the table and, for each metric that no
    run logged, a warning naming the nearest tags the runs did log."""
    import difflib

    data = {run: read_scalars(run) for run in runs}
    logged = sorted({tag for run in runs for tag in data[run]})
    missing = []
    for m in metrics:
        if not any(m in data[run] for run in runs):
            close = difflib.get_close_matches(m, logged, n=3, cutoff=0.6)
            missing.append(f"no run logged {m!r}" + (f"; did you mean {' or '.join(close)}?" if close else ""))
    labels = run_labels(runs)
    out.mkdir(parents=True, exist_ok=True)
    plot(out / f"{name}.png", runs, labels, data, metrics, smooth, title)
    text = table(runs, labels, data, metrics)
    (out / f"{name}.md").write_text(f"{text}\n\n{TABLE_NOTE}\n")
    return text, missing
