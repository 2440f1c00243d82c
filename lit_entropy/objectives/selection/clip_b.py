"""Clip-B (Wang et al. 2026, entropy discriminator clipping): the tokens whose discriminator score S is far out
of the batch's, by the sign of their advantage; ``S`` comes from :func:`lit_entropy.diagnostics.discriminator.token_scores`."""

from __future__ import annotations

from torch import Tensor

from lit_entropy.objectives.selection import SelectionRule, register
from lit_entropy.objectives.selection.tokens import check_mask, fraction, mean_over, per_token, pop_std


def clip_b(S: Tensor, advantages: Tensor, mask: Tensor, mu: float = 2.5) -> tuple[Tensor, Tensor]:
    """Clip_B (Wang et al. 2026): batch-normalised discriminator clipping of negative-advantage tokens.

    Rule: over the ``N`` response tokens, ``z_t = S_t − mean S`` and ``σ`` = population std of ``S``
    (``S_t = p_t·(H_t + log p_t)``). A response token with ``A_t < 0`` and ``z_t < −mu·σ`` (strict) is
    removed from the loss; tokens with ``A_t ≥ 0`` are always kept. ``σ = 0`` removes nothing.

    Returns ``(keep_mask, frac_removed)``: ``keep_mask`` is ``mask`` minus the removed tokens (False on
    padding, usable directly as the loss mask), ``frac_removed = removed / N``.
    """
    mask = check_mask(mask, S)
    adv = per_token(advantages, mask)
    n = int(mask.sum())
    z = S.detach().float() - mean_over(S, mask, n)
    removed = mask & (adv < 0) & (z < -mu * pop_std(S, mask, n))
    return mask & ~removed, fraction(removed, n)



register(SelectionRule("clip_b", clip_b, inputs={"S": "disc_s", "advantages": "token_advantages", "mask": "mask"}))
