"""Reading runs back (lit_entropy/analysis/runs.py): a resumed run reads like an uninterrupted one."""

from __future__ import annotations

import time
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from lit_entropy.analysis.runs import read_scalars, scalar_events, wall_times


def test_a_resumed_runs_purge_drops_what_the_interrupted_run_logged_after_its_checkpoint(tmp_path: Path) -> None:
    folder = tmp_path / "run" / "tensorboard"
    first = SummaryWriter(str(folder))
    for k in range(1, 6):  # interrupted after iteration 5; its checkpoint is after iteration 3
        first.add_scalar("rollout/entropy", 1.0 + k, k)
    first.close()
    time.sleep(1.1)  # a new event file name (it carries the creation time in seconds)
    resumed = SummaryWriter(str(folder), purge_step=4)
    for k in range(4, 7):
        resumed.add_scalar("rollout/entropy", 10.0 + k, k)
    resumed.close()
    assert len(list(folder.glob("events.out.tfevents.*"))) == 2
    assert read_scalars(tmp_path / "run")["rollout/entropy"] == [
        (1, 2.0), (2, 3.0), (3, 4.0), (4, 14.0), (5, 15.0), (6, 16.0)]
    assert len(wall_times(tmp_path / "run", "rollout/entropy")) == 6


def test_points_written_twice_unpurged_read_once_and_different_values_stay(tmp_path: Path) -> None:
    """A restart that did not purge (from the boundary-0 checkpoint, before the fix) wrote iterations 1-3 again:
    identical values read once; a value that differs at a step (a time) is kept, both copies in order."""
    folder = tmp_path / "run" / "tensorboard"
    first = SummaryWriter(str(folder), filename_suffix=".0")
    for k in range(1, 4):
        first.add_scalar("rollout/entropy", 1.0 + k, k)
        first.add_scalar("time/generate", 9.0, k)
    first.close()
    again = SummaryWriter(str(folder), filename_suffix=".1")
    for k in range(1, 6):
        again.add_scalar("rollout/entropy", 1.0 + k, k)
        again.add_scalar("time/generate", 5.0, k)
    again.close()
    s = read_scalars(tmp_path / "run")
    assert s["rollout/entropy"] == [(k, 1.0 + k) for k in range(1, 6)]
    assert s["time/generate"][:2] == [(1, 9.0), (1, 5.0)] and len(s["time/generate"]) == 8
    assert len(wall_times(tmp_path / "run", "rollout/entropy")) == 5  # one per point read, as the records keep them


def test_scalar_events_are_the_points_read_scalars_reads_with_their_wall_times(tmp_path: Path) -> None:
    """One read gives both: the (step, value) of each point as read_scalars reads it, and its own wall time."""
    writer = SummaryWriter(str(tmp_path / "run" / "tensorboard"))
    for k in range(1, 5):
        writer.add_scalar("rollout/entropy", 2.0 - 0.1 * k, k, walltime=100.0 + 7.0 * k)
        writer.add_scalar("train/pg_loss", 0.5 * k, 2 * k, walltime=100.0 + 7.0 * k + 1)
    writer.close()
    events = scalar_events(tmp_path / "run")
    assert {tag: [(s, v) for s, v, _ in pts] for tag, pts in events.items()} == read_scalars(tmp_path / "run")
    assert [w for _, _, w in events["rollout/entropy"]] == [107.0, 114.0, 121.0, 128.0]
    assert wall_times(tmp_path / "run", "train/pg_loss") == [108.0, 115.0, 122.0, 129.0]
