"""fit_entropy_law: R = -a*exp(H) + b by closed-form least squares (Cui et al. 2025)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lit_entropy.diagnostics.entropy_law import LawFit, fit_entropy_law, predict


def synthetic(a: float, b: float, n: int = 40, noise: float = 0.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    H = np.linspace(0.9, 0.1, n)  # entropy spent over the run
    R = -a * np.exp(H) + b + noise * rng.standard_normal(n)
    return H, R


def test_recovers_a_and_b_exactly_without_noise():
    fit = fit_entropy_law(*synthetic(0.35, 0.95))
    assert isinstance(fit, LawFit)
    assert fit.a == pytest.approx(0.35, rel=1e-12, abs=1e-12)
    assert fit.b == pytest.approx(0.95, rel=1e-12, abs=1e-12)
    assert fit.r2 == pytest.approx(1.0, abs=1e-12)
    assert fit.ceiling == pytest.approx(0.60, abs=1e-12)
    assert fit.ceiling == fit.b - fit.a
    assert fit.n == 40


def test_recovers_a_and_b_closely_with_noise():
    H, R = synthetic(0.4, 1.0, n=400, noise=0.01, seed=1)
    fit = fit_entropy_law(H, R)
    assert fit.a == pytest.approx(0.4, abs=0.01)
    assert fit.b == pytest.approx(1.0, abs=0.02)
    assert fit.ceiling == pytest.approx(0.6, abs=0.01)
    assert 0.95 < fit.r2 < 1.0


def test_matches_numpy_polyfit_on_random_points():
    rng = np.random.default_rng(3)
    H, R = rng.uniform(0.1, 2.0, 25), rng.uniform(0, 1, 25)
    slope, intercept = np.polyfit(np.exp(H), R, 1)
    fit = fit_entropy_law(H, R)
    assert fit.a == pytest.approx(-slope, rel=1e-9)
    assert fit.b == pytest.approx(intercept, rel=1e-9)
    resid = R - predict(fit, H)
    assert fit.r2 == pytest.approx(1 - resid @ resid / ((R - R.mean()) @ (R - R.mean())), rel=1e-12)


def test_accepts_lists_and_three_points():
    fit = fit_entropy_law([0.1, 0.5, 1.0], [0.8, 0.6, 0.3])
    assert fit.n == 3 and math.isfinite(fit.a) and math.isfinite(fit.r2)


def test_predict_scalar_and_array():
    fit = LawFit(a=0.5, b=1.0, r2=1.0, ceiling=0.5, n=3)
    assert predict(fit, 0.0) == pytest.approx(0.5)
    assert isinstance(predict(fit, 0.0), float)
    out = predict(fit, [0.0, 1.0])
    assert out == pytest.approx([0.5, 1.0 - 0.5 * math.e])


def test_constant_accuracy_is_a_flat_exact_fit():
    fit = fit_entropy_law([0.1, 0.2, 0.3], [0.5, 0.5, 0.5])
    assert fit.a == pytest.approx(0.0, abs=1e-12) and fit.b == pytest.approx(0.5)
    assert fit.r2 == 1.0


@pytest.mark.parametrize("H,R", [([], []), ([0.1], [0.2]), ([0.1, 0.2], [0.3, 0.4])])
def test_too_few_points(H, R):
    with pytest.raises(ValueError, match="at least 3"):
        fit_entropy_law(H, R)


def test_constant_entropy_is_refused():
    with pytest.raises(ValueError, match="zero variance"):
        fit_entropy_law([0.4] * 5, [0.1, 0.2, 0.3, 0.4, 0.5])


def test_mismatched_and_non_finite_input():
    with pytest.raises(ValueError, match="one R per H"):
        fit_entropy_law([0.1, 0.2, 0.3], [0.1, 0.2])
    with pytest.raises(ValueError, match="finite"):
        fit_entropy_law([0.1, float("nan"), 0.3], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="overflows"):
        fit_entropy_law([0.1, 800.0, 0.3], [0.1, 0.2, 0.3])
