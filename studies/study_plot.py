"""The method study's figure: entropy, accuracy and eval pass@k against the iteration, one line per cell."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from pathlib import Path

from lit_entropy.analysis.runs import read_scalars, values
from studies.method_study import StudyPlan, cell_name, finished, moving_mean, run_dir


def eval_series(scalars: dict[str, list[tuple[int, float]]], tag: str) -> dict[int, float]:
    """One run's eval ``tag`` by iteration: an evaluation after iteration i is logged at the step of that
    iteration's ``rollout/entropy``, one at start (``callbacks.eval.at_start``) at step 0 = iteration 0. Counting
    the ``rollout/entropy`` steps up to an evaluation's step gives i on either axis: step i in a run with the
    ``iteration`` marker, the optimizer step that ended iteration i in an older one (lit_entropy/utils/log_steps.py)."""
    ends = [step for step, _ in scalars.get("rollout/entropy", [])]
    return {sum(1 for e in ends if e <= step): v for step, v in scalars.get(tag, [])}


HELD_OUT_SAMPLED = "eval/held_out/sampled/"
"""Where a task with evaluation splits (the real-LM arithmetic) logs its held-out sampled pass@k."""
RETENTION_SAMPLED = "eval/retention/sampled/"
"""Where it logs the retention split's (kinds of problems training never draws: what the model forgets)."""


def last_eval(scalars: dict[str, list[tuple[int, float]]], tag: str) -> float | None:
    """A run's ``tag`` at its last evaluation (after the last iteration, or at a stop), None if it never logged it."""
    series = eval_series(scalars, tag)
    return series[max(series)] if series else None


def trade_axes(plan: StudyPlan, prefix: str) -> tuple[str, str] | None:
    """The final panel's x and y tags: sampled pass@(smallest k) against pass@(largest k of the last evaluation),
    where that last evaluation has a k beyond the periodic ones (the protocol's 64 samples against 8); else None."""
    if not plan.eval_final_ks or max(plan.eval_final_ks) <= max(plan.eval_ks):
        return None
    return f"{prefix}pass@{min(plan.eval_final_ks)}", f"{prefix}pass@{max(plan.eval_final_ks)}"


def first_run_tags(plan: StudyPlan, out: Path) -> set[str]:
    """The tags the study's first finished run logged (none yet: empty)."""
    for algo, controller, seed in plan.runs():
        folder = run_dir(out, algo, controller, seed)
        if finished(folder):
            return set(read_scalars(folder))
    return set()


def eval_prefix(plan: StudyPlan, out: Path) -> str:
    """``eval/held_out/sampled/`` when the study's runs log a held-out split (disjoint from training), else
    ``eval/`` (a task without splits), read from the first finished run."""
    return HELD_OUT_SAMPLED if any(t.startswith(HELD_OUT_SAMPLED) for t in first_run_tags(plan, out)) else "eval/"


