"""studies/significance.py: the exact sign-flip test, Holm, the seeds a claim needs, the detectable effect and the
two-level bootstrap, each against its formula or a brute-force count on constructed cases."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from studies.significance import (
    detectable_effect,
    holm,
    p_floor,
    seeds_needed,
    sign_flip_p,
    two_level_bootstrap,
)


def test_three_seeds_that_agree_give_one_eighth_the_degenerate_case():
    """The earlier rule called three seeds agreeing in direction "reproduced"; the exact test says p = 1/8."""
    assert sign_flip_p([0.02, 0.05, 0.01]) == 0.125 == p_floor(3)
    assert sign_flip_p([0.02, 0.05, 0.01], "lower") == 1.0
    assert sign_flip_p([0.02, 0.05, -0.01]) == 0.25  # flipping the -0.01 or not: 2 of 8 reach the observed sum
    assert sign_flip_p([0.02, -0.05, 0.01]) == 0.625  # sums 0.08, 0.06, 0.04, 0.02, -0.02 of 8 reach -0.02


def test_sign_flip_p_is_the_brute_force_share_of_assignments():
    rng = np.random.default_rng(0)
    for n in range(1, 9):
        for _ in range(20):
            d = list(np.round(rng.normal(0.01, 0.03, n), 3))  # rounded: ties and zeros happen
            for direction, sgn in (("higher", 1), ("lower", -1)):
                obs = sgn * sum(d)
                hits = sum(sgn * sum(e * abs(x) for e, x in zip(eps, d, strict=True)) >= obs - 1e-9
                           for eps in itertools.product((-1, 1), repeat=n))
                assert sign_flip_p(d, direction) == pytest.approx(hits / 2**n), (d, direction)


def test_sign_flip_refuses_what_it_cannot_test():
    with pytest.raises(ValueError, match="at least one"):
        sign_flip_p([])
    with pytest.raises(ValueError, match="direction"):
        sign_flip_p([0.1], "up")
    with pytest.raises(ValueError, match="2\\^n"):
        sign_flip_p([0.1] * 25)


def test_holm_by_hand():
    adjusted = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005}, alpha=0.05)
    # sorted 0.005, 0.01, 0.03, 0.04 -> 4x, 3x, 2x, 1x = 0.02, 0.03, 0.06, 0.04 -> running max 0.02, 0.03, 0.06, 0.06
    assert {k: round(v[0], 10) for k, v in adjusted.items()} == {"a": 0.03, "b": 0.06, "c": 0.06, "d": 0.02}
    assert {k for k, v in adjusted.items() if v[1]} == {"a", "d"}
    assert list(adjusted) == ["a", "b", "c", "d"]  # the caller's order
    assert holm({"only": 0.049})["only"] == (0.049, True)  # one claim: no adjustment
    assert holm({"x": 0.6, "y": 0.7})["y"][0] == 1.0  # capped at 1
    with pytest.raises(ValueError, match="not in"):
        holm({"bad": 1.5})


def test_the_seeds_a_claim_needs_and_the_issues_floor():
    assert [seeds_needed(m) for m in (1, 2, 10, 16, 54)] == [5, 6, 8, 9, 11]
    for m in (1, 2, 10, 16, 54):
        n = seeds_needed(m)
        assert p_floor(n) <= 0.05 / m < p_floor(n - 1)
    # the lab's 54 comparisons at 5 seeds: even five seeds all agreeing (p = 1/32) cannot survive Holm
    survivors = holm({i: p_floor(5) for i in range(54)})
    assert not any(ok for _, ok in survivors.values())


def test_detectable_effect():
    assert detectable_effect(0.05, 4) == math.inf  # 1/16 > 0.05: no data can reach 0.05
    eight = detectable_effect(0.05, 8)
    assert eight == pytest.approx((1.6448536 + 0.8416212) * 0.05 / math.sqrt(8), rel=1e-6)
    assert detectable_effect(0.05, 16) < eight < detectable_effect(0.05, 8, alpha=0.005)


def test_two_level_bootstrap():
    base = np.random.default_rng(1).random((6, 40))
    lo, hi = two_level_bootstrap(base + 0.1, base)
    assert lo == pytest.approx(0.1) and hi == pytest.approx(0.1)  # a constant difference has no spread
    rng = np.random.default_rng(2)
    method = (rng.random((8, 64)) < 0.55).astype(float)  # per-problem outcomes: problem noise on top of seeds
    baseline = (rng.random((8, 64)) < 0.45).astype(float)
    lo, hi = two_level_bootstrap(method, baseline, resamples=4000)
    seed_means = (method - baseline).mean(axis=1)
    idx = np.random.default_rng(0).integers(0, 8, size=(4000, 8))
    s_lo, s_hi = np.quantile(seed_means[idx].mean(axis=1), [0.025, 0.975])
    assert lo < float(np.mean(seed_means)) < hi
    assert hi - lo > s_hi - s_lo  # the problems add their own uncertainty
    assert two_level_bootstrap(method, baseline, resamples=4000) == (lo, hi)  # seeded
    with pytest.raises(ValueError, match="same"):
        two_level_bootstrap(method[:1], baseline[:1])
