"""Entropy-aware changes to the PPO surrogate (pure tensor functions) and their settings. GPPO / CE-GPPO, the
gradient-preserving clip, is a loss of its own: :func:`lit_entropy.objectives.losses.ppo.gppo_surrogate`.

* :func:`erc_keep`: ERC, entropy ratio clipping (``algo.erc``).
* :func:`high_entropy_tokens`: the per-response entropy quantile split of Archer and SimKO.
* :func:`simko_inputs`: SimKO's top-K mixing and top-1 penalty, as a modified (log-prob, advantage) pair
  that any PPO-style surrogate then clips (``algo.simko``).

Archer's, SimKO's and ERC's registrations as surrogate changes (where the objective applies each) are in
:mod:`lit_entropy.objectives.changes`; Archer's dual constraints are :func:`high_entropy_tokens`, two clip ranges
and a per-token KL weight (``algo.archer``).
Per-token tensors are [B, L]; everything is fp32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from lit_entropy.objectives.policy_loss import per_token_advantages, ratio, zero_outside

# ------------------------------------------------------------------------------------------------ settings


@dataclass(frozen=True)
class ErcArgs:
    """ERC's bounds: a token keeps its gradient while ``1 − low < H_new/H_old < 1 + high``."""

    low: float = 0.05
    high: float = 0.05

    def __post_init__(self) -> None:
        if not (0 < self.low < 1 and self.high > 0):
            raise ValueError(f"algo.erc: need 0 < low < 1 and high > 0, got low={self.low}, high={self.high}")


@dataclass(frozen=True)
class ArcherArgs:
    """Archer's split and its constraints on the high-entropy (reasoning) tokens.

    The low-entropy (knowledge) tokens keep the clip knobs ``eps_low``/``eps_high`` and the KL knob
    ``kl_coef``; the high-entropy ones get the clip range ``eps`` on both sides and the KL weight ``kl_high``."""

    quantile: float = 0.8
    eps: float = 0.5
    kl_high: float = 0.0

    def __post_init__(self) -> None:
        if not (0 < self.quantile < 1 and 0 <= self.eps < 1 and self.kl_high >= 0):
            raise ValueError(f"algo.archer: need 0 < quantile < 1, 0 <= eps < 1, kl_high >= 0; got {self}")


@dataclass(frozen=True)
class SimkoArgs:
    """SimKO's settings: ``k`` candidates, mixing weight ``alpha``, top-1 penalty ``lam``, entropy ``quantile``."""

    k: int = 3
    alpha: float = 0.01
    lam: float = 1.1
    quantile: float = 0.8

    def __post_init__(self) -> None:
        if not (self.k >= 1 and 0 <= self.alpha <= 1 and self.lam >= 1 and 0 < self.quantile < 1):
            raise ValueError(f"algo.simko: need k >= 1, 0 <= alpha <= 1, lam >= 1, 0 < quantile < 1; got {self}")


# ----------------------------------------------------------------------------------------------------- ERC


def erc_keep(entropy: Tensor, old_entropy: Tensor, low: float, high: float) -> tuple[Tensor, Tensor]:
    """ERC (Su et al. 2025, "Entropy Ratio Clipping as a Soft Global Constraint for Stable Reinforcement
    Learning", arXiv 2512.05591): the tokens that keep their gradient, and the entropy ratio.

    ``ρ_t = (H_t(π_θ) + 1e-8) / (H_t(π_old) + 1e-8)`` with ``H_t`` the full-vocabulary entropy at position
    ``t`` under the current and the pre-update policy. A token keeps its gradient while
    ``1 − low < ρ_t < 1 + high``; the others are detached (value kept, no gradient). ERC acts on top of the
    PPO clip (the paper pairs it with DAPO and GPPO). Returns ``(keep [B, L] bool, ρ [B, L])``, both detached.
    """
    rho = entropy_ratio(entropy, old_entropy)
    return (rho > 1.0 - low) & (rho < 1.0 + high), rho


def entropy_ratio(entropy: Tensor, old_entropy: Tensor) -> Tensor:
    """``(H_t(π_θ) + 1e-8) / (H_t(π_old) + 1e-8)`` per token, detached (ERC's ρ; ``train/entropy_ratio``)."""
    return (entropy.detach().float() + 1e-8) / (old_entropy.float() + 1e-8)


# ---------------------------------------------------------------------------------- Archer and SimKO split


def high_entropy_tokens(entropy: Tensor, mask: Tensor, quantile: float) -> Tensor:
    """[B, L] bool: response tokens whose entropy is above the ``quantile`` of their own response's entropies.

    The quantile is linear-interpolated (``torch.quantile``) over each row's ``mask`` tokens; a row with no
    masked token has none. Archer (``quantile = 0.8``: the top 20 % are the reasoning tokens) and SimKO use it.
    """
    mask = mask.bool()
    values = torch.where(mask, entropy.float(), torch.full((), math.nan, device=entropy.device))
    threshold = torch.nanquantile(values, quantile, dim=-1, keepdim=True)  # NaN for an empty row
    return mask & (entropy.float() > threshold)


# --------------------------------------------------------------------------------------------------- SimKO


def simko_inputs(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    topk_logp: Tensor,
    is_top1: Tensor,
    high: Tensor,
    alpha: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """SimKO (Peng et al. 2025, "SimKO: Simple Pass@K Policy Optimization", arXiv 2510.14807) as the
    (log-prob, advantage) pair a clipped surrogate receives.

    On high-entropy tokens (``high``) of positive-advantage (correct) responses the ratio becomes
    ``r̃ = (1 − α)·r + (α/K)·Σ_k sg(r)·π_k/sg(π_k)`` over the current top-K candidates ``π_k``
    (``topk_logp`` [B, L, K], with gradient): its value is ``r``, its gradient
    ``r·[(1 − α)·∇log π(y_t) + (α/K)·Σ_k ∇log π_k]``, so the update also lifts the top-K candidates. It is
    returned as ``old_logp + log r̃``, so clipping sees the same ratio. On high-entropy tokens of
    negative-advantage (incorrect) responses where the sampled token is the top-1 candidate (``is_top1``)
    the advantage is scaled by ``λ > 1``: a stronger push down on the dominant candidate. Other tokens are
    unchanged (``logp`` itself, the same advantages).
    """
    adv = per_token_advantages(advantages, logp, None)
    boost = high.bool() & (adv > 0)
    r = ratio(zero_outside(logp, boost), zero_outside(old_logp, boost))  # 1 off the boosted tokens: no NaN gradients
    k = topk_logp.shape[-1]
    shift = zero_outside(topk_logp - topk_logp.detach(), boost[..., None])
    candidates = torch.exp(shift).sum(-1)  # value K, gradient Σ_k ∇log π_k
    mixed = (1.0 - alpha) * r + (alpha / k) * r.detach() * candidates
    logp_eff = torch.where(boost, zero_outside(old_logp, boost) + torch.log(mixed), logp.float())
    adv_eff = torch.where(high & (adv < 0) & is_top1.bool(), lam * adv, adv)
    return logp_eff, adv_eff
