"""The mismatch corrections (lit_entropy.objectives.correction) against hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from lit_entropy.objectives import correction as corr

# Two rows: position 0 is the prompt; row 0 has 3 response tokens, row 1 has 2.
OLD = torch.tensor([[0.0, -1.0, -2.0, -0.5], [0.0, -1.0, -3.0, 0.0]])
SAMPLER = torch.tensor([[0.0, -1.5, -1.0, -0.5], [0.0, -1.0, -1.0, 0.0]])
MASK = torch.tensor([[False, True, True, True], [False, True, True, False]])
LOG_W = torch.tensor([[0.0, 0.5, -1.0, 0.0], [0.0, 0.0, -2.0, 0.0]])  # old − sampler on the mask


def test_log_weights_and_levels():
    assert torch.equal(corr.log_weights(OLD, SAMPLER, MASK), LOG_W)
    assert torch.equal(corr.level_log_weights(LOG_W, MASK, "token"), LOG_W)
    seq = corr.level_log_weights(LOG_W, MASK, "sequence")  # Σ_t log w_t on every response token
    assert torch.allclose(seq, torch.tensor([[0.0, -0.5, -0.5, -0.5], [0.0, -2.0, -2.0, 0.0]]))
    geo = corr.level_log_weights(LOG_W, MASK, "geometric")  # mean
    assert torch.allclose(geo, torch.tensor([[0.0, -0.5 / 3, -0.5 / 3, -0.5 / 3], [0.0, -1.0, -1.0, 0.0]]))
    with pytest.raises(ValueError, match="unknown weight level"):
        corr.level_log_weights(LOG_W, MASK, "row")


def test_truncated_weights_cap_at_c():
    w, cut = corr.truncated_weights(torch.tensor([math.log(3.0), math.log(0.5), 0.0]), cap=2.0)
    assert torch.allclose(w, torch.tensor([2.0, 0.5, 1.0]))
    assert cut.tolist() == [True, False, False]
    assert not w.requires_grad


def test_masked_weights_keep_the_band_and_their_weight():
    log_w = torch.tensor([math.log(6.0), math.log(0.4), math.log(2.0), math.log(0.5)])
    w, keep = corr.masked_weights(log_w, low=0.5, high=5.0)  # IcePop's band
    assert keep.tolist() == [False, False, True, True]
    assert torch.allclose(w, torch.tensor([0.0, 0.0, 2.0, 0.5]))
    _, keep = corr.masked_weights(log_w, low=0.0, high=5.0)  # TRL's mask: an upper bound only
    assert keep.tolist() == [False, True, True, True]


def test_k1_and_k3_per_token():
    log_w = torch.tensor([math.log(2.0), 0.0])
    assert torch.allclose(corr.token_k1(log_w), torch.tensor([-math.log(2.0), 0.0]))
    assert torch.allclose(corr.token_k3(log_w), torch.tensor([2.0 - 1.0 - math.log(2.0), 0.0]))


@pytest.mark.parametrize(("stat", "threshold", "expected"), [
    ("k1_mean", 0.5, [False, True]),    # |mean −log w|: row 0 0.5/3, row 1 1.0
    ("k1_max", 0.9, [True, True]),      # max |log w|: row 0 1.0, row 1 2.0
    ("k1_max", 1.5, [False, True]),
    ("k3_mean", 0.3, [False, True]),    # row 0 (k3(.5)+k3(−1))/3 = 0.150, row 1 k3(−2)/2 = 0.568
    ("k3_max", 0.3, [True, True]),      # row 0 k3(−1) = e⁻¹ = 0.368
    ("k3_max", 0.4, [False, True]),
])
def test_sequence_rejection_statistics(stat, threshold, expected):
    assert corr.reject_sequences(LOG_W, MASK, stat, threshold).tolist() == expected


def test_veto_rejects_a_row_with_one_catastrophic_token():
    assert corr.veto_sequences(LOG_W, MASK, veto=0.2).tolist() == [False, True]  # e⁻² = 0.135 < 0.2
    assert corr.veto_sequences(LOG_W, MASK, veto=0.1).tolist() == [False, False]


def test_opsm_drops_only_negative_far_off_policy_rows():
    # mean per-token log(π_sampler/π_old): row 0 (−0.5 + 1 + 0)/3 = 0.167, row 1 (0 + 2)/2 = 1.0
    adv = torch.tensor([-1.0, -1.0])
    assert corr.off_policy_sequence_mask(OLD, SAMPLER, MASK, adv, delta=0.5).tolist() == [False, True]
    assert corr.off_policy_sequence_mask(OLD, SAMPLER, MASK, adv, delta=0.1).tolist() == [True, True]
    pos = torch.tensor([1.0, 1.0])  # positive samples are always kept
    assert corr.off_policy_sequence_mask(OLD, SAMPLER, MASK, pos, delta=0.0).tolist() == [False, False]


def test_batch_normalisation_and_effective_sample_size():
    w = torch.tensor([[0.0, 1.0, 3.0], [0.0, 2.0, 9.0]])
    m = torch.tensor([[False, True, True], [False, True, False]])
    normed = corr.batch_normalized(w, m)
    assert torch.allclose(normed[m].mean(), torch.tensor(1.0))
    assert torch.allclose(normed, w / 2.0)
    ess = corr.effective_sample_size(w, m)  # (1+3+2)² / (3·(1+9+4))
    assert torch.allclose(ess, torch.tensor(36.0 / 42.0))
    assert float(corr.effective_sample_size(torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool))) == 1.0


def test_mismatch_metrics_by_hand():
    m = corr.mismatch_metrics(OLD, SAMPLER, MASK)
    w = [math.exp(0.5), math.exp(-1.0), 1.0, 1.0, math.exp(-2.0)]
    lw = [0.5, -1.0, 0.0, 0.0, -2.0]
    assert float(m["kl"]) == pytest.approx(-sum(lw) / 5)
    assert float(m["k3_kl"]) == pytest.approx(sum(x - 1 - y for x, y in zip(w, lw, strict=True)) / 5, rel=1e-6)
    assert float(m["chi2_token"]) == pytest.approx(sum(x * x for x in w) / 5 - 1, abs=1e-6)
    assert float(m["chi2_seq"]) == pytest.approx((math.exp(2 * -0.5) + math.exp(2 * -2.0)) / 2 - 1, abs=1e-6)
    assert float(m["ppl_ratio"]) == pytest.approx((math.exp(0.5 / 3) + math.exp(1.0)) / 2, rel=1e-6)
    assert float(m["ess"]) == pytest.approx(sum(w) ** 2 / (5 * sum(x * x for x in w)), rel=1e-6)
    same = corr.mismatch_metrics(OLD, OLD, MASK)  # no mismatch: KL 0, χ² 0, ESS 1
    assert float(same["kl"]) == 0 and float(same["chi2_seq"]) == 0 and float(same["ess"]) == pytest.approx(1.0)


def test_kl_bias_correction_ratio_carries_the_gradient():
    logp = torch.tensor([[0.0, -1.0]], requires_grad=True)
    r = corr.kl_bias_correction_ratio(logp, torch.tensor([[0.0, -2.0]]), torch.tensor([[False, True]]))
    assert torch.allclose(r, torch.tensor([[1.0, math.e]]))
    r.sum().backward()
    assert torch.allclose(logp.grad, torch.tensor([[0.0, math.e]]))
