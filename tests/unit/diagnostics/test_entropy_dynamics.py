"""Entropy-dynamics statistics (docs/design.md §7.5): the first-order law on a tabular softmax, on-policy
centring of S − N, and every statistic against a by-hand computation with garbage padding."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lit_entropy.diagnostics.discriminator import token_scores
from lit_entropy.diagnostics.entropy_dynamics import (
    cov_logp_adv,
    dh_pred,
    disc_centered_mean,
    entropy_by_sign,
    entropy_quantiles,
    mean_loglik_by_sign,
)

# Response layout used below: row i has response tokens at positions 1..LENGTHS[i]; the rest is padding.
LENGTHS = (5, 4, 3)
L = 7


def layout(lengths=LENGTHS, length=L) -> torch.Tensor:
    mask = torch.zeros(len(lengths), length, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, 1 : 1 + n] = True
    return mask


def with_garbage(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x`` with NaN / inf / huge values off the mask (padding may hold anything)."""
    junk = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30], dtype=x.dtype)
    fill = junk[torch.arange(x.numel()) % 4].view_as(x)
    return torch.where(mask, x, fill)


def entropy_of(logits: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits, -1)
    return -(logp.exp() * logp).sum(-1)


# ---- the first-order law on a tabular softmax ----------------------------------------------------
@pytest.mark.parametrize("adv_kind", ["token", "sequence"])
def test_tabular_softmax_entropy_change_matches_minus_eta_A_times_S_minus_N(adv_kind):
    """One SGD step on Σ_t −η·A_t·log p_t(y_t): each state's entropy moves by −η·A_t·(S_t − N_t) + O(η²)."""
    gen = torch.Generator().manual_seed(0)
    mask = layout()
    n_states, vocab, eta = int(mask.sum()), 7, 1e-5
    theta = (1.5 * torch.randn(n_states, vocab, generator=gen, dtype=torch.float64)).requires_grad_(True)
    tokens = torch.multinomial(torch.softmax(theta.detach(), -1), 1, generator=gen).squeeze(-1)
    if adv_kind == "token":
        token_adv = torch.randn(n_states, generator=gen, dtype=torch.float64)
        adv_bl = torch.zeros(mask.shape, dtype=torch.float64)
        adv_bl[mask] = token_adv
        adv_arg = with_garbage(adv_bl, mask)
    else:
        seq_adv = torch.randn(len(LENGTHS), generator=gen, dtype=torch.float64)
        adv_arg = seq_adv
        token_adv = seq_adv[:, None].expand(mask.shape)[mask]

    # One state per response token; the update is plain SGD on the logits of each state.
    loss = -(eta * token_adv * torch.log_softmax(theta, -1)[torch.arange(n_states), tokens]).sum()
    loss.backward()
    with torch.no_grad():
        h_before = entropy_of(theta)
        h_after = entropy_of(theta - theta.grad)
    actual = h_after - h_before

    # S, N from the package's scorer, laid out as a padded [B, L] batch (garbage logits on padding).
    logits = 50 * torch.randn(*mask.shape, vocab, generator=gen, dtype=torch.float64)
    logits[mask] = theta.detach()
    targets = torch.zeros(mask.shape, dtype=torch.long)
    targets[mask] = tokens
    S, N = token_scores(logits, targets)
    S, N = S.double(), N.double()
    predicted = -eta * token_adv * (S[mask] - N[mask])

    assert predicted.abs().min() > 1e-3 * predicted.abs().max()  # no degenerate state hides in the check
    torch.testing.assert_close(actual, predicted, rtol=1e-2, atol=0.0)  # per state
    # Batch mean: the token-mean change is η·dH_pred (product form), garbage padding ignored.
    pred_mean = eta * dh_pred(with_garbage(S, mask), with_garbage(N, mask), adv_arg, mask)
    assert pred_mean.dtype == torch.float64
    assert math.isclose(float(actual.mean()), float(pred_mean), rel_tol=1e-2)
    assert math.copysign(1.0, float(actual.mean())) == math.copysign(1.0, float(pred_mean))


def test_tabular_law_holds_to_first_order_only():
    """Error shrinks like η²: halving η quarters the gap between the actual and predicted change."""
    gen = torch.Generator().manual_seed(1)
    theta0 = torch.randn(4, 5, generator=gen, dtype=torch.float64)
    tokens = torch.tensor([0, 1, 2, 3])
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0], dtype=torch.float64)
    S, N = token_scores(theta0[None], tokens[None])
    S, N = S[0].double(), N[0].double()

    def gap(eta: float) -> torch.Tensor:
        theta = theta0.clone().requires_grad_(True)
        (-(eta * adv * torch.log_softmax(theta, -1)[torch.arange(4), tokens]).sum()).backward()
        with torch.no_grad():
            actual = entropy_of(theta - theta.grad) - entropy_of(theta0)
        return (actual - (-eta * adv * (S - N))).abs()

    ratio = gap(1e-2) / gap(5e-3)
    assert ((ratio > 3.0) & (ratio < 5.0)).all(), ratio


