"""The policy losses that replace PPO's hard ratio clip, their pure functions and their ``algo.loss`` entries
(docs/design.md §7.2).

* :func:`cispo_surrogate`: CISPO (MiniMax-M1, arXiv 2506.13585), REINFORCE on ``log π`` weighted by the detached,
  upper-capped importance ratio: no token's gradient is ever dropped.
* :func:`sapo_surrogate`: SAPO (Gao et al. 2025, arXiv 2511.20347), a temperature-controlled sigmoid gate on the
  ratio instead of the clip, with separate temperatures for positive and negative advantages.
* :func:`dppo_surrogate`: DPPO (Qi et al. 2026, arXiv 2602.04879), the trust region from a per-token divergence
  between the current and the old policy (binary total variation or binary KL) instead of the ratio clip.

Every function takes ``logp``, ``old_logp`` [B, L], advantages [B, L] or [B] and the loss ``mask`` [B, L], and
returns the per-token loss [B, L] in fp32 with the same info dict as
:func:`~lit_entropy.objectives.policy_loss.clipped_surrogate` (``clipped_low``, ``clipped_high``,
``dual_clipped``, ``ratio``), so the objective aggregates and logs them the same way. Positions outside the mask
are replaced by zeros with ``torch.where`` before any arithmetic: garbage there (even NaN) cannot reach a result.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from lit_entropy.objectives.losses import PolicyLoss, register
from lit_entropy.objectives.policy_loss import loss_info, masked_loss_inputs, ratio

SAPO_TAU_POS = 1.0
"""SAPO's temperature for positive advantages (the paper's default; TRL ``sapo_temperature_pos``)."""
SAPO_TAU_NEG = 1.05
"""SAPO's temperature for negative advantages (the paper's default; TRL ``sapo_temperature_neg``)."""
DPPO_RATIO_CAP = 20.0
"""DPPO's cap on the detached ratio that weighs ``log π`` (verl ``clip_ratio_c``'s default)."""
DPPO_KL_EPS = 1e-8
"""verl's guard inside the binary KL's ``log((1 − p_old)/(1 − p))``."""
DIVERGENCES = ("tv", "kl")


def cispo_surrogate(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
                    eps_high: float) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO per-token loss (MiniMax-M1, arXiv 2506.13585, eq. 4-5), fp32 [B, L].

    ``l_t = −sg(min(r_t, 1 + eps_high))·A_t·log π_θ(y_t)`` with ``r_t = π_θ/π_old``. The paper clips the
    importance-sampling weight at ``[1 − ε_low, 1 + ε_high]`` and sets no lower bound in practice; only the
    upper cap is kept here. The gradient is ``−min(r_t, 1 + eps_high)·A_t·∇log π_θ`` on EVERY token: the cap
    scales a token's gradient, it never removes it (PPO's clip zeroes the gradient of clipped tokens).

    ``clipped_high`` marks tokens whose weight is capped (``r_t > 1 + eps_high``, either sign of ``A``), which
    still learn; ``clipped_low`` is all False.
    """
    if eps_high < 0:
        raise ValueError(f"eps_high must be >= 0, got {eps_high}")
    lp, old, adv, mask = masked_loss_inputs(logp, old_logp, advantages, mask)
    r = ratio(lp, old)
    weight = torch.clamp(r, max=1.0 + eps_high).detach()
    loss = torch.where(mask, -weight * adv * lp, torch.zeros((), device=lp.device))
    r = r.detach()
    return loss, loss_info(r, torch.zeros_like(mask), mask & (r > 1.0 + eps_high))


def sapo_gate(r: Tensor, tau: Tensor | float) -> Tensor:
    """SAPO's soft gate ``f(r) = σ(τ·(r − 1))·4/τ``: ``f′(1) = 1`` (PPO's gradient on-policy), and the gradient
    ``f′(r) = 4·σ(τ(r−1))·(1 − σ(τ(r−1)))`` decays smoothly as ``r`` leaves 1, faster for a larger ``τ``."""
    return torch.sigmoid(tau * (r - 1.0)) * (4.0 / tau)


def sapo_surrogate(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, tau_pos: float = SAPO_TAU_POS,
                   tau_neg: float = SAPO_TAU_NEG) -> tuple[Tensor, dict[str, Tensor]]:
    """SAPO per-token loss (Soft Adaptive Policy Optimization, arXiv 2511.20347), fp32 [B, L].

    ``l_t = −f(r_t; τ_t)·A_t`` with :func:`sapo_gate` ``f`` and ``τ_t = tau_pos`` where ``A_t > 0``, else
    ``tau_neg`` (the paper, TRL, verl and AReaL all branch on ``A > 0``). Its gradient is
    ``−4·σ(1 − σ)·A_t·∇r_t``: PPO's on-policy gradient at ``r = 1`` and a smooth decay off-policy instead of a
    hard cut. Nothing is clipped: ``clipped_low`` and ``clipped_high`` are all False.
    """
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"SAPO temperatures must be > 0, got tau_pos={tau_pos}, tau_neg={tau_neg}")
    lp, old, adv, mask = masked_loss_inputs(logp, old_logp, advantages, mask)
    r = ratio(lp, old)
    tau = torch.where(adv > 0, torch.tensor(float(tau_pos)), torch.tensor(float(tau_neg))).to(r.device)
    loss = torch.where(mask, -sapo_gate(r, tau) * adv, torch.zeros((), device=lp.device))
    none = torch.zeros_like(mask)
    return loss, loss_info(r, none, none)


