"""EntropyController: what every entropy controller shares (docs/design.md §6.2, §7.4.1).

A controller is a Lightning callback. Once per RL iteration, after the pre-update pass and before the
update, the rollout DataModule calls ``on_rollout_batch(trainer, pl_module, batch)``; the controller
reads ``batch.metrics["rollout/entropy"]``, compares it with its target and acts — by changing the
module's knobs (``eps_high``, ``entropy_coef``, ``pic_alpha``, …) or by reshaping the batch (``keep``,
``token_advantages``). It never patches the loss. Its state lives in ``state_dict()`` so a resumed run
continues exactly.

Config keys every controller takes (subclasses hand them on as ``**common``):

* ``target`` — a number (a fixed entropy in nats), ``"first"`` (the first iteration's entropy, the
  papers' default for ADAPO and REPO) or a schedule ``{kind: linear|cosine|constant|piecewise|
  <pkg.module:function>, start:, end:, points:}`` over training progress p ∈ [0, 1], read by
  :func:`lit_entropy.callbacks.schedules.parse_schedule` (Entrocraft's ``band`` is the same grammar with
  ``[h_low, h_high]`` values; its target is the band's centre);
* ``progress`` — ``{unit: iterations|samples, total_samples:}``, what p counts (:class:`ProgressConfig`);
* ``clamp_patience`` — iterations a knob may sit at its clamp before one log warning.

Errors name the config key: ``callbacks.entropy.<key>: <what is wrong>`` (:func:`config_error`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import lightning.pytorch as pl

from lit_entropy.callbacks.schedules import BandSchedule, Schedule, parse_schedule, probe_points, progress
from lit_entropy.dose import Dose
from lit_entropy.rollout.batch import RolloutBatch

log = logging.getLogger(__name__)

CONFIG_PATH = "callbacks.entropy"
"""Where a controller's config node lives; every error it raises starts with this path."""
PROGRESS_UNITS = ("iterations", "samples")


def config_error(key: str, message: str) -> ValueError:
    """``ValueError("callbacks.entropy.<key>: <message>")``: the controllers' one error convention."""
    return ValueError(f"{CONFIG_PATH}.{key}: {message}" if key else f"{CONFIG_PATH}: {message}")


DECIMALS = 12
""":func:`step_toward` rounds each step to this many decimals, so k steps of δ land exactly on
``init + k·δ`` and on the clamp bounds (no 0.30000000000000004 drift in the logs or in clamp tests)."""


def check_delta(delta: float) -> float:
    """A step δ that :func:`step_toward` can resolve: at least 1e-:data:`DECIMALS`."""
    if not delta >= 10**-DECIMALS:
        raise config_error("delta", f"{delta} must be > 0 (at least 1e-{DECIMALS})")
    return float(delta)


def step_toward(
    value: float, entropy: float, target: float, delta: float, low: float, high: float
) -> tuple[float, float]:
    """One step of a knob that entropy below target raises: ``value + δ·sign(target − entropy)``,
    rounded to :data:`DECIMALS`, then clamped to [low, high]. Returns (the step before the clamp, after)."""
    if entropy < target:
        proposal = value + delta
    elif entropy > target:
        proposal = value - delta
    else:
        proposal = value
    proposal = round(proposal, DECIMALS)
    return proposal, min(max(proposal, low), high)


@dataclass(frozen=True)
class ProgressConfig:
    """What training progress p ∈ [0, 1] counts, for schedule targets and bands (config node ``progress``)."""

    unit: str = "iterations"
    """``iterations``: p = ``current_epoch / (max_epochs − 1)``. ``samples``: p = rows generated so far /
    ``total_samples`` (the count is kept in the controller's state, so a resumed run continues the
    schedule where it stopped)."""
    total_samples: int | None = None
    """Rows over the whole run; needed (> 0) with ``unit: samples``, unused with ``iterations``. Set it to
    rows per iteration × (iterations − 1) for a schedule to reach its end at the last iteration."""

    def __post_init__(self) -> None:
        if self.unit not in PROGRESS_UNITS:
            raise config_error("progress.unit", f"{self.unit!r}; choose one of {PROGRESS_UNITS}")
        if self.unit == "samples" and not (self.total_samples and self.total_samples > 0):
            raise config_error("progress.total_samples", f"{self.total_samples!r}; unit=samples needs a count > 0")

    @classmethod
    def parse(cls, spec: ProgressConfig | Mapping | None) -> ProgressConfig:
        """From the ``progress`` node."""
        fields = asdict(spec) if isinstance(spec, ProgressConfig) else dict(spec or {})
        unknown = sorted(set(fields) - {"unit", "total_samples"})
        if unknown:
            raise config_error("progress", f"unknown key(s) {unknown}; it takes unit, total_samples")
        return cls(**fields)

    def at(self, iteration: int, max_epochs: int | None, samples_seen: int) -> float:
        """p for a trainer at ``iteration`` of ``max_epochs`` that has generated ``samples_seen`` rows."""
        if self.unit == "samples":
            return min(1.0, samples_seen / self.total_samples)
        return progress(iteration, max_epochs or 1)


