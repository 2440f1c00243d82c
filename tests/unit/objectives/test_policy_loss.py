import math

import pytest
import torch

from lit_entropy.diagnostics.entropy import naive_logprobs_and_entropy, token_logprobs_and_entropy
from lit_entropy.objectives.kl import kl_penalty
from lit_entropy.objectives.losses.gspo import gspo_surrogate
from lit_entropy.objectives.losses.ppo import clipped_surrogate
from lit_entropy.objectives.policy_loss import (
    AGG_MODES,
    aggregate,
    aggregate_token_mean,
    entropy_bonus,
    global_counts,
    masked_mean,
    ratio,
)

EPS_LOW, EPS_HIGH, DUAL = 0.2, 0.28, 3.0


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    """Tiny tensors: intra-op threads only add contention (100x slower on a busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_ratio_is_fp32_from_bf16():
    logp = torch.tensor([[-1.0, -2.5]], dtype=torch.bfloat16)
    old = torch.tensor([[-1.25, -2.0]], dtype=torch.bfloat16)
    r = ratio(logp, old)
    assert r.dtype == torch.float32
    torch.testing.assert_close(r, torch.tensor([[math.exp(0.25), math.exp(-0.5)]]))
    loss, _ = clipped_surrogate(logp, old, torch.tensor([1.0]), EPS_LOW, EPS_HIGH)
    assert loss.dtype == torch.float32



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



# ---- aggregation modes ------------------------------------------------------------------------------------

AGG_VALUES = torch.tensor(
    [[1.0, 2.0, float("nan"), 0.0], [3.0, float("inf"), 5.0, 7.0], [9.0, 9.0, 9.0, 9.0]]
)
AGG_MASK = torch.tensor([[True, True, False, False], [True, False, True, True], [False] * 4])


@pytest.mark.parametrize(
    ("mode", "kwargs", "expected"),
    [
        ("token-mean", {}, (1 + 2 + 3 + 5 + 7) / 5),
        ("token-mean", {"num_tokens": 10}, 18 / 10),
        ("seq-mean-token-mean", {}, (1.5 + 5.0) / 2),
        ("seq-mean-token-mean", {"num_seqs": 4}, (1.5 + 5.0) / 4),
        ("seq-mean-token-sum", {}, (3 + 15) / 2),
        ("seq-mean-token-sum", {"num_seqs": torch.tensor(3)}, (3 + 15) / 3),
        ("seq-mean-token-sum-norm", {"norm_constant": 4.0}, (3 + 15) / 2 / 4),
        ("seq-mean-token-sum-norm", {"norm_constant": 8, "num_seqs": 3.0}, (3 + 15) / 3 / 8),
    ],
)
def test_aggregate_hand_values(mode, kwargs, expected):
    values = AGG_VALUES.clone().requires_grad_()
    out = aggregate(values, AGG_MASK, mode, **kwargs)
    assert out.dtype == torch.float32 and out.dim() == 0
    torch.testing.assert_close(out, torch.tensor(float(expected)))
    out.backward()
    assert torch.isfinite(values.grad).all() and (values.grad[~AGG_MASK] == 0).all()


def test_aggregate_token_mean_matches_legacy():
    values = torch.randn(3, 5)
    mask = torch.rand(3, 5) > 0.4
    for n in (None, 7, torch.tensor(9)):
        torch.testing.assert_close(
            aggregate(values, mask, "token-mean", num_tokens=n),
            aggregate_token_mean(values, mask, num_tokens=n),
        )


def test_aggregate_seq_mean_token_mean_gradient():
    values = torch.randn(2, 4, requires_grad=True)
    mask = torch.tensor([[True, True, False, False], [True, True, True, True]])
    aggregate(values, mask, "seq-mean-token-mean", num_seqs=5).backward()
    expected = torch.tensor([[1 / 2, 1 / 2, 0, 0], [1 / 4] * 4]) / 5
    torch.testing.assert_close(values.grad, expected)


def test_global_counts():
    num_tokens, num_seqs = global_counts(AGG_MASK)
    assert num_tokens.item() == 5 and num_seqs.item() == 2
    assert global_counts(torch.zeros(2, 3, dtype=torch.bool))[1].item() == 0


def test_aggregate_errors():
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):  # the message lists AGG_MODES
        aggregate(AGG_VALUES, AGG_MASK, "sum")
    with pytest.raises(ValueError, match="norm_constant"):
        aggregate(AGG_VALUES, AGG_MASK, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="norm_constant"):
        aggregate(AGG_VALUES, AGG_MASK, "seq-mean-token-sum-norm", norm_constant=0.0)
    with pytest.raises(ValueError):
        aggregate(AGG_VALUES, AGG_MASK, "seq-mean-token-sum", num_seqs=-1)


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("count", [None, 0, 0.0, torch.tensor(0)])
def test_aggregate_zero_count_keeps_grad_path(mode, count):
    values = torch.randn(2, 3, requires_grad=True)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    out = aggregate(values, mask, mode, num_tokens=count, num_seqs=count, norm_constant=3.0)
    assert out.item() == 0.0 and out.requires_grad
    out.backward()
    assert torch.equal(values.grad, torch.zeros(2, 3))


# ---- GSPO ------------------------------------------------------------------------------------------------



# ---- entropy bonus ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", AGG_MODES)
def test_entropy_bonus_gradient_matches_naive(mode):
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(3, 5, 13, generator=gen).requires_grad_()
    targets = torch.randint(0, 13, (3, 5), generator=gen)
    mask = torch.rand(3, 5, generator=gen) > 0.3
    mask[0] = True
    _, ent = token_logprobs_and_entropy(logits, targets, temperature=0.8, chunk_size=4)
    bonus = entropy_bonus(ent, mask, 0.01, mode, norm_constant=5.0)
    (grad,) = torch.autograd.grad(bonus, logits)
    _, ent_ref = naive_logprobs_and_entropy(logits, targets, temperature=0.8)
    ref = -0.01 * aggregate(ent_ref, mask, mode, norm_constant=5.0)
    (grad_ref,) = torch.autograd.grad(ref, logits)
    torch.testing.assert_close(bonus, ref)
    torch.testing.assert_close(grad, grad_ref, atol=1e-8, rtol=1e-5)
    # minimising the bonus increases the entropy: a small step along −grad raises the aggregated entropy
    _, ent_after = naive_logprobs_and_entropy(logits.detach() - 10.0 * grad, targets, temperature=0.8)
    assert aggregate(ent_after, mask, mode, norm_constant=5.0) > aggregate(
        ent_ref.detach(), mask, mode, norm_constant=5.0
    )


# ---- micro-batch invariance (docs/design.md §7.2) ------------------------------------------------------

MB_BATCH, MB_LEN, MB_VOCAB, MB_HIDDEN = 8, 10, 11, 6
MASK_KINDS = ("response", "selection", "rows_removed", "single_token", "padding")
LOSS_KINDS = ("clipped", "gspo", "entropy", "kl")
NAN = float("nan")


def _mb_mask(kind: str, gen: torch.Generator) -> torch.Tensor:
    pos = torch.arange(MB_LEN)[None]
    prompt = torch.randint(1, 4, (MB_BATCH, 1), generator=gen)
    resp_len = torch.randint(1, MB_LEN - 3, (MB_BATCH, 1), generator=gen)
    response = (pos >= prompt) & (pos < prompt + resp_len)
    if kind == "response":
        return response
    if kind == "selection":
        keep = torch.rand(MB_BATCH, MB_LEN, generator=gen) > 0.35
        return response & keep
    if kind == "rows_removed":
        out = response.clone()
        out[[1, 4, 5]] = False  # rows 4 and 5 form a whole micro-batch when split in 4
        return out
    if kind == "single_token":
        return pos == prompt
    if kind == "padding":  # left-padded prompts, right padding, very different lengths
        start = torch.tensor([[5], [1], [3], [2], [6], [1], [4], [2]])
        length = torch.tensor([[5], [1], [7], [2], [1], [9], [3], [6]])
        return (pos >= start) & (pos < (start + length).clamp(max=MB_LEN))
    raise AssertionError(kind)


def _mb_data(mask_kind: str):
    gen = torch.Generator().manual_seed(1234)
    mask = _mb_mask(mask_kind, gen)
    hidden = torch.randn(MB_BATCH, MB_LEN, MB_HIDDEN, generator=gen)
    weight = (0.5 * torch.randn(MB_HIDDEN, MB_VOCAB, generator=gen)).requires_grad_()
    targets = torch.randint(0, MB_VOCAB, (MB_BATCH, MB_LEN), generator=gen)
    with torch.no_grad():
        logp0, ent0 = token_logprobs_and_entropy(hidden @ weight, targets)
    # the sampler/old policy is a perturbation of the current one, so that some tokens and sequences clip
    old = logp0 + 0.15 * torch.randn(MB_BATCH, MB_LEN, generator=gen)
    ref = logp0 + 0.3 * torch.randn(MB_BATCH, MB_LEN, generator=gen)
    adv = torch.randn(MB_BATCH, generator=gen)
    # a few negative-advantage tokens with r > 3, so that the dual clip is active too
    far = (adv[:, None] < 0) & (torch.rand(MB_BATCH, MB_LEN, generator=gen) < 0.25)
    old = torch.where(far, old - 1.5, old)
    # garbage outside the mask must never leak
    old = torch.where(mask, old, torch.full_like(old, NAN))
    ref = torch.where(mask, ref, torch.full_like(ref, float("inf")))
    adv = torch.where(mask.any(-1), adv, torch.full_like(adv, NAN))
    logp_leaf = torch.where(mask, logp0, torch.full_like(logp0, NAN))
    ent_leaf = torch.where(mask, ent0, torch.full_like(ent0, NAN))
    return dict(
        mask=mask,
        hidden=hidden,
        weight=weight,
        targets=targets,
        old=old,
        ref=ref,
        adv=adv,
        logp=logp_leaf,
        ent=ent_leaf,
    )


def _mb_loss(loss_kind, logp, ent, old, ref, adv, mask, mode, num_tokens, num_seqs):
    agg = dict(mode=mode, num_tokens=num_tokens, num_seqs=num_seqs, norm_constant=float(MB_LEN))
    if loss_kind == "clipped":
        tok, _ = clipped_surrogate(logp, old, adv, EPS_LOW, EPS_HIGH, dual_clip=DUAL, mask=mask)
        return aggregate(tok, mask, **agg)
    if loss_kind == "gspo":
        tok, _ = gspo_surrogate(logp, old, adv, mask, eps_low=0.03, eps_high=0.04)
        return aggregate(tok, mask, **agg)
    if loss_kind == "entropy":
        return entropy_bonus(ent, mask, 0.05, **agg)
    if loss_kind == "kl":
        return kl_penalty(logp, ref, mask, 0.1, "k3", **agg)
    raise AssertionError(loss_kind)


def _mb_run(d, loss_kind, mode, num_micro, counts):
    """Sum of micro-batch losses and the accumulated gradients w.r.t. logp and the model weight.

    ``counts`` is ``"global"`` (counts of the whole minibatch) or ``"local"`` (each micro-batch's own).
    """
    logp = d["logp"].clone().requires_grad_()
    ent = d["ent"].clone().requires_grad_()
    weight = d["weight"].detach().clone().requires_grad_()
    num_tokens, num_seqs = global_counts(d["mask"])
    total = torch.zeros(())
    for rows in torch.tensor_split(torch.arange(MB_BATCH), num_micro):
        mask = d["mask"][rows]
        if counts == "local":
            num_tokens, num_seqs = global_counts(mask)
        args = (d["old"][rows], d["ref"][rows], d["adv"][rows], mask, mode, num_tokens, num_seqs)
        # (a) w.r.t. per-token log-probs / entropies given as leaves (with NaN outside the mask)
        part = _mb_loss(loss_kind, logp[rows], ent[rows], *args)
        part.backward()
        # (b) w.r.t. the weights of a linear model through token_logprobs_and_entropy
        logits = d["hidden"][rows] @ weight
        m_logp, m_ent = token_logprobs_and_entropy(logits, d["targets"][rows], chunk_size=7)
        _mb_loss(loss_kind, m_logp, m_ent, *args).backward()
        total = total + part.detach()
    return total, logp.grad, ent.grad, weight.grad


def _assert_finite_outside_mask(d, logp_grad, ent_grad):
    for g in (logp_grad, ent_grad):
        if g is not None:
            assert torch.isfinite(g).all()
            assert (g[~d["mask"]] == 0).all()


@pytest.mark.parametrize("loss_kind", LOSS_KINDS)
@pytest.mark.parametrize("mask_kind", MASK_KINDS)
@pytest.mark.parametrize("mode", AGG_MODES)
def test_micro_batch_invariance(mode, mask_kind, loss_kind):
    d = _mb_data(mask_kind)
    ref_total, ref_glogp, ref_gent, ref_gw = _mb_run(d, loss_kind, mode, 1, "global")
    assert torch.isfinite(ref_total) and ref_total.abs() > 1e-6
    assert ref_gw.abs().max() > 1e-6
    _assert_finite_outside_mask(d, ref_glogp, ref_gent)
    # the single micro-batch is the plain minibatch loss with its own counts
    assert torch.equal(_mb_run(d, loss_kind, mode, 1, "local")[0], ref_total)
    for num_micro in (2, 4):
        total, g_logp, g_ent, g_w = _mb_run(d, loss_kind, mode, num_micro, "global")
        torch.testing.assert_close(total, ref_total, atol=1e-6, rtol=0)
        for got, want in ((g_logp, ref_glogp), (g_ent, ref_gent)):
            if want is None:
                assert got is None
            else:
                torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
        torch.testing.assert_close(g_w, ref_gw, atol=1e-6, rtol=0)
        _assert_finite_outside_mask(d, g_logp, g_ent)


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("mask_kind", MASK_KINDS)
def test_micro_batch_local_counts_do_not_match(mode, mask_kind):
    """The invariance test can fail: per-micro-batch (local) counts give a different loss and gradient."""
    d = _mb_data(mask_kind)
    ref_total, _, _, ref_gw = _mb_run(d, "clipped", mode, 1, "global")
    for num_micro in (2, 4):
        total, _, _, g_w = _mb_run(d, "clipped", mode, num_micro, "local")
        assert not torch.allclose(total, ref_total, atol=1e-4, rtol=0)
        assert not torch.allclose(g_w, ref_gw, atol=1e-4, rtol=0)
