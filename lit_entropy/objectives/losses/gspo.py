"""GSPO (Zheng et al. 2025): one clipped ratio per sequence (docs/design.md §7.2)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from lit_entropy.objectives.losses import PolicyLoss, register

GSPO_LOG_RATIO_CLAMP = 10.0
"""Upper bound on GSPO's sequence log-ratio (verl clamps it at 10) and, symmetrically, the lower one."""


def gspo_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO per-token loss [B, L] (fp32): one importance ratio per sequence (Zheng et al. 2025,
    "Group Sequence Policy Optimization", GSPO-token form).

    Sequence ratio over the row's masked (response) tokens ``y_i``:
    ``s_i = exp( (1/|y_i|)·Σ_{t∈y_i} (logp_t − old_logp_t) )``.
    Token form, so the gradient flows through each token's log-prob:
    ``s_it = sg[s_i]·exp(logp_t − sg[logp_t])`` (value ``s_i``; ``∂s_it/∂logp_t = s_i``), and
    ``l_it = −min(s_it·A_i, clip(s_it, 1 − eps_low, 1 + eps_high)·A_i)``.

    The clipping decision is per sequence. Aggregated with ``seq-mean-token-mean`` (the intended mode)
    the gradient is ``−(1/S)·Σ_i s_i·A_i·(1/|y_i|)·Σ_t ∇logp_t`` over unclipped sequences, which is GSPO's
    sequence-level gradient; clipped sequences get none. ``advantages`` is per sequence [B] (per-token
    [B, L] is accepted: GSPO-token). The ``mask`` defines ``y_i`` (a selection mask therefore also
    changes the sequence ratio); positions outside it are replaced by zeros with ``torch.where`` before
    any arithmetic, so garbage there (even NaN) yields a finite zero loss and an exactly zero gradient.
    A row with no masked token gets ``s_i = 1`` and zero loss.

    Info (all detached): bool [B, L] ``clipped_low`` (``A < 0``, ``s_i < 1 − eps_low``), ``clipped_high``
    (``A > 0``, ``s_i > 1 + eps_high``) — the sequence decision broadcast to its masked tokens —,
    ``dual_clipped`` (all False, for parity with :func:`~lit_entropy.objectives.losses.ppo.clipped_surrogate`), ``ratio`` [B, L]
    (``s_i`` broadcast) and ``seq_ratio`` [B].
    """
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"clip ranges must be >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    mask = mask.bool()
    zero = torch.zeros((), dtype=torch.float32, device=logp.device)
    lp = torch.where(mask, logp.float(), zero)
    old = torch.where(mask, old_logp.float(), zero)
    adv = advantages.float()
    if adv.dim() == lp.dim() - 1:
        adv = adv.unsqueeze(-1)
    adv = torch.where(mask, adv.expand_as(lp), zero)

    lengths = mask.sum(dim=-1)
    seq_log_ratio = (lp - old).sum(dim=-1) / lengths.clamp(min=1).to(torch.float32)
    seq_log_ratio = seq_log_ratio.clamp(-GSPO_LOG_RATIO_CLAMP, GSPO_LOG_RATIO_CLAMP)  # exp stays finite
    seq_ratio = torch.exp(seq_log_ratio.detach())  # sg[s_i]
    token_ratio = seq_ratio.unsqueeze(-1) * torch.exp(lp - lp.detach())  # value s_i, d/dlogp_t = s_i
    # (|log s_i| is bounded by GSPO_LOG_RATIO_CLAMP, so s_i and its gradient stay finite.)

    unclipped = token_ratio * adv
    clipped = torch.clamp(token_ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    loss = torch.where(mask, -torch.minimum(unclipped, clipped), zero)

    r = seq_ratio.unsqueeze(-1).expand_as(lp)
    info = {
        "clipped_low": mask & (adv < 0) & (r < 1.0 - eps_low),
        "clipped_high": mask & (adv > 0) & (r > 1.0 + eps_high),
        "dual_clipped": torch.zeros_like(mask),
        "ratio": r,
        "seq_ratio": seq_ratio,
    }
    return loss, info


def gspo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float,
         knobs: Mapping[str, Any], dual_clip: float | None) -> tuple[Tensor, dict[str, Tensor]]:
    return gspo_surrogate(logp, old_logp, advantages, mask, eps_low, eps_high)


register(PolicyLoss("gspo", gspo, per_sequence=True))
