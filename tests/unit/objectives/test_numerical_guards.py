"""Numerical guards (docs/design.md §8): inputs that broke the loss before each guard existed."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.algo import AlgoConfig
from lit_entropy.objectives.entropic import entropic_term
from lit_entropy.objectives.kl import kl_estimate
from lit_entropy.objectives.losses.gspo import gspo_surrogate
from lit_entropy.objectives.losses.ppo import clipped_surrogate
from lit_entropy.objectives.objective import Knobs, micro_batch_loss, select_tokens
from lit_entropy.objectives.policy_loss import aggregate
from lit_entropy.objectives.selection.kl_cov import kl_cov, kl_cov_loss


def _far_off_policy(delta: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = (logp.detach() - torch.tensor([[delta, 0.1, -delta]]))
    mask = torch.ones(1, 3, dtype=torch.bool)
    return logp, old, mask


@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_log_ratio_is_clamped_before_exp(adv):
    """|log r| = 100 overflowed fp32 exp: the loss was inf and its gradient NaN."""
    logp, old, mask = _far_off_policy(100.0)
    loss, info = clipped_surrogate(logp, old, torch.tensor([adv]), 0.2, 0.28, dual_clip=None, mask=mask)
    total = aggregate(loss, mask, "token-mean")
    total.backward()
    assert torch.isfinite(total) and torch.isfinite(logp.grad).all()
    assert float(info["ratio"].max()) == pytest.approx(float(torch.exp(torch.tensor(20.0))), rel=1e-6)
    # A token that is only 0.1 nats off is untouched by the guard.
    assert float(info["ratio"][0, 1]) == pytest.approx(float(torch.exp(torch.tensor(0.1))), rel=1e-6)


def test_kl_cov_loss_and_entropic_term_stay_finite_far_off_policy():
    logp, old, mask = _far_off_policy(100.0)
    loss = kl_cov_loss(logp, old, torch.tensor([-1.0]), torch.zeros(1, 3, dtype=torch.bool)).sum()
    term = entropic_term(logp, old, torch.tensor([-1.0]), mask, mask.sum())
    (loss + term).backward()
    assert torch.isfinite(loss) and torch.isfinite(term) and torch.isfinite(logp.grad).all()


def test_gspo_sequence_log_ratio_is_bounded():
    logp = torch.full((2, 4), -1.0, requires_grad=True)
    old = torch.tensor([[-200.0] * 4, [-1.05] * 4])  # row 0: mean log-ratio 199 (exp overflows fp32)
    mask = torch.ones(2, 4, dtype=torch.bool)
    loss, info = gspo_surrogate(logp, old, torch.tensor([-1.0, 1.0]), mask)
    total = aggregate(loss, mask, "seq-mean-token-mean")
    total.backward()
    assert torch.isfinite(total) and torch.isfinite(logp.grad).all()
    assert float(info["seq_ratio"][0]) == pytest.approx(float(torch.exp(torch.tensor(10.0))), rel=1e-6)
    assert float(info["seq_ratio"][1]) == pytest.approx(float(torch.exp(torch.tensor(0.05))), rel=1e-6)


def test_kl_cov_selects_at_least_one_token_when_k_times_n_is_below_one():
    g = torch.Generator().manual_seed(0)
    logp, adv = torch.randn(4, 6, generator=g), torch.randn(4, generator=g)
    mask = torch.ones(4, 6, dtype=torch.bool)
    selected, frac = kl_cov(logp, adv, mask, k=2e-4)  # ⌊2e-4·24⌋ = 0
    assert int(selected.sum()) == 1 and frac == pytest.approx(1 / 24)
    c = (adv[:, None] - adv.mean()) * (logp - logp.mean())
    assert bool(selected.flatten()[c.flatten().argmax()])  # the top token by covariance
    assert int(kl_cov(logp, adv, mask, k=0.0)[0].sum()) == 0


def test_k3_clamp_bounds_the_gradient():
    logp = torch.tensor([[-16.0, -1.0]], requires_grad=True)  # token 0: the policy fell 15 nats below ref
    ref = torch.tensor([[-1.0, -1.1]])
    kl_estimate(logp, ref, "k3").sum().backward()
    assert float(logp.grad.abs().max()) > 1e6  # 1 − e^15: the gradient a clamp is for
    logp.grad = None
    kl = kl_estimate(logp, ref, "k3", clamp=10.0)
    kl.sum().backward()
    assert float(kl.max()) == 10.0 and float(logp.grad.abs().max()) < 13
    assert float(kl[0, 1]) == pytest.approx(float(kl_estimate(logp, ref, "k3")[0, 1]))
    with pytest.raises(ValueError, match="kl_clamp"):
        AlgoConfig(kl_clamp=0.0)


def test_clip_cov_reports_pg_loss_without_the_detached_tokens_value():
    algo = AlgoConfig(selection="clip_cov", selection_args={"rho": 0.3, "bound_low": -1e9, "bound_high": 1e9})
    g = torch.Generator().manual_seed(3)
    B, L = 4, 5
    logp = torch.randn(B, L, generator=g).requires_grad_(True)
    mb = {
        "response_mask": torch.ones(B, L, dtype=torch.bool),
        "token_advantages": torch.randn(B, generator=g)[:, None].expand(B, L).clone(),
        "old_logp": logp.detach() + 0.1 * torch.randn(B, L, generator=g),
    }
    knobs = Knobs(0.2, 0.2)
    sel = select_tokens(algo, mb, knobs, logp.detach(), torch.Generator().manual_seed(0))
    assert sel.detach.any()
    loss, stats = micro_batch_loss(algo, knobs, mb, sel, logp, None)
    loss.backward()
    plain_tok, _ = clipped_surrogate(logp.detach(), mb["old_logp"], mb["token_advantages"], 0.2, 0.2,
                                     mask=mb["response_mask"])
    kept = torch.where(sel.detach, 0.0, plain_tok).sum() / (B * L)
    assert float(stats["pg_loss"]) == pytest.approx(float(kept), rel=1e-6)
    assert float(stats["pg_loss"]) != pytest.approx(float(plain_tok.sum() / (B * L)), rel=1e-3)
    assert (logp.grad[sel.detach] == 0).all() and (logp.grad[~sel.detach] != 0).any()


def test_weight_sync_finite_check_is_exact():
    """The sync's fast finiteness check: a finite sum proves every element finite; NaN, ±inf and an overflowing
    sum of finite values are each told apart exactly."""
    import torch

    from lit_entropy.rollout.vllm_engine import all_finite

    assert all_finite(torch.randn(1000))
    for bad in (float("nan"), float("inf"), float("-inf")):
        t = torch.randn(1000)
        t[17] = bad
        assert not all_finite(t)
    t = torch.randn(10)
    t[3], t[4] = float("inf"), float("-inf")  # the sum is NaN
    assert not all_finite(t)
    huge = torch.full((4,), 3e38)  # finite values whose fp32 sum overflows
    assert all_finite(huge) and not torch.isfinite(huge.sum())
    assert all_finite(torch.zeros(0)) and all_finite(torch.arange(5)) and all_finite(torch.randn(8).bfloat16())
