"""PPO-style clipped policy loss and token-mean aggregation (DESIGN §7.2, §8).

Everything is computed in fp32 whatever the dtype of the inputs: a bf16-rounded ratio biases clipping.
"""

from __future__ import annotations

import torch
from torch import Tensor


def ratio(logp: Tensor, old_logp: Tensor) -> Tensor:
    """Importance ratio ``r = exp(logp − old_logp)`` in fp32."""
    return torch.exp(logp.float() - old_logp.float())


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token clipped surrogate loss [B, L] (fp32) and per-token clip indicators.

    ``l_t = −min(r·A, clip(r, 1 − eps_low, 1 + eps_high)·A)`` with ``r = exp(logp − old_logp)``.
    With ``dual_clip = c`` (> 1, e.g. 3) the loss of negative-advantage tokens is capped:
    ``l_t = min(l_t, −c·A)`` for ``A < 0``, i.e. at most ``c·|A|``.

    ``advantages`` is per token [B, L] or per sequence [B] (broadcast over tokens).

    The dict holds bool [B, L] tensors ``clipped_low`` (``A < 0`` and ``r < 1 − eps_low``: the clipped
    branch is active, no gradient), ``clipped_high`` (``A > 0`` and ``r > 1 + eps_high``),
    ``dual_clipped`` (``A < 0`` and the dual-clip cap is active) and the detached fp32 ``ratio``.
    Masking is left to the aggregation.
    """
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"clip ranges must be >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    r = ratio(logp, old_logp)
    adv = advantages.float()
    if adv.dim() == r.dim() - 1:  # per-sequence [B] against per-token [B, L]
        adv = adv.unsqueeze(-1)
    adv = adv.expand_as(r)

    unclipped = r * adv
    clipped = torch.clamp(r, 1.0 - eps_low, 1.0 + eps_high) * adv
    loss = -torch.minimum(unclipped, clipped)

    r_detached = r.detach()
    info = {
        "clipped_low": (adv < 0) & (r_detached < 1.0 - eps_low),
        "clipped_high": (adv > 0) & (r_detached > 1.0 + eps_high),
    }
    if dual_clip is not None:
        cap = -dual_clip * adv
        dual_active = (adv < 0) & (loss.detach() > cap)
        loss = torch.where(dual_active, cap, loss)
        info["dual_clipped"] = dual_active
    else:
        info["dual_clipped"] = torch.zeros_like(info["clipped_low"])
    info["ratio"] = r_detached
    return loss, info


def aggregate_token_mean(values: Tensor, mask: Tensor, num_tokens: float | Tensor | None = None) -> Tensor:
    """Token-mean aggregation, ``Σ_t values_t·M_t / num_tokens`` (fp32 scalar).

    ``num_tokens`` defaults to ``M.sum()``. When a minibatch is split into micro-batches, pass the
    token count of the whole minibatch (global over micro-batches and ranks) so that the micro-batch
    losses sum exactly to the minibatch loss. With ``num_tokens == 0`` a zero is returned that still
    has a gradient path to ``values``. Positions outside the mask never contribute, even if non-finite.
    """
    mask = mask.bool()
    masked = torch.where(mask, values.float(), torch.zeros((), dtype=torch.float32, device=values.device))
    if num_tokens is None:
        num_tokens = mask.sum()
    total = masked.sum()
    if isinstance(num_tokens, Tensor):
        # Stays on device (no host sync): a zero count selects ``total * 0``.
        denom = num_tokens.to(device=total.device, dtype=torch.float32)
        return torch.where(denom > 0, total / denom.clamp(min=1e-30), total * 0.0)
    if not num_tokens >= 0:
        raise ValueError(f"num_tokens must be a non-negative count, got {num_tokens}")
    if num_tokens == 0:
        return total * 0.0
    return total / float(num_tokens)


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """``Σ values·M / Σ M`` in fp32; 0 (with a gradient path) when the mask is empty."""
    return aggregate_token_mean(values, mask)
