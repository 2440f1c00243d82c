"""Pass@k training (Chen et al. 2025, arXiv 2508.10751): the closed-form group advantage of pass@k."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lit_entropy.objectives.advantages import register
from lit_entropy.objectives.advantages.groups import by_group


def pass_at_k(rewards: Tensor, group_size: int, k: int = 4, correct_threshold: float = 1.0,
              eps: float = 1e-6) -> Tensor:
    """Pass@k-training advantages (Chen et al. 2025, "Pass@k Training for Adaptively Balancing
    Exploration and Exploitation of Large Reasoning Models", arXiv 2508.10751), fp32 [B].

    The analytical form of their bootstrap: the group of N = G responses with c correct is split into all
    C(N, k) subsets of k; a subset scores 1 if any member is correct (its pass@k); each response's advantage
    is the group-normalised score averaged over the subsets it belongs to. In closed form, with
    ``ρ = 1 − C(N−c, k)/C(N, k)`` (mean subset score) and ``σ = sqrt(ρ(1 − ρ))``:

    * correct response: ``A⁺ = (1 − ρ)/(σ + eps)``;
    * wrong response: ``A⁻ = (1 − ρ − C(N−c−1, k−1)/C(N−1, k−1))/(σ + eps)``.

    k = 1 gives GRPO with the population std. Rewards count as correct when ``R ≥ correct_threshold``:
    the closed form is for binary outcomes, so non-binary rewards are binarised (their size is lost).
    All-correct and all-wrong groups give 0. Raises ``ValueError`` unless ``1 ≤ k ≤ G``.
    """
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= group_size:
        raise ValueError(f"k={k!r} must be an integer in [1, group_size={group_size}]")
    correct = by_group(rewards, group_size) >= correct_threshold
    n = group_size
    table = torch.zeros(n + 1, 2, dtype=torch.float64)  # row c: (A⁺, A⁻) for a group with c correct
    for c in range(1, n):
        rho = 1 - math.comb(n - c, k) / math.comb(n, k)
        sigma = math.sqrt(rho * (1 - rho))
        miss = math.comb(n - c - 1, k - 1) / math.comb(n - 1, k - 1)
        table[c] = torch.tensor([(1 - rho) / (sigma + eps), (1 - rho - miss) / (sigma + eps)])
    per_group = table.float().to(rewards.device)[correct.sum(dim=1)]  # [B // G, 2]
    return torch.where(correct, per_group[:, :1], per_group[:, 1:]).reshape(-1)


register("passk", pass_at_k, options=("k", "correct_threshold", "eps"))
