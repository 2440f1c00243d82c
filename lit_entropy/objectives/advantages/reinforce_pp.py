"""REINFORCE++-baseline (Hu et al. 2025): the group mean, then whitening over the batch."""

from __future__ import annotations

import torch
from torch import Tensor

from lit_entropy.objectives.advantages import register
from lit_entropy.objectives.advantages.groups import by_group


def reinforce_pp_baseline(rewards: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """REINFORCE++-baseline advantages (Hu et al. 2025, "REINFORCE++: An Efficient RLHF Algorithm
    with Robustness to Both Prompt and Reward Models"), fp32 [B].

    Two steps: ``x_i = R_i − mean_G R`` (group baseline), then whitening over the whole batch,
    ``A_i = (x_i − mean_B x) / (std_B x + eps)``.

    * The batch statistics are over **sequences**: each of the ``B`` rows counts once, whatever its
      response length (reference implementations whiten over tokens, which weighs long responses more).
      Rows of all-equal groups take part with ``x = 0`` (they pull ``std_B`` down) and are then set back
      to exactly 0.
    * ``std_B`` is the **population** standard deviation (``correction=0``), so with ``eps = 0`` the
      output has batch mean 0 and population std 1 exactly (up to rounding). Note that :func:`grpo`
      uses the unbiased std within a group instead.
    * When the whole batch has zero variance (every group all-equal) the result is all zeros, not NaN,
      for any ``eps`` including 0.

    Raises ``ValueError`` for ``G < 2`` or ``B`` not a multiple of ``G``.
    """
    grouped = by_group(rewards, group_size)
    flat = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    centred = torch.where(flat, torch.zeros_like(grouped), grouped - grouped.mean(dim=1, keepdim=True))
    x = centred.reshape(-1)
    std = x.std(correction=0)
    positive = std > 0
    denom = torch.where(positive, std + eps, torch.ones_like(std))
    whitened = torch.where(positive, (x - x.mean()) / denom, torch.zeros_like(x))
    return torch.where(flat.expand_as(grouped).reshape(-1), torch.zeros_like(whitened), whitened)


register("reinforce_pp", reinforce_pp_baseline, options=("eps",))
