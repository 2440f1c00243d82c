"""Per-token KL estimators to a reference policy (docs/design.md §7.2).

J. Schulman, "Approximating KL Divergence" (2020). For a token sampled from the current policy
``π_θ`` with ``log_ratio = ref_logp − logp = log(π_ref/π_θ)``:

* ``k1 = −log_ratio = logp − ref_logp``: unbiased for ``KL(π_θ‖π_ref)``, high variance, can be < 0.
* ``k2 = ½·log_ratio²``: biased (second-order accurate when the policies are close), low variance, ≥ 0.
* ``k3 = exp(log_ratio) − log_ratio − 1``: unbiased (``E_{π_θ}[π_ref/π_θ] = 1``), low variance, ≥ 0.

All estimators are computed in fp32. For ``k3`` the log-ratio is clamped to ``[−20, 20]`` before use
(both in the ``exp`` and in the linear term, so ``k3 = f(clamp(x))`` with ``f(x) = eˣ − x − 1 ≥ 0``):
this avoids ``exp`` overflow (and inf/NaN gradients) on tokens where the two policies disagree
wildly; on such tokens the estimate saturates and carries no gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_entropy.objectives.policy_loss import aggregate

KL_KINDS: tuple[str, ...] = ("k1", "k2", "k3")

K3_LOG_RATIO_CLAMP = 20.0


def kl_estimate(
    logp: Tensor, ref_logp: Tensor, kind: str, mask: Tensor | None = None, clamp: float | None = None
) -> Tensor:
    """Per-token estimate [B, L] (fp32) of ``KL(π_θ‖π_ref)`` from the sampled tokens' log-probs.

    ``logp`` (current policy, carries the gradient) and ``ref_logp`` (reference policy) are [B, L];
    ``kind`` is one of :data:`KL_KINDS` (see the module docstring for the formulas). With the optional
    ``mask`` both inputs are replaced by 0 outside it (``torch.where``) before any arithmetic, so the
    estimate is 0 there and garbage (even NaN) in padding cannot leak into the gradient. Masking for
    the reduction is otherwise left to :func:`~lit_entropy.objectives.policy_loss.aggregate`.

    ``clamp`` (optional, > 0) clamps the estimate to ``[−clamp, clamp]``: tokens past it carry no
    gradient, which bounds k3's gradient ``1 − exp(log_ratio)`` (verl's ``low_var_kl`` is k3 with 10).
    """
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL estimator {kind!r}; expected one of {KL_KINDS}")
    logp = logp.float()
    ref_logp = ref_logp.float()
    if mask is not None:
        mask = mask.bool()
        zero = torch.zeros((), dtype=torch.float32, device=logp.device)
        logp = torch.where(mask, logp, zero)
        ref_logp = torch.where(mask, ref_logp, zero)
    log_ratio = ref_logp - logp
    if kind == "k1":
        kl = -log_ratio
    elif kind == "k2":
        kl = 0.5 * log_ratio.square()
    else:
        clamped = log_ratio.clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
        kl = torch.exp(clamped) - clamped - 1.0
    return kl if clamp is None else kl.clamp(-float(clamp), float(clamp))


def kl_penalty(
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    coef: float,
    kind: str = "k3",
    mode: str = "token-mean",
    num_tokens: float | int | Tensor | None = None,
    num_seqs: float | int | Tensor | None = None,
    norm_constant: float | None = None,
) -> Tensor:
    """KL penalty term ``coef·aggregate(kl_estimate(logp, ref_logp, kind), mask, mode, ...)`` (fp32 scalar).

    To be *added* to the loss. Use the same aggregation mode and minibatch-global counts as the policy
    loss so the term is micro-batch invariant.
    """
    kl = kl_estimate(logp, ref_logp, kind, mask=mask)
    return float(coef) * aggregate(kl, mask, mode, num_tokens, num_seqs, norm_constant)
