"""ERC (Su et al. 2025, arXiv 2512.05591): entropy ratio clipping. A token whose entropy moved too far from the
pre-update policy's loses its gradient; it acts on top of any loss (docs/design.md §7.8)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from lit_entropy.objectives.changes import SurrogateChange, register
from lit_entropy.objectives.entropy_methods import ErcArgs, erc_keep


def entropy_ratio_clip(args: ErcArgs, loss_tok: Tensor, entropy: Tensor | None,
                       mb: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
    """Detach the tokens whose current/old entropy ratio left ``(1 - low, 1 + high)``; those tokens."""
    if entropy is None:
        raise ValueError("algo.erc needs the current policy's entropy (entropy)")
    kept, _ = erc_keep(entropy, mb["entropy"], args.low, args.high)
    return torch.where(kept, loss_tok, loss_tok.detach()), ~kept


register(SurrogateChange("erc", ErcArgs, needs_ppo_clip=False, gradient=entropy_ratio_clip, metric="erc_clipfrac"))
