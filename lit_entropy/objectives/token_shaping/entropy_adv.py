"""Entropy-based advantage shaping (Cheng et al. 2025, "Reasoning with Exploration: An Entropy Perspective", arXiv
2506.14758): ``A′_t = A + min(α·H_t, |A|/κ)``."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_entropy.objectives.token_shaping import check_shapes, register


def entropy_advantage(advantages: Tensor, entropy: Tensor, response_mask: Tensor,
                      alpha: float = 0.4, kappa: float = 2.0) -> Tensor:
    """Entropy-based advantage shaping (Cheng et al. 2025, arXiv 2506.14758), fp32 [B, L].

    ``A′_t = A + ψ(H_t)`` with ``ψ(H_t) = min(α·sg(H_t), |A|/κ)`` on every response token, whatever the
    sign of A. The entropy term carries no gradient (it only rescales the advantage); the cap ``|A|/κ`` with
    κ > 1 keeps ``ψ`` below ``|A|``, so a negative advantage is softened but never flipped, and a zero
    advantage (an all-equal group) stays 0. High-entropy tokens of correct answers are pushed up more and
    those of wrong answers down less, which the paper reports lengthens reasoning and raises pass@K.
    Defaults α = 0.4, κ = 2 are the paper's. ``advantages`` are per sequence [B].

    The paper's code reads H_t from the update's own forward (the current policy, detached); here it is the
    pre-update pass, i.e. the policy that sampled the batch. Both are the same on the first optimizer step
    of an iteration and drift apart by one iteration's updates at most.
    """
    mask = check_shapes(entropy, response_mask, advantages.shape[0])
    a = advantages.detach().float()[:, None].expand(mask.shape)
    h = torch.where(mask, entropy.detach().float(), 0.0)
    shaped = a + torch.minimum(alpha * h, a.abs() / kappa)
    return torch.where(mask, shaped, 0.0)


def check(args: dict[str, Any]) -> None:
    """α ≥ 0 and κ > 0."""
    if not float(args.get("alpha", 0.4)) >= 0:
        raise ValueError(f"algo.token_shaping_args.alpha={args['alpha']} must be >= 0")
    if not float(args.get("kappa", 2.0)) > 0:
        raise ValueError(f"algo.token_shaping_args.kappa={args['kappa']} must be > 0")


def shaped(advantages: Tensor, rewards: Tensor, entropy: Tensor, mask: Tensor, group_size: int,
           **args: Any) -> tuple[Tensor, Tensor]:
    """The estimator's per-sequence advantages kept, the tokens shaped."""
    return advantages, entropy_advantage(advantages, entropy, mask, **args)


register("entropy_adv", shaped, args=("alpha", "kappa"), check=check)
