"""Forking tokens (Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective
Reinforcement Learning for LLM Reasoning"): only the top fraction of tokens by entropy stays in the loss."""

from __future__ import annotations

from torch import Tensor

from lit_entropy.objectives.selection import SelectionRule, register
from lit_entropy.objectives.selection.tokens import check_mask, decimal_count, fraction, top_k


def forking_tokens(entropy: Tensor, mask: Tensor, top_frac: float = 0.2) -> tuple[Tensor, Tensor]:
    """High-entropy "forking" tokens (Wang et al. 2025, "Beyond the 80/20 Rule").

    Rule: keep in the loss only the top ``⌈top_frac·N⌉`` of the ``N`` response tokens by entropy ``H_t``
    (paper: 20%); ties are broken deterministically toward the earlier token in row-major [B, L] order.

    Returns ``(keep_mask [B, L] bool (False on padding), frac_kept = kept / N)``.
    """
    mask = check_mask(mask, entropy)
    if not 0 <= top_frac <= 1:
        raise ValueError(f"top_frac must be in [0, 1], got {top_frac}")
    n = int(mask.sum())
    keep = top_k(entropy, mask, decimal_count(top_frac, n, "ceil"))
    return keep, fraction(keep, n)



register(SelectionRule("forking", forking_tokens, reports_kept=True, inputs={"entropy": "entropy", "mask": "mask"}))
