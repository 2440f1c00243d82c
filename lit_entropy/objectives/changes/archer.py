"""Archer (Wang et al. 2025, arXiv 2507.15778): dual-token constraints. The high-entropy (reasoning) tokens of each
response get their own, looser clip range ``eps`` (and, in the KL term, their own weight ``kl_high``); the
low-entropy (knowledge) tokens keep the clip knobs and ``kl_coef`` (docs/design.md §7.8)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from lit_entropy.objectives.changes import Clipped, SurrogateChange, register
from lit_entropy.objectives.entropy_methods import ArcherArgs, high_entropy_tokens
from lit_entropy.objectives.policy_loss import global_counts


def split(args: ArcherArgs, mb: Mapping[str, Tensor], kept: Tensor, loss_mask: Tensor) -> dict[str, Tensor]:
    """The high-entropy tokens, by the quantile over every response token (the authors' script), and the
    minibatch's loss tokens on each side (each side's KL is its own mean: the KL term reads them)."""
    high = high_entropy_tokens(mb["entropy"], mb["response_mask"], args.quantile)
    n_high, _ = global_counts(loss_mask & high)
    n_low, _ = global_counts(loss_mask & ~high)
    return {"archer_high": high, "archer_n_high": n_high, "archer_n_low": n_low}


def dual_clip_range(args: ArcherArgs, loss_tok: Tensor, info: dict[str, Tensor], clipped: Clipped, logp: Tensor,
                    advantages: Tensor, prepared: Mapping[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
    """The high-entropy tokens' surrogate at the clip range ``(eps, eps)``, the others' as it was."""
    high = prepared["archer_high"]
    loss_hi, info_hi = clipped(logp, advantages, args.eps, args.eps)
    return torch.where(high, loss_hi, loss_tok), {k: torch.where(high, info_hi[k], v) for k, v in info.items()}


def needs_kl(args: ArcherArgs, algo: Any) -> None:
    if args.kl_high > 0 and not algo.kl_coef > 0:
        raise ValueError("algo.archer.kl_high > 0 needs algo.kl_coef > 0 (the KL term and its reference "
                         "model are on only then; kl_coef is the low-entropy tokens' weight)")


register(SurrogateChange("archer", ArcherArgs, prepare=split, surrogate=dual_clip_range, check=needs_kl))
