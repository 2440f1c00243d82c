"""GSPO (Zheng et al. 2025): one clipped ratio per sequence (docs/design.md §7.2)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from lit_entropy.objectives.losses import PolicyLoss, register
from lit_entropy.objectives.policy_loss import gspo_surrogate


def gspo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float,
         knobs: Mapping[str, Any], dual_clip: float | None) -> tuple[Tensor, dict[str, Tensor]]:
    return gspo_surrogate(logp, old_logp, advantages, mask, eps_low, eps_high)


register(PolicyLoss("gspo", gspo, per_sequence=True))
