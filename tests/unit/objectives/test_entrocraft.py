import math

import pytest
import torch

from lit_entropy.objectives.advantages import compute_advantages
from lit_entropy.objectives.entrocraft import band_direction, hard_advantages, keep_probability, sample_keep


@pytest.mark.parametrize(
    "entropy, expected",
    [(0.65, 0), (0.6, 0), (0.7, 0), (0.71, 1), (5.0, 1), (0.59, -1), (0.0, -1)],
)
def test_band_direction(entropy, expected):
    assert band_direction(entropy, 0.6, 0.7) == expected


def test_band_direction_validation():
    with pytest.raises(ValueError):
        band_direction(0.5, 0.7, 0.6)
    with pytest.raises(ValueError):
        band_direction(float("nan"), 0.6, 0.7)
    assert band_direction(0.5, 0.5, 0.5) == 0


def test_keep_probability_values():
    a = torch.tensor([0.1, -0.1, 0.0])
    e1 = math.exp(-1.0)
    torch.testing.assert_close(keep_probability(a, +1, 10.0), torch.tensor([1.0, e1, 1.0]))
    torch.testing.assert_close(keep_probability(a, -1, 10.0), torch.tensor([e1, 1.0, 1.0]))
    torch.testing.assert_close(keep_probability(a, 0, 10.0), torch.ones(3))
    assert keep_probability(a.to(torch.bfloat16), 1).dtype == torch.float32


def test_keep_probability_no_overflow():
    a = torch.tensor([1e6, -1e6, 50.0])
    p = keep_probability(a, -1, 10.0)
    assert torch.isfinite(p).all()
    torch.testing.assert_close(p, torch.tensor([0.0, 1.0, 0.0]))
    with pytest.raises(ValueError):
        keep_probability(a, 2)


def test_sample_keep_rate_and_determinism():
    n = 200_000
    adv = torch.full((n,), -0.1)
    g = torch.Generator().manual_seed(123)
    keep = sample_keep(adv, +1, 10.0, generator=g)
    assert keep.dtype == torch.bool and keep.shape == (n,)
    # std of the rate is sqrt(p(1-p)/n) ~ 1.1e-3
    assert abs(keep.float().mean().item() - math.exp(-1.0)) < 6e-3
    again = sample_keep(adv, +1, 10.0, generator=torch.Generator().manual_seed(123))
    assert torch.equal(keep, again)
    other = sample_keep(adv, +1, 10.0, generator=torch.Generator().manual_seed(124))
    assert not torch.equal(keep, other)


def test_sample_keep_mixed_advantages():
    adv = torch.tensor([0.3, -0.3] * 50_000)
    keep = sample_keep(adv, -1, 10.0, generator=torch.Generator().manual_seed(0))
    assert keep[1::2].all()  # m=-1 keeps every negative-advantage sample
    assert abs(keep[0::2].float().mean().item() - math.exp(-3.0)) < 6e-3
    assert sample_keep(adv, 0, 10.0, generator=torch.Generator().manual_seed(0)).all()


# ---- hard mode (reference-code parity) ------------------------------------------------------------
# Two groups of G = 4 on a hand example: 0/1 rewards and the same outcomes as -1/+1 rewards.
R01 = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0])
RPM = 2 * R01 - 1


def test_hard_raft_pp_when_entropy_is_too_high():
    grpo = compute_advantages("grpo", R01, 4)
    assert torch.equal(hard_advantages(R01, grpo, +1), torch.tensor([1.0, 0, 0, 1, 1, 1, 1, 0]))
    assert torch.equal(hard_advantages(RPM, grpo, +1), torch.tensor([1.0, 0, 0, 1, 1, 1, 1, 0]))
    # The offset belongs to NSR only.
    assert torch.equal(hard_advantages(R01, grpo, +1, nsr_reward_offset=1.0), R01)


def test_hard_nsr_when_entropy_is_too_low():
    grpo = compute_advantages("grpo", RPM, 4)
    nsr = torch.tensor([0.0, -1, -1, 0, 0, 0, 0, -1])
    assert torch.equal(hard_advantages(RPM, grpo, -1), nsr)
    # 0/1 rewards: min(R, 0) is all zeros; offset 1 maps {0, 1} -> {-1, 0}, the same NSR.
    assert torch.equal(hard_advantages(R01, grpo, -1), torch.zeros(8))
    assert torch.equal(hard_advantages(R01, grpo, -1, nsr_reward_offset=1.0), nsr)


def test_hard_inside_the_band_returns_the_base_estimator():
    grpo = compute_advantages("grpo", R01, 4)
    # Group 1: mean 0.5, unbiased std 1/sqrt(3); group 2: mean 0.75, std 0.5.
    s1, s2 = 1 / math.sqrt(3), 0.5
    expected = torch.tensor([0.5 / s1, -0.5 / s1, -0.5 / s1, 0.5 / s1, 0.25 / s2, 0.25 / s2, 0.25 / s2, -0.75 / s2])
    torch.testing.assert_close(grpo, expected, rtol=1e-5, atol=1e-5)
    out = hard_advantages(R01, grpo, 0, nsr_reward_offset=1.0)
    assert out is grpo


def test_hard_validation():
    a = torch.zeros(4)
    with pytest.raises(ValueError, match="m must be"):
        hard_advantages(a, a, 2)
    with pytest.raises(ValueError, match="shape"):
        hard_advantages(torch.zeros(4), torch.zeros(3), 1)
    with pytest.raises(ValueError, match="finite"):
        hard_advantages(a, a, -1, nsr_reward_offset=float("inf"))
    assert hard_advantages(a.to(torch.bfloat16), a, 1).dtype == torch.float32
