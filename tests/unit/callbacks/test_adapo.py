"""ADAPOCallback on synthetic entropy sequences: direction, clamps, targets, clamp warning, state, validation."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest

from lit_entropy.callbacks.adapo import ADAPOCallback
from lit_entropy.rollout.batch import RolloutBatch
from tests.helpers import small_rollout_batch


def make_batch(entropy: float, B: int = 4) -> RolloutBatch:
    return small_rollout_batch(entropy, [0.0] * B)


def make_module(eps_high: float = 0.28) -> SimpleNamespace:
    return SimpleNamespace(
        eps_low=0.2,
        eps_high=eps_high,
        entropy_coef=0.0,
        model=SimpleNamespace(config=SimpleNamespace(vocab_size=23)),
    )


def trainer_at(epoch: int, max_epochs: int = 11) -> SimpleNamespace:
    return SimpleNamespace(current_epoch=epoch, max_epochs=max_epochs)


def drive(cb: ADAPOCallback, module: SimpleNamespace, entropies: list[float], start: int = 0, n: int = 11):
    """Feed the entropies one iteration each; return the eps_high the module holds after each."""
    seen = []
    for i, h in enumerate(entropies):
        batch = make_batch(h)
        cb.on_rollout_batch(trainer_at(start + i, n), module, batch)
        assert batch.metrics["control/eps_high"] == module.eps_high
        seen.append(module.eps_high)
    return seen


def test_raises_eps_high_while_entropy_is_below_target():
    cb, module = ADAPOCallback(target=0.5), make_module()
    assert drive(cb, module, [0.3] * 3) == [0.29, 0.30, 0.31]
    assert module.eps_low == 0.2


def test_lowers_eps_high_while_entropy_is_above_target():
    cb, module = ADAPOCallback(target=0.5), make_module()
    assert drive(cb, module, [0.9] * 3) == [0.27, 0.26, 0.25]


def test_equal_entropy_leaves_it_unchanged():
    cb, module = ADAPOCallback(target=0.5), make_module()
    assert drive(cb, module, [0.5, 0.3, 0.5]) == [0.28, 0.29, 0.29]


def test_clamps_at_the_upper_bound():
    cb, module = ADAPOCallback(target=0.5, eps_max=0.32), make_module()
    # 0.28 → 0.29, 0.30, 0.31, 0.32, then held at 0.32
    assert drive(cb, module, [0.1] * 7) == [0.29, 0.30, 0.31, 0.32, 0.32, 0.32, 0.32]  # exact
    assert module.eps_high == 0.32
    # and leaves the clamp as soon as entropy is above target
    assert drive(cb, module, [0.9]) == [0.31]


def test_clamps_at_the_lower_bound():
    cb, module = ADAPOCallback(target=0.5), make_module()
    # 0.28 → 0.27 … 0.20, then held at eps_min = 0.2
    expected = [0.27, 0.26, 0.25, 0.24, 0.23, 0.22, 0.21, 0.20, 0.20, 0.20]
    assert drive(cb, module, [0.9] * 10) == expected
    assert module.eps_high == 0.2


def test_target_first_takes_the_first_iteration_entropy():
    cb, module = ADAPOCallback(target="first"), make_module()
    batch = make_batch(0.7)
    cb.on_rollout_batch(trainer_at(0), module, batch)
    assert cb.first_entropy == 0.7
    assert batch.metrics["control/target_entropy"] == 0.7
    assert module.eps_high == 0.28  # H == H* on the first iteration: unchanged
    assert drive(cb, module, [0.6, 0.6, 0.8], start=1) == [0.29, 0.30, 0.29]


def test_fixed_target_is_logged():
    cb, module = ADAPOCallback(target=0.45), make_module()
    batch = make_batch(0.4)
    cb.on_rollout_batch(trainer_at(3), module, batch)
    assert batch.metrics["control/target_entropy"] == 0.45
    assert batch.metrics["control/eps_high"] == 0.29


def test_schedule_target_follows_progress():
    cb, module = ADAPOCallback(target={"kind": "linear", "start": 0.8, "end": 0.4}), make_module()
    # progress 0, 0.5, 1 over 11 iterations: targets 0.8, 0.6, 0.4; entropy 0.7 is below, then above them
    targets, knobs = [], []
    for epoch in (0, 5, 10):
        batch = make_batch(0.7)
        cb.on_rollout_batch(trainer_at(epoch), module, batch)
        targets.append(batch.metrics["control/target_entropy"])
        knobs.append(module.eps_high)
    assert targets == pytest.approx([0.8, 0.6, 0.4])
    assert knobs == [0.29, 0.28, 0.27]


def test_init_none_takes_the_module_value_at_fit_start():
    cb, module = ADAPOCallback(target=0.5, eps_high_init=None), make_module(eps_high=0.3)
    cb.on_fit_start(trainer_at(0), module)
    assert cb.eps_high == 0.3
    assert drive(cb, module, [0.9]) == [0.29]


def test_init_none_outside_range_fails_naming_the_argument():
    cb = ADAPOCallback(target=0.5, eps_high_init=None)
    with pytest.raises(ValueError, match="eps_high_init"):
        cb.on_fit_start(trainer_at(0), make_module(eps_high=0.5))


def test_fit_start_pushes_the_restored_value_onto_the_module():
    cb, module = ADAPOCallback(target=0.5), make_module(eps_high=0.2)
    cb.load_state_dict({**ADAPOCallback(target=0.5).state_dict(), "eps_high": 0.35})
    cb.on_fit_start(trainer_at(0), module)
    assert module.eps_high == 0.35


def test_logs_once_when_stuck_at_the_clamp(caplog):
    cb, module = ADAPOCallback(target=0.5, eps_max=0.30, clamp_patience=3), make_module()
    with caplog.at_level(logging.WARNING, logger="lit_entropy.callbacks.base"):
        drive(cb, module, [0.1] * 2)  # 0.29, 0.30: reached, not yet pushed past
        assert not caplog.records
        drive(cb, module, [0.1] * 2, start=2)  # two clamped iterations: below patience
        assert not caplog.records
        drive(cb, module, [0.1] * 5, start=4)  # the third clamped iteration warns, later ones stay quiet
    warnings = [r for r in caplog.records if "eps_high" in r.getMessage()]
    assert len(warnings) == 1
    assert "ADAPOCallback" in warnings[0].getMessage()


def test_clamp_run_resets_when_the_knob_moves_away():
    cb, module = ADAPOCallback(target=0.5, eps_max=0.29, clamp_patience=3), make_module()
    drive(cb, module, [0.1, 0.1, 0.1, 0.9, 0.1, 0.1])
    assert cb.clamp_run == 1
    assert not cb.clamp_warned


def test_state_round_trip_continues_bit_for_bit():
    seq = [0.5, 0.41, 0.47, 0.62, 0.3, 0.3, 0.55, 0.2, 0.2, 0.2, 0.8, 0.44, 0.1, 0.1, 0.1, 0.1]
    kwargs = dict(target="first", eps_max=0.33, clamp_patience=2)
    ref = ADAPOCallback(**kwargs)
    reference = drive(ref, make_module(), seq, n=len(seq))

    a, module_a = ADAPOCallback(**kwargs), make_module()
    head = drive(a, module_a, seq[:7], n=len(seq))
    state = a.state_dict()
    b, module_b = ADAPOCallback(**kwargs, eps_high_init=0.2), make_module()  # the state overrides the init
    b.load_state_dict(state)
    b.on_fit_start(trainer_at(7, len(seq)), module_b)
    tail = drive(b, module_b, seq[7:], start=7, n=len(seq))
    assert head + tail == reference  # exact equality, not approx
    assert b.clamp_run == ref.clamp_run and b.clamp_warned == ref.clamp_warned
    assert b.first_entropy == 0.5


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"delta": 0.0}, "delta"),
        ({"delta": -0.01}, "delta"),
        ({"eps_high_init": 0.5}, "eps_high_init"),
        ({"eps_high_init": 0.1}, "eps_high_init"),
        ({"eps_min": 0.3, "eps_max": 0.25}, "eps_min"),
        ({"target": "last"}, "target"),
        ({"target": -1.0}, "target"),
    ],
)
def test_invalid_arguments_raise_naming_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ADAPOCallback(**kwargs)


def test_target_above_log_vocab_fails_at_fit_start():
    module = make_module()
    with pytest.raises(ValueError, match="log\\(vocab_size=23\\)"):
        ADAPOCallback(target=math.log(23) + 0.1).on_fit_start(trainer_at(0), module)
    with pytest.raises(ValueError, match="above log"):
        ADAPOCallback(target={"kind": "linear", "start": 4.0, "end": 1.0}).on_fit_start(trainer_at(0), module)
    ADAPOCallback(target=math.log(23) - 0.1).on_fit_start(trainer_at(0), module)


@pytest.mark.parametrize("algo", [{"loss": "gspo"}, {"loss": "ppo", "selection": "kl_cov"}])
def test_refuses_objectives_without_a_token_clip(algo):
    module = make_module()
    module.algo = SimpleNamespace(**{"name": "x", "selection": None, **algo})
    with pytest.raises(ValueError, match="ADAPO"):
        ADAPOCallback().on_fit_start(trainer_at(0), module)
    module.algo = SimpleNamespace(name="dapo", loss="ppo", selection=None)
    ADAPOCallback().on_fit_start(trainer_at(0), module)
    assert module.eps_high == 0.28


def test_knobs_declare_eps_high():
    assert ADAPOCallback.knobs == ("eps_high",)
