"""The in-process harness is safe to share: fits on one engine log what fresh ``scripts/train.py`` processes log."""

from __future__ import annotations

import pytest

from tests.helpers import read_scalars
from tests.integration.test_train_smoke import run_train

pytestmark = pytest.mark.integration

RUNS = {  # two different runs, one after the other on the same engine
    "first": ["rollout=vllm", "callbacks/entropy=entrocraft_hard", "seed=1"],
    "second": ["rollout=vllm", "callbacks/entropy=none", "algo=dapo"],
}


def _timeless(scalars):
    return {t: v for t, v in scalars.items() if not t.startswith("time/")}  # wall-clock seconds differ by nature


def test_two_fits_on_the_shared_engine_equal_two_fresh_processes(tmp_path, harness):
    starts = harness.starts
    inproc = {name: harness.fit(overrides, tmp_path / "inproc", name=name) for name, overrides in RUNS.items()}
    assert harness.starts - starts <= 1  # the second fit started no engine of its own
    for name, overrides in RUNS.items():
        run_train(tmp_path / name, *overrides)
        fresh = _timeless(read_scalars(tmp_path / name / "run"))
        got = _timeless(inproc[name].scalars)
        assert sorted(got) == sorted(fresh), name
        for tag, values in fresh.items():
            assert got[tag] == values, (name, tag, got[tag], values)


def test_a_fit_after_a_hand_closed_engine_starts_afresh_and_logs_the_same(tmp_path, harness):
    """A test that builds a ``VLLMEngine`` itself and closes it destroys vLLM's process-wide parallel groups,
    which the harness's shared engine needs: the next fit must notice, start a new engine, and log as before."""
    from vllm.distributed import parallel_state

    overrides = RUNS["second"]
    before = harness.fit(overrides, tmp_path, name="before")
    starts = harness.starts
    parallel_state.destroy_model_parallel()  # what the hand-built engine's close does to the whole process
    after = harness.fit(overrides, tmp_path, name="after")
    assert harness.starts == starts + 1
    assert _timeless(after.scalars) == _timeless(before.scalars)
