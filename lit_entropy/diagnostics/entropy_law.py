"""The entropy–performance law of Cui et al. (2025): R = −a·exp(H) + b.

Cui et al. ("The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models", 2025)
observe that, over an RL run without entropy intervention, the policy's performance R (accuracy) and
its entropy H are tied by ``R = −a·exp(H) + b``: performance is bought by spending entropy, and once
entropy is spent (H → 0) performance stops at the predicted ceiling ``R(0) = b − a``.

Given x = exp(H) the law is linear in (a, b), so the least-squares fit has a closed form (ordinary
linear regression of R on x; slope = −a, intercept = b). Pure NumPy, no state; see
``docs/entropy_law.md``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class LawFit:
    """A fit of R = −a·exp(H) + b."""

    a: float
    """Scale: how much performance one unit of exp(H) costs (> 0 when performance rises as entropy falls)."""
    b: float
    """Offset."""
    r2: float
    """Coefficient of determination of the fit, 1 − SS_res/SS_tot (1.0 when every R is equal and fitted)."""
    ceiling: float
    """Predicted performance once entropy is spent: R(H = 0) = b − a."""
    n: int
    """Number of (H, R) points fitted."""

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def _as_points(H, R) -> tuple[np.ndarray, np.ndarray]:
    h = np.asarray(H, dtype=np.float64).reshape(-1)
    r = np.asarray(R, dtype=np.float64).reshape(-1)
    if h.shape != r.shape:
        raise ValueError(f"entropy law: H has {h.size} points but R has {r.size}; give one R per H")
    if not (np.isfinite(h).all() and np.isfinite(r).all()):
        raise ValueError("entropy law: H and R must be finite (drop NaN/inf points before fitting)")
    return h, r


def fit_entropy_law(H, R) -> LawFit:
    """Least-squares fit of ``R = −a·exp(H) + b`` to paired entropies ``H`` and performances ``R``.

    Raises ``ValueError`` with fewer than 3 points (two points fit any curve exactly: no evidence), when
    exp(H) does not vary (a constant entropy cannot tell a from b), or for mismatched / non-finite input.
    """
    h, r = _as_points(H, R)
    n = int(h.size)
    if n < 3:
        raise ValueError(f"entropy law: need at least 3 (H, R) points to fit R = -a*exp(H) + b, got {n}")
    with np.errstate(over="ignore"):
        x = np.exp(h)
    if not np.isfinite(x).all():
        raise ValueError("entropy law: exp(H) overflows; H must be an entropy in nats (well below 700)")
    xc = x - x.mean()
    sxx = float(np.dot(xc, xc))
    if sxx <= (1e-12 * float(np.abs(x).mean())) ** 2 * n:
        raise ValueError(
            f"entropy law: exp(H) has zero variance over the {n} points (H = {h[0]:.6g} throughout); "
            "the fit needs the entropy to change"
        )
    rc = r - r.mean()
    slope = float(np.dot(xc, rc)) / sxx
    a = -slope
    b = float(r.mean()) - slope * float(x.mean())
    resid = r - (b - a * x)
    ss_res = float(np.dot(resid, resid))
    ss_tot = float(np.dot(rc, rc))
    if ss_tot > 0:
        r2 = 1.0 - ss_res / ss_tot
    else:  # every R equal: the (flat) fit is exact; follow sklearn's finite convention
        r2 = 1.0 if ss_res <= 1e-24 * n else 0.0
    return LawFit(a=a, b=b, r2=float(r2), ceiling=b - a, n=n)


def predict(fit: LawFit, H):
    """Predicted performance ``−a·exp(H) + b`` at entropy ``H`` (a float for a scalar, else an array)."""
    if np.ndim(H) == 0:
        return -fit.a * math.exp(float(H)) + fit.b
    return -fit.a * np.exp(np.asarray(H, dtype=np.float64)) + fit.b
