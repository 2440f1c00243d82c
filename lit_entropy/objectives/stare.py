"""The pure parts of STARE (Luo et al. 2026, arXiv 2606.19236; code github.com/hp-luo/STARE; docs/design.md §7.4.8).

STARE's first-order analysis splits a token's entropy change into its advantage times an entropy sensitivity that
grows with the token's surprisal ``s_t = −log π(y_t)``. Four quadrants follow:

============  ==========================  ====================================
              low surprisal               high surprisal
============  ==========================  ====================================
``A > 0``     entropy falls (most tokens)  entropy rises: ``L⁺``, entropy-critical
``A < 0``     entropy rises (most tokens)  entropy falls: ``L⁻``, entropy-critical
============  ==========================  ====================================

STARE picks the critical tokens by a quantile of surprisal inside the batch (the top ``P`` of the positive-advantage
tokens by surprisal are ``L⁺``, the top ``P`` of the negative ones ``L⁻``) and multiplies their advantages by a
weight ω: ``W > 1`` on ``L⁺`` (more of the entropy-raising push), and in variant C2 also ``M < 1`` on ``L⁻`` (less of
the entropy-lowering one). A closed loop gates it: ω applies only while the batch entropy is under a target.

Where ω is computed, two ways (the controller's ``rank``, :class:`~lit_entropy.callbacks.stare.STARECallback`):

* ``micro_batch`` (the default, the authors' code): in every micro-batch of the update, on that micro-batch's
  tokens, ranked by the **current** policy's log-probs (the update's own forward, detached), ω multiplies the
  per-token surrogate loss (:func:`micro_batch_weights`, applied by :func:`lit_entropy.objectives.objective.
  micro_batch_loss` while the knob ``stare_top_frac`` > 0). The controller only sets the knobs ``stare_w``,
  ``stare_m`` (1 while its gate is shut) and ``stare_top_frac``.
* ``iteration``: once per iteration, over the whole batch, ranked by the pre-update log-probs; the controller
  multiplies ``token_advantages`` by ω (equal to weighting the loss, since ω > 0 and PPO's clip and dual clip are
  positively homogeneous in A), so everything that reads the advantages sees them reweighted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

VARIANTS = ("o1", "c2")
"""``o1``: one-sided, ω = W on ``L⁺`` only (the paper's default); ``c2``: also ω = M on ``L⁻``."""


def top_surprisal(surprisal: Tensor, candidates: Tensor, top_frac: float) -> Tensor:
    """The ``k = max(1, ⌈top_frac·n⌉)`` candidates with the highest surprisal (bool, like ``candidates``), where
    ``n`` is the number of candidates; none when there are none. Ties at the cut are broken by ``torch.topk``."""
    if not 0 < top_frac <= 1:
        raise ValueError(f"top_frac={top_frac} must be in (0, 1]")
    chosen = torch.zeros_like(candidates, dtype=torch.bool)
    flat = candidates.reshape(-1).nonzero().squeeze(-1)
    n = flat.numel()
    if n == 0:
        return chosen
    k = min(n, max(1, math.ceil(top_frac * n)))
    top = torch.topk(surprisal.reshape(-1)[flat].float(), k, largest=True).indices
    chosen.view(-1)[flat[top]] = True
    return chosen


def stare_weights(token_advantages: Tensor, logp: Tensor, mask: Tensor, top_frac: float, w: float, m: float,
                  variant: str = "o1") -> tuple[Tensor, Tensor, Tensor]:
    """STARE's token weights ω [B, L] (fp32, no gradient) and the masks of ``L⁺`` and ``L⁻``.

    ``token_advantages``, ``logp`` (the sampled tokens' log-probs that rank the surprisal: the current policy's in
    :func:`micro_batch_weights`, the pre-update pass's in the controller's ``rank: iteration``) and ``mask`` (the
    response tokens of the rows that train) are [B, L]. ``L⁺``: the
    ``top_frac`` of the tokens with ``A > 0`` with the highest surprisal ``−logp``; ``L⁻``: the same of the tokens with
    ``A < 0``; tokens with ``A = 0`` are in neither. ω = ``w`` on ``L⁺``, ``m`` on ``L⁻`` in variant ``c2``, else 1
    (``L⁻`` is still returned in ``o1``, for its metric). Positions off ``mask`` get 1 and are in neither set.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r}; choose one of {VARIANTS}")
    if not (w > 0 and m > 0):
        raise ValueError(f"STARE's weights must be > 0, got w={w}, m={m}")
    if not token_advantages.shape == logp.shape == mask.shape or logp.dim() != 2:
        raise ValueError(f"token_advantages {tuple(token_advantages.shape)}, logp {tuple(logp.shape)} and mask "
                         f"{tuple(mask.shape)} must all be [B, L]")
    mask = mask.bool()
    adv = token_advantages.detach().float()
    surprisal = torch.where(mask, -logp.detach().float(), 0.0)
    l_plus = top_surprisal(surprisal, mask & (adv > 0), top_frac)
    l_minus = top_surprisal(surprisal, mask & (adv < 0), top_frac)
    weights = torch.ones_like(adv)
    weights = torch.where(l_plus, torch.tensor(float(w)), weights)
    if variant == "c2":
        weights = torch.where(l_minus, torch.tensor(float(m)), weights)
    return weights, l_plus, l_minus


def is_on(knobs: Mapping[str, Any]) -> bool:
    """STARE's token weights are in the loss (the knob ``stare_top_frac`` > 0; with ``stare_w = stare_m = 1`` they
    are all 1 and only the count ``train/stare_reweighted_frac`` = 0 is logged)."""
    return knobs.get("stare_top_frac", 0.0) > 0


def micro_batch_weights(knobs: Mapping[str, Any], token_advantages: Tensor, logp: Tensor,
                        mask: Tensor) -> tuple[Tensor, Tensor]:
    """ω [B, L] of one micro-batch and the tokens it reweights (ω ≠ 1), as the authors' ``compute_stare_token_weights``
    (hp-luo/STARE, ``verl/trainer/ppo/core_algos.py``): the surprisal is ``−logp`` of the **current** policy
    (``logp``, the update's forward; detached: it only picks tokens), the candidates are this micro-batch's loss
    tokens (``mask``) by the sign of their advantage, ``L⁺`` gets ``stare_w`` and ``L⁻`` gets ``stare_m`` (the
    controller sets ``stare_m = 1`` in variant ``o1``, where the authors leave ``L⁻`` alone)."""
    w, m = float(knobs["stare_w"]), float(knobs["stare_m"])
    if w == m == 1.0:  # the gate is shut: nothing to rank
        return torch.ones_like(logp, dtype=torch.float32), torch.zeros_like(mask, dtype=torch.bool)
    weights, _, _ = stare_weights(token_advantages, logp, mask, float(knobs["stare_top_frac"]), w, m, variant="c2")
    return weights, weights != 1


def adapt_weights(w: float, m: float, entropy: float, target: float, alpha: float, w_max: float,
                  m_min: float) -> tuple[float, float]:
    """STARE's optional adaptive schedule (the paper's §4.4), one step per iteration whatever the gate says:
    ``W ← clip(W + α·sign(H* − H), 1, w_max)`` and ``M ← clip(M − α·sign(H* − H), m_min, 1)``: entropy under the
    target strengthens both weights, above it relaxes them toward 1."""
    step = alpha * ((target > entropy) - (target < entropy))
    # rounded like the other controllers' steps: k steps of alpha land exactly on 1 + k*alpha and on the bounds
    return min(max(round(w + step, 12), 1.0), w_max), min(max(round(m - step, 12), m_min), 1.0)
