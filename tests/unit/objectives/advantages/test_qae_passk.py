"""QAE and Pass@k-training advantages against hand-computed groups (lit_entropy/objectives/advantages/qae.py, passk.py)."""

import math

import pytest
import torch

from lit_entropy.objectives.advantages import compute_advantages
from lit_entropy.objectives.advantages.passk import pass_at_k
from lit_entropy.objectives.advantages.qae import qae

STD_3_OF_5 = math.sqrt(0.3)  # unbiased std of {1,1,1,0,0} (and of {1,1,0,0,0})
STD_4_OF_5 = math.sqrt(0.2)  # unbiased std of {1,1,1,1,0}


def test_qae_hard_prompt_baseline_is_zero_only_successes_learn():
    # G=5, K=0.4: b = the ⌈2⌉ = 2nd smallest reward. p = 0.6 <= 1 - K, so b = 0 (the mean would be 0.6).
    adv = qae(torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0]), group_size=5, quantile_k=0.4)
    expected = torch.tensor([1, 1, 1, 0, 0]) / (STD_3_OF_5 + 1e-6)
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)
    assert (adv[3:] == 0).all()  # failures get exactly 0


def test_qae_easy_prompt_baseline_is_one_only_failures_learn():
    adv = qae(torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0]), group_size=5, quantile_k=0.4)
    torch.testing.assert_close(adv, torch.tensor([0, 0, 0, 0, -1 / (STD_4_OF_5 + 1e-6)]), atol=1e-5, rtol=0)


def test_qae_non_binary_uses_the_empirical_quantile():
    # G=4, K=0.5: b = 2nd smallest = 0.5; unbiased std of {0, .5, 1, 2} = sqrt(2.1875 / 3).
    adv = qae(torch.tensor([0.0, 0.5, 1.0, 2.0]), group_size=4, quantile_k=0.5)
    std = math.sqrt(2.1875 / 3)
    torch.testing.assert_close(adv, torch.tensor([-0.5, 0.0, 0.5, 1.5]) / (std + 1e-6), atol=1e-5, rtol=0)


def test_qae_all_equal_groups_are_zero_and_bad_k_raises():
    assert (qae(torch.ones(4), 4) == 0).all()
    with pytest.raises(ValueError, match="quantile_k"):
        qae(torch.ones(4), 4, quantile_k=1.0)


def test_pass_at_k_hand_groups():
    # n=4, k=2. c=1: rho = 1 - C(3,2)/C(4,2) = 1/2, sigma = 1/2; A+ = 1, A- = (1/2 - C(2,1)/C(3,1)) / (1/2) = -1/3.
    # c=2: rho = 5/6, sigma = sqrt(5)/6; A+ = (1/6)/sigma, A- = (1/6 - 1/3)/sigma.
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0])
    s = math.sqrt(5) / 6
    expected = torch.tensor([1, -1 / 3, -1 / 3, -1 / 3, 1 / 6 / s, -1 / 6 / s, 1 / 6 / s, -1 / 6 / s])
    torch.testing.assert_close(pass_at_k(r, group_size=4, k=2), expected, atol=1e-5, rtol=0)


def test_pass_at_k_saturated_groups_are_zero():
    # c=3 of 4 with k=2: every pair holds a success, rho = 1: nothing to learn; all-wrong groups too.
    r = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert (pass_at_k(r, group_size=4, k=2) == 0).all()


def test_pass_at_1_is_grpo_with_the_population_std():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    p = torch.tensor([1 / 3] * 3 + [1.0] * 3)  # group success rates
    adv = pass_at_k(r, group_size=3, k=1)
    sigma = torch.sqrt(p * (1 - p))
    expected = torch.where(sigma > 0, (r - p) / (sigma + 1e-6), torch.zeros(()))
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)


def test_pass_at_k_binarises_rewards_and_checks_k():
    half = pass_at_k(torch.tensor([1.0, 0.5, 0.0, 0.0]), group_size=4, k=2)
    zero = pass_at_k(torch.tensor([1.0, 0.0, 0.0, 0.0]), group_size=4, k=2)
    torch.testing.assert_close(half, zero)  # 0.5 < correct_threshold counts as wrong
    with pytest.raises(ValueError, match="k="):
        pass_at_k(torch.ones(4), group_size=4, k=5)


def test_dispatch_routes_the_new_knobs():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(compute_advantages("passk", r, 4, k=2, quantile_k=0.3, lam=0.1),
                               pass_at_k(r, 4, k=2))
    torch.testing.assert_close(compute_advantages("qae", r, 4, quantile_k=0.3, k=2), qae(r, 4, quantile_k=0.3))
