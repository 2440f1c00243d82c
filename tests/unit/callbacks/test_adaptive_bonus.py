"""AdaptiveEntropyBonusCallback on synthetic entropy sequences: direction, clamps, gating, targets, state."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest

from lit_entropy.callbacks.adaptive_bonus import AdaptiveEntropyBonusCallback
from lit_entropy.rollout.batch import RolloutBatch
from tests.helpers import small_rollout_batch


def make_batch(entropy: float, B: int = 4) -> RolloutBatch:
    return small_rollout_batch(entropy, [0.0] * B)


def make_module() -> SimpleNamespace:
    return SimpleNamespace(
        eps_low=0.2,
        eps_high=0.28,
        entropy_coef=0.0,
        model=SimpleNamespace(config=SimpleNamespace(vocab_size=23)),
    )


def trainer_at(epoch: int, max_epochs: int = 11) -> SimpleNamespace:
    return SimpleNamespace(current_epoch=epoch, max_epochs=max_epochs)


def drive(
    cb: AdaptiveEntropyBonusCallback,
    module: SimpleNamespace,
    entropies: list[float],
    start: int = 0,
    n: int = 11,
) -> tuple[list[float], list[float]]:
    """One iteration per entropy; return (applied entropy_coef, internal state c) after each."""
    applied, state = [], []
    for i, h in enumerate(entropies):
        batch = make_batch(h)
        cb.on_rollout_batch(trainer_at(start + i, n), module, batch)
        assert batch.metrics["control/entropy_coef"] == module.entropy_coef
        applied.append(module.entropy_coef)
        state.append(batch.metrics["control/entropy_coef_state"])
    return applied, state


def test_coefficient_rises_while_entropy_is_below_target():
    cb, module = AdaptiveEntropyBonusCallback(target=0.5), make_module()
    applied, state = drive(cb, module, [0.3] * 3)
    assert state == [5e-4, 1e-3, 1.5e-3]
    assert applied == state


def test_coefficient_falls_while_above_and_the_bonus_is_off_there():
    cb, module = AdaptiveEntropyBonusCallback(target=0.5, coef_init=0.002, delta=5e-4), make_module()
    applied, state = drive(cb, module, [0.9] * 3)
    assert state == [1.5e-3, 1e-3, 5e-4]
    assert applied == [0.0, 0.0, 0.0]


def test_bonus_applies_at_equality_with_unchanged_coefficient():
    cb, module = AdaptiveEntropyBonusCallback(target=0.5, coef_init=0.003), make_module()
    applied, state = drive(cb, module, [0.5])
    assert state == [0.003] and applied == [0.003]


def test_clamps_at_zero():
    cb, module = AdaptiveEntropyBonusCallback(target=0.5, coef_init=0.001, delta=5e-4), make_module()
    applied, state = drive(cb, module, [0.9] * 4)
    assert state == [5e-4, 0.0, 0.0, 0.0]
    assert cb.coef == 0.0 and applied == [0.0] * 4
    assert cb.clamp_run == 0  # resting at 0 above target is not a stuck clamp


def test_clamps_at_coef_max_and_gates_on_the_target():
    cb, module = AdaptiveEntropyBonusCallback(target=0.5, delta=0.004, coef_max=0.01), make_module()
    applied, state = drive(cb, module, [0.1, 0.1, 0.1, 0.1, 0.9, 0.2])
    # 0 → 0.004, 0.008, 0.01 (clamped), 0.01, then 0.006 above target (bonus off), 0.01 below again
    assert state == [0.004, 0.008, 0.01, 0.01, 0.006, 0.01]
    assert applied == [0.004, 0.008, 0.01, 0.01, 0.0, 0.01]
    assert max(state) == 0.01


def test_target_first_and_schedule():
    cb, module = AdaptiveEntropyBonusCallback(target="first", coef_init=0.001), make_module()
    applied, _ = drive(cb, module, [0.6, 0.61, 0.59])
    assert cb.first_entropy == 0.6
    assert applied == [0.001, 0.0, 0.001]

    cb = AdaptiveEntropyBonusCallback(target={"kind": "linear", "start": 0.8, "end": 0.4})
    targets, coefs = [], []
    for epoch in (0, 5, 10):
        batch = make_batch(0.7)
        cb.on_rollout_batch(trainer_at(epoch), module, batch)
        targets.append(batch.metrics["control/target_entropy"])
        coefs.append(module.entropy_coef)
    assert targets == pytest.approx([0.8, 0.6, 0.4])
    assert coefs == [5e-4, 0.0, 0.0]  # below 0.8; above 0.6 and 0.4 (c back to 0)


def test_logs_once_when_stuck_at_coef_max(caplog):
    cb, module = (
        AdaptiveEntropyBonusCallback(target=0.5, delta=0.005, coef_max=0.01, clamp_patience=2),
        make_module(),
    )
    with caplog.at_level(logging.WARNING, logger="lit_entropy.callbacks.base"):
        drive(cb, module, [0.1] * 3)  # 0.005, 0.01, then one clamped iteration
        assert not caplog.records
        drive(cb, module, [0.1] * 4, start=3)
    warnings = [r for r in caplog.records if "entropy_coef" in r.getMessage()]
    assert len(warnings) == 1


def test_state_round_trip_continues_bit_for_bit():
    seq = [0.5, 0.41, 0.47, 0.62, 0.3, 0.3, 0.55, 0.2, 0.2, 0.2, 0.8, 0.44, 0.1, 0.1, 0.1, 0.1, 0.9, 0.3]
    kwargs = dict(target="first", delta=1.3e-3, coef_max=0.005, clamp_patience=2)
    reference = drive(AdaptiveEntropyBonusCallback(**kwargs), make_module(), seq, n=len(seq))

    a = AdaptiveEntropyBonusCallback(**kwargs)
    head = drive(a, make_module(), seq[:8], n=len(seq))
    b = AdaptiveEntropyBonusCallback(**kwargs, coef_init=0.004)  # the state overrides the init
    b.load_state_dict(a.state_dict())
    tail = drive(b, make_module(), seq[8:], start=8, n=len(seq))
    assert head[0] + tail[0] == reference[0]  # exact equality, not approx
    assert head[1] + tail[1] == reference[1]


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"delta": 0.0}, "delta"),
        ({"coef_max": 0.0}, "coef_max"),
        ({"coef_init": -1e-3}, "coef_init"),
        ({"coef_init": 0.02, "coef_max": 0.01}, "coef_init"),
    ],
)
def test_invalid_arguments_raise_naming_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        AdaptiveEntropyBonusCallback(**kwargs)


def test_target_above_log_vocab_fails_at_fit_start():
    with pytest.raises(ValueError, match="log\\(vocab_size=23\\)"):
        AdaptiveEntropyBonusCallback(target=math.log(23) + 0.1).on_fit_start(trainer_at(0), make_module())


def test_knobs_declare_entropy_coef():
    assert AdaptiveEntropyBonusCallback.knobs == ("entropy_coef",)
