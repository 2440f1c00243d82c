"""STARE's pure parts (lit_entropy/objectives/stare.py): the surprisal quantile, the weights of the four quadrants,
the adaptive schedule, and that reweighting the advantages is reweighting the loss (the paper's code's form)."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.objectives.policy_loss import clipped_surrogate
from lit_entropy.objectives.stare import adapt_weights, stare_weights, top_surprisal

ADV = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0], [-1.0, -1.0, -1.0, 0.0, 0.0]])
LOGP = torch.tensor([[-0.1, -2.0, -0.5, -3.0, -9.0], [-3.0, -0.2, -1.0, -7.0, float("nan")]])
MASK = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)


def test_top_surprisal_takes_the_ceiling_of_the_fraction_and_at_least_one():
    s = torch.tensor([[0.5, 3.0, 1.0, 2.0]])
    every = torch.ones(1, 4, dtype=torch.bool)
    assert top_surprisal(s, every, 0.5).tolist() == [[False, True, False, True]]  # ceil(2.0) = 2
    assert top_surprisal(s, every, 0.26).tolist() == [[False, True, False, True]]  # ceil(1.04) = 2
    assert top_surprisal(s, every, 0.01).tolist() == [[False, True, False, False]]  # at least 1
    assert not top_surprisal(s, torch.zeros(1, 4, dtype=torch.bool), 0.5).any()  # no candidate, none
    only = torch.tensor([[True, False, True, False]])
    assert top_surprisal(s, only, 1.0).tolist() == [[True, False, True, False]]  # never off the candidates
    with pytest.raises(ValueError, match="top_frac"):
        top_surprisal(s, every, 0.0)


def test_weights_by_hand_o1_and_c2():
    # A > 0 tokens (row 0, 4 in the mask), surprisals 0.1, 2, 0.5, 3: with P = 0.5, L+ = {2.0, 3.0}.
    # A < 0 tokens (row 1, 3 of them; the 4th has A = 0), surprisals 3, 0.2, 1: L- = ceil(1.5) = 2 -> {3, 1}.
    w, l_plus, l_minus = stare_weights(ADV, LOGP, MASK, 0.5, w=1.5, m=0.5, variant="c2")
    assert l_plus.tolist() == [[False, True, False, True, False], [False] * 5]
    assert l_minus.tolist() == [[False] * 5, [True, False, True, False, False]]
    assert w.tolist() == [[1.0, 1.5, 1.0, 1.5, 1.0], [0.5, 1.0, 0.5, 1.0, 1.0]]
    w1, _, l_minus1 = stare_weights(ADV, LOGP, MASK, 0.5, w=1.5, m=0.5, variant="o1")
    assert w1.tolist() == [[1.0, 1.5, 1.0, 1.5, 1.0], [1.0] * 5]  # o1 leaves L- alone
    assert torch.equal(l_minus1, l_minus)  # but still reports it
    assert not w.requires_grad and w.dtype == torch.float32


def test_zero_advantage_and_off_mask_tokens_are_never_picked():
    adv = torch.zeros(2, 5)
    w, l_plus, l_minus = stare_weights(adv, LOGP, MASK, 1.0, w=2.0, m=0.5, variant="c2")
    assert not l_plus.any() and not l_minus.any() and torch.equal(w, torch.ones(2, 5))


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="variant"):
        stare_weights(ADV, LOGP, MASK, 0.1, 1.1, 0.9, variant="o2")
    with pytest.raises(ValueError, match="> 0"):
        stare_weights(ADV, LOGP, MASK, 0.1, 1.1, 0.0)
    with pytest.raises(ValueError, match=r"\[B, L\]"):
        stare_weights(ADV[0], LOGP[0], MASK[0], 0.1, 1.1, 0.9)


def test_reweighted_advantage_is_the_reweighted_loss_value_and_gradient():
    """The paper's code multiplies PPO's per-token loss (dual clip included) by ω; the controller multiplies the
    advantage. With ω > 0 both are the same loss and the same gradient, clipped tokens included."""
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 7, generator=g) * 3
    logp = (old + (torch.rand(4, 7, generator=g) - 0.5)).requires_grad_(True)
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5])[:, None].expand(4, 7)
    mask = torch.rand(4, 7, generator=g) > 0.2
    w, _, _ = stare_weights(adv, old, mask, 0.3, w=1.4, m=0.6, variant="c2")
    ours, _ = clipped_surrogate(logp, old, adv * w, 0.2, 0.28, 3.0, mask=mask)
    theirs, _ = clipped_surrogate(logp, old, adv, 0.2, 0.28, 3.0, mask=mask)
    theirs = theirs * w
    assert torch.allclose(ours, theirs, atol=1e-6)
    (g1,) = torch.autograd.grad(ours.sum(), logp)
    (g2,) = torch.autograd.grad(theirs.sum(), logp)
    assert torch.allclose(g1, g2, atol=1e-6)
    assert (w != 1).any()  # the case reweighted something


def test_adaptive_schedule_steps_and_clamps():
    assert adapt_weights(1.1, 0.9, entropy=0.2, target=0.3, alpha=0.01, w_max=1.5, m_min=0.5) == (1.11, 0.89)
    assert adapt_weights(1.1, 0.9, entropy=0.4, target=0.3, alpha=0.01, w_max=1.5, m_min=0.5) == (1.09, 0.91)
    assert adapt_weights(1.1, 0.9, entropy=0.3, target=0.3, alpha=0.01, w_max=1.5, m_min=0.5) == (1.1, 0.9)
    assert adapt_weights(1.5, 0.5, entropy=0.0, target=0.3, alpha=0.1, w_max=1.5, m_min=0.5) == (1.5, 0.5)
    assert adapt_weights(1.0, 1.0, entropy=1.0, target=0.3, alpha=0.1, w_max=1.5, m_min=0.5) == (1.0, 1.0)
    w, m = 1.1, 0.9
    for _ in range(7):
        w, m = adapt_weights(w, m, 0.0, 0.3, 0.01, 1.5, 0.5)
    assert (w, m) == (1.17, 0.83)  # rounded steps: no drift
