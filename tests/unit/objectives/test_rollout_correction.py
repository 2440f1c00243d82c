"""The mismatch corrections against hand-computed cases; the config's validation; the batch wiring."""

from __future__ import annotations

import math

import pytest
import torch

from lit_entropy.objectives import correction as corr
from lit_entropy.objectives.rollout_correction import CorrectionConfig, check_with_algo, correct_rollout

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


# ------------------------------------------------------------------------------------- one rollout batch

ADV = torch.tensor([1.0, -1.0])


def test_none_only_measures():
    out = correct_rollout(CorrectionConfig(), OLD, SAMPLER, MASK, ADV)
    assert out.weight is None and out.keep is None
    assert set(out.metrics) >= {f"rollout_corr/{k}" for k in ("kl", "k3_kl", "ppl_ratio", "chi2_token", "chi2_seq",
                                                                "ess", "frac_truncated", "frac_masked",
                                                                "frac_rejected")}
    assert out.metrics["rollout_corr/frac_masked"] == 0.0


def test_tis_truncates_token_weights():
    out = correct_rollout(CorrectionConfig(level="token", threshold=1.5), OLD, SAMPLER, MASK, ADV)
    assert torch.allclose(out.weight[MASK], torch.tensor([1.5, math.exp(-1), 1.0, 1.0, math.exp(-2)]))
    assert out.keep is None and out.metrics["rollout_corr/frac_truncated"] == pytest.approx(1 / 5)


def test_sequence_mask_drops_rows_and_batch_normalises_the_rest():
    cfg = CorrectionConfig(level="sequence", mode="mask", threshold=3.0, threshold_low=0.2, batch_normalize=True)
    out = correct_rollout(cfg, OLD, SAMPLER, MASK, ADV)  # row weights e^−0.5 (kept), e^−2 = 0.135 (dropped)
    assert out.keep.tolist() == [[False, True, True, True], [False, False, False, False]]
    assert torch.allclose(out.weight[0, 1:], torch.ones(3)) and float(out.weight[1].abs().sum()) == 0
    assert out.metrics["rollout_corr/frac_rejected"] == 0.5 and out.metrics["rollout_corr/frac_masked"] == 0.4


def test_rejection_veto_and_opsm_combine():
    cfg = CorrectionConfig(reject="k3_max", reject_threshold=0.3, veto=0.2, opsm_delta=0.5)
    out = correct_rollout(cfg, OLD, SAMPLER, MASK, ADV)
    assert out.weight is None
    assert out.keep.any(-1).tolist() == [False, False]  # row 0 by k3_max, row 1 by all three
    assert out.metrics["rollout_corr/frac_vetoed"] == 0.5 and out.metrics["rollout_corr/frac_opsm"] == 0.5


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"level": "row"}, "correction.level"),
    ({"mode": "clip"}, "correction.mode"),
    ({"threshold": 0.0}, "correction.threshold="),
    ({"level": "token", "mode": "mask", "threshold": 2.0, "threshold_low": 3.0}, "correction.threshold_low"),
    ({"level": "token", "threshold_low": 0.5}, "needs correction.mode=mask"),
    ({"reject": "k2_mean", "reject_threshold": 1.0}, "correction.reject="),
    ({"reject": "k3_mean"}, "correction.reject and correction.reject_threshold"),
    ({"reject_threshold": 1.0}, "correction.reject and correction.reject_threshold"),
    ({"veto": 2.0}, "correction.veto"),
    ({"opsm_delta": -1.0}, "correction.opsm_delta"),
    ({"batch_normalize": True}, "correction.batch_normalize"),
    ({"bypass": True, "level": "token"}, "correction.bypass"),
])
def test_bad_values_fail_naming_the_key(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CorrectionConfig(**kwargs)


def test_bias_corrected_kl_needs_the_kl_term():
    from lit_entropy.algo import AlgoConfig

    with pytest.raises(ValueError, match="correction.bias_corrected_kl .* algo.kl_coef"):
        check_with_algo(CorrectionConfig(bias_corrected_kl=True), AlgoConfig())
    check_with_algo(CorrectionConfig(bias_corrected_kl=True), AlgoConfig(kl_coef=0.01))


def test_every_preset_builds():
    from hydra.utils import instantiate

    from tests.helpers import CONF, compose_train

    for path in sorted((CONF / "correction").glob("*.yaml")):
        cfg = instantiate(compose_train([f"correction={path.stem}", "paths.output_dir=/tmp/x"]).correction)
        assert isinstance(cfg, CorrectionConfig) and cfg.name == path.stem
    assert compose_train(["paths.output_dir=/tmp/x"]).correction.name == "none"


@pytest.mark.parametrize("preset", ["none", "tis", "mis", "seq_mask", "icepop", "opsm", "bypass"])
def test_every_shipped_preset_but_none_corrects(preset):
    """``corrects`` decides the start-up warning for ``rollout.max_staleness`` >= 1 without a correction."""
    from hydra.utils import instantiate

    from lit_entropy.objectives.rollout_correction import corrects
    from tests.helpers import compose_train

    assert corrects(instantiate(compose_train([f"correction={preset}"]).correction)) == (preset != "none")
    assert not corrects(None)


@pytest.mark.parametrize("k, preset, warns", [
    (0, "none", None), (1, "none", "no correction"), (2, "none", "no correction"), (1, "tis", None),
    (2, "tis", "truncated weights only"), (3, "tis", "truncated weights only"), (1, "mis", None), (2, "mis", None),
    (3, "mis", None), (2, "seq_mask", None), (2, "bypass", None)])
def test_the_staleness_warning_follows_the_measurement(k, preset, warns):
    """No correction at any lag, and TIS from a lag of 2, are warned about at start-up (docs/overlap.md)."""
    from hydra.utils import instantiate

    from lit_entropy.objectives.rollout_correction import staleness_advice
    from tests.helpers import compose_train

    advice = staleness_advice(k, instantiate(compose_train([f"correction={preset}"]).correction))
    assert (advice is None) if warns is None else (warns in advice and "correction=mis" in advice)
