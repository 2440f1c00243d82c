"""EntroPICCallback (Yang et al. 2025): the PI law on synthetic entropy sequences, its state, its start-up checks.
The loss term it drives: tests/unit/objectives/test_entropic.py."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest

from lit_entropy.callbacks.entropic import EntroPICCallback
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
