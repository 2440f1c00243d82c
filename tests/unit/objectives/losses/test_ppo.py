"""PPO's clipped surrogate and GPPO / CE-GPPO (lit_entropy/objectives/losses/ppo.py) against hand-computed cases."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.objectives.losses.ppo import clip_active, clipped_surrogate, gppo_surrogate
from lit_entropy.objectives.policy_loss import aggregate

EPS_LOW, EPS_HIGH, DUAL = 0.2, 0.28, 3.0


# (r, A, loss without dual clip, loss with dual clip c=3, clipped_low, clipped_high, dual_clipped)
TABLE = [
    (1.1, 1.0, -1.1, -1.1, False, False, False),  # unclipped, A>0
    (1.5, 1.0, -1.28, -1.28, False, True, False),  # clipped high: min picks (1+0.28)*A
    (0.5, 1.0, -0.5, -0.5, False, False, False),  # A>0, r low: unclipped branch wins the min
    (0.5, -1.0, 0.8, 0.8, True, False, False),  # clipped low: -(1-0.2)*A
    (1.5, -1.0, 1.5, 1.5, False, False, False),  # A<0, r high: unclipped, below the dual cap 3
    (4.0, -1.0, 4.0, 3.0, False, False, True),  # dual clip: capped at c*|A| = 3
    (0.9, -2.0, 1.8, 1.8, False, False, False),  # unclipped, A<0
    (1.2, 0.0, 0.0, 0.0, False, False, False),  # zero advantage
    (4.0, 2.0, -2.56, -2.56, False, True, False),  # clipped high
    (10.0, -0.5, 5.0, 1.5, False, False, True),  # dual clip: 3*0.5
]


def _table_tensors():
    r = torch.tensor([row[0] for row in TABLE], dtype=torch.float64)
    adv = torch.tensor([row[1] for row in TABLE])
    logp = r.log().float()[None].requires_grad_()
    return logp, torch.zeros_like(logp.detach()), adv[None]


@pytest.mark.parametrize("dual", [None, DUAL])
def test_clipped_surrogate_table(dual):
    logp, old, adv = _table_tensors()
    loss, info = clipped_surrogate(logp, old, adv, EPS_LOW, EPS_HIGH, dual_clip=dual)
    col = 2 if dual is None else 3
    expected = torch.tensor([[row[col] for row in TABLE]])
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=0)
    assert loss.dtype == torch.float32
    assert info["clipped_low"].tolist()[0] == [row[4] for row in TABLE]
    assert info["clipped_high"].tolist()[0] == [row[5] for row in TABLE]
    dual_expected = [row[6] for row in TABLE] if dual is not None else [False] * len(TABLE)
    assert info["dual_clipped"].tolist()[0] == dual_expected
    torch.testing.assert_close(info["ratio"], logp.detach().exp())

    # Gradient: -A*r on the unclipped branch, 0 where any clip is active.
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    r = torch.tensor([[row[0] for row in TABLE]])
    active = info["clipped_low"] | info["clipped_high"] | info["dual_clipped"]
    expected_grad = torch.where(active, torch.zeros_like(r), -adv * r)
    torch.testing.assert_close(grad, expected_grad, atol=1e-5, rtol=0)


def test_sequence_advantages_broadcast():
    logp = torch.log(torch.tensor([[1.1, 0.5], [1.5, 0.9]]))
    adv_seq = torch.tensor([1.0, -2.0])
    loss_seq, _ = clipped_surrogate(logp, torch.zeros_like(logp), adv_seq, EPS_LOW, EPS_HIGH)
    loss_tok, _ = clipped_surrogate(
        logp, torch.zeros_like(logp), adv_seq[:, None].expand(2, 2), EPS_LOW, EPS_HIGH
    )
    torch.testing.assert_close(loss_seq, loss_tok)
    torch.testing.assert_close(loss_seq, torch.tensor([[-1.1, -0.5], [3.0, 1.8]]), atol=1e-5, rtol=0)


def test_invalid_dual_clip():
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError):
        clipped_surrogate(x, x, x, 0.2, 0.2, dual_clip=1.0)


def test_dual_clip_is_min_of_clipped_loss_and_cap():
    """Dual clip (c = 3): for A < 0, l = min(PPO clipped loss, −c·A); for A >= 0 it changes nothing."""
    gen = torch.Generator().manual_seed(3)
    logp = (torch.randn(4, 50, generator=gen) * 1.5).requires_grad_()
    old = torch.zeros(4, 50)
    adv = torch.randn(4, 50, generator=gen)
    plain, _ = clipped_surrogate(logp, old, adv, EPS_LOW, EPS_HIGH)
    dual, info = clipped_surrogate(logp, old, adv, EPS_LOW, EPS_HIGH, dual_clip=DUAL)
    expected = torch.where(adv < 0, torch.minimum(plain, -DUAL * adv), plain)
    torch.testing.assert_close(dual, expected)
    assert info["dual_clipped"].any() and not (info["dual_clipped"] & (adv >= 0)).any()
    assert (dual[adv < 0] <= DUAL * adv.abs()[adv < 0] + 1e-6).all()
    (grad,) = torch.autograd.grad(dual.sum(), logp)
    assert (grad[info["dual_clipped"]] == 0).all()


def test_clipped_surrogate_mask_blocks_garbage():
    logp = torch.tensor([[-1.0, -0.5, float("nan")], [-2.0, float("inf"), -0.1]], requires_grad=True)
    old = torch.tensor([[-1.1, float("nan"), 0.0], [-1.9, 0.0, float("-inf")]])
    adv = torch.tensor([[1.0, 2.0, float("nan")], [-1.0, 1.0, 3.0]])
    mask = torch.tensor([[True, False, False], [True, False, False]])
    loss, info = clipped_surrogate(logp, old, adv, EPS_LOW, EPS_HIGH, dual_clip=DUAL, mask=mask)
    assert torch.isfinite(loss).all() and (loss[~mask] == 0).all()
    unmasked, _ = clipped_surrogate(logp[:, :1], old[:, :1], adv[:, :1], EPS_LOW, EPS_HIGH, dual_clip=DUAL)
    torch.testing.assert_close(loss[:, :1], unmasked)
    aggregate(loss, mask, "token-mean").backward()
    assert torch.isfinite(logp.grad).all() and (logp.grad[~mask] == 0).all()
    assert not (info["clipped_low"] | info["clipped_high"])[~mask].any()


def test_clip_active_is_where_the_surrogate_gives_no_gradient():
    """The one definition of PPO's active clip: the info dict's flags, and the tokens whose gradient is zero."""
    gen = torch.Generator().manual_seed(0)
    logp = (0.5 * torch.randn(3, 40, generator=gen)).requires_grad_()
    adv = torch.randn(3, 40, generator=gen)
    loss, info = clipped_surrogate(logp, torch.zeros(3, 40), adv, EPS_LOW, EPS_HIGH)
    low, high = clip_active(logp.detach().exp(), adv, EPS_LOW, EPS_HIGH)
    assert torch.equal(low, info["clipped_low"]) and torch.equal(high, info["clipped_high"])
    assert low.any() and high.any() and not (low & high).any()
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    assert torch.equal(grad == 0, low | high | (adv == 0))


# ---------------------------------------------------------------------------------------------- GPPO


def gppo_case(beta_low: float, beta_high: float):
    """Three tokens, eps 0.2 / 0.28: low-clipped (A = −1, r = 0.5), high-clipped (A = 2, r = 1.5), inside (A = 1, r = 1.1)."""
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[0.5, 1.5, 1.1]])).requires_grad_()
    adv = torch.tensor([[-1.0, 2.0, 1.0]])
    loss, info = gppo_surrogate(logp, old, adv, 0.2, 0.28, beta_low, beta_high)
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    return loss.detach(), grad, info


def test_gppo_keeps_ppo_value_and_a_scaled_gradient_on_clipped_tokens():
    loss, grad, info = gppo_case(0.75, 0.5)
    # value: PPO's −min(rA, clip(r)A) = 0.8, −1.28·2, −1.1
    assert loss.tolist()[0] == pytest.approx([0.8, -2.56, -1.1], abs=1e-6)
    # gradient: −β₁(1 − ε_l)A = −0.75·0.8·(−1); −β₂(1 + ε_h)A = −0.5·1.28·2; inside: −rA
    assert grad.tolist()[0] == pytest.approx([0.6, -1.28, -1.1], abs=1e-6)
    assert info["clipped_low"].tolist() == [[True, False, False]]
    assert info["clipped_high"].tolist() == [[False, True, False]]


def test_gppo_with_betas_one_is_klear_and_zero_is_ppo():
    _, grad, _ = gppo_case(1.0, 1.0)
    assert grad.tolist()[0] == pytest.approx([0.8, -2.56, -1.1], abs=1e-6)  # (1 ± ε)·∇log π, GPPO
    _, grad, _ = gppo_case(0.0, 0.0)
    logp = torch.log(torch.tensor([[0.5, 1.5, 1.1]])).requires_grad_()
    ppo, _ = clipped_surrogate(logp, torch.zeros(1, 3), torch.tensor([[-1.0, 2.0, 1.0]]), 0.2, 0.28)
    (ppo_grad,) = torch.autograd.grad(ppo.sum(), logp)
    assert torch.equal(grad, ppo_grad)
