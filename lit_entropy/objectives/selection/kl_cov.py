"""KL-Cov (Cui et al. 2025): a KL penalty on the tokens of largest covariance term."""

from __future__ import annotations

import torch
from torch import Tensor

from lit_entropy.objectives.policy_loss import ratio
from lit_entropy.objectives.selection import SelectionRule, register
from lit_entropy.objectives.selection.tokens import (
    check_count,
    check_mask,
    covariance_terms,
    decimal_count,
    fraction,
    top_k,
)


def check_kl_cov_args(k: float = 2e-3, min_count: int = 1, beta: float = 1.0, **_: object) -> None:
    """Raise, naming the ``algo.selection_args`` key, on a KL-Cov setting that cannot work."""
    if not 0 <= k <= 1:
        raise ValueError(f"k must be in [0, 1], got {k} (algo.selection_args.k)")
    check_count(min_count)
    if not beta >= 0:
        raise ValueError(f"algo.selection_args.beta={beta} must be >= 0")


def kl_cov(logp: Tensor, advantages: Tensor, mask: Tensor, k: float = 2e-3,
           min_count: int = 1) -> tuple[Tensor, Tensor]:
    """KL-Cov (Cui et al. 2025): the response tokens that get the KL penalty in :func:`kl_cov_loss`.

    Rule: ``c_t = (A_t − mean A)·(logp_t − mean logp)`` (means over the ``N`` response tokens); select the
    top ``min(N, max(min_count, ⌊k·N⌋))`` response tokens by ``c_t`` (ties → earlier row-major index).
    ``min_count=1`` (the default) is Clip-Cov's at-least-one: with ``⌊k·N⌋ = 0`` (a small minibatch, the 32B
    value of ``k``) the penalty would vanish and the loss become the unclipped ``−A·r`` alone; a larger
    ``min_count`` keeps a fixed number of tokens per step in small minibatches. ``k = 0`` selects none.
    Paper values: ``k = 2e-3`` (7B class), ``2e-4`` (32B class).

    Returns ``(selected_mask [B, L] bool, frac = selected / N)``.
    """
    mask = check_mask(mask, logp)
    check_kl_cov_args(k, min_count)
    n = int(mask.sum())
    count = min(n, max(min_count, decimal_count(k, n, "floor"))) if k > 0 and n > 0 else 0
    selected = top_k(covariance_terms(logp, advantages, mask), mask, count)
    return selected, fraction(selected, n)


def kl_cov_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, selected: Tensor, beta: float = 1.0
) -> Tensor:
    """Per-token KL-Cov loss [B, L] (fp32; Cui et al. 2025). Masking is left to the aggregation.

    Rule, with the unclipped ratio ``r = exp(logp − old_logp)``::

        l_t = −A_t·r_t + beta·|logp_t − old_logp_t|    if selected_t
        l_t = −A_t·r_t                                   otherwise

    ``advantages`` is [B, L] or per sequence [B]. With ``logp == old_logp`` the penalty and its
    gradient (``sign(0) = 0``) vanish, so the loss is exactly the plain surrogate ``−A·r``.
    """
    r = ratio(logp, old_logp)
    adv = advantages.float()
    if adv.dim() == r.dim() - 1:
        adv = adv.unsqueeze(-1)
    surrogate = -adv * r
    penalty = beta * (logp.float() - old_logp.float()).abs()
    return torch.where(selected.bool(), surrogate + penalty, surrogate)



register(SelectionRule("kl_cov", kl_cov, effect="kl_selected", extra_args=("beta",), per_token_ratios=True,
                       check=check_kl_cov_args,
                       inputs={"logp": "current_logp", "advantages": "token_advantages", "mask": "mask"}))
