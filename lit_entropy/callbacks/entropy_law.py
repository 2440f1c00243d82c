"""EntropyLawCallback: fit the entropy–performance law online (Cui et al. 2025; docs/design.md §7.6).

Every RL iteration, in ``on_rollout_batch``, the callback records the pair
(``rollout/entropy``, ``rollout/accuracy``) of the batch. Once it holds ``min_points`` pairs it fits
``R = −a·exp(H) + b`` (:func:`lit_entropy.diagnostics.entropy_law.fit_entropy_law`) and writes
``law/a``, ``law/b``, ``law/r2`` and ``law/ceiling`` (= b − a, the predicted accuracy at H = 0) into
``batch.metrics``, which the module logs with the other per-iteration metrics.

It is a diagnostic: it drives no knob and never touches the batch's rows. The collected points live in
``state_dict()`` so a resumed run keeps fitting over the whole history. Docs: ``docs/entropy_law.md``.

Import path: ``lit_entropy.callbacks.entropy_law.EntropyLawCallback``; config
``callbacks/law=entropy_law``.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import lightning.pytorch as pl

from lit_entropy.diagnostics.entropy_law import LawFit, fit_entropy_law
from lit_entropy.rollout.batch import RolloutBatch

log = logging.getLogger(__name__)


class EntropyLawCallback(pl.Callback):
    """Online fit of R = −a·exp(H) + b over the run's (entropy, accuracy) pairs.

    Args:
        min_points: fit once this many iterations have been seen (at least 3).
        fit_first: fit only the first ``fit_first`` points and keep predicting from them (the paper's
            "fit on the early run, predict the end"); ``None`` fits all points so far, every iteration.
        x: metric used as H.
        y: metric used as R.
    """

    knobs: tuple[str, ...] = ()

    def __init__(
        self,
        min_points: int = 10,
        fit_first: int | None = None,
        x: str = "rollout/entropy",
        y: str = "rollout/accuracy",
    ) -> None:
        if int(min_points) < 3:
            raise ValueError(f"EntropyLawCallback: min_points={min_points}; the fit needs at least 3 points")
        if fit_first is not None and int(fit_first) < int(min_points):
            raise ValueError(
                f"EntropyLawCallback: fit_first={fit_first} is below min_points={min_points}; it would never fit"
            )
        self.min_points = int(min_points)
        self.fit_first = None if fit_first is None else int(fit_first)
        self.x = x
        self.y = y
        self.points: list[tuple[int, float, float]] = []
        """(iteration, H, R) per iteration, in iteration order."""
        self.last: dict[str, float] = {}
        self._warned: set[str] = set()

    # ---- helpers ---------------------------------------------------------------------------------
    def _warn_once(self, key: str, msg: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args)

    def record(self, iteration: int, h: float, r: float) -> None:
        """Add (or, for an iteration seen before, replace) one point."""
        self.points = [p for p in self.points if p[0] != iteration]
        self.points.append((int(iteration), float(h), float(r)))
        self.points.sort(key=lambda p: p[0])

    def fit(self) -> LawFit | None:
        """The current fit, or ``None`` before ``min_points`` points or when the points cannot be fitted."""
        pts = self.points if self.fit_first is None else self.points[: self.fit_first]
        if len(pts) < self.min_points:
            return None
        try:
            return fit_entropy_law([p[1] for p in pts], [p[2] for p in pts])
        except ValueError as err:
            self._warn_once("fit", "EntropyLawCallback: no fit yet (%s)", err)
            return None

    # ---- hook ------------------------------------------------------------------------------------
    def on_rollout_batch(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: RolloutBatch) -> None:
        h, r = batch.metrics.get(self.x), batch.metrics.get(self.y)
        if h is None or r is None:
            missing = self.x if h is None else self.y
            self._warn_once("missing", "EntropyLawCallback: %r is not in the rollout metrics; nothing to fit", missing)
            return
        h, r = float(h), float(r)
        if not (math.isfinite(h) and math.isfinite(r)):
            self._warn_once("nonfinite", "EntropyLawCallback: skipping a non-finite point (H=%s, R=%s)", h, r)
            return
        iteration = getattr(trainer, "current_epoch", None)
        self.record(len(self.points) if iteration is None else int(iteration), h, r)
        fit = self.fit()
        if fit is None:
            return
        metrics = {"law/a": fit.a, "law/b": fit.b, "law/r2": fit.r2, "law/ceiling": fit.ceiling}
        if all(math.isfinite(v) for v in metrics.values()):  # the module refuses non-finite metrics
            self.last = metrics
            batch.metrics.update(metrics)

    # ---- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"points": [list(p) for p in self.points], "last": dict(self.last)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.points = [(int(i), float(h), float(r)) for i, h, r in state_dict.get("points", [])]
        self.last = dict(state_dict.get("last", {}))
