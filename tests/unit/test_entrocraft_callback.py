"""EntrocraftCallback on real RolloutBatch objects: band schedule, rejection, logging and state."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lit_entropy.callbacks.entrocraft import EntrocraftCallback
from lit_entropy.data.batch import RolloutBatch


def make_batch(entropy: float, advantages: list[float]) -> RolloutBatch:
    B = len(advantages)
    batch = RolloutBatch(
        input_ids=torch.ones(B, 4, dtype=torch.long),
        attention_mask=torch.ones(B, 4, dtype=torch.bool),
        response_mask=torch.tensor([[False, True, True, True]] * B),
        rewards=torch.zeros(B),
        group_index=torch.arange(B) // 2,
        group_size=2,
        sampler_logp=torch.zeros(B, 4),
    )
    batch.advantages = torch.tensor(advantages)
    batch.metrics["rollout/entropy"] = entropy
    return batch


def trainer_at(epoch: int, max_epochs: int = 11):
    return SimpleNamespace(current_epoch=epoch, max_epochs=max_epochs)


def test_band_follows_linear_schedule_over_iterations():
    cb = EntrocraftCallback(band_start=(0.6, 0.7), band_end=(0.4, 0.5), schedule="linear")
    seen = []
    for epoch in (0, 5, 10):
        batch = make_batch(0.65, [0.5, -0.5])
        cb.on_rollout_batch(trainer_at(epoch), None, batch)
        seen.append((batch.metrics["control/band_low"], batch.metrics["control/band_high"]))
    assert seen == [pytest.approx((0.6, 0.7)), pytest.approx((0.5, 0.6)), pytest.approx((0.4, 0.5))]
    assert batch.metrics["control/target_entropy"] == pytest.approx(0.45)


def test_inside_band_keeps_everything():
    cb = EntrocraftCallback(band_start=(0.6, 0.7))
    batch = make_batch(0.65, [2.0, -2.0] * 50)
    cb.on_rollout_batch(trainer_at(0), None, batch)
    assert batch.keep.all()
    assert batch.metrics["control/direction"] == 0


@pytest.mark.parametrize("entropy,dropped_sign", [(0.9, -1.0), (0.3, 1.0)])
def test_outside_band_rejects_the_side_that_pushes_entropy_the_wrong_way(entropy, dropped_sign):
    cb = EntrocraftCallback(band_start=(0.6, 0.7), gamma=10.0, seed=3)
    adv = [1.0, -1.0] * 200
    batch = make_batch(entropy, adv)
    cb.on_rollout_batch(trainer_at(0), None, batch)
    a = batch.advantages
    kept_wrong = batch.keep[torch.sign(a) == dropped_sign].float().mean()
    kept_right = batch.keep[torch.sign(a) == -dropped_sign].float().mean()
    assert kept_right == 1.0
    assert kept_wrong < 0.01  # exp(-10) acceptance
    assert batch.metrics["control/direction"] == (1.0 if entropy > 0.7 else -1.0)
    assert batch.metrics["control/band_error"] == pytest.approx(0.2 if entropy > 0.7 else 0.3)


def test_state_dict_round_trip_reproduces_the_same_draws():
    a = EntrocraftCallback(band_start=(0.6, 0.7), gamma=1.0, seed=7)
    a.on_rollout_batch(trainer_at(0), None, make_batch(0.9, [-0.5] * 64))
    state = a.state_dict()
    first = make_batch(0.9, [-0.5] * 64)
    a.on_rollout_batch(trainer_at(1), None, first)
    b = EntrocraftCallback(band_start=(0.6, 0.7), gamma=1.0, seed=999)
    b.load_state_dict(state)
    second = make_batch(0.9, [-0.5] * 64)
    b.on_rollout_batch(trainer_at(1), None, second)
    assert torch.equal(first.keep, second.keep)
    assert not first.keep.all() and first.keep.any()


def test_invalid_band_and_mode_fail_clearly():
    with pytest.raises(ValueError):
        EntrocraftCallback(band_start=(0.7, 0.6))
    with pytest.raises(ValueError, match="mode"):
        EntrocraftCallback(mode="bogus")
    with pytest.raises(ValueError, match="gamma"):
        EntrocraftCallback(gamma=0.0)


def test_rejected_rows_leave_the_minibatches():
    batch = make_batch(0.9, [1.0, -1.0] * 4)
    batch.keep = torch.tensor([True, False] * 4)
    mbs = batch.minibatches(2, generator=torch.Generator().manual_seed(0))
    assert sum(mb["input_ids"].shape[0] for mb in mbs) == 4
    assert all((mb["advantages"] > 0).all() for mb in mbs)


def test_all_rows_rejected_gives_no_minibatches():
    batch = make_batch(0.9, [-1.0] * 4)
    batch.keep = torch.zeros(4, dtype=torch.bool)
    assert batch.minibatches(2) == []
