"""The pure parts of REPO (Petrenko et al. 2026, "Entropy-Preserving Reinforcement Learning").

The rules in one place: docs/design.md §7.4.4.

REPO reshapes the per-token advantage, ``A′_t = A − λ·f_t``, with a term ``f_t`` built from the sampled
token's log-prob under the current policy (``logp_t``, taken from the pre-update pass, so a constant
for the gradient):

* REPO-R: ``A′_t = A − λ·|A|·max(logp_t, floor)``, then A′ is clamped to keep the sign of A;
* REPO-D: ``A′_t = A − λ·β·L_t`` with ``L_t = logp_t + H_t`` and ``β = Cov_B(A, L) / Var_B(L)``.

λ is adapted once per iteration toward a target entropy by :func:`adapt_lambda` (shared by both).

Sign convention: **positive λ raises entropy** (relative to the unshaped update).

* REPO-R: ``logp_t ≤ 0``, so ``−λ·|A|·logp_t = λ·|A|·|logp_t| ≥ 0`` for λ > 0: it is added to the
  advantage, more for unlikely tokens. For A > 0 unlikely tokens are pushed up harder; for A < 0 they
  are pushed down less (A′ moves toward 0). Either way probability flows toward low-probability
  tokens, which flattens the distribution: entropy rises. λ < 0 does the opposite.
* REPO-D: the first-order entropy change of a policy-gradient step is ∝ −Cov(A, L) (Cui et al. 2025;
  Petrenko et al. 2026). ``Cov_B(A′, L) = Cov_B(A, L) − λ·β·Var_B(L) = (1 − λ)·Cov_B(A, L)``: λ·β·L
  removes the part of A linearly explained by L. In the collapse regime the paper describes
  (Cov(A, L) > 0: likely tokens are rewarded), λ > 0 shrinks the entropy-lowering drift (λ = 1 zeroes
  it, λ > 1 reverses it), and λ < 0 amplifies it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

LOGP_FLOOR = -20.0
"""Default floor on ``logp_t`` for REPO-R: bounds the shaping term at ``20·λ·|A|``."""


def _check_shapes(advantages: Tensor, logp: Tensor, mask: Tensor) -> None:
    if advantages.dim() != 1:
        raise ValueError(f"advantages must be per sequence [B], got shape {tuple(advantages.shape)}")
    if logp.dim() != 2 or logp.shape[0] != advantages.shape[0] or mask.shape != logp.shape:
        raise ValueError(
            f"logp {tuple(logp.shape)} and mask {tuple(mask.shape)} must both be [B, L] with "
            f"B = {advantages.shape[0]}"
        )


def _check_lam(lam: float) -> None:
    if not math.isfinite(lam):
        raise ValueError(f"lambda must be finite, got {lam}")


def repo_r_advantages(
    advantages: Tensor, logp: Tensor, mask: Tensor, lam: float, logp_floor: float = LOGP_FLOOR
) -> Tensor:
    """REPO-R token advantages [B, L] (fp32): ``A′_t = A − λ·|A|·max(logp_t, logp_floor)``.

    ``advantages`` [B] is broadcast over each row's tokens; ``logp`` [B, L] are the sampled tokens'
    log-probs under the current policy (values only — the result carries no gradient). A′ keeps the
    sign of A: for A > 0 it is clamped at ≥ 0, for A < 0 at ≤ 0, and A = 0 gives 0. Positions off
    ``mask`` are 0 (whatever ``logp`` holds there, NaN included).
    """
    _check_shapes(advantages, logp, mask)
    _check_lam(lam)
    if not math.isfinite(logp_floor):
        raise ValueError(f"logp_floor must be finite, got {logp_floor}")
    mask = mask.bool()
    a = advantages.detach().float()[:, None].expand_as(logp)
    lp = torch.where(mask, logp.detach().float(), 0.0).clamp(min=logp_floor)
    shaped = a - lam * a.abs() * lp
    shaped = torch.where(a > 0, shaped.clamp(min=0.0), torch.where(a < 0, shaped.clamp(max=0.0), 0.0))
    return torch.where(mask, shaped, 0.0)


def repo_d_advantages(
    advantages: Tensor, logp: Tensor, entropy: Tensor, mask: Tensor, lam: float
) -> tuple[Tensor, float]:
    """REPO-D token advantages [B, L] (fp32) and the regression slope β.

    With the centred log-prob ``L_t = logp_t + H_t`` (``E_π[log π] = −H``, so L has mean 0 under the
    policy at each state) and A broadcast to tokens, over the response tokens of the whole batch::

        β = Cov_B(A, L) / Var_B(L)        (population moments, β = 0 when Var_B(L) = 0)
        A′_t = A − λ·β·L_t

    Since ``Cov_B(A′, L) = (1 − λ)·Cov_B(A, L)``, λ = 1 makes A′ uncorrelated with L over the batch,
    so the first-order entropy drift of the update (∝ −Cov(A, L)) goes to zero. This "decorrelate"
    reading of the paper (β as the batch least-squares slope of A on L) is ours. Positions off ``mask``
    are 0 and do not enter β; the moments are computed in fp64.
    """
    _check_shapes(advantages, logp, mask)
    if entropy.shape != logp.shape:
        raise ValueError(f"entropy {tuple(entropy.shape)} must match logp {tuple(logp.shape)}")
    _check_lam(lam)
    mask = mask.bool()
    a = advantages.detach().double()[:, None].expand_as(logp)
    centred = torch.where(mask, logp.detach().double() + entropy.detach().double(), 0.0)
    n = int(mask.sum())
    beta = 0.0
    if n > 0:
        a_mean = a[mask].mean()
        l_mean = centred[mask].mean()
        dl = centred[mask] - l_mean
        var = (dl * dl).mean()
        # Var = 0 (all L equal, up to round-off): no direction to decorrelate along.
        if var > 1e-12 * (centred[mask] ** 2).mean():
            beta = float(((a[mask] - a_mean) * dl).mean() / var)
    shaped = a - lam * beta * centred
    return torch.where(mask, shaped, 0.0).float(), beta


def adapt_lambda(lam: float, entropy: float, target: float, lam_min: float, lam_max: float) -> float:
    """One step of REPO's adaptive λ law; returns the new λ, with |λ| in {0} ∪ [lam_min, lam_max].

    Positive λ raises entropy (see the module docstring), so:

    * entropy < target (too low) — λ > 0: double it (at most ``lam_max``); λ = 0: set it to
      ``+lam_min``; λ < 0: halve it, and once ``|λ| < lam_min`` after halving flip to ``+lam_min``;
    * entropy > target (too high) — the mirror image: λ < 0: double its magnitude (at most
      ``lam_max``); λ = 0: ``−lam_min``; λ > 0: halve it, flipping to ``−lam_min`` below ``lam_min``;
    * entropy == target — unchanged.

    Doubling from a magnitude below ``lam_min`` lands on at least ``lam_min``.
    """
    if not (0 < lam_min <= lam_max and math.isfinite(lam_max)):
        raise ValueError(f"need 0 < lam_min <= lam_max < inf, got lam_min={lam_min}, lam_max={lam_max}")
    _check_lam(lam)
    if math.isnan(entropy) or math.isnan(target):
        raise ValueError(f"entropy={entropy} and target={target} must not be NaN")
    if entropy == target:
        return lam
    direction = 1.0 if entropy < target else -1.0  # the sign of λ that pushes entropy toward target
    signed = direction * lam  # > 0: λ already pushes the right way
    if signed > 0:
        new = min(max(2.0 * signed, lam_min), lam_max)
    elif signed == 0:
        new = lam_min
    else:
        new = signed / 2.0
        if abs(new) < lam_min:
            new = lam_min
    return direction * new
