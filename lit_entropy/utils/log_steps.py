"""The steps a run's metrics are logged at: two x axes.

``train/*`` (but ``train/loss_epoch``) is logged once per optimizer step, at the optimizer step (Lightning's
global step, from 0). Everything else is logged once per RL iteration (one Lightning epoch): ``rollout/*``,
``rollout_corr/*``, ``control/*``, ``diag/*``, ``law/*``, ``stop/*``, ``eval/*``, ``summary/*``, ``time/*``, ``train/loss_epoch``, the
``rollout/samples`` text and the ``diag/token_entropy`` histogram, at the iteration k: the number of iterations
finished when the value is written (1 for the first), whatever the number of optimizer steps per iteration. The
evaluation of the starting policy (``callbacks.eval.at_start``) is at 0, an evaluation after iteration k at k.

The module logs ``step`` = k with each iteration's values (Lightning takes a logged ``step`` as the step of that
write and drops it) and ``iteration`` = k, the marker that a run uses this axis: runs logged before it wrote every
value at the optimizer step (:mod:`lit_entropy.analysis.compare` reads both kinds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ITERATION = "iteration"
"""The scalar that marks a run whose per-iteration values are logged at the iteration."""

PER_ITERATION_TRAIN = frozenset({"train/loss_epoch"})


def iteration_step(current_epoch: int) -> int:
    """The step of what is logged during Lightning epoch ``current_epoch`` (from 0): the iteration it finishes."""
    return int(current_epoch) + 1


def on_optimizer_step(tag: str) -> bool:
    """Whether ``tag`` is logged against the optimizer step: ``train/*`` but ``train/loss_epoch``, and Lightning's
    own ``epoch`` (written with every optimizer step's values). Every other tag of a run is per iteration."""
    return tag == "epoch" or (tag.startswith("train/") and tag not in PER_ITERATION_TRAIN)


def tensorboard_resume(log_dir: str | Path, step: int, iteration: int) -> tuple[int, list[Any]]:
    """A resumed run's TensorBoard writer in the interrupted run's folder ``log_dir``: its ``purge_step`` and the
    events of the folder to write again after it.

    A writer's ``purge_step`` P makes TensorBoard drop, in every tag, what the folder holds at step P and later:
    what the interrupted run logged after its checkpoint, which the resumed run logs again. The checkpoint after
    ``iteration`` iterations and ``step`` optimizer steps comes after the iteration axis's steps up to ``iteration``
    and the optimizer axis's steps up to ``step - 1``; one purge step cannot cut both axes there. So P is the smaller
    of ``step`` and ``iteration + 1``, and the events at P or later that came before the checkpoint on their own axis
    are returned, to be written again (:func:`write_again`) behind the purge. A folder without the ``iteration``
    marker (logged before the two axes, or empty) keeps P = ``step`` and nothing to write again.

    The purge is TensorBoard's ``EventAccumulator``'s (``--load_fast=false``, and what the tests read): scalars and
    histograms, not tensor summaries such as the text samples, which are neither purged nor written again (the
    unfinished iteration's text may show twice). TensorBoard's default data server instead drops, in each series,
    the points at and after the first step written again; the events written again leave that view unchanged.
    """
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2

    seen: list[Any] = []  # the summary events TensorBoard shows now: earlier purges applied, in file order
    for path in sorted(Path(log_dir).glob("events.out.tfevents.*")):
        for raw in RawEventFileLoader(str(path)).Load():
            event = event_pb2.Event.FromString(raw)
            if event.HasField("session_log") and event.session_log.status == event_pb2.SessionLog.START:
                seen = [e for e in seen if e.step < event.step]
            elif event.HasField("summary"):
                seen.append(event)
    if not any(v.tag == ITERATION for e in seen for v in e.summary.value):
        return step, []
    purge = min(step, iteration + 1)
    again = []
    for event in seen:
        if event.step < purge:
            continue
        values = [v for v in event.summary.value if v.WhichOneof("value") != "tensor"  # never purged (text)
                  and (event.step < step if on_optimizer_step(v.tag) else event.step <= iteration)]
        if values:
            copy = event_pb2.Event()
            copy.CopyFrom(event)
            del copy.summary.value[:]
            copy.summary.value.extend(values)
            again.append(copy)
    return purge, again


def write_again(writer: Any, events: list[Any]) -> None:
    """Append ``events`` (from :func:`tensorboard_resume`) to a ``SummaryWriter``'s file, wall times kept."""
    file_writer = writer._get_file_writer()  # what Lightning's TensorBoardLogger writes its hparams through
    for event in events:
        file_writer.add_event(event, walltime=event.wall_time)
    writer.flush()