# ---- on-policy centring ----------------------------------------------------------------------------
def _scored_batch(sampler: str, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    B, Lq, V = 64, 40, 11
    logits = 2.0 * torch.randn(B, Lq, V, generator=gen)
    if sampler == "policy":
        probs = torch.softmax(logits, -1)
    else:  # uniform: off-policy
        probs = torch.full_like(logits, 1.0 / V)
    targets = torch.multinomial(probs.view(-1, V), 1, generator=gen).view(B, Lq)
    S, N = token_scores(logits, targets)
    lengths = torch.randint(5, Lq, (B,), generator=gen)
    mask = torch.arange(Lq)[None, :] < lengths[:, None]
    mask[:, 0] = False
    return S, N, mask


def test_disc_centered_mean_is_zero_on_policy_within_standard_errors():
    S, N, mask = _scored_batch("policy")
    d = (S - N)[mask].double()
    se = float(d.std() / math.sqrt(d.numel()))
    value = float(disc_centered_mean(with_garbage(S, mask), with_garbage(N, mask), mask))
    assert math.isclose(value, float(d.mean()), rel_tol=1e-4, abs_tol=1e-7)
    assert abs(value) < 4 * se, (value, se)


def test_disc_centered_mean_detects_off_policy_tokens():
    # Under uniform sampling E[S] = Σ_v p_v(H + log p_v)/V = 0, so the mean is −mean N < 0.
    S, N, mask = _scored_batch("uniform")
    d = (S - N)[mask].double()
    se = float(d.std() / math.sqrt(d.numel()))
    value = float(disc_centered_mean(S, N, mask))
    assert value < -10 * se


# ---- by-hand references with padding ----------------------------------------------------------------
def _random_batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    mask = layout((5, 0, 3, 6), 8)
    B = mask.shape[0]
    logp = -torch.rand(B, 8, generator=gen) * 4
    ent = torch.rand(B, 8, generator=gen) * 2
    adv = torch.tensor([1.5, 0.7, -0.5, 0.0])
    tok_adv = torch.randn(B, 8, generator=gen)
    return mask, logp, ent, adv, tok_adv


@pytest.mark.parametrize("kind", ["sequence", "token"])
def test_cov_logp_adv_matches_a_direct_computation_with_padding(kind):
    mask, logp, _, adv, tok_adv = _random_batch()
    a_bl = adv[:, None].expand_as(logp) if kind == "sequence" else tok_adv
    xs, ys = [], []
    m, lp, a = mask.numpy(), logp.numpy(), a_bl.numpy()
    for i in range(m.shape[0]):
        for t in range(m.shape[1]):
            if m[i, t]:
                xs.append(float(lp[i, t]))
                ys.append(float(a[i, t]))
    x, y = np.array(xs), np.array(ys)
    expected = float(np.mean((x - x.mean()) * (y - y.mean())))
    assert math.isclose(expected, float(np.cov(x, y, bias=True)[0, 1]), rel_tol=1e-9, abs_tol=1e-12)
    arg = adv if kind == "sequence" else with_garbage(tok_adv, mask)
    got = cov_logp_adv(with_garbage(logp, mask), arg, mask)
    assert got.dtype == torch.float32 and torch.isfinite(got)
    assert math.isclose(float(got), expected, rel_tol=1e-5, abs_tol=1e-7)


def test_cov_sign_follows_the_correlation():
    mask = torch.ones(1, 6, dtype=torch.bool)
    logp = torch.tensor([[-3.0, -2.0, -1.0, -0.5, -0.2, -0.1]])
    assert cov_logp_adv(logp, torch.linspace(-1, 1, 6)[None], mask) > 0
    assert cov_logp_adv(logp, -torch.linspace(-1, 1, 6)[None], mask) < 0


def test_dh_pred_is_the_product_form_not_the_covariance():
    mask, _, _, adv, tok_adv = _random_batch(3)
    gen = torch.Generator().manual_seed(4)
    S = torch.rand(mask.shape, generator=gen)
    N = torch.rand(mask.shape, generator=gen) * 0.1  # mean(S − N) far from 0: product ≠ covariance
    d, a = (S - N)[mask], tok_adv[mask]
    expected = -float((a * d).mean())
    got = float(dh_pred(with_garbage(S, mask), with_garbage(N, mask), with_garbage(tok_adv, mask), mask))
    assert math.isclose(got, expected, rel_tol=1e-5)
    cov = -float(((a - a.mean()) * (d - d.mean())).mean())
    assert not math.isclose(got, cov, rel_tol=1e-2)
    # Per-sequence advantages broadcast over tokens.
    a_seq = adv[:, None].expand_as(S)[mask]
    assert math.isclose(float(dh_pred(S, N, adv, mask)), -float((a_seq * d).mean()), rel_tol=1e-5)


def test_entropy_and_loglik_by_sign_by_hand():
    mask, logp, ent, adv, _ = _random_batch(5)
    # Signs: row0 +, row1 + but no response token, row2 −, row3 zero (in neither class).
    pos, neg = entropy_by_sign(with_garbage(ent, mask), adv, mask)
    assert math.isclose(float(pos), float(ent[0, 1:6].mean()), rel_tol=1e-6)
    assert math.isclose(float(neg), float(ent[2, 1:4].mean()), rel_tol=1e-6)
    lpos, lneg = mean_loglik_by_sign(with_garbage(logp, mask), adv, mask)
    assert math.isclose(float(lpos), float(logp[0, 1:6].mean()), rel_tol=1e-6)
    assert math.isclose(float(lneg), float(logp[2, 1:4].mean()), rel_tol=1e-6)


def test_by_sign_pools_tokens_for_entropy_but_averages_sequences_for_loglik():
    mask = layout((1, 3), 5)
    logp = torch.tensor([[0.0, -4.0, 0, 0, 0], [0.0, -1.0, -1.0, -1.0, 0]])
    ent = torch.tensor([[0.0, 4.0, 0, 0, 0], [0.0, 1.0, 1.0, 1.0, 0]])
    adv = torch.tensor([1.0, 2.0])
    pos, neg = entropy_by_sign(ent, adv, mask)
    assert float(pos) == pytest.approx(7.0 / 4.0) and float(neg) == 0.0
    lpos, lneg = mean_loglik_by_sign(logp, adv, mask)
    assert float(lpos) == pytest.approx((-4.0 - 1.0) / 2) and float(lneg) == 0.0
    # Token advantages: the sample's sign is that of its mean token advantage.
    tok = torch.tensor([[0.0, -1.0, 0, 0, 0], [0.0, 3.0, -1.0, -1.0, 0]])
    pos, neg = entropy_by_sign(ent, tok, mask)
    assert float(pos) == pytest.approx(1.0) and float(neg) == pytest.approx(4.0)


def test_quantiles_match_torch_quantile():
    mask, _, ent, _, _ = _random_batch(7)
    qs = (0.0, 0.1, 0.5, 0.9, 0.99, 1.0)
    got = entropy_quantiles(with_garbage(ent, mask), mask, qs)
    expected = torch.quantile(ent[mask], torch.tensor(qs))
    torch.testing.assert_close(got, expected)
    default = entropy_quantiles(ent, mask)
    assert default.shape == (4,)
    with pytest.raises(ValueError, match="quantiles"):
        entropy_quantiles(ent, mask, (1.5,))


def test_empty_masks_give_zeros_not_nan():
    mask = torch.zeros(2, 4, dtype=torch.bool)
    x = torch.full((2, 4), float("nan"))
    adv = torch.tensor([1.0, -1.0])
    assert float(cov_logp_adv(x, adv, mask)) == 0.0
    assert float(disc_centered_mean(x, x, mask)) == 0.0
    assert float(dh_pred(x, x, adv, mask)) == 0.0
    assert [float(v) for v in entropy_by_sign(x, adv, mask)] == [0.0, 0.0]
    assert [float(v) for v in mean_loglik_by_sign(x, adv, mask)] == [0.0, 0.0]
    assert entropy_quantiles(x, mask).tolist() == [0.0] * 4


def test_low_precision_inputs_are_computed_in_fp32_and_shapes_are_checked():
    mask, logp, ent, adv, _ = _random_batch(9)
    got = cov_logp_adv(logp.bfloat16(), adv.bfloat16(), mask)
    assert got.dtype == torch.float32
    with pytest.raises(ValueError, match="mask"):
        cov_logp_adv(logp, adv, mask[:, :-1])
    with pytest.raises(ValueError, match="advantages"):
        dh_pred(ent, ent, adv[:-1], mask)
