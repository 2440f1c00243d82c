"""EntropyController: what every entropy controller shares (DESIGN §6, §7.4).

A controller is a Lightning callback. Once per RL iteration, after the pre-update pass and before the
update, the rollout DataModule calls ``on_rollout_batch(trainer, pl_module, batch)``; the controller
reads ``batch.metrics["rollout/entropy"]``, compares it with its target and acts — by changing the
module's knobs (``eps_high``, ``entropy_coef``, ``pic_alpha``, …) or by reshaping the batch (``keep``,
``token_advantages``). It never patches the loss. Its state lives in ``state_dict()`` so a resumed run
continues exactly.

Targets (``target=``):

* a number — a fixed entropy in nats;
* ``"first"`` — the first iteration's entropy (the papers' default for ADAPO and REPO);
* a schedule — ``{kind: linear|cosine|constant|piecewise|<dotted.path>, start:, end:, points:}``
  evaluated at training progress p ∈ [0, 1] (see :mod:`lit_entropy.schedules`).

Progress is measured in iterations (``trainer.current_epoch``) or in samples (rows generated so far,
kept in the state), so a resumed run continues the schedule where it stopped.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl

from lit_entropy.data.batch import RolloutBatch
from lit_entropy.schedules import Schedule, make_schedule, progress

log = logging.getLogger(__name__)

PROGRESS_UNITS = ("iterations", "samples")


def build_target(spec: Any) -> float | str | Schedule:
    """A fixed float, ``"first"``, or a schedule from a mapping ``{kind, start, end, points}``."""
    if isinstance(spec, str):
        if spec != "first":
            raise ValueError(f"target={spec!r}: give a number, 'first', or a schedule mapping")
        return spec
    if isinstance(spec, Mapping):
        spec = dict(spec)
        kind = spec.pop("kind", "linear")
        return make_schedule(kind, **spec)
    if isinstance(spec, Schedule) or callable(spec):
        return spec
    value = float(spec)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"target={spec!r} must be a finite entropy >= 0 (nats)")
    return value


class EntropyController(pl.Callback):
    """Base class: target handling, progress, clamp warnings, state. Subclasses implement :meth:`control`."""

    knobs: tuple[str, ...] = ()
    """What this controller drives: module knob names, or ``keep`` / ``token_advantages`` batch slots."""

    def __init__(
        self,
        target: Any = "first",
        progress_unit: str = "iterations",
        total_samples: int | None = None,
        clamp_patience: int = 5,
    ) -> None:
        if progress_unit not in PROGRESS_UNITS:
            raise ValueError(f"progress_unit={progress_unit!r}; choose one of {PROGRESS_UNITS}")
        self.target = build_target(target)
        self.progress_unit = progress_unit
        self.total_samples = total_samples
        self.clamp_patience = clamp_patience
        self.first_entropy: float | None = None
        self.samples_seen = 0
        self.clamp_run = 0
        self.clamp_warned = False
        self.last: dict[str, float] = {}

    # ---- to implement ----------------------------------------------------------------------------
    def control(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: RolloutBatch, entropy: float, target: float
    ) -> dict[str, float]:
        """Act on this iteration; return the ``control/*`` metrics to log."""
        raise NotImplementedError

    def extra_state(self) -> dict[str, Any]:
        """Subclass state for ``state_dict()`` (tensors and generator states allowed)."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`extra_state`."""

    # ---- shared machinery ------------------------------------------------------------------------
    def progress(self, trainer: pl.Trainer) -> float:
        if self.progress_unit == "samples":
            if not self.total_samples:
                raise ValueError("progress_unit=samples needs total_samples")
            return min(1.0, self.samples_seen / self.total_samples)
        return progress(trainer.current_epoch, trainer.max_epochs or 1)

    def target_value(self, trainer: pl.Trainer, entropy: float) -> float:
        if self.target == "first":
            if self.first_entropy is None:
                self.first_entropy = float(entropy)
            return self.first_entropy
        if isinstance(self.target, float):
            return self.target
        return float(self.target(self.progress(trainer)))

    def note_clamp(self, at_clamp: bool, what: str) -> None:
        """Say once, in the log, when a knob has sat at its clamp for ``clamp_patience`` iterations."""
        self.clamp_run = self.clamp_run + 1 if at_clamp else 0
        if self.clamp_run >= self.clamp_patience and not self.clamp_warned:
            self.clamp_warned = True
            log.warning(
                "%s: %s has been at its limit for %d iterations; the target may be out of reach",
                type(self).__name__, what, self.clamp_run,
            )

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        vocab = getattr(getattr(pl_module.model, "config", None), "vocab_size", None)
        if not vocab or self.target == "first":
            return
        ceiling = math.log(vocab)
        if isinstance(self.target, float):
            highest = self.target
        else:
            highest = max(self.target(p / 20) for p in range(21))
        if highest > ceiling:
            raise ValueError(
                f"{type(self).__name__}: target entropy {highest:.3f} nats is above log(vocab_size={vocab}) = "
                f"{ceiling:.3f}, the most any policy can reach"
            )

    def on_rollout_batch(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: RolloutBatch) -> None:
        entropy = float(batch.metrics["rollout/entropy"])
        target = self.target_value(trainer, entropy)
        metrics = {"control/target_entropy": target, **self.control(trainer, pl_module, batch, entropy, target)}
        self.samples_seen += batch.batch_size
        self.last = metrics
        batch.metrics.update(metrics)

    def state_dict(self) -> dict[str, Any]:
        return {
            "first_entropy": self.first_entropy,
            "samples_seen": self.samples_seen,
            "clamp_run": self.clamp_run,
            "clamp_warned": self.clamp_warned,
            "last": dict(self.last),
            **self.extra_state(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.first_entropy = state_dict["first_entropy"]
        self.samples_seen = state_dict["samples_seen"]
        self.clamp_run = state_dict["clamp_run"]
        self.clamp_warned = state_dict["clamp_warned"]
        self.last = dict(state_dict.get("last", {}))
        self.load_extra_state(state_dict)
