"""lit_entropy/analysis/tfevents.py reads what TensorBoard's EventAccumulator shows, rule by rule."""

from __future__ import annotations

from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

from lit_entropy.analysis.tfevents import records, stream_scalars


def accumulated(folder: Path) -> list[tuple[str, list[tuple[int, float, float]]]]:
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return [(tag, [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)]) for tag in acc.Tags()["scalars"]]


def streamed(folder: Path) -> list[tuple[str, list[tuple[int, float, float]]]]:
    return list(stream_scalars(sorted(folder.glob("events.out.tfevents.*"))).items())


def scalar(step: int, **values: float) -> event_pb2.Event:
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=t.replace("_", "/"), simple_value=v)
                                         for t, v in values.items()])
    return event_pb2.Event(wall_time=1000.0 + step + len(values) / 10, step=step, summary=summary)


def version(text: str = "brain.Event:2", step: int = 0) -> event_pb2.Event:
    return event_pb2.Event(wall_time=999.0, step=step, file_version=text)


def start(step: int) -> event_pb2.Event:
    return event_pb2.Event(wall_time=2000.0, step=step, session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START))


def write(path: Path, events: list[event_pb2.Event]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        out = RecordWriter(f)
        for event in events:
            out.write(event.SerializeToString())
    return path


STREAMS = {
    # a SummaryWriter's run, resumed with purge_step=3 in a second file: points at steps >= 3 of every tag go,
    # a tag logged only after step 3 stays listed with no points
    "restart": [[version(), *[scalar(s, a=s, b=-s) for s in range(6)], scalar(4, late=1.0)],
                [version(), start(3), *[scalar(s, a=10 + s) for s in range(3, 5)]]],
    # no file_version: an event with summaries below the latest step purges its own tags only
    "out of order": [[scalar(0, a=0, b=0), scalar(1, a=1, b=1), scalar(2, a=2, b=2), scalar(1, a=9)]],
    # an unreadable file_version is -1: the out-of-order rule; a START event does nothing there
    "version 1": [[version("brain.Event:1"), scalar(0, a=0), scalar(2, a=2), start(1), scalar(1, b=5),
                   scalar(1, a=7), version("garbage"), scalar(0, a=3)]],
    # a non-summary event moves the latest step too; a value without a tag purges every tag
    "untagged": [[scalar(0, a=0, b=0), scalar(3, a=3, b=3), event_pb2.Event(step=5, graph_def=b"graph"),
                  scalar(2, **{"": 1.0})]],
}


@pytest.mark.parametrize("name", STREAMS)
def test_the_stream_reads_what_the_accumulator_shows(tmp_path, name):
    for i, events in enumerate(STREAMS[name]):
        write(tmp_path / f"events.out.tfevents.{i:04d}.host", events)
    got = streamed(tmp_path)
    assert got == accumulated(tmp_path)
    assert any(points for _, points in got)  # each stream keeps something to compare


def test_the_restart_stream_spelled_out(tmp_path):
    for i, events in enumerate(STREAMS["restart"]):
        write(tmp_path / f"events.out.tfevents.{i:04d}.host", events)
    got = {tag: [(s, v) for s, v, _ in points] for tag, points in streamed(tmp_path)}
    assert got == {"a": [(0, 0.0), (1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0)], "b": [(0, 0.0), (1, -1.0), (2, -2.0)],
                   "late": []}


def test_an_unfinished_last_record_ends_the_file_and_a_summary_writer_run_reads_alike(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path))
    for step in range(20):
        writer.add_scalar("train/loss", 1.0 / (step + 1), step)
        writer.add_scalar("rollout/entropy", 2.0 - step / 10, step)
    writer.close()
    writer = SummaryWriter(str(tmp_path), purge_step=12)
    for step in range(12, 15):
        writer.add_scalar("train/loss", -1.0, step)
    writer.close()
    assert streamed(tmp_path) == accumulated(tmp_path)
    last = sorted(tmp_path.glob("events.out.tfevents.*"))[-1]
    whole = last.read_bytes()
    for cut in (2, 7):  # the writer killed inside its last record's CRC, or inside its data
        last.write_bytes(whole[:-cut])
        assert len(list(records(last))) == len(list(records_of(whole))) - 1
        assert streamed(tmp_path) == accumulated(tmp_path)


def records_of(data: bytes) -> list[bytes]:
    import tempfile

    with tempfile.NamedTemporaryFile() as f:
        f.write(data)
        f.flush()
        return list(records(f.name))


def test_the_vectorised_checksum_is_tensorboards():
    import random

    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as one_by_one

    from lit_entropy.analysis.tfevents import masked_crc32c

    rng = random.Random(0)
    blobs = [bytes(rng.randrange(256) for _ in range(n)) for n in [0, 1, 8, 8, 8, 57, 57, 300] + list(range(2, 40))]
    assert masked_crc32c(blobs) == [one_by_one(b) for b in blobs]


def test_written_scalars_read_back_through_tensorboards_checksummed_reader(tmp_path):
    from lit_entropy.analysis.tfevents import write_scalars

    scalars = {"rollout/entropy": [(0, 2.25, 10.0), (1, 1.5, 11.0)], "train/loss": [(0, -0.125, None), (1, 3e-9, None)],
               "a/tag/of/another/length": [(7, float("inf"), 12.5)]}
    first = write_scalars(tmp_path, scalars)
    second = write_scalars(tmp_path, {"x": [(0, 1.0, 1.0)]})  # a second file in the same second: its own name
    assert first != second and first.name.startswith("events.out.tfevents.")
    got = dict(accumulated(tmp_path))  # EventAccumulator stops at a record whose CRC fails
    assert {t: [(s, v) for s, v, _ in p] for t, p in got.items()} == {
        "rollout/entropy": [(0, 2.25), (1, 1.5)], "train/loss": [(0, -0.125), (1, pytest.approx(3e-9))],
        "a/tag/of/another/length": [(7, float("inf"))], "x": [(0, 1.0)]}
    assert [w for _, _, w in got["rollout/entropy"]] == [10.0, 11.0]
    assert streamed(tmp_path) == accumulated(tmp_path)
