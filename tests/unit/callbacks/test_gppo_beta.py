"""GPPOBetaCallback: the law on synthetic entropy sequences, clamps, drives, state, refusals, and the
sign of its lever on a tabular softmax with the real CE-GPPO loss."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lit_entropy.callbacks.gppo_beta import GPPOBetaCallback
from lit_entropy.objectives.losses.ppo import gppo_surrogate
from tests.helpers import small_rollout_batch


def make_module(beta_low: float = 0.75, beta_high: float = 1.0, loss: str = "gppo") -> SimpleNamespace:
    return SimpleNamespace(
        gppo_beta_low=beta_low, gppo_beta_high=beta_high, eps_low=0.2, eps_high=0.28,
        algo=SimpleNamespace(name="ce_gppo" if loss == "gppo" else "grpo", loss=loss),
        model=SimpleNamespace(config=SimpleNamespace(vocab_size=23)),
    )


def trainer_at(epoch: int, max_epochs: int = 11) -> SimpleNamespace:
    return SimpleNamespace(current_epoch=epoch, max_epochs=max_epochs)


def drive(cb: GPPOBetaCallback, module: SimpleNamespace, entropies: list[float], start: int = 0):
    """One iteration per entropy; the (β_low, β_high) the module holds after each."""
    seen = []
    for i, h in enumerate(entropies):
        batch = small_rollout_batch(h, [0.0] * 4)
        cb.on_rollout_batch(trainer_at(start + i), module, batch)
        for side in ("low", "high"):
            if f"gppo_beta_{side}" in cb.knobs:
                assert batch.metrics[f"control/gppo_beta_{side}"] == getattr(module, f"gppo_beta_{side}")
        seen.append((module.gppo_beta_low, module.gppo_beta_high))
    return seen


def test_entropy_below_target_raises_beta_high_and_lowers_beta_low():
    cb, module = GPPOBetaCallback(target=0.5), make_module()
    assert drive(cb, module, [0.3] * 3) == [(0.7, 1.05), (0.65, 1.1), (0.6, 1.15)]


def test_entropy_above_target_lowers_beta_high_and_raises_beta_low():
    cb, module = GPPOBetaCallback(target=0.5), make_module()
    assert drive(cb, module, [0.9] * 2) == [(0.8, 0.95), (0.85, 0.9)]


def test_equal_entropy_leaves_both_unchanged_and_first_target_starts_still():
    cb, module = GPPOBetaCallback(target="first"), make_module()
    assert drive(cb, module, [0.4, 0.4, 0.3]) == [(0.75, 1.0), (0.75, 1.0), (0.7, 1.05)]


def test_both_betas_clamp_and_warn_once(caplog):
    cb, module = GPPOBetaCallback(target=0.5, beta_min=0.6, beta_max=1.1, clamp_patience=2), make_module()
    with caplog.at_level("WARNING", logger="lit_entropy.callbacks.base"):
        seen = drive(cb, module, [0.1] * 6)
    assert seen[-1] == (0.6, 1.1) and seen[:4] == [(0.7, 1.05), (0.65, 1.1), (0.6, 1.1), (0.6, 1.1)]
    assert sum("GPPOBetaCallback" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("drive_,knobs,expected", [
    ("high", ("gppo_beta_high",), (0.75, 1.05)),
    ("low", ("gppo_beta_low",), (0.7, 1.0)),
])
def test_one_sided_drives_touch_one_knob(drive_, knobs, expected):
    cb, module = GPPOBetaCallback(target=0.5, drive=drive_), make_module()
    assert cb.knobs == knobs
    assert drive(cb, module, [0.3]) == [expected]


def test_inits_override_the_preset_and_fit_start_pushes_them():
    cb, module = GPPOBetaCallback(target=0.5, beta_low_init=0.5, beta_high_init=1.25), make_module()
    cb.on_fit_start(trainer_at(0), module)
    assert (module.gppo_beta_low, module.gppo_beta_high) == (0.5, 1.25)


def test_state_round_trip_continues_bit_for_bit():
    seq = [0.5, 0.41, 0.47, 0.62, 0.3, 0.3, 0.55, 0.2, 0.2, 0.8, 0.44, 0.1]
    reference = drive(GPPOBetaCallback(beta_max=1.2), make_module(), seq)
    a, module_a = GPPOBetaCallback(beta_max=1.2), make_module()
    head = drive(a, module_a, seq[:5])
    b, module_b = GPPOBetaCallback(beta_max=1.2), make_module(beta_low=1.0, beta_high=0.5)
    b.load_state_dict(a.state_dict())
    b.on_fit_start(trainer_at(5), module_b)
    assert head + drive(b, module_b, seq[5:], start=5) == reference


def test_refuses_a_loss_that_does_not_read_the_betas():
    with pytest.raises(ValueError, match=r"^callbacks\.entropy: GPPOBetaCallback .* algo=grpo uses loss=ppo"):
        GPPOBetaCallback().on_fit_start(trainer_at(0), make_module(loss="ppo"))


@pytest.mark.parametrize("kwargs,key", [
    ({"drive": "sideways"}, "drive"),
    ({"delta": 0.0}, "delta"),
    ({"beta_min": 1.0, "beta_max": 0.5}, "beta_min"),
    ({"beta_low_init": 2.0}, "beta_low_init"),
    ({"beta_high_init": 0.1}, "beta_high_init"),
])
def test_bad_values_name_their_key(kwargs, key):
    with pytest.raises(ValueError, match=rf"^callbacks\.entropy\.{key}: "):
        GPPOBetaCallback(**kwargs)


def test_preset_value_outside_the_clamp_fails_at_fit_start_naming_the_init_key():
    with pytest.raises(ValueError, match=r"callbacks\.entropy\.beta_high_init: "):
        GPPOBetaCallback().on_fit_start(trainer_at(0), make_module(beta_high=2.0))


def entropy_after_one_step(beta_low: float, beta_high: float) -> float:
    """One SGD step of the CE-GPPO loss on a 5-token softmax whose two sampled tokens are both clipped: the
    rare token 3 with A = +1 and r = e^0.5 > 1 + ε_h, the rarest token 4 with A = −1 and r = e^−0.5 < 1 − ε_l."""
    z = torch.tensor([3.0, 1.0, 0.0, -1.0, -2.0], requires_grad=True)
    logp = torch.log_softmax(z, -1)[[3, 4]]
    old = logp.detach() + torch.tensor([-0.5, 0.5])
    loss, info = gppo_surrogate(logp, old, torch.tensor([1.0, -1.0]), 0.2, 0.28, beta_low, beta_high)
    assert info["clipped_high"].tolist() == [True, False] and info["clipped_low"].tolist() == [False, True]
    loss.mean().backward()
    with torch.no_grad():
        p = torch.softmax(z - 0.5 * z.grad, -1)
        return float(-(p * p.log()).sum())


def test_the_law_moves_entropy_the_way_it_intends_on_a_tabular_softmax():
    """What the controller does when entropy is below target (β_high up, β_low down) raises entropy."""
    before = entropy_after_one_step(0.75, 1.0)
    assert entropy_after_one_step(0.75, 1.5) > before  # more gradient on the rising rare token: up
    assert entropy_after_one_step(0.25, 1.0) > before  # less push-down on the rarest token: up
    assert entropy_after_one_step(1.5, 0.5) < before   # the reverse (entropy above target): down