def binary_tv(logp: Tensor, old_logp: Tensor) -> Tensor:
    """Signed binary total-variation proxy ``p − p_old`` of the sampled token (DPPO-Binary-TV)."""
    return torch.exp(logp) - torch.exp(old_logp)


def binary_kl(logp: Tensor, old_logp: Tensor, eps: float = DPPO_KL_EPS) -> Tensor:
    """Binary KL ``p_old·log(p_old/p) + (1 − p_old)·log((1 − p_old + ε)/(1 − p + ε))`` (DPPO-Binary-KL): the KL
    between the two Bernoulli distributions "sampled token / any other token" under the old and current policy."""
    p, p_old = torch.exp(logp), torch.exp(old_logp)
    return p_old * (old_logp - logp) + (1.0 - p_old) * torch.log((1.0 - p_old + eps) / (1.0 - p + eps))


def dppo_surrogate(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float,
                   divergence: str = "tv", ratio_cap: float = DPPO_RATIO_CAP) -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO per-token loss (Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement Learning",
    arXiv 2602.04879; verl ``dppo_tv`` / ``dppo_kl``), fp32 [B, L].

    ``l_t = −A_t·sg(min(r_t, ratio_cap))·log π_θ(y_t)·m_t`` (gradient ``−A_t·min(r_t, C)·∇log π_θ``, PPO's
    ``−A_t·∇r_t`` below the cap) where the trust-region mask ``m_t`` (detached) keeps a token unless its
    update already moved the policy too far in the direction the advantage pushes:

    * ``divergence="tv"`` (Binary-TV): ``m_t = [p − p_old ≤ eps_high]`` for ``A_t > 0``,
      ``[p − p_old ≥ −eps_low]`` otherwise (``p = π_θ(y_t)``, ``p_old = π_old(y_t)``);
    * ``divergence="kl"`` (Binary-KL): ``m_t = [D ≤ eps_high or p ≤ p_old]`` for ``A_t > 0``,
      ``[D ≤ eps_low or p ≥ p_old]`` otherwise, with ``D`` :func:`binary_kl`.

    ``eps_low`` / ``eps_high`` are divergence thresholds here, not ratio ranges (verl reads ``clip_ratio_low`` /
    ``clip_ratio_high`` the same way; its example uses 0.15 for TV and 0.05 for KL). Unlike PPO the mask
    depends on the probability moved, not on the ratio, so a rare token may change its ratio a lot and a
    likely one little. ``clipped_high`` marks masked tokens with ``A > 0``, ``clipped_low`` those with ``A ≤ 0``.
    """
    if divergence not in DIVERGENCES:
        raise ValueError(f"divergence={divergence!r}; choose one of {DIVERGENCES}")
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"DPPO thresholds must be >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    if not ratio_cap > 0:
        raise ValueError(f"ratio_cap must be > 0, got {ratio_cap}")
    lp, old, adv, mask = masked_loss_inputs(logp, old_logp, advantages, mask)
    r = ratio(lp, old)
    with torch.no_grad():
        if divergence == "tv":
            moved = binary_tv(lp, old)
            keep_pos, keep_neg = moved <= eps_high, moved >= -eps_low
        else:  # the direction is read on the probabilities, as verl does (not on the log-probs)
            d, p, p_old = binary_kl(lp, old), torch.exp(lp), torch.exp(old)
            keep_pos = (d <= eps_high) | (p <= p_old)
            keep_neg = (d <= eps_low) | (p >= p_old)
        keep = torch.where(adv > 0, keep_pos, keep_neg)
    weight = torch.clamp(r, max=ratio_cap).detach()
    loss = torch.where(mask & keep, -adv * weight * lp, torch.zeros((), device=lp.device))
    out = mask & ~keep
    return loss, loss_info(r, out & (adv <= 0), out & (adv > 0))


# ------------------------------------------------------------------------------------ the algo.loss entries


def cispo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float,
          knobs: Mapping[str, Any], dual_clip: float | None) -> tuple[Tensor, dict[str, Tensor]]:
    """The cap on the detached ratio is ``1 + eps_high``."""
    return cispo_surrogate(logp, old_logp, advantages, mask, eps_high)


def sapo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float,
         knobs: Mapping[str, Any], dual_clip: float | None, **args: float) -> tuple[Tensor, dict[str, Tensor]]:
    """No clip knob: the temperatures ``tau_pos`` / ``tau_neg`` set the gate."""
    return sapo_surrogate(logp, old_logp, advantages, mask, **args)


def dppo(divergence: str):
    def loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float,
             knobs: Mapping[str, Any], dual_clip: float | None, **args: float) -> tuple[Tensor, dict[str, Tensor]]:
        """The knobs ``eps_low`` / ``eps_high`` are the divergence's thresholds."""
        return dppo_surrogate(logp, old_logp, advantages, mask, eps_low, eps_high, divergence, **args)

    return loss


register(PolicyLoss("cispo", cispo, clip_knobs=("eps_high",)))
register(PolicyLoss("sapo", sapo, args={"tau_pos": SAPO_TAU_POS, "tau_neg": SAPO_TAU_NEG}, clip_knobs=()))
register(PolicyLoss("dppo_tv", dppo("tv"), args={"ratio_cap": DPPO_RATIO_CAP}))
register(PolicyLoss("dppo_kl", dppo("kl"), args={"ratio_cap": DPPO_RATIO_CAP}))
