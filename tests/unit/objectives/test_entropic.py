"""EntroPIC (Yang et al. 2025): the PI law on synthetic entropy sequences, the loss term, state, checks."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest
import torch

from lit_entropy.algo import AlgoConfig
from lit_entropy.callbacks.entropic import EntroPICCallback
from lit_entropy.objectives.entropic import PIC_PROB_THRESHOLD, entropic_term
from lit_entropy.objectives.objective import Knobs, micro_batch_loss, select_tokens
from lit_entropy.rollout.batch import RolloutBatch
from tests.helpers import small_rollout_batch


def make_batch(entropy: float, B: int = 4) -> RolloutBatch:
    return small_rollout_batch(entropy, [1.0, -1.0] * (B // 2))


def trainer_at(epoch: int, max_epochs: int = 11) -> SimpleNamespace:
    return SimpleNamespace(current_epoch=epoch, max_epochs=max_epochs)


def make_module(vocab_size: int = 100) -> SimpleNamespace:
    return SimpleNamespace(pic_alpha=0.0, model=SimpleNamespace(config=SimpleNamespace(vocab_size=vocab_size)))


def drive(cb: EntroPICCallback, entropies: list[float], module: SimpleNamespace | None = None) -> list[dict]:
    module = module if module is not None else make_module()
    seen = []
    for it, h in enumerate(entropies):
        batch = make_batch(h)
        cb.on_rollout_batch(trainer_at(it), module, batch)
        assert module.pic_alpha == batch.metrics["control/pic_alpha"]
        seen.append(dict(batch.metrics))
    return seen


# ---- the control law ------------------------------------------------------------------------------
def test_integral_accumulates_and_alpha_is_pi_of_error():
    cb = EntroPICCallback(target=1.0)  # K_p = 1, K_i = 0.01
    seen = drive(cb, [1.5, 1.2, 0.9, 0.8])
    # e = 0.5, 0.2, -0.1, -0.2; I = 0.5, 0.7, 0.6, 0.4; α = e + 0.01·I
    assert [m["control/pic_error"] for m in seen] == pytest.approx([0.5, 0.2, -0.1, -0.2])
    assert [m["control/pic_integral"] for m in seen] == pytest.approx([0.5, 0.7, 0.6, 0.4])
    assert [m["control/pic_alpha"] for m in seen] == pytest.approx([0.505, 0.207, -0.094, -0.196])
    assert all(m["control/target_entropy"] == 1.0 for m in seen)


def test_integral_alone_moves_alpha_for_a_constant_small_error():
    cb = EntroPICCallback(target=1.0, kp=0.0, ki=0.1)
    seen = drive(cb, [0.9] * 5)
    assert [m["control/pic_integral"] for m in seen] == pytest.approx([-0.1, -0.2, -0.3, -0.4, -0.5])
    assert [m["control/pic_alpha"] for m in seen] == pytest.approx([-0.01, -0.02, -0.03, -0.04, -0.05])


def test_first_target_starts_at_zero():
    cb = EntroPICCallback()  # target="first"
    seen = drive(cb, [2.0, 2.3, 1.8])
    assert [m["control/target_entropy"] for m in seen] == [2.0, 2.0, 2.0]
    assert [m["control/pic_alpha"] for m in seen] == pytest.approx([0.0, 0.3 + 0.003, -0.2 + 0.001])


@pytest.mark.parametrize("entropy,sign", [(1.3, 1.0), (0.7, -1.0)])
def test_sign_above_target_positive_below_negative(entropy, sign):
    cb = EntroPICCallback(target=1.0)
    (m,) = drive(cb, [entropy])
    assert math.copysign(1.0, m["control/pic_alpha"]) == sign
    assert m["control/pic_alpha"] == pytest.approx(sign * 0.3 * 1.01)


@pytest.mark.parametrize("entropy,limit", [(5.0, 1.0), (0.0, -1.0)])
def test_output_saturates_at_plus_minus_one(entropy, limit, caplog):
    cb = EntroPICCallback(target=2.5, clamp_patience=3)
    with caplog.at_level(logging.WARNING):
        seen = drive(cb, [entropy] * 4)
    assert [m["control/pic_alpha"] for m in seen] == [limit] * 4
    assert "pic_alpha has been at its limit" in caplog.text


def test_alpha_max_bounds_the_output():
    cb = EntroPICCallback(target=0.0, alpha_max=0.5)
    (m,) = drive(cb, [3.0])
    assert m["control/pic_alpha"] == 0.5


def test_anti_windup_clamp_bounds_the_integral():
    cb = EntroPICCallback(target=1.0, anti_windup="clamp")
    drive(cb, [3.0] * 100)  # e = 2 for 100 iterations: I would be 200, clamped to 1/K_i = 100
    assert cb.integral == pytest.approx(100.0)
    (m,) = drive(cb, [0.5])  # e = -0.5: I = 99.5, α = -0.5 + 0.995
    assert m["control/pic_integral"] == pytest.approx(99.5)
    assert m["control/pic_alpha"] == pytest.approx(0.495)


def test_anti_windup_none_is_the_plain_sum():
    cb = EntroPICCallback(target=1.0, anti_windup="none")
    drive(cb, [3.0] * 100)
    assert cb.integral == pytest.approx(200.0)
    (m,) = drive(cb, [0.5])
    assert m["control/pic_alpha"] == 1.0  # the wound-up integral keeps α pinned


def test_anti_windup_conditional_holds_while_saturated():
    cb = EntroPICCallback(target=1.0, anti_windup="conditional")
    drive(cb, [3.0] * 10)  # saturated by K_p·e alone, pushing outward: never integrates
    assert cb.integral == 0.0
    (m,) = drive(cb, [0.5])
    assert m["control/pic_integral"] == pytest.approx(-0.5)
    assert m["control/pic_alpha"] == pytest.approx(-0.505)


def test_non_finite_entropy_holds_alpha_and_integral():
    cb = EntroPICCallback(target=1.0)
    drive(cb, [1.5])
    (m,) = drive(cb, [float("nan")])
    assert m["control/pic_alpha"] == pytest.approx(0.505)
    assert cb.integral == pytest.approx(0.5)


def test_schedule_target():
    cb = EntroPICCallback(target={"kind": "linear", "start": 2.0, "end": 1.0})
    seen = drive(cb, [2.0] * 11)
    assert seen[0]["control/target_entropy"] == pytest.approx(2.0)
    assert seen[10]["control/target_entropy"] == pytest.approx(1.0)
    assert seen[0]["control/pic_alpha"] == 0.0 and seen[10]["control/pic_alpha"] > 0


def test_knobs_and_metric_names():
    assert EntroPICCallback.knobs == ("pic_alpha",)
    (m,) = drive(EntroPICCallback(target=1.0), [1.0])
    assert {"control/pic_alpha", "control/pic_error", "control/pic_integral", "control/target_entropy"} <= set(m)


# ---- state -----------------------------------------------------------------------------------------
def test_state_dict_round_trip_continues_identically():
    entropies = [2.0, 1.4, 1.1, 0.6, 0.9, 1.3, 1.7, 0.2]
    straight = EntroPICCallback(target=1.0, clamp_patience=2)
    expected = drive(straight, entropies)

    first = EntroPICCallback(target=1.0, clamp_patience=2)
    drive(first, entropies[:4])
    state = first.state_dict()
    assert state["integral"] == pytest.approx(1.1) and state["alpha"] == first.alpha
    resumed = EntroPICCallback(target=1.0, clamp_patience=2)
    resumed.load_state_dict(state)
    rest = []
    module = make_module()
    for it, h in enumerate(entropies[4:], start=4):
        batch = make_batch(h)
        resumed.on_rollout_batch(trainer_at(it), module, batch)
        rest.append(dict(batch.metrics))
    assert rest == expected[4:]
    assert resumed.state_dict() == straight.state_dict()


def test_first_target_survives_a_resume():
    a = EntroPICCallback()
    drive(a, [1.5, 1.0])
    b = EntroPICCallback()
    b.load_state_dict(a.state_dict())
    (m,) = drive(b, [1.2])
    assert m["control/target_entropy"] == 1.5


# ---- start-up checks -------------------------------------------------------------------------------
def test_on_fit_start_rejects_a_target_above_log_vocab():
    module = make_module(vocab_size=100)  # log(100) ≈ 4.605
    EntroPICCallback(target=4.5).on_fit_start(trainer_at(0), module)
    with pytest.raises(ValueError, match="log\\(vocab_size=100\\)"):
        EntroPICCallback(target=4.7).on_fit_start(trainer_at(0), module)
    with pytest.raises(ValueError, match="above log"):
        EntroPICCallback(target={"kind": "linear", "start": 5.0, "end": 1.0}).on_fit_start(trainer_at(0), module)
    EntroPICCallback(target="first").on_fit_start(trainer_at(0), module)


def test_on_fit_start_needs_the_knob():
    module = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(vocab_size=100)))
    with pytest.raises(ValueError, match="pic_alpha"):
        EntroPICCallback(target=1.0).on_fit_start(trainer_at(0), module)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"kp": -1.0}, "kp"),
        ({"ki": float("nan")}, "ki"),
        ({"kp": 0.0, "ki": 0.0}, "both 0"),
        ({"alpha_max": 1.5}, "alpha_max"),
        ({"alpha_max": 0.0}, "alpha_max"),
        ({"anti_windup": "bogus"}, "anti_windup"),
        ({"target": -1.0}, "target"),
        ({"target": "last"}, "target"),
    ],
)
def test_invalid_arguments_fail_clearly(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EntroPICCallback(**kwargs)


# ---- the loss term ---------------------------------------------------------------------------------
def term_example():
    # Row 0 positive, row 1 negative; columns: high-prob, high-prob, low-prob.
    logp = torch.tensor([[-0.02, -0.01, -1.5], [-0.03, -0.04, -2.0]], requires_grad=True)
    old = torch.tensor([[-0.03, -0.02, -1.4], [-0.01, -0.02, -2.2]])
    adv = torch.tensor([[0.7, 0.7, 0.7], [-1.3, -1.3, -1.3]])
    high = torch.tensor([[True, True, False], [True, True, False]])
    return logp, old, adv, high


@pytest.mark.parametrize("alpha", [0.6, -0.4, 1.0])
def test_gradient_weighs_positive_one_plus_alpha_and_negative_one_minus_alpha(alpha):
    logp, old, adv, high = term_example()
    r = torch.exp(logp - old)
    n_high = int(high.sum())
    # entropic_term is the mean over high-prob tokens; times the count it is Σ_high(−r·|A|).
    loss = (-r * adv).sum() + alpha * entropic_term(logp, old, adv, high, n_high) * n_high
    (grad,) = torch.autograd.grad(loss, logp)
    r = r.detach()
    weight = torch.where(high, torch.where(adv > 0, 1 + alpha, 1 - alpha), torch.ones_like(adv))
    assert torch.allclose(grad, -weight * adv * r, atol=1e-6)
    # spelled out: positive high-prob tokens (1 + α), negative (1 − α), low-prob tokens plain −A·r
    assert torch.allclose(grad[0, :2], -(1 + alpha) * adv[0, :2] * r[0, :2], atol=1e-6)
    assert torch.allclose(grad[1, :2], -(1 - alpha) * adv[1, :2] * r[1, :2], atol=1e-6)
    assert torch.allclose(grad[:, 2], -adv[:, 2] * r[:, 2], atol=1e-6)


def test_term_value_and_per_sequence_advantages():
    logp, old, adv, high = term_example()
    r = torch.exp(logp - old)
    expected = (-r * adv.abs())[high].sum() / 4
    assert torch.allclose(entropic_term(logp, old, adv, high, 4), expected)
    assert torch.allclose(entropic_term(logp, old, adv[:, 0], high, torch.tensor(4)), expected)


def test_term_is_zero_with_zero_gradient_when_no_token_qualifies():
    logp, old, adv, _ = term_example()
    none = torch.zeros_like(adv, dtype=torch.bool)
    value = entropic_term(logp, old, adv, none, 0)
    (grad,) = torch.autograd.grad(value, logp)
    assert value.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad))


def test_padding_with_extreme_log_probs_gives_finite_gradients():
    logp, old, adv, high = term_example()
    old = old.clone()
    old[:, 2] = -1e4  # exp(logp − old) would overflow on these unselected tokens
    (grad,) = torch.autograd.grad(entropic_term(logp, old, adv, high, 4), logp)
    assert torch.isfinite(grad).all() and (grad[:, 2] == 0).all()


@pytest.mark.parametrize("splits", [2, 3, 6])
def test_micro_batch_invariance_with_the_global_count(splits):
    g = torch.Generator().manual_seed(0)
    B, L = 6, 5
    logp = (-torch.rand(B, L, generator=g) * 0.2).requires_grad_()
    old = logp.detach() + 0.02 * torch.randn(B, L, generator=g)
    adv = torch.randn(B, generator=g)
    high = old > math.log(PIC_PROB_THRESHOLD)
    high[2] = False  # a micro-batch row without any high-probability token
    count = high.sum()
    whole = entropic_term(logp, old, adv, high, count)
    (g_whole,) = torch.autograd.grad(whole, logp)
    parts = [
        entropic_term(logp[rows], old[rows], adv[rows], high[rows], count)
        for rows in torch.tensor_split(torch.arange(B), splits)
    ]
    total = torch.stack(parts).sum()
    (g_parts,) = torch.autograd.grad(total, logp)
    assert torch.allclose(total, whole, atol=1e-6)
    assert torch.allclose(g_parts, g_whole, atol=1e-7)


def test_tokens_below_the_threshold_are_untouched_in_the_objective():
    probs = torch.tensor([[0.5, 0.99, 0.951, 0.949, 0.3, 0.999], [0.5, 0.97, 0.2, 0.96, 0.94, 0.999]])
    old = probs.log()
    mask = torch.tensor([[False, True, True, True, True, False], [False, True, True, True, True, True]])
    adv = torch.tensor([1.0, -2.0])
    mb = {"response_mask": mask, "token_advantages": adv[:, None].expand(2, 6).clone(), "old_logp": old}
    algo = AlgoConfig()
    off, on = Knobs(0.2, 0.2), Knobs(0.2, 0.2, pic_alpha=0.5)
    assert "high_prob" not in select_tokens(algo, mb, off).prepared
    sel = select_tokens(algo, mb, on)
    expected = torch.tensor([[0, 1, 1, 0, 0, 0], [0, 1, 0, 1, 0, 1]], dtype=torch.bool)
    assert torch.equal(sel.prepared["high_prob"], expected)  # > 0.95 and in the loss; the masked 0.999 excluded
    assert int(sel.prepared["num_high_prob"]) == 5

    grads = {}
    for name, knobs in (("off", off), ("on", on)):
        logp = (old + 0.01).requires_grad_()
        loss, _ = micro_batch_loss(algo, knobs, mb, select_tokens(algo, mb, knobs), logp, None)
        (grads[name],) = torch.autograd.grad(loss, logp)
    low = mask & ~expected
    assert torch.equal(grads["on"][low], grads["off"][low])
    assert not torch.allclose(grads["on"][expected], grads["off"][expected])
