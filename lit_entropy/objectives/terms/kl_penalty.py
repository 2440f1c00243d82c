"""The KL penalty to the reference policy (``kl_coef``; Archer's two weights when Archer is on)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_entropy.objectives.correction import kl_bias_correction_ratio
from lit_entropy.objectives.policy_loss import aggregate_token_mean
from lit_entropy.objectives.terms import LossTerm, TermInputs, register


def kl_penalty(t: TermInputs, coef: Any) -> Tensor:
    """coef · aggregated KL estimate to the reference (``algo.kl_kind``, ``algo.kl_clamp``); with
    ``kl_bias_correction`` each token's estimate is multiplied by π_θ/π_old, with its gradient (TRL,
    DeepSeek-V3.2).

    Archer: ``coef · mean_low(KL) + kl_high · mean_high(KL)``, each group's KL averaged over that group's own
    tokens of the minibatch, as the authors' script does under token-mean (a low-entropy token then weighs
    N/N_low times what a plain token-mean gives it). Under the other aggregations the high-entropy tokens'
    KL is weighted by ``kl_high`` instead of ``coef`` and aggregated like the loss."""
    kl = t.kl_tokens
    if t.kl_bias_correction:
        kl = kl * kl_bias_correction_ratio(t.logp, t.mb["old_logp"], t.mask)
    high = t.prepared.get("archer_high")
    if high is None:
        return coef * t.aggregate(kl)
    if t.algo.loss_agg == "token-mean":
        p = t.prepared
        return (coef * aggregate_token_mean(kl, t.mask & ~high, p["archer_n_low"])
                + t.algo.archer.kl_high * aggregate_token_mean(kl, t.mask & high, p["archer_n_high"]))
    weight = torch.where(high, float(t.algo.archer.kl_high), float(coef))
    return t.aggregate(weight * kl)


register(LossTerm("kl_penalty", "kl_coef", kl_penalty, needs=("ref_logp",)))
