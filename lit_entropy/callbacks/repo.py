"""REPOCallback — shape per-token advantages with an adaptive λ (Petrenko et al. 2026).

The rules: docs/design.md §7.4.4.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch

from lit_entropy.callbacks.base import Dose, EntropyController, config_error
from lit_entropy.objectives.repo import LOGP_FLOOR, adapt_lambda, repo_d_advantages, repo_r_advantages
from lit_entropy.rollout.batch import RolloutBatch

VARIANTS = ("r", "d")
LAMBDA_RANGES: dict[str, tuple[float, float]] = {"r": (1e-4, 0.05), "d": (1e-3, 10.0)}
"""Default ``(λ_min, λ_max)`` of |λ| per variant (docs/design.md §7.4.4)."""


class REPOCallback(EntropyController):
    """REPO (Petrenko et al. 2026, "Entropy-Preserving Reinforcement Learning"): ``A′_t = A − λ·f_t``.

    Laws, with A the sequence advantage broadcast to tokens and ``logp_t`` the sampled token's
    log-prob under the current policy from the pre-update pass (``batch.old_logp``, no gradient):

    * ``variant="r"`` (REPO-R): ``A′_t = A − λ·|A|·max(logp_t, −20)``, clamped to keep the sign of A;
    * ``variant="d"`` (REPO-D): ``A′_t = A − λ·β·L_t``, ``L_t = logp_t + H_t``,
      ``β = Cov_B(A, L)/Var_B(L)`` over the batch's response tokens (λ = 1 decorrelates A′ from L —
      our reading of the paper's "decorrelate").

    Each iteration, before shaping, λ takes one step of :func:`~lit_entropy.objectives.repo.adapt_lambda`
    with this batch's ``rollout/entropy`` against the target: entropy too low doubles a positive λ
    (positive λ raises entropy) or halves a negative one, flipping sign through ±λ_min; too high is the
    mirror image; |λ| stays in {0} ∪ [λ_min, λ_max]. The result is written to ``batch.token_advantages``
    (what the loss uses); ``batch.advantages`` is left alone. Rows already rejected (``keep`` False)
    get 0 and stay out of β.

    Args:
        variant: ``"r"`` (REPO-R) or ``"d"`` (REPO-D).
        target: target entropy (see :mod:`lit_entropy.callbacks.base`); default the first iteration's.
        lam_init: starting λ. Default 0 (our choice): no shaping until the entropy leaves the target,
            then ±λ_min. Must be 0 or have |λ| in [λ_min, λ_max].
        lam_min, lam_max: range of |λ|; default per variant, REPO-R [1e-4, 0.05], REPO-D [1e-3, 10].
        logp_floor: REPO-R's floor on ``logp_t`` (default −20).
        **common: ``progress``, ``clamp_patience`` (see :class:`EntropyController`).
    """

    knobs = ("token_advantages",)
    methods = {f"repo_{v}": Dose("lambda_mean", "mean |λ| over the iterations (control/repo_lambda)") for v in "rd"}

    @classmethod
    def method_of(cls, node: Mapping[str, Any]) -> str:
        return f"repo_{node.get('variant', 'r')}"

    def __init__(
        self,
        variant: str = "r",
        target: Any = "first",
        lam_init: float = 0.0,
        lam_min: float | None = None,
        lam_max: float | None = None,
        logp_floor: float = LOGP_FLOOR,
        **common: Any,
    ) -> None:
        super().__init__(target=target, **common)
        if variant not in VARIANTS:
            raise config_error("variant", f"{variant!r}; choose one of {VARIANTS}")
        default_min, default_max = LAMBDA_RANGES[variant]
        lam_min = float(default_min if lam_min is None else lam_min)
        lam_max = float(default_max if lam_max is None else lam_max)
        if not (0 < lam_min <= lam_max < float("inf")):
            raise config_error(
                "lam_min", f"need 0 < lam_min <= lam_max < inf, got lam_min={lam_min}, lam_max={lam_max}"
            )
        lam_init = float(lam_init)
        if lam_init != 0 and not lam_min <= abs(lam_init) <= lam_max:
            raise config_error("lam_init", f"{lam_init} must be 0 or have |lam_init| in [{lam_min}, {lam_max}]")
        if not (math.isfinite(logp_floor) and logp_floor < 0):
            raise config_error("logp_floor", f"{logp_floor} must be a finite negative log-prob")
        self.variant = variant
        self.lam_min = lam_min
        self.lam_max = lam_max
        self.logp_floor = float(logp_floor)
        self.lam = lam_init

    def control(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: RolloutBatch, entropy: float, target: float
    ) -> dict[str, float]:
        needed = ("advantages", "old_logp") + (("entropy",) if self.variant == "d" else ())
        missing = [name for name in needed if getattr(batch, name) is None]
        if missing:
            raise config_error(
                "", f"REPO-{self.variant.upper()} needs batch.{', batch.'.join(missing)} (pre-update pass)"
            )
        self.lam = adapt_lambda(self.lam, entropy, target, self.lam_min, self.lam_max)
        self.note_clamp(abs(self.lam) >= self.lam_max, "|repo_lambda|")
        mask = batch.response_mask.bool()
        if batch.keep is not None:
            mask = mask & batch.keep.bool()[:, None]
        metrics = {"control/repo_lambda": self.lam}
        if self.variant == "r":
            shaped = repo_r_advantages(batch.advantages, batch.old_logp, mask, self.lam, self.logp_floor)
        else:
            shaped, beta = repo_d_advantages(batch.advantages, batch.old_logp, batch.entropy, mask, self.lam)
            metrics["control/repo_beta"] = beta
        batch.token_advantages = shaped.to(dtype=torch.float32, device=batch.advantages.device)
        return metrics

    def extra_state(self) -> dict[str, Any]:
        return {"lam": self.lam}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.lam = float(state["lam"])
