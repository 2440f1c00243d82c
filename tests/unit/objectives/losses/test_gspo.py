"""GSPO's sequence-ratio surrogate (lit_entropy/objectives/losses/gspo.py) against hand values and autograd."""

from __future__ import annotations

import math

import torch

from lit_entropy.objectives.losses.gspo import gspo_surrogate
from lit_entropy.objectives.policy_loss import aggregate, global_counts


def _gspo_inputs():
    mask = torch.tensor(
        [
            [False, True, True, True, False],
            [False, True, True, False, False],
            [True, True, True, True, True],
            [False, False, False, False, False],
        ]
    )
    old = torch.tensor(
        [
            [0.0, -1.0, -2.0, -0.5, float("nan")],
            [float("nan"), -1.0, -1.0, 0.0, 0.0],
            [-0.3, -0.2, -0.1, -0.4, -0.5],
            [float("nan")] * 5,
        ]
    )
    # mean log-ratio per row: +0.01, -0.02, +0.0001, (empty row)
    shift = torch.tensor(
        [
            [0.0, 0.02, -0.01, 0.02, 0.0],
            [0.0, -0.03, -0.01, 0.0, 0.0],
            [0.0003, -0.0001, 0.0001, -0.0001, 0.0003],
            [0.0] * 5,
        ]
    )
    logp = torch.where(mask, old + shift, torch.full_like(old, float("nan"))).requires_grad_()
    adv = torch.tensor([1.5, -2.0, 0.7, float("nan")])
    return logp, old, adv, mask


def test_gspo_values_and_info():
    logp, old, adv, mask = _gspo_inputs()
    eps_low, eps_high = 0.015, 0.005
    loss, info = gspo_surrogate(logp, old, adv, mask, eps_low, eps_high)
    assert loss.dtype == torch.float32 and torch.isfinite(loss).all() and (loss[~mask] == 0).all()
    s = torch.tensor([math.exp(0.01), math.exp(-0.02), math.exp(0.0001), 1.0])
    torch.testing.assert_close(info["seq_ratio"], s)
    # row 0: A>0, s>1+eps_high -> clipped at 1+eps_high; row 1: A<0, s<1-eps_low -> clipped at 1-eps_low
    expected_rows = torch.tensor([-(1 + eps_high) * 1.5, (1 - eps_low) * 2.0, -s[2].item() * 0.7, 0.0])
    expected = torch.where(mask, expected_rows[:, None].expand(4, 5), torch.zeros(4, 5))
    torch.testing.assert_close(loss, expected)
    assert (
        info["clipped_high"].tolist() == (mask & torch.tensor([True, False, False, False])[:, None]).tolist()
    )
    assert (
        info["clipped_low"].tolist() == (mask & torch.tensor([False, True, False, False])[:, None]).tolist()
    )
    assert not info["dual_clipped"].any()


def test_gspo_gradient_reaches_every_token():
    logp, old, adv, mask = _gspo_inputs()
    eps_low, eps_high = 0.015, 0.005
    loss, info = gspo_surrogate(logp, old, adv, mask, eps_low, eps_high)
    num_tokens, num_seqs = global_counts(mask)
    aggregate(loss, mask, "seq-mean-token-mean", num_seqs=num_seqs).backward()
    grad = logp.grad
    assert torch.isfinite(grad).all() and (grad[~mask] == 0).all()
    # rows 0 and 1 are clipped: no gradient at all
    assert (grad[:2] == 0).all()
    # row 2 is unclipped: every token gets −A·s/(len·num_seqs)
    s2 = info["seq_ratio"][2]
    torch.testing.assert_close(grad[2], torch.full((5,), (-0.7 * s2 / 5 / num_seqs).item()))

    # with wide clip ranges nothing is clipped and each row's tokens share −A_i·s_i/len_i (one sequence)
    for row in range(3):
        lp = logp.detach()[row : row + 1].clone().requires_grad_()
        loss, info = gspo_surrogate(lp, old[row : row + 1], adv[row : row + 1], mask[row : row + 1], 0.5, 0.5)
        aggregate(loss, mask[row : row + 1], "seq-mean-token-mean").backward()
        length = int(mask[row].sum())
        expected = -adv[row] * info["seq_ratio"][0] / length
        got = lp.grad[0][mask[row]]
        assert (got != 0).all()
        torch.testing.assert_close(got, expected.expand(length))


def test_gspo_matches_autograd_of_sequence_objective():
    """Token form + seq-mean-token-mean reproduces GSPO's sequence-level gradient of (1/S)·Σ_i s_i(θ)·A_i."""
    gen = torch.Generator().manual_seed(5)
    logp = (-torch.rand(3, 6, generator=gen)).requires_grad_()
    old = logp.detach() + 0.01 * torch.randn(3, 6, generator=gen)
    adv = torch.tensor([1.0, -0.5, 2.0])
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[1, 4:] = False
    loss, _ = gspo_surrogate(logp, old, adv, mask, 1.0, 1.0)
    (g_tok,) = torch.autograd.grad(aggregate(loss, mask, "seq-mean-token-mean"), logp)
    lengths = mask.sum(-1)
    s = torch.exp(torch.where(mask, logp - old, torch.zeros(())).sum(-1) / lengths)
    (g_seq,) = torch.autograd.grad(-(s * adv).sum() / 3, logp)
    torch.testing.assert_close(g_tok, g_seq)
