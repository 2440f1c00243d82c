"""Every algo preset runs on the lab with the vLLM engine (debug=smoke), in-process on the shared engine
(tests/harness.py; test_harness.py shows such a fit logs what a `scripts/train.py` process logs).

One iteration each: its two minibatches are two optimizer steps, the second off-policy (ratios away from 1, the
clip and the losses that replace it at work). No objective keeps state from one iteration to the next, and the
engine's weight sync after an update is the same for every preset (test_train_smoke.py and test_distributed.py run
it over several iterations), so smoke's three iterations tripled the time and added no path (118 s -> 59 s here)."""

from __future__ import annotations

import math

import pytest

from tests.helpers import CONF

pytestmark = pytest.mark.integration

PRESETS = sorted(p.stem for p in (CONF / "algo").glob("*.yaml") if p.stem != "grpo")  # grpo: test_train_smoke
RULE_OF = {"clip_cov": "clip_cov", "kl_cov": "kl_cov", "clip_b": "clip_b", "clip_v": "clip_v", "forking": "forking"}


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_smoke_run_has_finite_loss(tmp_path, harness, preset):
    overrides = [f"algo={preset}", "rollout=vllm", "callbacks/entropy=none", "trainer.max_epochs=1"]  # every row reaches the loss
    if preset == "entropy_bonus":
        overrides.append("algo.kl_coef=0.01")  # the KL term and its frozen reference, in the same run
    if preset == "clip_v":
        overrides.append("algo.selection_args.max_frac=0.05")  # the paper's 1e-4 selects nothing at smoke size
    scalars = harness.fit(overrides, tmp_path).scalars
    losses = [v for _, v in scalars["train/loss"]]
    assert losses and all(math.isfinite(v) for v in losses), preset
    assert max(v for _, v in scalars["train/grad_norm"]) > 0, preset  # the smoke run learns something
    assert all(math.isfinite(v) for _, v in scalars["rollout/entropy"])
    if preset in RULE_OF:
        assert f"train/masked_frac_{RULE_OF[preset]}" in scalars
    if preset in ("qae", "passk"):  # sparse estimators: the share of rows left with advantage 0
        assert all(0 <= v <= 1 for _, v in scalars["diag/zero_adv_frac"])
    if preset == "dapo":
        assert "rollout/sampling_rounds" in scalars
    if preset == "erc":
        assert "train/erc_clipfrac" in scalars
    if preset in ("cispo", "sapo", "dppo_tv", "dppo_kl", "topr", "topr_paper"):  # losses that replace the clip log
        assert all(0 <= v <= 1 for _, v in scalars["train/clipfrac_low"] + scalars["train/clipfrac_high"])
    ratios = [v for _, v in scalars["train/entropy_ratio"]]
    assert ratios and all(math.isfinite(v) and v > 0 for v in ratios)
    assert all(0 < v <= 1 for _, v in scalars["diag/top1_mass"])
    if preset == "entropy_bonus":
        kl = [v for _, v in scalars["train/kl_ref"]]
        assert kl and all(math.isfinite(v) and v >= 0 for v in kl)  # k3 is non-negative
        assert kl[0] < 1e-6  # the first step starts from the reference policy itself


def test_rollout_filters_report_their_counts_on_the_dashboard(tmp_path, harness):
    overrides = ["rollout=vllm", "callbacks/entropy=none", "batch.filter_repetition={ngram:4,max_frac:0.5}",
                 "batch.filter_gibberish={logprob_offset:2.0}"]
    scalars = harness.fit(overrides, tmp_path).scalars
    for tag in ("rollout/filtered_repetition", "rollout/filtered_gibberish", "rollout/filtered_total"):
        values = [v for _, v in scalars[tag]]
        assert values and all(v >= 0 and v == int(v) for v in values), tag
    total, parts = scalars["rollout/filtered_total"], scalars["rollout/filtered_repetition"]
    assert all(t >= p for (_, t), (_, p) in zip(total, parts, strict=True))
