"""Atomic checkpoint writes and the start-up check of ``ckpt_path`` (lit_entropy.utils.checkpointing)."""

from __future__ import annotations

import errno
import random
from collections import OrderedDict

import numpy as np
import pytest
import torch

from lit_entropy.utils.checkpointing import (
    atomic_write,
    check_resumable,
    link_or_copy,
    preserved_rng,
    rng_from_safe,
    rng_to_safe,
    temp_path,
    to_host,
)


def _fake_ckpt(path, kind: str = "iteration", **meta) -> None:
    progress = {"ready": 2, "started": 2, "processed": 2, "completed": 2}
    torch.save({
        "state_dict": {"w": torch.arange(1000.0)},
        "loops": {"fit_loop": {"epoch_progress": {"total": progress},
                               "epoch_loop.state_dict": {"_batches_that_stepped": 8}}},
        "lit_entropy": {"kind": kind, "iteration": 2, **meta},
    }, path)


def test_a_failed_write_leaves_the_previous_file_and_no_temp(tmp_path):
    target = tmp_path / "last.ckpt"
    target.write_bytes(b"previous")

    def disk_full(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(b"half a checkp")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="last.ckpt.*intact"):
        atomic_write(target, disk_full)
    assert target.read_bytes() == b"previous"
    assert not temp_path(target).exists()

    def interrupted(tmp: str) -> None:
        open(tmp, "wb").write(b"x")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, interrupted)
    assert target.read_bytes() == b"previous" and not temp_path(target).exists()


def test_a_successful_write_replaces_the_file(tmp_path):
    target = tmp_path / "last.ckpt"
    target.write_bytes(b"previous")
    atomic_write(target, lambda tmp: open(tmp, "wb").write(b"new"))
    assert target.read_bytes() == b"new" and not temp_path(target).exists()
    link_or_copy(target, tmp_path / "iteration-0001.ckpt")
    atomic_write(target, lambda tmp: open(tmp, "wb").write(b"newer"))
    assert (tmp_path / "iteration-0001.ckpt").read_bytes() == b"new"  # the kept copy does not follow last.ckpt


def test_a_non_publishing_rank_only_writes(tmp_path):
    target = tmp_path / "last.ckpt"
    atomic_write(target, lambda tmp: None, publish=False)
    assert not target.exists()


def test_valid_checkpoint_passes_and_reports_its_step(tmp_path):
    path = tmp_path / "last.ckpt"
    _fake_ckpt(path)
    assert check_resumable(path) == {"step": 8, "iteration": 2, "kind": "iteration"}


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_damaged_checkpoint_is_refused_naming_its_path(tmp_path, damage):
    path = tmp_path / "last.ckpt"
    _fake_ckpt(path)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":  # a bit flipped inside the tensor data: only the CRC check sees it
        i = data.find(torch.arange(1000.0).numpy().tobytes()[400:408])
        assert i > 0
        data[i] ^= 0x01
    elif damage == "garbage":
        data = bytearray(b"not a checkpoint at all" * 10)
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"ckpt_path=.*last\.ckpt: not a readable checkpoint"):
        check_resumable(path)


def test_missing_checkpoint_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.ckpt"):
        check_resumable(tmp_path / "nope.ckpt")


def test_exception_checkpoint_is_refused_pointing_at_last(tmp_path):
    path = tmp_path / "exception.ckpt"
    _fake_ckpt(path, kind="exception", reason="FloatingPointError: non-finite loss")
    with pytest.raises(ValueError, match=r"FloatingPointError.*last\.ckpt"):
        check_resumable(path)


def test_rng_states_survive_weights_only_loading_and_starting_an_engine(tmp_path):
    from lightning.fabric.utilities.seed import _collect_rng_states, _set_rng_states

    torch.manual_seed(3), random.seed(3), np.random.seed(3)
    states = _collect_rng_states()
    torch.save(rng_to_safe(states), tmp_path / "rng.pt")
    def draw() -> tuple[list[float], float, float]:
        return torch.rand(3).tolist(), random.random(), float(np.random.rand())

    expected = draw()
    _set_rng_states(rng_from_safe(torch.load(tmp_path / "rng.pt", weights_only=True)))
    with preserved_rng():  # what an engine start does to the global RNGs is undone
        torch.manual_seed(0), random.seed(0), np.random.seed(0), torch.rand(5)
    assert draw() == expected


def test_the_background_copy_is_in_host_memory_and_keeps_tied_tensors_shared():
    weight = torch.nn.Parameter(torch.arange(6.0).view(2, 3))
    state = {"state_dict": OrderedDict(embed=weight.detach(), head=weight.detach(), row=weight.detach()[1]),
             "optimizer_states": [{"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 1e-3}]}],
             "rng": (torch.get_rng_state(), 7), "epoch": 2}
    copied = to_host(state)
    with torch.no_grad():
        weight.add_(100.0)  # the next update changes the live tensors in place
        state["optimizer_states"][0]["state"][0]["step"] += 1
    sd = copied["state_dict"]
    assert type(sd) is OrderedDict and list(sd) == ["embed", "head", "row"]
    assert sd["embed"].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] and sd["row"].tolist() == [3.0, 4.0, 5.0]
    assert sd["embed"].untyped_storage().data_ptr() == sd["head"].untyped_storage().data_ptr() \
        == sd["row"].untyped_storage().data_ptr() != weight.untyped_storage().data_ptr()
    assert copied["optimizer_states"][0]["state"][0]["step"].item() == 3.0
    assert isinstance(copied["rng"], tuple) and copied["rng"][1] == 7 and copied["epoch"] == 2
    assert all(t.device.type == "cpu" for t in (sd["embed"], copied["rng"][0]))
