"""REPO (Petrenko et al. 2026): the R/D advantage shaping, the adaptive λ law and REPOCallback."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from hydra.utils import instantiate

from lit_entropy.callbacks.repo import REPOCallback
from lit_entropy.objectives.repo import adapt_lambda, repo_d_advantages, repo_r_advantages
from lit_entropy.rollout.batch import RolloutBatch

CONF = Path(__file__).resolve().parents[3] / "conf" / "callbacks" / "entropy"


def random_batch(seed: int = 0, B: int = 12, L: int = 9, correlated: bool = True) -> RolloutBatch:
    """Right-padded rows (prompt 2 tokens, responses of varied length), NaN garbage in the padding."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, L - 2, (B,), generator=g)
    pos = torch.arange(L)[None, :]
    response = (pos >= 2) & (pos < 2 + lengths[:, None])
    attention = pos < 2 + lengths[:, None]
    logp = -torch.rand(B, L, generator=g) * 4.0
    entropy = torch.rand(B, L, generator=g) * 2.0
    advantages = torch.randn(B, generator=g)
    if correlated:  # likely responses get higher advantage: Cov(A, L) > 0, the collapse regime
        centred = torch.where(response, logp + entropy, 0.0).sum(-1) / response.sum(-1)
        advantages = advantages + 3.0 * centred
    batch = RolloutBatch(
        input_ids=torch.ones(B, L, dtype=torch.long),
        attention_mask=attention,
        response_mask=response,
        rewards=torch.zeros(B),
        group_index=torch.arange(B) // 2,
        group_size=2,
        sampler_logp=torch.where(response, logp, 0.0),
    )
    batch.advantages = advantages
    batch.old_logp = torch.where(response, logp, float("nan"))
    batch.entropy = torch.where(response, entropy, float("nan"))
    batch.token_advantages = advantages[:, None].expand(B, L).clone()
    return batch


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


# ---- adaptive λ ------------------------------------------------------------------------------------------
def test_adapt_lambda_doubles_halves_and_flips_on_a_synthetic_sequence():
    lam_min, lam_max, target = 1e-4, 0.05, 1.0
    entropies = [0.9, 0.9, 0.9, 1.0, 1.1, 1.1, 1.1, 1.1, 0.9, 0.9, 0.9]
    expected = [1e-4, 2e-4, 4e-4, 4e-4, 2e-4, 1e-4, -1e-4, -2e-4, -1e-4, 1e-4, 2e-4]
    #           low: 0 → +min, ×2, ×2 | equal | high: ÷2, ÷2, ÷2 < min → −min, ×2 | low: ÷2, ÷2 → +min, ×2
    lam, seen = 0.0, []
    for h in entropies:
        lam = adapt_lambda(lam, h, target, lam_min, lam_max)
        seen.append(lam)
    assert seen == pytest.approx(expected, rel=1e-12, abs=0)


def test_adapt_lambda_caps_at_lam_max_both_signs_and_mirrors():
    assert adapt_lambda(0.04, 0.5, 1.0, 1e-4, 0.05) == 0.05
    assert adapt_lambda(0.05, 0.5, 1.0, 1e-4, 0.05) == 0.05
    assert adapt_lambda(-0.04, 1.5, 1.0, 1e-4, 0.05) == -0.05
    assert adapt_lambda(0.0, 1.5, 1.0, 1e-4, 0.05) == -1e-4
    assert adapt_lambda(1.5e-4, 1.5, 1.0, 1e-4, 0.05) == -1e-4  # 7.5e-5 < min: flip
    assert adapt_lambda(2e-4, 1.5, 1.0, 1e-4, 0.05) == pytest.approx(1e-4)  # exactly min: no flip
    assert adapt_lambda(0.3, 1.0, 1.0, 1e-4, 0.05) == 0.3  # equal: unchanged


def test_adapt_lambda_stays_in_range_on_a_random_walk():
    g = torch.Generator().manual_seed(0)
    lam = 0.0
    for h in torch.rand(2000, generator=g).tolist():
        lam = adapt_lambda(lam, h, 0.5, 1e-3, 10.0)
        assert 1e-3 <= abs(lam) <= 10.0


@pytest.mark.parametrize("lam_min,lam_max", [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0), (1.0, float("inf"))])
def test_adapt_lambda_rejects_bad_ranges(lam_min, lam_max):
    with pytest.raises(ValueError):
        adapt_lambda(0.0, 0.5, 1.0, lam_min, lam_max)


def test_adapt_lambda_rejects_nan_entropy():
    with pytest.raises(ValueError):
        adapt_lambda(0.0, float("nan"), 1.0, 1e-4, 0.05)


# ---- REPO-R ----------------------------------------------------------------------------------------------
def test_repo_r_equals_the_formula_by_hand():
    adv = torch.tensor([1.0, -2.0, 0.0])
    logp = torch.tensor([[-0.5, -2.0, 0.0], [-1.0, -4.0, 0.0], [-3.0, -1.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, True, False], [True, True, False]])
    out = repo_r_advantages(adv, logp, mask, lam=0.1)
    expected = torch.tensor(
        [
            [1.0 + 0.1 * 1.0 * 0.5, 1.0 + 0.1 * 1.0 * 2.0, 0.0],  # 1.05, 1.2
            [-2.0 + 0.1 * 2.0 * 1.0, -2.0 + 0.1 * 2.0 * 4.0, 0.0],  # -1.8, -1.2
            [0.0, 0.0, 0.0],
        ]
    )
    torch.testing.assert_close(out, expected)
    assert out.dtype == torch.float32


