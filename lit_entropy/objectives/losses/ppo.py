"""PPO's clipped surrogate (Schulman et al. 2017) and GPPO / CE-GPPO's gradient-preserving version of it
(docs/design.md §7.2, §7.8)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from lit_entropy.objectives.entropy_methods import gppo_surrogate
from lit_entropy.objectives.losses import PolicyLoss, register
from lit_entropy.objectives.policy_loss import clipped_surrogate


def ppo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float,
        knobs: Mapping[str, Any], dual_clip: float | None) -> tuple[Tensor, dict[str, Tensor]]:
    return clipped_surrogate(logp, old_logp, advantages, eps_low, eps_high, dual_clip, mask=mask)


def gppo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float,
         knobs: Mapping[str, Any], dual_clip: float | None) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's value; the clipped tokens keep the gradient scales the knobs ``gppo_beta_low`` / ``gppo_beta_high``."""
    return gppo_surrogate(logp, old_logp, advantages, eps_low, eps_high, knobs["gppo_beta_low"],
                          knobs["gppo_beta_high"], dual_clip, mask=mask)


register(PolicyLoss("ppo", ppo, ppo_clip=True))
register(PolicyLoss("gppo", gppo, ppo_clip=True))
