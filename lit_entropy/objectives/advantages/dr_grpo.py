"""Dr.GRPO (Liu et al. 2025): the group mean as baseline, no scale."""

from __future__ import annotations

from torch import Tensor

from lit_entropy.objectives.advantages import register
from lit_entropy.objectives.advantages.grpo import grpo


def dr_grpo(rewards: Tensor, group_size: int) -> Tensor:
    """Dr.GRPO advantages (Liu et al. 2025, "Understanding R1-Zero-Like Training"), fp32 [B].

    ``A_i = R_i − mean_G R``: the group mean is subtracted and, unlike GRPO, nothing is divided by the
    group std (which up-weights near-flat groups). Same as ``grpo(rewards, group_size, scale_std=False)``.
    All-equal groups give exactly 0. Raises ``ValueError`` for ``G < 2`` or ``B`` not a multiple of ``G``.
    """
    return grpo(rewards, group_size, scale_std=False)


register("dr_grpo", dr_grpo, options=())
