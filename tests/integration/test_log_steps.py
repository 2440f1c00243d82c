"""A real run's TensorBoard files on the two x axes (lit_entropy/utils/log_steps.py; in-process, tests/harness.py): the
per-iteration tags at the iteration whatever the number of optimizer steps per iteration, train/* at the optimizer
step, the evaluation of the starting policy at 0."""

from __future__ import annotations

import pytest

from lit_entropy.utils.log_steps import ITERATION

pytestmark = pytest.mark.integration

N = 3  # debug=smoke: 3 iterations of 2 minibatches; ppo_epochs=2 makes it 4 optimizer steps per iteration
STEPS = 2 * 2


def test_per_iteration_tags_are_at_the_iteration_and_train_tags_at_the_optimizer_step(tmp_path, harness):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = harness.fit(["rollout=hf", "batch.ppo_epochs=2", "callbacks/eval=periodic", "callbacks.eval.at_start=true",
                       "callbacks.eval.every_n_iterations=2", "callbacks.eval.num_problems=2", "callbacks.eval.n=2",
                       "callbacks.eval.ks=[1,2]"], tmp_path)
    steps = {tag: [s for s, _ in points] for tag, points in run.scalars.items()}
    iterations = list(range(1, N + 1))
    for tag in ("rollout/entropy", "rollout/accuracy", "time/update", "time/generate", "control/kept_frac",
                "control/band_low", "diag/logp_mismatch_mean", "diag/entropy_q50", "train/loss_epoch"):
        assert steps[tag] == iterations, (tag, steps[tag])
    assert run.scalars[ITERATION] == [(k, float(k)) for k in iterations]  # the marker of the iteration axis
    assert steps["eval/pass@2"] == [0, 2, N]  # at start, after iteration 2 and after the last
    assert steps["train/loss"] == steps["train/grad_norm"] == list(range(N * STEPS))  # the optimizer steps
    assert steps["epoch"] == list(range(N * STEPS))  # Lightning's, written with the optimizer steps' values only
    assert "step" not in steps  # Lightning takes the logged `step` as the step of the write

    acc = EventAccumulator(str(run.run_dir / "tensorboard"), size_guidance={"tensors": 0, "histograms": 0})
    acc.Reload()
    assert [e.step for e in acc.Histograms("diag/token_entropy")] == iterations
    assert [e.step for e in acc.Tensors("rollout/samples/text_summary")] == iterations
