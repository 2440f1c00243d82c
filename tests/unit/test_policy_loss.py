import math

import pytest
import torch

from lit_entropy.objectives.policy_loss import aggregate_token_mean, clipped_surrogate, masked_mean, ratio

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


def test_ratio_is_fp32_from_bf16():
    logp = torch.tensor([[-1.0, -2.5]], dtype=torch.bfloat16)
    old = torch.tensor([[-1.25, -2.0]], dtype=torch.bfloat16)
    r = ratio(logp, old)
    assert r.dtype == torch.float32
    torch.testing.assert_close(r, torch.tensor([[math.exp(0.25), math.exp(-0.5)]]))
    loss, _ = clipped_surrogate(logp, old, torch.tensor([1.0]), EPS_LOW, EPS_HIGH)
    assert loss.dtype == torch.float32


def test_invalid_dual_clip():
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError):
        clipped_surrogate(x, x, x, 0.2, 0.2, dual_clip=1.0)


def test_aggregate_token_mean_basic():
    values = torch.tensor([[1.0, 2.0, float("nan")], [3.0, float("inf"), 5.0]])
    mask = torch.tensor([[True, True, False], [True, False, True]])
    torch.testing.assert_close(aggregate_token_mean(values, mask), torch.tensor(11.0 / 4))
    torch.testing.assert_close(aggregate_token_mean(values, mask, num_tokens=11), torch.tensor(1.0))
    torch.testing.assert_close(
        aggregate_token_mean(values, mask, num_tokens=torch.tensor(11)), torch.tensor(1.0)
    )
    torch.testing.assert_close(masked_mean(values, mask), torch.tensor(11.0 / 4))


@pytest.mark.parametrize("num_tokens", [None, 0, 0.0, torch.tensor(0)])
def test_aggregate_empty_mask_has_grad_path(num_tokens):
    values = torch.randn(2, 3, requires_grad=True)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    out = aggregate_token_mean(values, mask, num_tokens=num_tokens)
    assert out.item() == 0.0 and out.requires_grad
    out.backward()
    assert torch.equal(values.grad, torch.zeros(2, 3))
    assert masked_mean(values, mask).item() == 0.0


def test_aggregate_negative_count_rejected():
    with pytest.raises(ValueError):
        aggregate_token_mean(torch.ones(1, 1), torch.ones(1, 1, dtype=torch.bool), num_tokens=-1)


@pytest.mark.parametrize("num_micro", [1, 2, 4])
def test_micro_batches_with_global_count_match_minibatch(num_micro):
    gen = torch.Generator().manual_seed(0)
    batch, length = 8, 12
    logp_full = (-torch.rand(batch, length, generator=gen) * 3).requires_grad_()
    old = logp_full.detach() + 0.3 * torch.randn(batch, length, generator=gen)
    adv = torch.randn(batch, generator=gen)
    lengths = torch.randint(1, length, (batch,), generator=gen)
    mask = torch.arange(length)[None] < lengths[:, None]
    mask[:, 0] = False

    loss, _ = clipped_surrogate(logp_full, old, adv, EPS_LOW, EPS_HIGH, dual_clip=DUAL)
    reference = aggregate_token_mean(loss, mask)
    (ref_grad,) = torch.autograd.grad(reference, logp_full)

    logp = logp_full.detach().clone().requires_grad_()
    total_tokens = mask.sum()
    summed = torch.zeros(())
    for rows in torch.tensor_split(torch.arange(batch), num_micro):
        micro_loss, _ = clipped_surrogate(logp[rows], old[rows], adv[rows], EPS_LOW, EPS_HIGH, dual_clip=DUAL)
        part = aggregate_token_mean(micro_loss, mask[rows], num_tokens=total_tokens)
        part.backward()
        summed = summed + part.detach()
    torch.testing.assert_close(summed, reference.detach(), atol=1e-6, rtol=0)
    torch.testing.assert_close(logp.grad, ref_grad, atol=1e-6, rtol=0)

    if num_micro > 1:  # local token counts would not reproduce the minibatch loss
        local = sum(
            aggregate_token_mean(
                clipped_surrogate(logp[r], old[r], adv[r], EPS_LOW, EPS_HIGH)[0], mask[r]
            ).detach()
            for r in torch.tensor_split(torch.arange(batch), num_micro)
        )
        assert not torch.allclose(local, reference.detach())