def plot(plan: StudyPlan, out: Path, png: Path, smooth: int = 5, start: dict[str, float] | None = None,
         folder_of: Callable[[str, str, int], Path] | None = None) -> list[str]:
    """Entropy (log scale) and accuracy against the iteration, mean over seeds, one line per cell (accuracy as a
    trailing ``smooth``-iteration mean: per iteration it mostly follows which prompts were drawn); with periodic
    evaluation, a panel each for the smallest and largest k (and the retention split's smallest, where the runs log
    it). ``start``: eval values of the
    policy every cell starts from (e.g. ``scripts/evaluate.py``'s JSON for the warm start), drawn at
    iteration 0 where a run did not evaluate at start itself. Cells with no finished run are left out; the
    titles give the seeds per cell. Where the last evaluation has a larger k than the periodic ones, a last panel
    puts each cell's final pass@1 against that pass@k (mean ± sd over seeds, the starting policy as a star): the
    trade of the one for the other that entropy methods make. ``folder_of(algo, controller, seed)``: the run a
    seed's curves come from (default its ``seed{k}`` folder; a protocol passes the run its cell table reads, where
    a seed ran on two machines). Returns the panels' titles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tags = ["rollout/entropy", "rollout/accuracy"]
    if plan.eval_every:  # eval pass@k during training: one panel per k, smallest and largest
        prefix = eval_prefix(plan, out)
        tags += [f"{prefix}pass@{k}" for k in dict.fromkeys((min(plan.eval_ks), max(plan.eval_ks)))]
        if f"{RETENTION_SAMPLED}pass@{min(plan.eval_ks)}" in first_run_tags(plan, out):  # what training costs
            tags.append(f"{RETENTION_SAMPLED}pass@{min(plan.eval_ks)}")
    trade = trade_axes(plan, eval_prefix(plan, out)) if plan.eval_final_ks else None
    panels = len(tags) + (trade is not None)
    if panels >= 4:  # rows of three, the legend in the slot after the last panel: legible at a page's width
        rows = math.ceil((panels + 1) / 3)
        fig, grid = plt.subplots(rows, 3, figsize=(5.4 * 3, 4.4 * rows), squeeze=False)
        slots = list(grid.flat)
        axes, legend_ax = slots[:panels], slots[panels]
        for ax in slots[panels:]:
            ax.axis("off")
        right = 1.0
    else:  # one row, the legend beside it (the longest cell names ~45 characters at 7 pt)
        legend_inches = 3.2
        fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels + legend_inches, 5), squeeze=False)
        axes, legend_ax = list(axes.flat), None
        right = 1 - legend_inches / (6.5 * panels + legend_inches)
    colours = plt.get_cmap("tab10").colors  # ten distinct hues (tab20's pairs are near twins), then dashed, dotted
    counts = []
    for k, (algo, controller) in enumerate(plan.grid()):
        curves: dict[str, list] = {tag: [] for tag in tags}
        finals: list[tuple[float, float]] = []  # (pass@1, pass@k) after the last iteration, one per seed
        for seed in plan.seeds:
            folder = folder_of(algo, controller, seed) if folder_of else run_dir(out, algo, controller, seed)
            scalars = read_scalars(folder) if finished(folder) else {}
            if scalars.get("rollout/entropy"):  # a run that logged (not a folder yet to be made)
                for tag in curves:
                    if tag.startswith("eval/"):
                        series = eval_series(scalars, tag)
                        if start and tag in start:
                            series.setdefault(0, start[tag])
                        if series:
                            curves[tag].append(series)
                    elif scalars.get(tag):
                        curves[tag].append(values(scalars[tag]))
                if trade is not None:
                    x, y = last_eval(scalars, trade[0]), last_eval(scalars, trade[1])
                    if x is not None and y is not None:
                        finals.append((x, y))
        if not curves["rollout/entropy"]:
            continue
        counts.append(len(curves["rollout/entropy"]))
        style = {"color": colours[k % len(colours)], "linestyle": ("-", "--", ":")[k // len(colours) % 3]}
        if finals:
            xs, ys = [x for x, _ in finals], [y for _, y in finals]
            sd = lambda v: statistics.stdev(v) if len(v) > 1 else 0.0  # noqa: E731
            axes[-1].errorbar(statistics.mean(xs), statistics.mean(ys), xerr=sd(xs), yerr=sd(ys), marker="o",
                              ms=6, capsize=3, lw=1, color=style["color"], mfc="none" if style["linestyle"] != "-" else None)
        for ax, (tag, runs) in zip(axes, curves.items(), strict=False):
            if not runs:
                continue
            if tag.startswith("eval/"):  # the iterations every seed evaluated after
                xs = sorted(set.intersection(*(set(r) for r in runs)))
                mean = [statistics.mean(r[x] for r in runs) for x in xs]
                ax.plot(xs, mean, label=cell_name(algo, controller), lw=1.2, marker=".", **style)
                continue
            n = min(len(r) for r in runs)
            mean = [statistics.mean(r[i] for r in runs) for i in range(n)]
            if tag == "rollout/accuracy":
                mean = moving_mean(mean, smooth)
            ax.plot(range(1, n + 1), mean, label=cell_name(algo, controller), lw=1.2, **style)
    seeds = f"{min(counts)}" if counts and min(counts) == max(counts) else f"{min(counts, default=0)}-{max(counts, default=0)}"
    axes[0].set_yscale("log")  # a collapse is a fall by orders of magnitude, and a diverging cell would flatten it
    titles = ["rollout/entropy (nats, log scale)", f"rollout/accuracy, trailing {smooth}-iteration mean"]
    titles += [("held-out (disjoint) sampled " + tag.rsplit("/", 1)[1]) if tag.startswith(HELD_OUT_SAMPLED)
               else ("retention (kinds never trained) sampled " + tag.rsplit("/", 1)[1])
               if tag.startswith(RETENTION_SAMPLED) else f"eval {tag}" for tag in tags[2:]]
    for ax, title in zip(axes, titles, strict=False):
        ax.set_title(title + f"; mean over {seeds} seeds", fontsize=10)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    if trade is not None:
        ax = axes[-1]
        if start and trade[0] in start and trade[1] in start:
            ax.plot(start[trade[0]], start[trade[1]], marker="*", ms=12, color="black", ls="none")
            ax.annotate("start", (start[trade[0]], start[trade[1]]), textcoords="offset points", xytext=(6, -4), fontsize=8)
        name = lambda tag: tag.rsplit("/", 1)[1]  # noqa: E731
        where = "held-out (disjoint) sampled" if trade[0].startswith(HELD_OUT_SAMPLED) else "eval"
        ax.set_title(f"after the last iteration: {where} {name(trade[0])} against\n{name(trade[1])}; "
                     f"mean ± sd over {seeds} seeds", fontsize=10)
        ax.set_xlabel(name(trade[0]))
        ax.set_ylabel(name(trade[1]))
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    if legend_ax is not None:
        legend_ax.legend(handles, labels, loc="center left", fontsize=9, frameon=False)
    else:
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(right, 0.5), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0, right, 1))
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return [ax.get_title() for ax in axes]
