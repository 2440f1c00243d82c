import math

import pytest
import torch

from lit_entropy.advantages import broadcast_to_tokens, grpo, zero_std_groups

S2 = 1 / math.sqrt(2)  # G=2, rewards {1, 0}: mean 0.5, unbiased std sqrt(0.5) -> ±0.5/0.70711
S4 = math.sqrt(3) / 2  # G=4, rewards {1,0,0,1}: mean 0.5, unbiased std sqrt(1/3) -> ±0.5*sqrt(3)


def test_grpo_g2_hand_example():
    adv = grpo(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=2)
    expected = torch.tensor([S2, -S2, -S2, S2])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)
    assert adv.dtype == torch.float32


def test_grpo_g4_hand_example():
    adv = grpo(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=4)
    torch.testing.assert_close(adv, torch.tensor([S4, -S4, -S4, S4]), atol=1e-5, rtol=0)


def test_grpo_uses_unbiased_std_and_eps():
    r = torch.tensor([3.0, 1.0, 2.0])  # mean 2, unbiased std 1
    adv = grpo(r, group_size=3, eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0, 0.0]))
    adv_eps = grpo(r, group_size=3, eps=1.0)
    torch.testing.assert_close(adv_eps, torch.tensor([0.5, -0.5, 0.0]))


def test_dr_grpo_no_std_division():
    adv = grpo(torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0]), group_size=4, scale_std=False)
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5, 0.25, 0.25, 0.25, -0.75])
    torch.testing.assert_close(adv, expected)


def test_all_equal_group_is_exactly_zero():
    r = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.0, 0.0, 7.3, 7.3, 7.3], dtype=torch.float64)
    for scale in (True, False):
        adv = grpo(r, group_size=3, scale_std=scale)
        assert torch.isfinite(adv).all()
        assert (adv[:3] == 0).all() and (adv[6:] == 0).all()
        assert adv.dtype == torch.float32
    torch.testing.assert_close(
        grpo(r, 3)[3:6], torch.tensor([2 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)])
    )


def test_bf16_rewards_give_fp32():
    adv = grpo(torch.tensor([1.0, 0.0], dtype=torch.bfloat16), group_size=2)
    assert adv.dtype == torch.float32


def test_group_size_one_error():
    with pytest.raises(ValueError, match="G=1"):
        grpo(torch.tensor([1.0, 0.0]), group_size=1)


def test_non_divisible_error():
    with pytest.raises(ValueError, match="5.*3"):
        grpo(torch.ones(5), group_size=3)
    with pytest.raises(ValueError):
        zero_std_groups(torch.ones(5), group_size=2)


def test_zero_std_groups():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5])
    assert zero_std_groups(r, 2).tolist() == [True, False, True, True]
    assert zero_std_groups(r, 4).tolist() == [False, False]


def test_broadcast_to_tokens_zero_on_padding():
    adv = torch.tensor([0.5, -1.0])
    mask = torch.tensor([[False, True, True, False], [False, False, True, False]])
    out = broadcast_to_tokens(adv, mask)
    expected = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.0, 0.0, -1.0, 0.0]])
    torch.testing.assert_close(out, expected)
    assert out.dtype == torch.float32
