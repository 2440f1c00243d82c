"""Clip-V (Wang et al. 2026): as Clip-B against the score's on-policy baseline N."""

from __future__ import annotations

from torch import Tensor

from lit_entropy.objectives.selection import SelectionRule, register
from lit_entropy.objectives.selection.tokens import (
    check_mask,
    decimal_count,
    fraction,
    masked,
    per_token,
    pop_std,
    top_k,
)


def clip_v(
    S: Tensor, N: Tensor, advantages: Tensor, mask: Tensor, mu: float = 8.5, max_frac: float = 1e-4
) -> tuple[Tensor, Tensor]:
    """Clip_V (Wang et al. 2026): vocabulary-baseline discriminator clipping, capped.

    Rule: ``D_t = N_t − S_t`` (``N_t = Σ_v p_v²(H_t + log p_v)``, the on-policy mean of ``S_t``, so ``D`` is
    the negative centred score and is not re-centred here). ``σ_D`` = population std of ``D`` over the
    ``N`` response tokens. A response token with ``A_t < 0`` and ``D_t > mu·σ_D`` (strict) qualifies. At
    most ``K = ⌊max_frac·N⌋`` tokens are removed: if more qualify, the ``K`` with the largest ``D`` are
    removed (ties → earlier row-major index).

    Decision on the cap: ``K = ⌊max_frac·N⌋`` with no ``max(1, ·)``, so the removed fraction never
    exceeds ``max_frac`` (docs/design.md §7.3). Consequently ``K = 0`` — and nothing is
    removed — when ``N < 1 / max_frac`` (10,000 response tokens at the default): raise ``max_frac`` for
    small minibatches. ``frac_removed`` shows it. This matches :func:`kl_cov`'s ``⌊k·N⌋ = 0`` → none.

    Returns ``(keep_mask, frac_removed)``: ``keep_mask`` is ``mask`` minus the removed tokens (False on
    padding), ``frac_removed = removed / N``.
    """
    mask = check_mask(mask, S, N)
    if not 0 <= max_frac <= 1:
        raise ValueError(f"max_frac must be in [0, 1], got {max_frac}")
    adv = per_token(advantages, mask)
    n = int(mask.sum())
    d = masked(N, mask) - masked(S, mask)
    qualifies = mask & (adv < 0) & (d > mu * pop_std(d, mask, n))
    removed = top_k(d, qualifies, decimal_count(max_frac, n, "floor"))
    return mask & ~removed, fraction(removed, n)



register(SelectionRule("clip_v", clip_v,
                       inputs={"S": "disc_s", "N": "disc_n", "advantages": "token_advantages", "mask": "mask"}))
