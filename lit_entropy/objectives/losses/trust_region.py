"""The losses that replace PPO's hard ratio clip: CISPO, SAPO, DPPO (:mod:`lit_entropy.objectives.trust_region`
holds their pure functions; docs/design.md §7.2)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from lit_entropy.objectives import trust_region as tr
from lit_entropy.objectives.losses import PolicyLoss, register


def cispo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float,
          knobs: Mapping[str, Any], dual_clip: float | None) -> tuple[Tensor, dict[str, Tensor]]:
    """The cap on the detached ratio is ``1 + eps_high``."""
    return tr.cispo_surrogate(logp, old_logp, advantages, mask, eps_high)


def sapo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float,
         knobs: Mapping[str, Any], dual_clip: float | None, **args: float) -> tuple[Tensor, dict[str, Tensor]]:
    """No clip knob: the temperatures ``tau_pos`` / ``tau_neg`` set the gate."""
    return tr.sapo_surrogate(logp, old_logp, advantages, mask, **args)


def dppo(divergence: str):
    def loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float,
             knobs: Mapping[str, Any], dual_clip: float | None, **args: float) -> tuple[Tensor, dict[str, Tensor]]:
        """The knobs ``eps_low`` / ``eps_high`` are the divergence's thresholds."""
        return tr.dppo_surrogate(logp, old_logp, advantages, mask, eps_low, eps_high, divergence, **args)

    return loss


register(PolicyLoss("cispo", cispo))
register(PolicyLoss("sapo", sapo, args={"tau_pos": tr.SAPO_TAU_POS, "tau_neg": tr.SAPO_TAU_NEG}))
register(PolicyLoss("dppo_tv", dppo("tv"), args={"ratio_cap": tr.DPPO_RATIO_CAP}))
register(PolicyLoss("dppo_kl", dppo("kl"), args={"ratio_cap": tr.DPPO_RATIO_CAP}))
