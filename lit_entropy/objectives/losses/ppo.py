"""PPO's clipped surrogate (Schulman et al. 2017), the one home of its per-token ratio clip, and GPPO / CE-GPPO's
gradient-preserving version of it (docs/design.md §7.2, §7.8).

* :func:`clip_active`: where the clip is active (what the info dicts, the clip counters and KL-Cov's
  ``ppo_clipped`` input read);
* :func:`clipped_surrogate`: ``algo.loss=ppo`` (Clip-Higher / DAPO via ``eps_high``, optional dual clip);
* :func:`gppo_surrogate`: ``algo.loss=gppo``.

Everything is computed in fp32 whatever the dtype of the inputs: a bf16-rounded ratio biases clipping.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from lit_entropy.objectives.losses import PolicyLoss, register
from lit_entropy.objectives.policy_loss import per_token_advantages, ratio, zero_outside


def clip_active(r: Tensor, advantages: Tensor, eps_low: float, eps_high: float) -> tuple[Tensor, Tensor]:
    """``(low, high)`` bool [B, L]: the tokens whose clipped branch is active, so PPO gives them no gradient —
    ``A < 0`` and ``r < 1 − eps_low``, and ``A > 0`` and ``r > 1 + eps_high``. ``advantages`` has ``r``'s shape."""
    return (advantages < 0) & (r < 1.0 - eps_low), (advantages > 0) & (r > 1.0 + eps_high)


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
    mask: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token clipped surrogate loss [B, L] (fp32) and per-token clip indicators.

    ``l_t = −min(r·A, clip(r, 1 − eps_low, 1 + eps_high)·A)`` with ``r = exp(logp − old_logp)``.
    With ``dual_clip = c`` (> 1, e.g. 3) the loss of negative-advantage tokens is capped:
    ``l_t = min(l_t, −c·A)`` for ``A < 0``, i.e. at most ``c·|A|``.

    ``advantages`` is per token [B, L] or per sequence [B] (broadcast over tokens).

    The dict holds bool [B, L] tensors ``clipped_low`` (``A < 0`` and ``r < 1 − eps_low``: the clipped
    branch is active, no gradient), ``clipped_high`` (``A > 0`` and ``r > 1 + eps_high``),
    ``dual_clipped`` (``A < 0`` and the dual-clip cap is active) and the detached fp32 ``ratio``.
    Masking is left to the aggregation. With the optional ``mask`` [B, L], ``logp``, ``old_logp`` and
    the advantages are replaced by 0 outside it (``torch.where``) before any arithmetic and the loss is
    0 there: garbage in padding (e.g. NaN ``old_logp``) then cannot turn the zero gradient of the
    masked-out positions into NaN (``0·NaN``) on its way back through ``exp``. Inside the mask the
    result is the same as without it.
    """
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"clip ranges must be >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    if mask is not None:
        mask = mask.bool()
        zero = torch.zeros((), dtype=torch.float32, device=logp.device)
        logp = torch.where(mask, logp.float(), zero)
        old_logp = torch.where(mask, old_logp.float(), zero)
    r = ratio(logp, old_logp)
    adv = advantages.float()
    if adv.dim() == r.dim() - 1:  # per-sequence [B] against per-token [B, L]
        adv = adv.unsqueeze(-1)
    adv = adv.expand_as(r)
    if mask is not None:
        adv = torch.where(mask, adv, torch.zeros((), dtype=torch.float32, device=adv.device))

    unclipped = r * adv
    clipped = torch.clamp(r, 1.0 - eps_low, 1.0 + eps_high) * adv
    loss = -torch.minimum(unclipped, clipped)

    r_detached = r.detach()
    low, high = clip_active(r_detached, adv, eps_low, eps_high)
    info = {"clipped_low": low, "clipped_high": high}
    if dual_clip is not None:
        cap = -dual_clip * adv
        dual_active = (adv < 0) & (loss.detach() > cap)
        loss = torch.where(dual_active, cap, loss)
        info["dual_clipped"] = dual_active
    else:
        info["dual_clipped"] = torch.zeros_like(info["clipped_low"])
    if mask is not None:
        loss = torch.where(mask, loss, torch.zeros((), dtype=torch.float32, device=loss.device))
    info["ratio"] = r_detached
    return loss, info


def gppo_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    eps_low: float,
    eps_high: float,
    beta_low: float = 1.0,
    beta_high: float = 1.0,
    dual_clip: float | None = None,
    mask: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Gradient-preserving clipping: PPO's value, with a bounded gradient on the clipped tokens.

    GPPO (Su et al. 2025, "Klear-Reasoner: Advancing Reasoning Capability via Gradient-Preserving Clipping
    Policy Optimization", arXiv 2508.07629) writes the clipped branch as ``(1 ± ε)·r/sg(r)``: its value is
    the clip bound, as in PPO, but its gradient is ``(1 ± ε)·∇log π`` instead of zero. CE-GPPO (Su et al.
    2025, arXiv 2509.20712) scales that gradient by β₁ on the low side (``A < 0``, ``r < 1 − ε_l``) and by
    β₂ on the high side (``A > 0``, ``r > 1 + ε_h``); GPPO is β₁ = β₂ = 1.

    Here ``l_t`` is :func:`clipped_surrogate`'s loss plus, on the
    clipped tokens, ``−β·(1 ± ε)·A·(r/sg(r) − 1)``: zero in value (the forward value is PPO's, exactly),
    gradient ``−β·(1 ± ε)·A·∇log π``. (The authors' code multiplies the value by β too; the gradient is the
    same.) β₁ = β₂ = 0 gives PPO's gradient. Unclipped and dual-clipped tokens are PPO's. The info dict is
    :func:`clipped_surrogate`'s.
    """
    if beta_low < 0 or beta_high < 0:
        raise ValueError(f"GPPO betas must be >= 0, got beta_low={beta_low}, beta_high={beta_high}")
    loss, info = clipped_surrogate(logp, old_logp, advantages, eps_low, eps_high, dual_clip, mask=mask)
    mask = None if mask is None else mask.bool()
    r = ratio(zero_outside(logp, mask), zero_outside(old_logp, mask))
    adv = per_token_advantages(advantages, r, mask)
    grad_only = r / r.detach() - 1.0  # value 0, gradient ∇log π
    zero = torch.zeros((), dtype=torch.float32, device=loss.device)
    low = torch.where(info["clipped_low"], -beta_low * (1.0 - eps_low) * adv * grad_only, zero)
    high = torch.where(info["clipped_high"], -beta_high * (1.0 + eps_high) * adv * grad_only, zero)
    return loss + low + high, info


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
