"""No checkpoint runs code: every load the package does is weights-only (lit_entropy.utils.checkpointing.load_checkpoint).

A checkpoint whose pickle would run a shell command is refused by resume (``train.fit``), evaluation and export,
each naming the file, and the command never runs; a full unpickling happens only on the documented opt-in
(``trust_checkpoint=true``, ``--trust-checkpoint``). A sharded (DCP) folder's ``.metadata`` pickle is held to DCP's
own classes. That the package's own checkpoints load weights-only is what every resume test does (``train.fit``
passes ``weights_only=True``): tests/integration/test_controller_resume.py resumes every controller that way.
"""

from __future__ import annotations

import os
import pickle
import shutil
import warnings

import pytest
import torch

from lit_entropy.utils.checkpointing import (
    UnsafeCheckpointError,
    check_resumable,
    check_sharded_metadata,
    load_checkpoint,
)
from tests.helpers import compose_train


class RunsACommand:
    """Unpickling this calls ``os.system``: the payload of a hostile checkpoint."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def hostile_checkpoint(path, marker) -> None:
    """A file shaped like a training checkpoint of this package, with the payload among its callback states."""
    progress = {"ready": 1, "started": 1, "processed": 1, "completed": 1}
    torch.save({
        "state_dict": {"model.w": torch.ones(3)},
        "loops": {"fit_loop": {"epoch_progress": {"total": progress},
                               "epoch_loop.state_dict": {"_batches_that_stepped": 2}}},
        "callbacks": {"Payload": RunsACommand(marker)},
        "lit_entropy": {"kind": "iteration", "iteration": 1},
    }, path)


@pytest.fixture
def hostile(tmp_path):
    marker = tmp_path / "the_command_ran"
    path = tmp_path / "run" / "checkpoints" / "last.ckpt"
    path.parent.mkdir(parents=True)
    hostile_checkpoint(path, marker)
    return path, marker


def test_a_hostile_file_is_refused_naming_it_and_what_it_asked_for(hostile):
    path, marker = hostile
    with pytest.raises(UnsafeCheckpointError, match="trust_checkpoint=true") as err:
        load_checkpoint(path)
    assert str(path) in str(err.value) and "posix.system" in str(err.value)
    assert not marker.exists()


def test_full_unpickling_only_on_the_explicit_option_and_with_a_warning(hostile, caplog):
    path, marker = hostile
    load_checkpoint(path, trust=True)
    assert marker.exists()  # what the option means: the file's code runs
    assert "full unpickling" in caplog.text


def test_a_plain_checkpoint_loads_memory_mapped_and_a_legacy_one_read(tmp_path):
    new, old = tmp_path / "new.ckpt", tmp_path / "old.ckpt"
    state = {"state_dict": {"model.w": torch.arange(4.0)}, "rng": (1, [2, 3], {"a": None})}
    torch.save(state, new)
    torch.save(state, old, _use_new_zipfile_serialization=False)
    for path in (new, old):
        loaded = load_checkpoint(path)
        assert torch.equal(loaded["state_dict"]["model.w"], torch.arange(4.0)) and loaded["rng"] == state["rng"]


def test_resume_refuses_it_before_anything_is_built(hostile):
    from lit_entropy.train import fit

    path, marker = hostile
    with pytest.raises(UnsafeCheckpointError, match=str(path)):
        check_resumable(path)
    cfg = compose_train(["debug=smoke", f"ckpt_path={path}"])
    with pytest.raises(UnsafeCheckpointError, match=str(path)):
        fit(cfg)
    assert not marker.exists()


def test_evaluation_refuses_it(hostile):
    from lit_entropy.evaluation_run import compose_evaluate, run

    path, marker = hostile
    with pytest.raises(UnsafeCheckpointError, match=str(path)):
        run(compose_evaluate([f"ckpt_path={path}", "eval.limit=2", "eval.n=1", "eval.k=[1]"]))
    assert not marker.exists()


def test_export_refuses_it_and_names_its_flag(hostile, tmp_path, capsys):
    from lit_entropy.cli.export import main
    from lit_entropy.export import ExportError, export_checkpoint

    path, marker = hostile
    with pytest.raises(ExportError, match="--trust-checkpoint"):
        export_checkpoint(path, tmp_path / "out")
    assert main([str(path), str(tmp_path / "out")]) == 1
    assert str(path) in capsys.readouterr().err
    assert not marker.exists()


def test_a_sharded_folder_holds_dcp_metadata_only(tmp_path):
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "sharded.ckpt"
    with warnings.catch_warnings():  # DCP without a process group may say that it saves as one rank
        warnings.simplefilter("ignore")
        dcp.save({"model": {"w": torch.randn(3, 4, dtype=torch.bfloat16), "b": torch.randn(2)},
                  "optimizer": {"state": {0: {"step": torch.tensor(1.0)}}}}, checkpoint_id=str(folder))
    check_sharded_metadata(folder)
    assert check_resumable(folder)["kind"] is None
    hostile_folder = tmp_path / "hostile.ckpt"
    shutil.copytree(folder, hostile_folder)
    marker = tmp_path / "the_command_ran"
    (hostile_folder / ".metadata").write_bytes(pickle.dumps(RunsACommand(marker)))
    with pytest.raises(UnsafeCheckpointError, match="posix.system"):
        check_resumable(hostile_folder)
    assert not marker.exists()
