"""EntroPIC (Yang et al. 2025): the loss term (lit_entropy.objectives.entropic) and its confident tokens in the
objective. The PI controller that drives ``pic_alpha``: tests/unit/callbacks/test_entropic.py."""

from __future__ import annotations

import math

import pytest
import torch

from lit_entropy.algo import AlgoConfig
from lit_entropy.objectives.entropic import PIC_PROB_THRESHOLD, entropic_term
from lit_entropy.objectives.objective import Knobs, micro_batch_loss, select_tokens


# ---- the loss term ---------------------------------------------------------------------------------
def term_example():
    # Row 0 positive, row 1 negative; columns: high-prob, high-prob, low-prob.
    logp = torch.tensor([[-0.02, -0.01, -1.5], [-0.03, -0.04, -2.0]], requires_grad=True)
    old = torch.tensor([[-0.03, -0.02, -1.4], [-0.01, -0.02, -2.2]])
    adv = torch.tensor([[0.7, 0.7, 0.7], [-1.3, -1.3, -1.3]])
    high = torch.tensor([[True, True, False], [True, True, False]])
    return logp, old, adv, high


@pytest.mark.parametrize("alpha", [0.6, -0.4, 1.0])
def test_gradient_weighs_positive_one_plus_alpha_and_negative_one_minus_alpha(alpha):
    logp, old, adv, high = term_example()
    r = torch.exp(logp - old)
    n_high = int(high.sum())
    # entropic_term is the mean over high-prob tokens; times the count it is Σ_high(−r·|A|).
    loss = (-r * adv).sum() + alpha * entropic_term(logp, old, adv, high, n_high) * n_high
    (grad,) = torch.autograd.grad(loss, logp)
    r = r.detach()
    weight = torch.where(high, torch.where(adv > 0, 1 + alpha, 1 - alpha), torch.ones_like(adv))
    assert torch.allclose(grad, -weight * adv * r, atol=1e-6)
    # spelled out: positive high-prob tokens (1 + α), negative (1 − α), low-prob tokens plain −A·r
    assert torch.allclose(grad[0, :2], -(1 + alpha) * adv[0, :2] * r[0, :2], atol=1e-6)
    assert torch.allclose(grad[1, :2], -(1 - alpha) * adv[1, :2] * r[1, :2], atol=1e-6)
    assert torch.allclose(grad[:, 2], -adv[:, 2] * r[:, 2], atol=1e-6)


def test_term_value_and_per_sequence_advantages():
    logp, old, adv, high = term_example()
    r = torch.exp(logp - old)
    expected = (-r * adv.abs())[high].sum() / 4
    assert torch.allclose(entropic_term(logp, old, adv, high, 4), expected)
    assert torch.allclose(entropic_term(logp, old, adv[:, 0], high, torch.tensor(4)), expected)


def test_term_is_zero_with_zero_gradient_when_no_token_qualifies():
    logp, old, adv, _ = term_example()
    none = torch.zeros_like(adv, dtype=torch.bool)
    value = entropic_term(logp, old, adv, none, 0)
    (grad,) = torch.autograd.grad(value, logp)
    assert value.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad))


def test_padding_with_extreme_log_probs_gives_finite_gradients():
    logp, old, adv, high = term_example()
    old = old.clone()
    old[:, 2] = -1e4  # exp(logp − old) would overflow on these unselected tokens
    (grad,) = torch.autograd.grad(entropic_term(logp, old, adv, high, 4), logp)
    assert torch.isfinite(grad).all() and (grad[:, 2] == 0).all()


@pytest.mark.parametrize("splits", [2, 3, 6])
def test_micro_batch_invariance_with_the_global_count(splits):
    g = torch.Generator().manual_seed(0)
    B, L = 6, 5
    logp = (-torch.rand(B, L, generator=g) * 0.2).requires_grad_()
    old = logp.detach() + 0.02 * torch.randn(B, L, generator=g)
    adv = torch.randn(B, generator=g)
    high = old > math.log(PIC_PROB_THRESHOLD)
    high[2] = False  # a micro-batch row without any high-probability token
    count = high.sum()
    whole = entropic_term(logp, old, adv, high, count)
    (g_whole,) = torch.autograd.grad(whole, logp)
    parts = [
        entropic_term(logp[rows], old[rows], adv[rows], high[rows], count)
        for rows in torch.tensor_split(torch.arange(B), splits)
    ]
    total = torch.stack(parts).sum()
    (g_parts,) = torch.autograd.grad(total, logp)
    assert torch.allclose(total, whole, atol=1e-6)
    assert torch.allclose(g_parts, g_whole, atol=1e-7)


def test_tokens_below_the_threshold_are_untouched_in_the_objective():
    probs = torch.tensor([[0.5, 0.99, 0.951, 0.949, 0.3, 0.999], [0.5, 0.97, 0.2, 0.96, 0.94, 0.999]])
    old = probs.log()
    mask = torch.tensor([[False, True, True, True, True, False], [False, True, True, True, True, True]])
    adv = torch.tensor([1.0, -2.0])
    mb = {"response_mask": mask, "token_advantages": adv[:, None].expand(2, 6).clone(), "old_logp": old}
    algo = AlgoConfig()
    off, on = Knobs(0.2, 0.2), Knobs(0.2, 0.2, pic_alpha=0.5)
    assert "high_prob" not in select_tokens(algo, mb, off).prepared
    sel = select_tokens(algo, mb, on)
    expected = torch.tensor([[0, 1, 1, 0, 0, 0], [0, 1, 0, 1, 0, 1]], dtype=torch.bool)
    assert torch.equal(sel.prepared["high_prob"], expected)  # > 0.95 and in the loss; the masked 0.999 excluded
    assert int(sel.prepared["num_high_prob"]) == 5

    grads = {}
    for name, knobs in (("off", off), ("on", on)):
        logp = (old + 0.01).requires_grad_()
        loss, _ = micro_batch_loss(algo, knobs, mb, select_tokens(algo, mb, knobs), logp, None)
        (grads[name],) = torch.autograd.grad(loss, logp)
    low = mask & ~expected
    assert torch.equal(grads["on"][low], grads["off"][low])
    assert not torch.allclose(grads["on"][expected], grads["off"][expected])
