"""IterationProgress: one progress bar for the run, one tick per RL iteration, and a summary at the end.

Lightning's own bar counts optimizer steps inside an epoch, which says little in RL; this one counts
iterations and carries what a person watches: the pre-update entropy, the accuracy, the controller's
band or target and knob, and seconds per iteration. When the output is not a terminal (CI logs,
``nohup``) it prints one plain line per iteration instead of redrawing a bar. At the end of the fit
(or when it fails) it prints a short table: first, last, min and max of the curves, the median
seconds per iteration and where they went, and the reward errors.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any, TextIO

import lightning.pytorch as pl
from lightning.pytorch.callbacks.progress.progress_bar import ProgressBar
from lightning.pytorch.utilities import rank_zero_only

from lit_entropy.iteration import rollout_of

CURVES = ("rollout/entropy", "rollout/accuracy", "rollout/reward_mean", "rollout/response_len_mean")
PHASES = ("time/generate", "time/score", "time/sync", "time/forward", "time/forward_backward")
KNOBS = {"control/eps_high": "eps_high", "control/repo_lambda": "lambda", "control/entropy_coef": "coef",
         "control/pic_alpha": "alpha"}


def describe(metrics: dict[str, float], seconds: float | None) -> str:
    """``H 0.4939 | acc 0.290 | band [0.40, 0.55] | 2.1 s/it`` from one iteration's metrics."""
    parts = []
    if "rollout/entropy" in metrics:
        parts.append(f"H {metrics['rollout/entropy']:.4f}")
    if "rollout/accuracy" in metrics:
        parts.append(f"acc {metrics['rollout/accuracy']:.3f}")
    if "control/band_low" in metrics and "control/band_high" in metrics:
        parts.append(f"band [{metrics['control/band_low']:.3f}, {metrics['control/band_high']:.3f}]")
    elif "control/target_entropy" in metrics:
        parts.append(f"target {metrics['control/target_entropy']:.3f}")
    parts += [f"{name} {metrics[key]:.4g}" for key, name in KNOBS.items() if key in metrics]
    if metrics.get("rollout/reward_errors"):
        parts.append(f"reward errors {int(metrics['rollout/reward_errors'])}")
    if seconds is not None:
        parts.append(f"{seconds:.2f} s/it")
    return " | ".join(parts)


class IterationProgress(ProgressBar):
    """``refresh``: redraw the bar (True on a terminal, a line per iteration otherwise; None = detect).
    ``summary``: print the end-of-run table."""

    def __init__(self, refresh: bool | None = None, summary: bool = True, stream: TextIO | None = None) -> None:
        super().__init__()
        self.refresh = refresh
        self.summary = summary
        self.stream = stream
        self._enabled = True
        self._bar: Any = None
        self._last_end: float | None = None
        self.history: list[dict[str, float]] = []

    # Lightning's ProgressBar interface
    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def out(self) -> TextIO:
        return self.stream or sys.stderr

    @rank_zero_only
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last_end = time.perf_counter()
        self.history = []
        refresh = self.refresh if self.refresh is not None else self.out.isatty()
        if self._enabled and refresh:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=trainer.max_epochs, initial=trainer.current_epoch, desc="RL iterations",
                             unit="it", file=self.out, dynamic_ncols=True, leave=True)

    @rank_zero_only
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        now = time.perf_counter()
        seconds = None if self._last_end is None else now - self._last_end
        self._last_end = now
        rollout = rollout_of(trainer)  # this iteration's batch, from the epoch's loader
        metrics = {k: float(v) for k, v in (rollout.metrics if rollout is not None else {}).items()}
        metrics["time/forward"] = float(getattr(pl_module, "time_forward", 0.0))
        metrics["time/forward_backward"] = float(getattr(pl_module, "time_forward_backward", 0.0))
        if seconds is not None:
            metrics["time/iteration"] = seconds
        self.history.append(metrics)
        if not self._enabled:
            return
        line = describe(metrics, seconds)
        if self._bar is not None:
            self._bar.set_postfix_str(line, refresh=False)
            self._bar.update(1)
        else:
            print(f"iteration {trainer.current_epoch + 1}/{trainer.max_epochs} | {line}", file=self.out, flush=True)

    @rank_zero_only
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._finish(trainer)

    @rank_zero_only
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._finish(trainer)

    def _finish(self, trainer: pl.Trainer) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._enabled and self.summary and self.history:
            print(summary_table(self.history, trainer), file=self.out, flush=True)
            self.history = []


def summary_table(history: list[dict[str, float]], trainer: pl.Trainer | None = None) -> str:
    """A Markdown-style table of the run's curves and time per iteration (what ``IterationProgress`` prints)."""
    lines = [f"Run summary: {len(history)} iteration(s)", "",
             "| metric | first | last | min | max |", "|---|---:|---:|---:|---:|"]
    for key in CURVES:
        values = [m[key] for m in history if key in m]
        if values:
            lines.append(f"| {key} | {values[0]:.4f} | {values[-1]:.4f} | {min(values):.4f} | {max(values):.4f} |")
    times = [m["time/iteration"] for m in history[1:] if "time/iteration" in m]  # the first one warms up
    if times:
        total = statistics.median(times)
        lines += ["", f"seconds per iteration (median of {len(times)}, the first excluded): {total:.2f}"]
        shares = [f"{key.split('/')[1]} {statistics.median(m.get(key, 0.0) for m in history[1:]):.2f}"
                  for key in PHASES]
        lines.append("  of which " + ", ".join(shares))
    errors = sum(m.get("rollout/reward_errors", 0.0) for m in history)
    lines.append(f"reward errors (crashed, hung or non-finite rewards scored 0): {int(errors)}")
    # The logger's folder (``trainer.log_dir`` would be a collective: this runs on rank 0 only).
    log_dir = getattr(getattr(trainer, "logger", None), "log_dir", None) if trainer is not None else None
    if log_dir:
        lines.append(f"logs: {log_dir}")
    return "\n".join(lines)
