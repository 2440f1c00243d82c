"""Tests for a study's claims that stay valid with few seeds, a multiplicity correction across them, and the
two-level bootstrap over seeds and problems (issue 77's analysis plan; docs/real_lm_study.md).

* :func:`sign_flip_p`: the exact paired sign-flip permutation test. Seed ``s`` of a method and seed ``s`` of the
  baseline share the training problems, the sampler's seed and the start, so under the null hypothesis (the method
  changes nothing) each paired difference ``d_s`` is as likely to have either sign. The p-value is the share of the
  ``2ⁿ`` sign assignments whose mean is at least the observed one in the claimed direction (the observed one
  included). No normality is assumed; the price is a floor: ``p ≥ 1/2ⁿ`` (:func:`p_floor`).
* :func:`holm`: Holm's step-down adjustment, which keeps the chance of any false claim among ``m`` under ``α``
  whatever their dependence; uniformly more powerful than Bonferroni.
* :func:`seeds_needed`: the smallest ``n`` whose floor lets one claim of ``m`` survive Holm at ``α``.
* :func:`detectable_effect`: the smallest mean difference the test detects with a given power, by the normal
  approximation to the sign-flip distribution (its exact granularity adds the floor above).
* :func:`two_level_bootstrap`: a percentile interval of the mean paired difference resampling seeds and, within
  each, problems (the same problems for the method and the baseline): the problem-level uncertainty a 64-problem
  evaluation carries, reported beside the test.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import TypeVar

import numpy as np

K = TypeVar("K")

MAX_EXACT_SEEDS = 24
"""Up to this many paired seeds the sign-flip test enumerates all 2ⁿ assignments (16.8 million at 24)."""


def sign_flip_p(diffs: Sequence[float], direction: str = "higher") -> float:
    """One-sided exact p-value of the paired sign-flip test: the share of the ``2ⁿ`` sign assignments ``ε`` with
    ``mean(ε·|d|) ≥ mean(d)`` (``≤`` for ``direction="lower"``), the observed assignment included. A difference of
    exactly 0 counts under both signs (it flips to itself). Ties are resolved at 1e-12 relative tolerance."""
    if direction not in ("higher", "lower"):
        raise ValueError(f"direction={direction!r}; choose higher or lower")
    d = np.asarray(diffs, dtype=np.float64)
    n = d.size
    if n == 0:
        raise ValueError("the sign-flip test needs at least one paired difference")
    if n > MAX_EXACT_SEEDS:
        raise ValueError(f"{n} paired seeds: the exact test enumerates 2^n assignments (at most {MAX_EXACT_SEEDS})")
    if direction == "lower":
        d = -d
    signs = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1) * 2 - 1  # every assignment, one per row
    sums = signs @ np.abs(d)
    observed = d.sum()
    tol = 1e-12 * max(1.0, float(np.abs(d).sum()))
    return float(np.count_nonzero(sums >= observed - tol)) / 2**n


def p_floor(n: int) -> float:
    """The smallest one-sided p-value the sign-flip test can give on ``n`` paired seeds: ``1/2ⁿ``."""
    return 1.0 / 2**n


def seeds_needed(claims: int, alpha: float = 0.05) -> int:
    """The smallest ``n`` with ``1/2ⁿ ≤ α/m``: under it no claim of ``m`` can survive Holm, whatever the data."""
    if claims < 1 or not 0 < alpha < 1:
        raise ValueError(f"claims={claims} must be >= 1 and alpha={alpha} in (0, 1)")
    return math.ceil(math.log2(claims / alpha) - 1e-12)


def holm(pvalues: Mapping[K, float], alpha: float = 0.05) -> dict[K, tuple[float, bool]]:
    """Holm's step-down adjustment of ``m`` p-values: sorted ascending, ``p̃₍ᵢ₎ = max_{j ≤ i} min(1, (m − j + 1)·p₍ⱼ₎)``;
    claim ``k`` survives when ``p̃ₖ ≤ α``. Returns ``key -> (adjusted p, survives)``. Equal p-values keep the
    order of the mapping (the adjustment makes them equal anyway)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha={alpha} must be in (0, 1)")
    m = len(pvalues)
    ordered = sorted(pvalues.items(), key=lambda kv: kv[1])
    out: dict[K, tuple[float, bool]] = {}
    running = 0.0
    for i, (key, p) in enumerate(ordered):
        if not 0 <= p <= 1:
            raise ValueError(f"p-value of {key!r} is {p}, not in [0, 1]")
        running = max(running, min(1.0, (m - i) * p))
        out[key] = (running, running <= alpha)
    return {key: out[key] for key in pvalues}


def detectable_effect(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest mean paired difference a one-sided test at level ``alpha`` detects with probability ``power``
    when the per-seed differences have standard deviation ``sd``: ``(z₁₋α + z_power)·sd/√n`` (normal
    approximation). Below :func:`seeds_needed` the sign-flip test detects nothing at ``alpha`` (``inf``)."""
    if n < 1 or sd < 0 or not (0 < alpha < 1 and 0 < power < 1):
        raise ValueError(f"n={n}, sd={sd}, alpha={alpha}, power={power}")
    if p_floor(n) > alpha:
        return math.inf
    z = NormalDist().inv_cdf
    return (z(1 - alpha) + z(power)) * sd / math.sqrt(n)


def two_level_bootstrap(method: Sequence[Sequence[float]], baseline: Sequence[Sequence[float]],
                        resamples: int = 10_000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the mean paired difference, resampling seeds, then within each drawn seed its problems
    (the same draw for the method and the baseline: they were evaluated on the same problems). ``method[s][j]`` and
    ``baseline[s][j]`` are seed ``s``'s score on problem ``j`` (e.g. the unbiased pass@k of that problem)."""
    a, b = np.asarray(method, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2 or a.shape[0] < 2 or a.shape[1] < 1:
        raise ValueError(f"method {a.shape} and baseline {b.shape} must be the same [seeds >= 2, problems] array")
    if not 0 < level < 1 or resamples < 1:
        raise ValueError(f"level {level} must be in (0, 1) and resamples {resamples} >= 1")
    d = a - b
    seeds, problems = d.shape
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for start in range(0, resamples, 1000):  # in chunks: 1000 x seeds x problems indices at a time
        r = min(1000, resamples - start)
        s_idx = rng.integers(0, seeds, size=(r, seeds))
        p_idx = rng.integers(0, problems, size=(r, seeds, problems))
        means[start:start + r] = d[s_idx[:, :, None], p_idx].mean(axis=(1, 2))
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)
