"""W-REINFORCE (Zhu et al. 2025): +λ for a correct completion, −1 for a wrong one, no baseline."""

from __future__ import annotations

import torch
from torch import Tensor

from lit_entropy.objectives.advantages import register
from lit_entropy.objectives.advantages.groups import check_rows


def w_reinforce(
    rewards: Tensor,
    correct_threshold: float = 1.0,
    lam: float = 0.1,
    *,
    group_size: int | None = None,
) -> Tensor:
    """W-REINFORCE advantages (Zhu et al. 2025, "The Surprising Effectiveness of Negative
    Reinforcement in LLM Reasoning"), fp32 [B].

    ``A_i = +λ`` if ``R_i >= correct_threshold`` (correct), else ``−1`` (incorrect): the objective
    ``λ·PSR + NSR`` that down-weights positive-sample reinforcement. There is no baseline, so
    all-equal groups still get ``+λ`` / ``−1`` and ``G = 1`` is fine.

    ``group_size`` is only there so the dispatcher can call every estimator the same way; it does not
    change the result. When given, it is checked for consistency (``G >= 1``, ``B`` a multiple of ``G``),
    since a mismatch means the batch is not laid out in groups as the caller thinks.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if group_size is not None:
        check_rows(rewards, group_size, min_group_size=1)
    correct = rewards.float() >= correct_threshold
    return torch.where(
        correct,
        torch.full(rewards.shape, float(lam), dtype=torch.float32, device=rewards.device),
        torch.full(rewards.shape, -1.0, dtype=torch.float32, device=rewards.device),
    )


register("w_reinforce", w_reinforce, options=("lam", "correct_threshold"), baseline=False)
