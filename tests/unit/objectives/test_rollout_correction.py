"""The ``correction`` group (lit_entropy.objectives.rollout_correction): one rollout batch corrected, the config's
validation, the presets and the staleness warning. The rules themselves: test_correction.py beside this file."""

from __future__ import annotations

import math

import pytest
import torch

from lit_entropy.objectives.rollout_correction import CorrectionConfig, check_with_algo, correct_rollout
from tests.unit.objectives.test_correction import MASK, OLD, SAMPLER

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