def test_repo_r_positive_lambda_favours_unlikely_tokens():
    adv = torch.tensor([1.0, -1.0])
    logp = torch.tensor([[-0.1, -5.0], [-0.1, -5.0]])
    out = repo_r_advantages(adv, logp, torch.ones(2, 2, dtype=torch.bool), lam=0.05)
    assert out[0, 1] > out[0, 0] > 1.0  # positive sample: unlikely token boosted more
    assert -1.0 < out[1, 0] < out[1, 1] < 0.0  # negative sample: unlikely token pushed down less


def test_repo_r_floor_at_minus_20():
    adv = torch.tensor([1.0])
    logp = torch.tensor([[-20.0, -30.0, -1000.0, float("-inf")]])
    out = repo_r_advantages(adv, logp, torch.ones(1, 4, dtype=torch.bool), lam=0.01)
    torch.testing.assert_close(out, torch.full((1, 4), 1.2))
    out = repo_r_advantages(adv, logp, torch.ones(1, 4, dtype=torch.bool), lam=0.01, logp_floor=-5.0)
    torch.testing.assert_close(out, torch.full((1, 4), 1.05))


@pytest.mark.parametrize("lam", [-1.0, -0.05, -1e-4, 0.0, 1e-4, 0.05, 1.0, 5.0])
def test_repo_r_keeps_the_sign_of_a(lam):
    batch = random_batch(3, B=64, L=16, correlated=False)
    adv = batch.advantages.clone()
    adv[::5] = 0.0
    out = repo_r_advantages(adv, batch.old_logp, batch.response_mask, lam)
    a = adv[:, None].expand_as(out)
    resp = batch.response_mask
    assert torch.isfinite(out).all()
    assert (out[resp & (a > 0)] >= 0).all()
    assert (out[resp & (a < 0)] <= 0).all()
    assert (out[resp & (a == 0)] == 0).all()
    assert (out[~resp] == 0).all()


def test_repo_r_clamp_actually_bites_for_large_lambda():
    adv, logp, mask = torch.tensor([1.0, -1.0]), torch.tensor([[-10.0], [-10.0]]), torch.ones(2, 1).bool()
    out = repo_r_advantages(adv, logp, mask, lam=-1.0)
    assert out.flatten().tolist() == [0.0, -11.0]  # unclamped 1 − 10 = −9 → 0; −1 − 10 = −11 keeps its sign
    out = repo_r_advantages(adv, logp, mask, lam=1.0)
    assert out.flatten().tolist() == [11.0, 0.0]  # 1 + 10 = 11; unclamped −1 + 10 = 9 → 0


# ---- REPO-D ----------------------------------------------------------------------------------------------
def masked_corr(x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> float:
    x, y = x[mask].double(), y[mask].double()
    dx, dy = x - x.mean(), y - y.mean()
    return float((dx * dy).mean() / ((dx * dx).mean().sqrt() * (dy * dy).mean().sqrt()))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_repo_d_lambda_one_decorrelates_a_from_l(seed):
    batch = random_batch(seed, B=32, L=20)
    resp = batch.response_mask
    assert not resp.all()  # padding present (NaN there)
    centred = batch.old_logp + batch.entropy
    before = masked_corr(batch.advantages[:, None].expand_as(centred), centred, resp)
    assert abs(before) > 0.1
    out, beta = repo_d_advantages(batch.advantages, batch.old_logp, batch.entropy, resp, lam=1.0)
    assert beta > 0
    assert abs(masked_corr(out, centred, resp)) < 1e-6
    assert (out[~resp] == 0).all() and torch.isfinite(out).all()


def test_repo_d_scales_the_covariance_by_one_minus_lambda():
    batch = random_batch(5, B=32, L=20)
    resp = batch.response_mask
    centred = batch.old_logp + batch.entropy

    def cov(x: torch.Tensor) -> float:
        xs, ls = x[resp].double(), centred[resp].double()
        return float(((xs - xs.mean()) * (ls - ls.mean())).mean())

    base = cov(batch.advantages[:, None].expand_as(centred))
    for lam in (-0.5, 0.25, 2.0):
        out, _ = repo_d_advantages(batch.advantages, batch.old_logp, batch.entropy, resp, lam)
        assert cov(out) == pytest.approx((1 - lam) * base, rel=1e-5)


def test_repo_d_beta_by_hand_and_zero_variance():
    adv = torch.tensor([1.0, -1.0])
    logp = torch.tensor([[-1.0, 0.0], [-3.0, 0.0]])
    ent = torch.tensor([[0.5, 0.0], [0.5, 0.0]])
    mask = torch.tensor([[True, False], [True, False]])
    out, beta = repo_d_advantages(adv, logp, ent, mask, lam=0.5)
    # L = (-0.5, -2.5): mean -1.5, Var = 1, Cov(A, L) = mean((±1)·(±1)) = 1 → β = 1
    assert beta == pytest.approx(1.0)
    torch.testing.assert_close(out, torch.tensor([[1.0 + 0.25, 0.0], [-1.0 + 1.25, 0.0]]))
    same = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    out, beta = repo_d_advantages(adv, same, ent * 0 + 0.3, torch.ones(2, 2).bool(), lam=1.0)
    assert beta == 0.0
    torch.testing.assert_close(out, torch.tensor([[1.0, 1.0], [-1.0, -1.0]]))
    out, beta = repo_d_advantages(adv, logp, ent, torch.zeros(2, 2).bool(), lam=1.0)
    assert beta == 0.0 and (out == 0).all()


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