def build_target(spec: Any) -> str | Schedule | BandSchedule:
    """``"first"``, or a schedule (a number is a constant one) read by ``parse_schedule``; a band passes."""
    if isinstance(spec, str):
        if spec != "first":
            raise config_error("target", f"{spec!r}: give a number, 'first', or a schedule mapping")
        return spec
    if isinstance(spec, BandSchedule):
        return spec
    return parse_schedule(spec, f"{CONFIG_PATH}.target")


CONTROLLERS: dict[str, type[EntropyController]] = {}
"""Every controller class by name, registered by subclassing :class:`EntropyController` (the studies read their
:attr:`~EntropyController.methods` and doses from here)."""


FAR_PATIENCE = 10
"""Iterations in a row the entropy may sit far from the target or band (:func:`far_from`) before one warning."""


def far_from(entropy: float, low: float, high: float) -> bool:
    """``entropy`` is far from the band ``[low, high]`` (a target: ``low == high``): outside it by more than the
    larger of its width and half its centre. A controller that keeps the entropy there for :data:`FAR_PATIENCE`
    iterations is likely set for another task or model (the lab's nats on a real LM, a paper's target on the lab)."""
    margin = max(high - low, 0.25 * (low + high))
    return entropy < low - margin or entropy > high + margin


class EntropyController(pl.Callback):
    """Base class: target, progress, clamp warnings, state. Subclasses implement :meth:`control`.

    A subclass's ``__init__`` takes its own knobs and hands the rest on: ``super().__init__(**common)``
    (``target``, ``progress``, ``clamp_patience``). Its class data say what
    the rest of the package needs to know of it: :attr:`knobs`, :attr:`methods` (with their doses),
    :attr:`refused_losses`.
    """

    knobs: tuple[str, ...] = ()
    """What this controller drives: module knob names, or ``keep`` / ``token_advantages`` batch slots. Two owners of
    one knob are refused at start-up (:func:`lit_entropy.train.check_knob_owners`)."""
    methods: ClassVar[dict[str, Dose | None]] = {}
    """The study methods this class runs (each mode's name in ``conf/callbacks/entropy``) and each one's dose."""
    refused_losses: ClassVar[tuple[str, ...]] = ()
    """Values of ``algo.loss`` this controller cannot act under, refused at start-up with :attr:`refusal`."""
    refusal: ClassVar[str] = ""
    """Why, formatted with ``loss`` and ``algo`` (the preset's name)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        CONTROLLERS[cls.__name__] = cls

    @classmethod
    def method_of(cls, node: Mapping[str, Any]) -> str:
        """Which of :attr:`methods` a run with the controller config ``node`` tests (the only one, unless a
        subclass has modes)."""
        return next(iter(cls.methods), cls.__name__)

    def __init__(
        self,
        target: Any = "first",
        progress: ProgressConfig | Mapping | None = None,
        clamp_patience: int = 5,
        **unknown: Any,
    ) -> None:
        if unknown:  # named with the controller's class (Python would name this base class's __init__)
            raise TypeError(f"{type(self).__name__}() got unexpected keyword argument(s) {sorted(unknown)}")
        if not clamp_patience >= 1:
            raise config_error("clamp_patience", f"{clamp_patience} must be >= 1")
        self.target = build_target(target)
        self.progress_config = ProgressConfig.parse(progress)
        self.clamp_patience = clamp_patience
        self.first_entropy: float | None = None
        self.samples_seen = 0
        self.clamp_run = 0
        self.clamp_warned = False
        self.far_run = 0
        self.far_warned = False
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
        """Training progress p ∈ [0, 1] now (see :class:`ProgressConfig`)."""
        return self.progress_config.at(trainer.current_epoch, trainer.max_epochs, self.samples_seen)

    def target_value(self, trainer: pl.Trainer, entropy: float) -> float:
        """The target entropy now: the first entropy, the schedule at p, or the band's centre at p."""
        if self.target == "first":
            if self.first_entropy is None:
                self.first_entropy = float(entropy)
            return self.first_entropy
        if isinstance(self.target, BandSchedule):
            return self.target.centre(self.progress(trainer))
        return float(self.target(self.progress(trainer)))

    def note_clamp(self, at_clamp: bool, what: str) -> None:
        """Say once, in the log, when a knob has sat at its clamp for ``clamp_patience`` iterations."""
        self.clamp_run = self.clamp_run + 1 if at_clamp else 0
        if self.clamp_run >= self.clamp_patience and not self.clamp_warned:
            self.clamp_warned = True
            log.warning(
                "%s (%s): %s has been at its limit for %d iterations; the target may be out of reach",
                CONFIG_PATH, type(self).__name__, what, self.clamp_run,
            )

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Fail early when the target (a band: its high edge) is above log(vocab_size) anywhere in the run."""
        vocab = getattr(getattr(getattr(pl_module, "model", None), "config", None), "vocab_size", None)
        if not vocab or self.target == "first":
            return
        ceiling = math.log(vocab)
        if isinstance(self.target, BandSchedule):
            key, highest = "band", self.target.max_high()
        else:
            key, highest = "target", max(self.target(p) for p in probe_points(self.target))
        if highest > ceiling:
            raise config_error(
                key,
                f"reaches {highest:.3f} nats, above log(vocab_size={vocab}) = {ceiling:.3f}, the most any "
                "policy can reach: an unreachable target",
            )

    def note_far(self, trainer: pl.Trainer, entropy: float, target: float) -> None:
        """Say once, in the log, when the entropy has sat far from the target or band (:func:`far_from`) for
        :data:`FAR_PATIENCE` iterations in a row."""
        if isinstance(self.target, BandSchedule):
            low, high = self.target(self.progress(trainer))
            where = f"band [{low:.3g}, {high:.3g}]"
        else:
            low = high = target
            where = f"target {target:.3g}"
        self.far_run = self.far_run + 1 if far_from(entropy, low, high) else 0
        if self.far_run >= FAR_PATIENCE and not self.far_warned:
            self.far_warned = True
            log.warning(
                "%s (%s): rollout/entropy has been far from its %s for %d iterations (now %.3g nats), so the "
                "controller is not holding it: a target or band in another task's or model's nats, or a lever too "
                "weak for this run? Set callbacks.entropy.target / band for this run, or callbacks/entropy=none "
                "(docs/controllers/overview.md)",
                CONFIG_PATH, type(self).__name__, where, self.far_run, entropy,
            )

    def on_rollout_batch(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: RolloutBatch) -> None:
        entropy, target = self.read(trainer, batch)
        self.record(batch, target, self.control(trainer, pl_module, batch, entropy, target))

    def read(self, trainer: pl.Trainer, batch: RolloutBatch) -> tuple[float, float]:
        """This batch's ``rollout/entropy`` and the target for now (warning when the two stay far apart)."""
        entropy = float(batch.metrics["rollout/entropy"])
        target = self.target_value(trainer, entropy)
        self.note_far(trainer, entropy, target)
        return entropy, target

    def record(self, batch: RolloutBatch, target: float, metrics: dict[str, float]) -> None:
        """This iteration's ``control/*`` metrics (with the target) into the batch and the state."""
        metrics = {"control/target_entropy": target, **metrics}
        self.samples_seen += batch.batch_size
        self.last = metrics
        batch.metrics.update(metrics)

    def state_dict(self) -> dict[str, Any]:
        return {
            "first_entropy": self.first_entropy,
            "samples_seen": self.samples_seen,
            "clamp_run": self.clamp_run,
            "clamp_warned": self.clamp_warned,
            "far_run": self.far_run,
            "far_warned": self.far_warned,
            "last": dict(self.last),
            **self.extra_state(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.first_entropy = state_dict["first_entropy"]
        self.samples_seen = state_dict["samples_seen"]
        self.clamp_run = state_dict["clamp_run"]
        self.clamp_warned = state_dict["clamp_warned"]
        self.far_run = int(state_dict.get("far_run", 0))  # absent from checkpoints before 2026-12-05
        self.far_warned = bool(state_dict.get("far_warned", False))
        self.last = dict(state_dict.get("last", {}))
        self.load_extra_state(state_dict)
