"""``2R − 1``: the reward on ±1 with no baseline (TOPR's setting, Le Roux et al. 2025)."""

from __future__ import annotations

from torch import Tensor

from lit_entropy.objectives.advantages import register
from lit_entropy.objectives.advantages.groups import check_rows


def signed(rewards: Tensor, *, group_size: int | None = None) -> Tensor:
    """The reward on ±1 with no baseline, ``A_i = 2R_i − 1``, fp32 [B]: TOPR's setting (Le Roux et al. 2025,
    "Tapered Off-Policy REINFORCE", arXiv 2503.14286: +1 for a correct completion, −1 for a wrong one, REINFORCE
    with no baseline, which the paper shows would change the effective share of positive samples).

    Rewards here lie in [0, 1] with 1 correct, so binary rewards give exactly +1 / −1; other rewards (a shaped
    reward, DAPO's overlong penalty) are mapped by the same affine map, keeping their order and spacing. No
    baseline: all-equal groups keep their ±1 and ``G = 1`` is fine; ``group_size`` is only checked (as in
    :func:`w_reinforce`).
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if group_size is not None:
        check_rows(rewards, group_size, min_group_size=1)
    return 2.0 * rewards.float() - 1.0


register("signed", signed, options=(), baseline=False)
