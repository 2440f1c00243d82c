"""MaxRL (Tajwar et al. 2026, arXiv 2602.02710): the group mean divides instead of the std."""

from __future__ import annotations

import torch
from torch import Tensor

from lit_entropy.objectives.advantages import register
from lit_entropy.objectives.advantages.groups import by_group


def maxrl(rewards: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """MaxRL advantages (Tajwar et al. 2026, "Maximum Likelihood Reinforcement Learning", arXiv 2602.02710;
    prime-rl ``max_rl``, TRL ``MaxRLTrainer``'s p-normalisation), fp32 [B].

    ``A_i = (R_i − mean_G R)/(mean_G R + eps)``. With binary rewards and c of G correct (p = c/G) a correct
    response gets ``(1 − p)/p`` and a wrong one ``−1``: the group's gradient is weighted by ``1/p``, the
    gradient of ``log p`` (the likelihood of success) instead of ``p`` (pass@1), so hard prompts weigh more.
    The rewards should be non-negative (a mean near 0 from mixed signs would blow up). All-equal groups
    (all wrong included) give exactly 0.
    """
    grouped = by_group(rewards, group_size)
    mean = grouped.mean(dim=1, keepdim=True)
    centred = (grouped - mean) / (mean + eps)
    flat = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    return torch.where(flat, torch.zeros_like(centred), centred).reshape(-1)


register("maxrl", maxrl, options=("eps",))
