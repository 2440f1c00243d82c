"""StopWhenDiverged: end a run whose policy has diverged, and evaluate it where it stopped.

A policy pushed out of its useful range (an entropy bonus too strong for a 49k-token vocabulary, a learning
rate far too large) stops learning long before it yields a NaN or becomes uniform (which
``module.uniform_entropy_tol`` catches): its entropy climbs, its completions turn to noise that runs to
``max_new_tokens`` (each iteration slower than the last) and its reward stays at 0. Running it to its last
iteration costs hours and shows nothing new. This callback ends such a run once, for ``patience`` consecutive
iterations, the rollout entropy has been above ``factor`` times the first iteration's and the rollout
accuracy at most ``accuracy_at_most``.

It sets ``trainer.should_stop`` after the last optimizer step of that iteration, so every ``on_train_epoch_end``
that follows sees it, whatever the order of the callbacks: the periodic evaluation
(:class:`~lit_entropy.callbacks.evaluation.PeriodicEvalCallback`) runs its final evaluation (``final_n``,
``final_ks``) there, as after a last iteration, and the run exits normally.

Per iteration it adds ``stop/streak`` (consecutive iterations that met both conditions) to the rollout metrics,
and ``stop/diverged`` = 1 at the iteration where it stops. The first iteration's entropy and the streak live
in ``state_dict()``, so a resumed run counts on; a run resumed from a checkpoint written without this callback
takes the first iteration after the resume as its reference.

Config ``callbacks/stop=diverged`` (``callbacks/stop=none`` is the default).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import lightning.pytorch as pl

from lit_entropy.rollout.batch import RolloutBatch

log = logging.getLogger(__name__)


def diverged_streak(streak: int, entropy: float, accuracy: float, entropy_above: float,
                    accuracy_at_most: float) -> int:
    """The streak after one more iteration: ``streak + 1`` when its entropy is above ``entropy_above`` and its
    accuracy at most ``accuracy_at_most``, else 0."""
    return streak + 1 if entropy > entropy_above and accuracy <= accuracy_at_most else 0


class StopWhenDiverged(pl.Callback):
    """Stop a run whose entropy has grown past ``factor`` × its start while it scores nothing.

    Args:
        factor: the entropy limit as a multiple of the first iteration's ``rollout/entropy`` (> 0).
        accuracy_at_most: the ``rollout/accuracy`` at or below which an iteration counts (0: nothing solved).
        patience: consecutive iterations meeting both conditions before the run stops (>= 1).
    """

    knobs: tuple[str, ...] = ()

    def __init__(self, factor: float = 2.0, accuracy_at_most: float = 0.0, patience: int = 10) -> None:
        if not (math.isfinite(float(factor)) and float(factor) > 0):
            raise ValueError(f"callbacks.stop.factor={factor}: must be a finite number > 0")
        if not 0.0 <= float(accuracy_at_most) <= 1.0:
            raise ValueError(f"callbacks.stop.accuracy_at_most={accuracy_at_most}: must be in [0, 1]")
        if int(patience) < 1 or int(patience) != patience:
            raise ValueError(f"callbacks.stop.patience={patience}: must be an integer >= 1")
        self.factor = float(factor)
        self.accuracy_at_most = float(accuracy_at_most)
        self.patience = int(patience)
        self.reference: float | None = None
        """The first iteration's ``rollout/entropy`` (nats)."""
        self.streak = 0
        self.stopped_at: int | None = None
        """The iteration (from 1) after which the run stopped, once it has."""

    @property
    def entropy_above(self) -> float | None:
        """The entropy limit in nats (None before the first iteration)."""
        return None if self.reference is None else self.factor * self.reference

    def on_rollout_batch(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: RolloutBatch) -> None:
        h, acc = batch.metrics.get("rollout/entropy"), batch.metrics.get("rollout/accuracy")
        if h is None or acc is None:
            raise KeyError("callbacks.stop: the rollout metrics have no rollout/entropy or rollout/accuracy")
        h, acc = float(h), float(acc)
        if self.reference is None:
            self.reference = h
        self.streak = diverged_streak(self.streak, h, acc, self.factor * self.reference, self.accuracy_at_most)
        batch.metrics["stop/streak"] = float(self.streak)
        if self.streak >= self.patience:
            batch.metrics["stop/diverged"] = 1.0

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if batch_idx + 1 < trainer.num_training_batches:  # the iteration's last optimizer step only
            return
        stop = trainer.strategy.reduce_boolean_decision(self.streak >= self.patience, all=False)
        if stop and not trainer.should_stop:
            self.stopped_at = trainer.current_epoch + 1
            trainer.should_stop = True
            log.warning("callbacks.stop: stopping after iteration %d: rollout/entropy above %.3f nats (%.2f x the "
                        "first iteration's) with rollout/accuracy <= %g for %d iterations; the run has diverged",
                        self.stopped_at, self.entropy_above, self.factor, self.accuracy_at_most, self.streak)

    def state_dict(self) -> dict[str, Any]:
        return {"reference": self.reference, "streak": self.streak, "stopped_at": self.stopped_at}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.reference = state_dict.get("reference")
        self.streak = int(state_dict.get("streak", 0))
        self.stopped_at = state_dict.get("stopped_at")
