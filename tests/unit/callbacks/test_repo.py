"""REPOCallback (Petrenko et al. 2026): the adaptive λ driven from the rollout's entropy, the shaped token
advantages it writes, its state and its configs. The shaping and the λ law: tests/unit/objectives/test_repo.py."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from hydra.utils import instantiate

from lit_entropy.callbacks.repo import REPOCallback
from lit_entropy.objectives.repo import repo_r_advantages
from tests.unit.objectives.test_repo import masked_corr, random_batch

CONF = Path(__file__).resolve().parents[3] / "conf" / "callbacks" / "entropy"


def trainer_at(epoch: int = 0, max_epochs: int = 20):
    return SimpleNamespace(current_epoch=epoch, max_epochs=max_epochs)


def drive(cb: REPOCallback, entropies: list[float], seed: int = 0) -> list[float]:
    lams = []
    for i, h in enumerate(entropies):
        batch = random_batch(seed + i)
        batch.metrics["rollout/entropy"] = h
        cb.on_rollout_batch(trainer_at(i), None, batch)
        lams.append(batch.metrics["control/repo_lambda"])
    return lams


# ---- the callback ----------------------------------------------------------------------------------------
def test_callback_writes_token_advantages_and_leaves_advantages_alone():
    cb = REPOCallback(variant="r", target=2.0, lam_init=0.01)
    batch = random_batch(1)
    batch.metrics["rollout/entropy"] = 1.0  # too low: 0.01 → 0.02
    adv_before = batch.advantages.clone()
    cb.on_rollout_batch(trainer_at(0), None, batch)
    assert torch.equal(batch.advantages, adv_before)
    assert batch.metrics["control/repo_lambda"] == pytest.approx(0.02)
    assert batch.metrics["control/target_entropy"] == 2.0
    assert "control/repo_beta" not in batch.metrics
    expected = repo_r_advantages(adv_before, batch.old_logp, batch.response_mask, 0.02)
    torch.testing.assert_close(batch.token_advantages, expected)
    assert batch.token_advantages.shape == batch.input_ids.shape
    assert not torch.equal(
        batch.token_advantages[batch.response_mask],
        adv_before[:, None].expand_as(expected)[batch.response_mask],
    )


def test_callback_d_logs_beta_and_decorrelates_at_lambda_one():
    cb = REPOCallback(variant="d", target=0.5, lam_init=2.0)
    batch = random_batch(4, B=32, L=20)
    batch.metrics["rollout/entropy"] = 1.0  # too high: λ > 0 halves, 2 → 1
    cb.on_rollout_batch(trainer_at(0), None, batch)
    assert batch.metrics["control/repo_lambda"] == 1.0
    assert batch.metrics["control/repo_beta"] > 0
    centred = batch.old_logp + batch.entropy
    assert abs(masked_corr(batch.token_advantages, centred, batch.response_mask)) < 1e-6


def test_callback_lambda_sequence_with_first_target():
    cb = REPOCallback(variant="d")
    entropies = [1.0, 0.9, 0.9, 0.9, 1.0, 1.2, 1.2, 1.2, 1.2, 0.8, 0.8]
    expected = [0.0, 1e-3, 2e-3, 4e-3, 4e-3, 2e-3, 1e-3, -1e-3, -2e-3, -1e-3, 1e-3]
    assert drive(cb, entropies) == pytest.approx(expected, rel=1e-12, abs=0)
    assert cb.first_entropy == 1.0


def test_callback_first_iteration_at_lambda_zero_is_unshaped():
    cb = REPOCallback(variant="r")
    batch = random_batch(2)
    batch.metrics["rollout/entropy"] = 0.7
    cb.on_rollout_batch(trainer_at(0), None, batch)
    resp = batch.response_mask
    a = batch.advantages[:, None].expand_as(resp)
    torch.testing.assert_close(batch.token_advantages[resp], a[resp])


def test_callback_rejected_rows_get_zero_and_stay_out_of_beta():
    cb = REPOCallback(variant="d", target=2.0, lam_init=1.0)
    batch = random_batch(6, B=16, L=12)
    batch.keep[::3] = False
    batch.metrics["rollout/entropy"] = 2.0
    cb.on_rollout_batch(trainer_at(0), None, batch)
    assert (batch.token_advantages[~batch.keep] == 0).all()
    kept = batch.response_mask & batch.keep[:, None]
    assert abs(masked_corr(batch.token_advantages, batch.old_logp + batch.entropy, kept)) < 1e-6


def test_callback_warns_when_lambda_sits_at_its_max(caplog):
    cb = REPOCallback(variant="d", target=5.0, lam_init=4.0, clamp_patience=3)
    with caplog.at_level(logging.WARNING):
        lams = drive(cb, [1.0] * 5)
    assert lams == [8.0, 10.0, 10.0, 10.0, 10.0]
    assert sum("repo_lambda" in r.getMessage() for r in caplog.records) == 1


def test_state_dict_round_trip_continues_the_same_lambda_sequence():
    entropies = [1.0, 0.8, 0.8, 1.3, 1.3, 1.3, 0.8, 0.8, 0.8, 1.3, 0.8]
    a = REPOCallback(variant="r")
    drive(a, entropies[:4])
    state = a.state_dict()
    b = REPOCallback(variant="r", lam_init=0.05)  # same config, different start: λ must come from the state
    b.load_state_dict(state)
    rest_a = drive(a, entropies[4:], seed=100)
    rest_b = drive(b, entropies[4:], seed=100)
    assert rest_a == rest_b
    assert len(set(rest_a)) > 2 and any(x < 0 for x in rest_a) and any(x > 0 for x in rest_a)
    assert b.state_dict() == a.state_dict()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"variant": "x"},
        {"variant": "R"},
        {"variant": "r", "lam_min": 0.0},
        {"variant": "r", "lam_min": -1e-4},
        {"variant": "d", "lam_min": 1.0, "lam_max": 0.5},
        {"variant": "d", "lam_max": float("inf")},
        {"variant": "r", "lam_init": 1.0},
        {"variant": "r", "lam_init": 1e-5},
        {"variant": "d", "lam_init": -20.0},
        {"variant": "r", "logp_floor": 0.0},
        {"variant": "r", "target": "last"},
    ],
)
def test_invalid_arguments_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        REPOCallback(**kwargs)


def test_default_ranges_per_variant():
    r, d = REPOCallback(variant="r"), REPOCallback(variant="d")
    assert (r.lam_min, r.lam_max, r.lam) == (1e-4, 0.05, 0.0)
    assert (d.lam_min, d.lam_max, d.lam) == (1e-3, 10.0, 0.0)
    assert REPOCallback.knobs == ("token_advantages",)


def test_missing_pre_update_fields_fail_clearly():
    cb = REPOCallback(variant="d", target=1.0)
    batch = random_batch(0)
    batch.entropy = None
    batch.metrics["rollout/entropy"] = 1.0
    with pytest.raises(ValueError, match="entropy"):
        cb.on_rollout_batch(trainer_at(0), None, batch)


@pytest.mark.parametrize(
    "name,variant,lam_range", [("repo_r", "r", (1e-4, 0.05)), ("repo_d", "d", (1e-3, 10.0))]
)
def test_yaml_configs_instantiate(name, variant, lam_range):
    cfg = yaml.safe_load((CONF / f"{name}.yaml").read_text())
    cb = instantiate(cfg)
    assert isinstance(cb, REPOCallback)
    assert cb.variant == variant and (cb.lam_min, cb.lam_max) == lam_range and cb.target == "first"
