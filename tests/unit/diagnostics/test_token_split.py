"""Entropy high/low split and gradient-mass quadrants (lit_entropy.diagnostics.token_split)."""

import math

import pytest
import torch

from lit_entropy.diagnostics.token_split import QUADRANTS, entropy_high_low, grad_mass_quadrants


def test_entropy_high_low_top_20_percent():
    h = torch.tensor([[float("nan"), 1, 2, 3, 4, 5], [float("inf"), 6, 7, 8, 9, 10]])
    mask = torch.tensor([[False] + [True] * 5] * 2)
    high, low = entropy_high_low(h, mask)
    assert float(high) == pytest.approx(9.5)  # 10 and 9: the top 2 of 10 tokens
    assert float(low) == pytest.approx(4.5)  # 1..8


def test_entropy_high_low_rounds_the_high_count_up_and_handles_empty():
    high, low = entropy_high_low(torch.tensor([[1.0, 2.0, 4.0]]), torch.ones(1, 3, dtype=torch.bool))
    assert (float(high), float(low)) == (4.0, 1.5)  # ⌈0.6⌉ = 1 high token
    high, low = entropy_high_low(torch.ones(2, 2), torch.zeros(2, 2, dtype=torch.bool))
    assert (float(high), float(low)) == (0.0, 0.0)


def test_grad_mass_quadrants_hand_case():
    adv = torch.tensor([[1.0, 2.0, -1.0, -0.5, 0.0, 9.0]])
    p = torch.tensor([[0.9, 0.2, 0.5, 0.2, 0.1, 0.1]])
    mask = torch.tensor([[True, True, True, True, True, False]])  # the last token is not counted
    shares = grad_mass_quadrants(adv, p.log(), mask)
    # masses |A|(1 - p): 0.1 (pos, high), 1.6 (pos, low), 0.5 (neg, p = 0.5 counts as high), 0.4 (neg, low)
    assert QUADRANTS == ("pos_highp", "pos_lowp", "neg_highp", "neg_lowp")
    torch.testing.assert_close(shares, torch.tensor([0.1, 1.6, 0.5, 0.4]) / 2.6)
    assert math.isclose(float(shares.sum()), 1.0, rel_tol=1e-6)


def test_grad_mass_quadrants_sequence_advantages_and_zero_mass():
    logp = torch.log(torch.tensor([[0.9, 0.2], [0.3, 0.6]]))
    mask = torch.ones(2, 2, dtype=torch.bool)
    shares = grad_mass_quadrants(torch.tensor([1.0, -1.0]), logp, mask)
    torch.testing.assert_close(shares, torch.tensor([0.1, 0.8, 0.4, 0.7]) / 2.0)
    assert (grad_mass_quadrants(torch.zeros(2), logp, mask) == 0).all()
