"""EntroPICCallback — hold the batch entropy at a target with a PI controller.

Yang et al. 2025; docs/design.md §7.4.6.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import lightning.pytorch as pl

from lit_entropy.callbacks.base import Dose, EntropyController, config_error
from lit_entropy.rollout.batch import RolloutBatch

log = logging.getLogger(__name__)

ANTI_WINDUP = ("clamp", "conditional", "none")


class EntroPICCallback(EntropyController):
    """EntroPIC: Entropy stabilisation via Proportional-Integral Control (Yang et al. 2025, arXiv 2511.15248).

    Law, once per RL iteration with H = ``rollout/entropy`` (pre-update) and H* the target::

        e = H − H*
        I ← I + e
        α = clip(K_p·e + K_i·I, −α_max, α_max)        (K_p = 1, K_i = 0.01, α_max = 1)

    α is written to the module knob ``pic_alpha``. The loss then adds α · mean over the loss tokens whose
    pre-update probability exceeds 0.95 of (−r·|A|) (:func:`lit_entropy.objectives.entropic.entropic_term`):
    on those tokens positive samples weigh (1 + α) and negative samples (1 − α). Entropy above target
    gives α > 0, which sharpens the policy; below target α < 0, which flattens it.

    Target (``target=``, see :mod:`lit_entropy.callbacks.base`): a number in nats, ``"first"`` (the default: the
    first iteration's entropy, so α starts at 0 and the controller holds the initial entropy — our
    choice; the paper sets a fixed value per experiment) or a schedule over training progress.

    Anti-windup (our choice; the paper's law is the plain sum): with ``"clamp"`` (default) the integral
    is kept in ±α_max/K_i, the range in which K_i·I alone can move the output. Inside it the law is exactly
    the paper's; beyond it the extra integral could only keep α pinned at the limit after the error has
    changed sign. ``"conditional"`` skips integration on iterations where the output is saturated and the
    error pushes it further out; ``"none"`` is the plain sum.

    State (checkpointed): the integral I and the last α. Other keys (``progress``, ``clamp_patience``)
    go to :class:`~lit_entropy.callbacks.base.EntropyController` as ``**common``.
    """

    knobs = ("pic_alpha",)
    methods = {"entropic": Dose("pic_alpha_mean", "mean |α| (control/pic_alpha)")}

    def __init__(
        self,
        target: Any = "first",
        kp: float = 1.0,
        ki: float = 0.01,
        alpha_max: float = 1.0,
        anti_windup: str = "clamp",
        **common: Any,
    ) -> None:
        super().__init__(target=target, **common)
        for name, value in (("kp", kp), ("ki", ki)):
            if not (math.isfinite(value) and value >= 0):
                raise config_error(name, f"{value} must be a finite gain >= 0")
        if kp == 0 and ki == 0:
            raise config_error("ki", "kp and ki are both 0: the controller would never act")
        if not (0 < alpha_max <= 1):
            raise config_error("alpha_max", f"{alpha_max} must be in (0, 1] (weights 1 ± α must stay >= 0)")
        if anti_windup not in ANTI_WINDUP:
            raise config_error("anti_windup", f"{anti_windup!r}; choose one of {ANTI_WINDUP}")
        self.kp = float(kp)
        self.ki = float(ki)
        self.alpha_max = float(alpha_max)
        self.anti_windup = anti_windup
        self.integral = 0.0
        self.alpha = 0.0

    # ---- the law ---------------------------------------------------------------------------------
    def _clip(self, u: float) -> float:
        return min(self.alpha_max, max(-self.alpha_max, u))

    def step(self, error: float) -> float:
        """Advance the integral by one error and return the new α (pure arithmetic, no trainer needed)."""
        integral = self.integral + error
        if self.anti_windup == "clamp" and self.ki > 0:
            bound = self.alpha_max / self.ki
            integral = min(bound, max(-bound, integral))
        elif self.anti_windup == "conditional":
            u = self.kp * error + self.ki * integral
            if abs(u) > self.alpha_max and u * error > 0:
                integral = self.integral  # saturated and the error pushes further out: hold
        self.integral = integral
        self.alpha = self._clip(self.kp * error + self.ki * integral)
        return self.alpha

    # ---- EntropyController -----------------------------------------------------------------------
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        if not hasattr(pl_module, "pic_alpha"):
            raise config_error(
                "", f"EntroPICCallback drives the module knob 'pic_alpha', which {type(pl_module).__name__} lacks"
            )

    def control(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: RolloutBatch, entropy: float, target: float
    ) -> dict[str, float]:
        error = entropy - target
        if math.isfinite(error):
            alpha = self.step(error)
        else:  # a NaN entropy would poison the integral for the rest of the run: hold α instead
            log.warning(
                "callbacks.entropy (EntroPICCallback): rollout/entropy=%s is not finite; keeping pic_alpha=%s",
                entropy,
                self.alpha,
            )
            alpha = self.alpha
        self.note_clamp(abs(alpha) >= self.alpha_max, "pic_alpha")
        pl_module.pic_alpha = alpha
        return {"control/pic_alpha": alpha, "control/pic_error": error, "control/pic_integral": self.integral}

    def extra_state(self) -> dict[str, Any]:
        return {"integral": self.integral, "alpha": self.alpha}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.integral = float(state["integral"])
        self.alpha = float(state["alpha"])
