"""REPO (Petrenko et al. 2026): the R/D advantage shaping and the adaptive λ law (lit_entropy.objectives.repo).
REPOCallback: tests/unit/callbacks/test_repo.py."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.objectives.repo import adapt_lambda, repo_d_advantages, repo_r_advantages
from lit_entropy.rollout.batch import RolloutBatch


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
