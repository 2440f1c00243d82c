"""MaxRL's and batch-scaled (TRL scale_rewards="batch", Lite PPO) advantages against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from lit_entropy.objectives.advantages import ESTIMATORS, compute_advantages
from lit_entropy.objectives.advantages.grpo_batch import grpo_batch
from lit_entropy.objectives.advantages.maxrl import maxrl


def test_maxrl_binary_rewards_weigh_a_group_by_one_over_its_pass_rate():
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0])  # p = 1/4, 3/4, 0
    adv = maxrl(rewards, 4, eps=0.0)
    assert adv.tolist() == pytest.approx([3, -1, -1, -1, 1 / 3, 1 / 3, 1 / 3, -1, 0, 0, 0, 0])
    # the group's gradient weight Σ_correct A = G·(1 − p): the 1/p of the likelihood's gradient times p·G·(1 − p)
    assert adv[:4].clamp(min=0).sum() == pytest.approx(3.0)


def test_maxrl_eps_and_non_binary_rewards():
    adv = maxrl(torch.tensor([0.5, 0.0, 1.0, 0.5]), 2, eps=1e-6)  # means 0.25, 0.75
    assert adv.tolist() == pytest.approx([0.25 / (0.25 + 1e-6), -0.25 / (0.25 + 1e-6),
                                          0.25 / (0.75 + 1e-6), -0.25 / (0.75 + 1e-6)])


def test_maxrl_all_equal_groups_are_zero():
    assert maxrl(torch.tensor([0.0, 0, 1, 1]), 2).tolist() == [0, 0, 0, 0]


def test_grpo_batch_divides_by_the_batch_std():
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1])
    std = float(torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1]).std())  # unbiased: sqrt(15/56)
    assert std == pytest.approx(math.sqrt(15 / 56))
    adv = grpo_batch(rewards, 4, eps=0.0)
    assert adv.tolist() == pytest.approx([0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std, 0, 0, 0, 0])


def test_grpo_batch_of_equal_rewards_is_zero():
    assert grpo_batch(torch.ones(6), 3).tolist() == [0.0] * 6


def test_the_dispatcher_knows_both():
    rewards = torch.tensor([1.0, 0, 1, 1])
    assert "maxrl" in ESTIMATORS and "grpo_batch" in ESTIMATORS
    assert torch.equal(compute_advantages("maxrl", rewards, 2, eps=1e-6, lam=0.3), maxrl(rewards, 2))
    assert torch.equal(compute_advantages("grpo_batch", rewards, 2), grpo_batch(rewards, 2))
