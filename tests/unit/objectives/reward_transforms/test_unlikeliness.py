"""The unlikeliness reward (lit_entropy.objectives.reward_transforms.unlikeliness): ranks within a group, β, the
estimator after it, errors."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.objectives.advantages import compute_advantages
from lit_entropy.objectives.reward_transforms.unlikeliness import unlikeliness_rewards


def test_unlikeliness_ranks_with_ties():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    logp = torch.tensor([-0.5, -2.0, -1.0, -0.5, -1.0, -1.0, -1.0, -1.0])
    # group 0 ascending: idx1 (-2.0) rank 0, idx2 (-1.0) rank 1, idx0 (-0.5) rank 2, idx3 (-0.5, tie,
    # later index) rank 3; group 1 is all tied -> ranks 0, 1, 2, 3 in index order.
    # factor = 1 - 0.25·rank/4 = 1, 0.9375, 0.875, 0.8125 for ranks 0..3.
    out = unlikeliness_rewards(rewards, logp, group_size=4)
    expected = torch.tensor([0.875, 1.0, 0.0, 0.8125, 1.0, 0.9375, 0.875, 0.8125])
    torch.testing.assert_close(out, expected)
    assert out.dtype == torch.float32


def test_unlikeliness_beta_and_g2():
    # G=2, β=0.5: the more likely sample (rank 1) is scaled by 1 - 0.5·1/2 = 0.75
    out = unlikeliness_rewards(
        torch.tensor([1.0, 1.0, 2.0, 4.0]), torch.tensor([-0.1, -3.0, -5.0, -4.0]), 2, beta_rank=0.5
    )
    torch.testing.assert_close(out, torch.tensor([0.75, 1.0, 2.0, 3.0]))
    # β = 0 leaves rewards unchanged; G = 1 too (every rank is 0)
    r = torch.tensor([1.0, 0.0, 1.0, 1.0])
    lp = torch.tensor([-1.0, -2.0, -3.0, -0.5])
    torch.testing.assert_close(unlikeliness_rewards(r, lp, 2, beta_rank=0.0), r)
    torch.testing.assert_close(unlikeliness_rewards(r, lp, 1), r)


def test_unlikeliness_then_estimator_prefers_unlikely_correct():
    r = torch.tensor([1.0, 1.0, 0.0, 0.0])
    lp = torch.tensor([-0.1, -3.0, -1.0, -2.0])  # idx1 is the unlikely correct sample
    shaped = unlikeliness_rewards(r, lp, 4)
    adv = compute_advantages("grpo", shaped, 4)
    assert adv[1] > adv[0] > 0 > adv[2] and adv[2] == adv[3]


def test_unlikeliness_errors():
    with pytest.raises(ValueError, match="does not match"):
        unlikeliness_rewards(torch.ones(4), torch.ones(3), 2)
    with pytest.raises(ValueError, match="5.*2"):
        unlikeliness_rewards(torch.ones(5), torch.ones(5), 2)
    with pytest.raises(ValueError):
        unlikeliness_rewards(torch.ones(4), torch.ones(4), 0)
