"""EntropyLawCallback: collects (entropy, accuracy) per iteration, fits once it has enough, state, config."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

from lit_entropy.callbacks.entropy_law import EntropyLawCallback
from lit_entropy.diagnostics.entropy_law import fit_entropy_law
from lit_entropy.rollout.batch import RolloutBatch
from lit_entropy.train import instantiate_callbacks
from tests.helpers import CONF, compose_train

A, B = 0.3, 0.9
H = np.linspace(0.8, 0.2, 15)
R = -A * np.exp(H) + B


def make_batch(metrics: dict[str, float], n: int = 4) -> RolloutBatch:
    batch = RolloutBatch(
        input_ids=torch.ones(n, 4, dtype=torch.long),
        attention_mask=torch.ones(n, 4, dtype=torch.bool),
        response_mask=torch.tensor([[False, True, True, True]] * n),
        rewards=torch.zeros(n),
        group_index=torch.arange(n) // 2,
        group_size=2,
        sampler_logp=torch.zeros(n, 4),
    )
    batch.metrics.update(metrics)
    return batch


def step(cb: EntropyLawCallback, it: int, h: float, r: float) -> RolloutBatch:
    batch = make_batch({"rollout/entropy": h, "rollout/accuracy": r})
    cb.on_rollout_batch(SimpleNamespace(current_epoch=it), SimpleNamespace(), batch)
    return batch


LAW = ("law/a", "law/b", "law/r2", "law/ceiling")


def test_silent_until_min_points_then_fits_every_iteration():
    cb = EntropyLawCallback(min_points=10)
    assert cb.knobs == ()
    for i in range(9):
        batch = step(cb, i, H[i], R[i])
        assert not any(k in batch.metrics for k in LAW)
    for i in range(9, 15):
        batch = step(cb, i, H[i], R[i])
        assert batch.metrics["law/a"] == pytest.approx(A, abs=1e-9)
        assert batch.metrics["law/b"] == pytest.approx(B, abs=1e-9)
        assert batch.metrics["law/r2"] == pytest.approx(1.0, abs=1e-9)
        assert batch.metrics["law/ceiling"] == pytest.approx(B - A, abs=1e-9)
    assert len(cb.points) == 15


def test_fit_uses_all_points_so_far():
    rng = np.random.default_rng(0)
    r = R + 0.02 * rng.standard_normal(R.size)
    cb = EntropyLawCallback(min_points=5)
    for i in range(12):
        batch = step(cb, i, H[i], r[i])
    want = fit_entropy_law(H[:12], r[:12])
    assert batch.metrics["law/a"] == pytest.approx(want.a)
    assert batch.metrics["law/ceiling"] == pytest.approx(want.ceiling)


def test_fit_first_holds_the_early_fit():
    cb = EntropyLawCallback(min_points=4, fit_first=6)
    for i in range(6):
        step(cb, i, H[i], R[i])
    batch = step(cb, 6, 0.1, 0.0)  # an off-law point after the window changes nothing
    assert batch.metrics["law/a"] == pytest.approx(A, abs=1e-9)
    assert len(cb.points) == 7


def test_missing_or_non_finite_metrics_are_skipped(caplog):
    cb = EntropyLawCallback(min_points=3)
    batch = make_batch({"rollout/entropy": 0.5})
    cb.on_rollout_batch(SimpleNamespace(current_epoch=0), SimpleNamespace(), batch)
    step(cb, 1, float("nan"), 0.2)
    assert cb.points == []
    assert "rollout/accuracy" in caplog.text


def test_constant_entropy_writes_nothing_and_never_non_finite():
    cb = EntropyLawCallback(min_points=3)
    for i in range(5):
        batch = step(cb, i, 0.4, 0.1 * i)
        assert not any(k in batch.metrics for k in LAW)
        assert all(math.isfinite(v) for v in batch.metrics.values())


def test_repeated_iteration_replaces_its_point():
    cb = EntropyLawCallback(min_points=3)
    step(cb, 0, 0.5, 0.1)
    step(cb, 0, 0.6, 0.2)
    assert cb.points == [(0, 0.6, 0.2)]


def test_state_round_trip_continues_the_fit():
    cb = EntropyLawCallback(min_points=10)
    for i in range(8):
        step(cb, i, H[i], R[i])
    state = cb.state_dict()
    cb2 = EntropyLawCallback(min_points=10)
    cb2.load_state_dict(state)
    assert cb2.points == cb.points
    step(cb, 8, H[8], R[8])
    batch = step(cb2, 8, H[8], R[8])
    assert "law/a" not in batch.metrics  # 9 points
    batch = step(cb2, 9, H[9], R[9])
    assert batch.metrics["law/a"] == pytest.approx(A, abs=1e-9)


def test_validation():
    with pytest.raises(ValueError, match="at least 3"):
        EntropyLawCallback(min_points=2)
    with pytest.raises(ValueError, match="fit_first"):
        EntropyLawCallback(min_points=10, fit_first=5)


def law_override(choice: str) -> str:
    """``callbacks/law=…``, appended with ``+`` while conf/callbacks/default.yaml has no ``law`` default yet."""
    defaults = yaml.safe_load((CONF / "callbacks" / "default.yaml").read_text()).get("defaults", [])
    listed = any(isinstance(d, dict) and "law" in d for d in defaults)
    return f"{'' if listed else '+'}callbacks/law={choice}"


def test_config_group_attaches_and_detaches():
    out = ["paths.output_dir=/tmp/lit-entropy-test-out"]
    cbs = instantiate_callbacks(compose_train([law_override("entropy_law"), *out]).callbacks)
    law = [cb for cb in cbs if isinstance(cb, EntropyLawCallback)]
    assert len(law) == 1 and law[0].min_points == 10 and law[0].fit_first is None
    cbs = instantiate_callbacks(compose_train([law_override("none"), *out]).callbacks)
    assert not any(isinstance(cb, EntropyLawCallback) for cb in cbs)
