"""The two x axes of a run's logs (lit_entropy/utils/log_steps.py): which tag is on which, and a resumed run's TensorBoard
writer in the interrupted run's folder, which must hide what was logged after the checkpoint on both axes."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_entropy.utils.log_steps import (
    ITERATION,
    iteration_step,
    on_optimizer_step,
    tensorboard_resume,
    write_again,
)


def test_train_tags_are_per_optimizer_step_and_everything_else_per_iteration():
    assert iteration_step(0) == 1 and iteration_step(39) == 40
    for tag in ("train/loss", "train/grad_norm", "train/masked_frac_clip_cov", "epoch"):
        assert on_optimizer_step(tag), tag
    for tag in ("train/loss_epoch", "rollout/entropy", "control/band_low", "eval/pass@1", "time/update", "diag/dH_actual",
                "law/a", "rollout_corr/kl", "rollout/samples/text_summary", "diag/token_entropy", ITERATION):
        assert not on_optimizer_step(tag), tag


def log_run(writer, iterations: range, m: int, upto_step: int | None = None) -> None:
    """What the module logs for ``iterations`` (from 1) with ``m`` optimizer steps each: train/* and epoch at the
    optimizer steps, the per-iteration values (a scalar, the marker, a text and a histogram) at the iteration. An
    interrupted run stops after optimizer step ``upto_step`` of the last iteration, before its per-iteration values."""
    import torch

    for it in iterations:
        writer.add_histogram("diag/token_entropy", torch.rand(8), it)  # at the rollout, before the update
        writer.add_text("rollout/samples", f"samples of iteration {it}", it)
        for step in range((it - 1) * m, it * m):
            if upto_step is not None and step > upto_step:
                return
            writer.add_scalar("train/loss", 1.0 / (1 + step), step)
            writer.add_scalar("epoch", it - 1, step)
        for tag, value in (("rollout/entropy", 0.5 - 0.01 * it), (ITERATION, it)):
            writer.add_scalar(tag, value, it)


def shown(folder: Path) -> dict[str, list[int]]:
    """The steps of every tag as TensorBoard shows the folder: all its files, restarts' purges applied."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0, "histograms": 0})
    acc.Reload()
    tags = acc.Tags()
    out = {t: [e.step for e in acc.Scalars(t)] for t in tags["scalars"]}
    out.update({t: [e.step for e in acc.Tensors(t)] for t in tags["tensors"]})
    out.update({t: [e.step for e in acc.Histograms(t)] for t in tags["histograms"]})
    return out


@pytest.mark.parametrize("m", [1, 2, 4])
def test_a_resumed_run_in_the_same_folder_shows_every_step_once_on_both_axes(tmp_path, m):
    from torch.utils.tensorboard import SummaryWriter

    K, J = 5, 2  # killed during iteration J + 1, after its rollout and one optimizer step; last.ckpt after J
    folder = tmp_path / "tensorboard"
    writer = SummaryWriter(str(folder), filename_suffix=".0")
    log_run(writer, range(1, J + 2), m, upto_step=J * m)
    writer.close()
    purge, again = tensorboard_resume(folder, step=J * m, iteration=J)
    assert purge == min(J * m, J + 1)
    writer = SummaryWriter(str(folder), purge_step=purge, filename_suffix=".1")  # a later file, as a restart's
    write_again(writer, again)
    log_run(writer, range(J + 1, K + 1), m)
    writer.close()

    straight = tmp_path / "straight"
    writer = SummaryWriter(str(straight))
    log_run(writer, range(1, K + 1), m)
    writer.close()
    got, want = shown(folder), shown(straight)
    text = "rollout/samples/text_summary"  # TensorBoard purges no text: the unfinished iteration's shows twice
    assert got.pop(text) == sorted([*want.pop(text), J + 1])
    assert got == want
    assert got["rollout/entropy"] == got[ITERATION] == list(range(1, K + 1))
    assert got["diag/token_entropy"] == list(range(1, K + 1))
    assert got["train/loss"] == got["epoch"] == list(range(K * m))


def test_a_folder_without_the_iteration_marker_keeps_the_purge_at_the_optimizer_step(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    assert tensorboard_resume(tmp_path / "missing", step=8, iteration=2) == (8, [])
    writer = SummaryWriter(str(tmp_path))
    for step in range(10):  # logged before the two axes: everything at the optimizer step
        writer.add_scalar("train/loss", 1.0, step)
        writer.add_scalar("rollout/entropy", 0.5, step)
    writer.close()
    assert tensorboard_resume(tmp_path, step=8, iteration=2) == (8, [])


def test_a_run_resumed_from_its_first_checkpoint_replaces_what_the_interrupted_run_logged(tmp_path):
    """The checkpoint at boundary 0 (before the first rollout) has optimizer step 0: the restart's writer must still
    purge (a guard on a falsy step once left the interrupted run's iterations beside their recomputed copies)."""
    from lightning.pytorch.loggers import TensorBoardLogger
    from omegaconf import OmegaConf

    from lit_entropy.train import instantiate_loggers

    node = {"tb": {"_target_": "lightning.pytorch.loggers.TensorBoardLogger", "save_dir": str(tmp_path),
                   "name": "tensorboard", "version": ""}}
    (first,) = instantiate_loggers(OmegaConf.create(node))
    log_run(first.experiment, range(1, 4), 2)  # three iterations, then killed before the checkpoint at 10
    first.experiment.close()
    (again,) = instantiate_loggers(OmegaConf.create(node), resume_step=0, resume_iteration=0)
    assert isinstance(again, TensorBoardLogger)
    log_run(again.experiment, range(1, 6), 2)  # the resumed run from the start
    again.experiment.close()
    got = shown(tmp_path / "tensorboard")
    assert got["rollout/entropy"] == got[ITERATION] == list(range(1, 6))
    assert got["train/loss"] == list(range(10))
