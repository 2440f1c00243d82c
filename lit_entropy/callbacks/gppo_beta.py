"""GPPOBetaCallback — steer entropy with CE-GPPO's two gradient scales β_low and β_high.

Su et al. 2025 (CE-GPPO, arXiv 2509.20712); the loss is :func:`lit_entropy.objectives.losses.ppo.gppo_surrogate`.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from lit_entropy.callbacks.base import EntropyController, check_delta, config_error, step_toward
from lit_entropy.rollout.batch import RolloutBatch

DRIVES = ("both", "high", "low")


class GPPOBetaCallback(EntropyController):
    """A smooth actuator for CE-GPPO: nudge β_high and β_low by ∓δ each iteration toward a target entropy H*.

    CE-GPPO keeps a bounded gradient on the tokens PPO clips. Its analysis splits them in two: positive
    advantage with the ratio above 1 + ε_high (low-probability tokens being raised) pushes entropy **up**,
    and its gradient is scaled by β_high; negative advantage with the ratio below 1 − ε_low
    (low-probability tokens being pushed further down) pushes entropy **down**, scaled by β_low. The paper
    picks the two by hand; this controller moves them with ADAPO's sign law (once per RL iteration,
    H = ``rollout/entropy`` of the current batch, s = sign(H* − H))::

        β_high ← clip(β_high + δ·s, β_min, β_max)        (drive: both | high)
        β_low  ← clip(β_low  − δ·s, β_min, β_max)        (drive: both | low)

    Entropy below target gives the exploring tokens more gradient and the sharpening ones less; above
    target, the reverse; ``H == H*`` leaves both unchanged. The forward value of the loss is PPO's
    whatever the βs, so only the clipped tokens' gradients change.

    Our choices (the paper fixes β by hand, it has no controller): ``delta=0.05`` and
    ``[beta_min, beta_max] = [0.25, 1.5]``; the starting values are the preset's (``algo=ce_gppo``:
    β_low = 0.75, β_high = 1.0) unless ``beta_low_init`` / ``beta_high_init`` are given.

    Timing as ADAPO: this batch's entropy sets the βs used for this batch's update. Refused at fit start
    unless ``algo.loss=gppo`` (``algo=gppo`` or ``algo=ce_gppo``): no other loss reads the βs.

    Args:
        target: ``"first"``, a fixed entropy in nats, or a schedule mapping (see
            :class:`~lit_entropy.callbacks.base.EntropyController`).
        drive: ``both`` (default), ``high`` (β_high only) or ``low`` (β_low only).
        beta_low_init / beta_high_init: starting values; ``None`` takes the module's at fit start.
        delta: step per iteration (> 0).
        beta_min / beta_max: the clamp range of both βs (0 ≤ beta_min ≤ beta_max).
        **common: ``progress``, ``clamp_patience`` (see :class:`~lit_entropy.callbacks.base.EntropyController`).
    """

    methods = {"gppo_beta": None}  # no dose rule: the βs move every iteration the entropy is off its target

    def __init__(
        self,
        target: Any = "first",
        drive: str = "both",
        beta_low_init: float | None = None,
        beta_high_init: float | None = None,
        delta: float = 0.05,
        beta_min: float = 0.25,
        beta_max: float = 1.5,
        **common: Any,
    ) -> None:
        super().__init__(target=target, **common)
        if drive not in DRIVES:
            raise config_error("drive", f"{drive!r}; choose one of {DRIVES}")
        self.drive = drive
        self.knobs = tuple(f"gppo_beta_{side}" for side in ("low", "high") if drive in ("both", side))
        self.delta = check_delta(delta)
        if not 0 <= beta_min <= beta_max:
            raise config_error("beta_min", f"need 0 <= beta_min <= beta_max, got {beta_min}, {beta_max}")
        self.beta_min, self.beta_max = float(beta_min), float(beta_max)
        self.beta: dict[str, float | None] = {
            "low": None if beta_low_init is None else self._check("beta_low_init", beta_low_init),
            "high": None if beta_high_init is None else self._check("beta_high_init", beta_high_init),
        }

    def _check(self, key: str, value: float) -> float:
        value = float(value)
        if not self.beta_min <= value <= self.beta_max:
            raise config_error(key, f"{value} must lie in [beta_min, beta_max] = [{self.beta_min}, {self.beta_max}]")
        return value

    def _driven(self) -> tuple[str, ...]:
        return tuple(knob.removeprefix("gppo_beta_") for knob in self.knobs)

    def _start_from(self, pl_module: pl.LightningModule) -> None:
        for side in self._driven():
            if self.beta[side] is None:
                self.beta[side] = self._check(f"beta_{side}_init", getattr(pl_module, f"gppo_beta_{side}"))

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        algo = getattr(pl_module, "algo", None)
        if getattr(algo, "loss", None) != "gppo":
            raise config_error(
                "",
                f"GPPOBetaCallback drives gppo_beta_low/high, which only loss=gppo reads (algo=gppo or "
                f"algo=ce_gppo); algo={getattr(algo, 'name', '?')} uses loss={getattr(algo, 'loss', '?')}",
            )
        self._start_from(pl_module)
        for side in self._driven():  # a resumed run starts from the restored values
            setattr(pl_module, f"gppo_beta_{side}", self.beta[side])

    def control(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: RolloutBatch, entropy: float, target: float
    ) -> dict[str, float]:
        self._start_from(pl_module)  # on_fit_start was not called (e.g. driven by hand)
        at_clamp = False
        metrics = {}
        for side in self._driven():
            # β_high rises when entropy is below target; β_low falls (the same step with H and H* swapped).
            h, h_star = (entropy, target) if side == "high" else (target, entropy)
            proposal, self.beta[side] = step_toward(self.beta[side], h, h_star, self.delta, self.beta_min, self.beta_max)
            at_clamp |= proposal != self.beta[side]
            setattr(pl_module, f"gppo_beta_{side}", self.beta[side])
            metrics[f"control/gppo_beta_{side}"] = self.beta[side]
        self.note_clamp(at_clamp, "/".join(self.knobs))
        return metrics

    def extra_state(self) -> dict[str, Any]:
        return {"beta": dict(self.beta)}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.beta = dict(state["beta"])
