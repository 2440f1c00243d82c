"""QAE (Wu et al. 2025, arXiv 2509.22611): the group's K-quantile as baseline."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lit_entropy.objectives.advantages import register
from lit_entropy.objectives.advantages.groups import by_group


def qae(rewards: Tensor, group_size: int, quantile_k: float = 0.4, eps: float = 1e-6) -> Tensor:
    """QAE advantages (Wu et al. 2025, "Quantile Advantage Estimation for Entropy-Safe Reasoning",
    arXiv 2509.22611), fp32 [B].

    ``A_i = (R_i − b_K)/(std_G R + eps)``: GRPO with the group mean replaced by the K-quantile
    ``b_K = inf{x : F_G(x) ≥ K}`` of the group's rewards (F_G their empirical CDF), i.e. the
    ``⌈K·G⌉``-th smallest reward; ``std_G`` is the unbiased group std, as in :func:`grpo`. With binary
    rewards and success rate p, ``b_K = 0`` when ``p ≤ 1 − K`` (only the successes learn, A > 0) and
    ``b_K = 1`` otherwise (only the failures learn, A < 0): most responses get advantage 0 exactly. K = 0.4
    is the value of the paper's figures. ``⌈K·G⌉`` is taken with a 1e-9 tolerance so that e.g. K·G = 2 in
    floating point counts as 2. All-equal groups give 0. Raises ``ValueError`` for ``K ∉ (0, 1)``.
    """
    if not 0 < quantile_k < 1:
        raise ValueError(f"quantile_k={quantile_k} must be in (0, 1)")
    grouped = by_group(rewards, group_size)
    rank = min(max(math.ceil(quantile_k * group_size - 1e-9), 1), group_size)
    baseline = grouped.sort(dim=1).values[:, rank - 1 : rank]
    centred = (grouped - baseline) / (grouped.std(dim=1, keepdim=True, correction=1) + eps)
    flat = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    return torch.where(flat, torch.zeros_like(centred), centred).reshape(-1)


register("qae", qae, options=("quantile_k", "eps"))
