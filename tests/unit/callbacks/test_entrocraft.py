"""EntrocraftCallback on real RolloutBatch objects: band schedule, rejection, logging and state."""

from __future__ import annotations

import io
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lit_entropy.callbacks.base import EntropyController
from lit_entropy.callbacks.entrocraft import EntrocraftCallback
from lit_entropy.objectives.advantages import compute_advantages
from lit_entropy.rollout.batch import RolloutBatch
from tests.helpers import small_rollout_batch

YAML = Path(__file__).resolve().parents[3] / "conf" / "callbacks" / "entropy" / "entrocraft.yaml"


def make_batch(
    entropy: float, advantages: list[float], rewards: list[float] | None = None, group_size: int = 2
) -> RolloutBatch:
    batch = small_rollout_batch(entropy, advantages, rewards, group_size)
    batch.token_advantages = batch.advantages[:, None].expand_as(batch.input_ids).clone()  # as the module
    return batch


def trainer_at(epoch: int, max_epochs: int = 11):
    return SimpleNamespace(current_epoch=epoch, max_epochs=max_epochs)


def test_band_follows_linear_schedule_over_iterations():
    cb = EntrocraftCallback(band={"kind": "linear", "start": (0.6, 0.7), "end": (0.4, 0.5)})
    seen = []
    for epoch in (0, 5, 10):
        batch = make_batch(0.65, [0.5, -0.5])
        cb.on_rollout_batch(trainer_at(epoch), None, batch)
        seen.append((batch.metrics["control/band_low"], batch.metrics["control/band_high"]))
    assert seen == [pytest.approx((0.6, 0.7)), pytest.approx((0.5, 0.6)), pytest.approx((0.4, 0.5))]
    assert batch.metrics["control/target_entropy"] == pytest.approx(0.45)


def test_inside_band_keeps_everything():
    cb = EntrocraftCallback(band=(0.6, 0.7))
    batch = make_batch(0.65, [2.0, -2.0] * 50)
    cb.on_rollout_batch(trainer_at(0), None, batch)
    assert batch.keep.all()
    assert batch.metrics["control/direction"] == 0


@pytest.mark.parametrize("entropy,dropped_sign", [(0.9, -1.0), (0.3, 1.0)])
def test_outside_band_rejects_the_side_that_pushes_entropy_the_wrong_way(entropy, dropped_sign):
    cb = EntrocraftCallback(band=(0.6, 0.7), gamma=10.0, seed=3)
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
    a = EntrocraftCallback(band=(0.6, 0.7), gamma=1.0, seed=7)
    a.on_rollout_batch(trainer_at(0), None, make_batch(0.9, [-0.5] * 64))
    state = a.state_dict()
    first = make_batch(0.9, [-0.5] * 64)
    a.on_rollout_batch(trainer_at(1), None, first)
    b = EntrocraftCallback(band=(0.6, 0.7), gamma=1.0, seed=999)
    b.load_state_dict(state)
    second = make_batch(0.9, [-0.5] * 64)
    b.on_rollout_batch(trainer_at(1), None, second)
    assert torch.equal(first.keep, second.keep)
    assert not first.keep.all() and first.keep.any()


def test_invalid_band_and_mode_fail_clearly():
    with pytest.raises(ValueError, match=r"^callbacks\.entropy\.band: .*h_low=0.7 > h_high=0.6"):
        EntrocraftCallback(band=(0.7, 0.6))
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


# ---- base class, knobs, progress ------------------------------------------------------------------
def test_is_an_entropy_controller_with_per_instance_knobs():
    paper = EntrocraftCallback(mode="paper")
    hard = EntrocraftCallback(mode="hard")
    assert isinstance(paper, EntropyController)
    assert paper.knobs == ("keep", "row_weight") and hard.knobs == ("token_advantages",)
    assert EntropyController.knobs == ()


def test_progress_in_samples_ignores_the_epoch_counter():
    cb = EntrocraftCallback(
        band={"kind": "linear", "start": (0.6, 0.7), "end": (0.4, 0.5)}, progress={"unit": "samples", "total_samples": 8}
    )
    seen = []
    for _ in range(4):
        batch = make_batch(0.55, [0.5, -0.5, 0.5, -0.5])  # 4 rows per iteration
        cb.on_rollout_batch(trainer_at(0), None, batch)
        seen.append((batch.metrics["control/band_low"], batch.metrics["control/band_high"]))
    assert seen == [pytest.approx((0.6, 0.7)), pytest.approx((0.5, 0.6))] + [pytest.approx((0.4, 0.5))] * 2
    assert cb.samples_seen == 16
    with pytest.raises(ValueError, match=r"^callbacks\.entropy\.progress\.total_samples: "):
        EntrocraftCallback(progress={"unit": "samples"})
    with pytest.raises(ValueError, match=r"^callbacks\.entropy\.progress\.unit: 'tokens'"):
        EntrocraftCallback(progress={"unit": "tokens"})


def test_piecewise_band_through_the_callback():
    cb = EntrocraftCallback(band={"kind": "piecewise", "points": [[0, 0.6, 0.7], [0.5, 0.5, 0.6], [1, 0.2, 0.3]]})
    got = []
    for epoch in (0, 5, 10):
        batch = make_batch(0.5, [1.0, -1.0])
        cb.on_rollout_batch(trainer_at(epoch), None, batch)
        got.append((batch.metrics["control/band_low"], batch.metrics["control/band_high"]))
        assert batch.metrics["control/target_entropy"] == pytest.approx(sum(got[-1]) / 2)
    assert got == [pytest.approx((0.6, 0.7)), pytest.approx((0.5, 0.6)), pytest.approx((0.2, 0.3))]
    with pytest.raises(ValueError, match=r"^callbacks\.entropy\.band: .*piecewise"):
        EntrocraftCallback(band={"kind": "linear", "start": (0.6, 0.7), "end": (0.6, 0.7), "points": [[0, 0.6, 0.7]]})


def low_edge(p: float) -> float:
    return 0.4 - 0.2 * p


def high_edge(p: float) -> float:
    return 0.5 - 0.2 * p


def band_edges(p: float) -> tuple[float, float]:
    return low_edge(p), high_edge(p)


def test_callable_band_through_the_callback():
    cb = EntrocraftCallback(band={"kind": f"{__name__}:band_edges"})
    batch = make_batch(0.9, [1.0, -1.0])
    cb.on_rollout_batch(trainer_at(5), None, batch)
    assert batch.metrics["control/band_low"] == pytest.approx(0.3)
    assert batch.metrics["control/band_high"] == pytest.approx(0.4)
    assert batch.metrics["control/band_error"] == pytest.approx(0.5)
    assert batch.metrics["control/direction"] == 1.0


def test_yaml_instantiates_with_overrides():
    def build(**overrides):
        cfg = OmegaConf.create({"seed": 3, "cb": OmegaConf.load(YAML)})
        for k, v in overrides.items():
            cfg.cb[k] = v
        return instantiate(cfg.cb)

    default = build()
    assert default.mode == "paper" and default.band(0.0) == pytest.approx((0.45, 0.55))
    pw = build(band={"kind": "piecewise", "points": [[0, 0.4, 0.5], [0.5, 0.3, 0.4], [1, 0.2, 0.3]]})
    assert pw.band(0.25) == pytest.approx((0.35, 0.45))
    hard = build(mode="hard", nsr_reward_offset=1, progress={"unit": "samples", "total_samples": 1024})
    assert hard.knobs == ("token_advantages",) and hard.nsr_reward_offset == 1.0


def module_with_vocab(vocab: int):
    return SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(vocab_size=vocab)))


def test_fit_start_checks_the_high_edge_everywhere():
    ceiling = math.log(2)  # 0.693
    EntrocraftCallback(band=(0.6, 0.69)).on_fit_start(None, module_with_vocab(2))
    with pytest.raises(ValueError, match="^callbacks\\.entropy\\.band: .*log\\(vocab_size=2\\)"):
        EntrocraftCallback(band=(0.6, 0.7)).on_fit_start(None, module_with_vocab(2))
    # The high edge peaks mid-run: only a check at every knot sees it.
    cb = EntrocraftCallback(band={"kind": "piecewise", "points": [[0, 0.3, 0.4], [0.5, 0.6, ceiling + 0.01], [1, 0.3, 0.4]]})
    with pytest.raises(ValueError, match="unreachable"):
        cb.on_fit_start(None, module_with_vocab(2))
    cb.on_fit_start(None, module_with_vocab(32000))
    cb.on_fit_start(None, SimpleNamespace(model=None))  # no vocab known: nothing to check


# ---- hard mode ------------------------------------------------------------------------------------
REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0]  # two groups of G = 4, 0/1 rewards


def hard_batch(entropy: float, rewards: list[float]) -> RolloutBatch:
    r = torch.tensor(rewards)
    grpo = compute_advantages("grpo", r, 4)
    return make_batch(entropy, grpo.tolist(), rewards, group_size=4)


def test_hard_mode_raft_pp_above_the_band():
    batch = hard_batch(0.9, REWARDS)
    cb = EntrocraftCallback(band=(0.6, 0.7), mode="hard")
    cb.on_rollout_batch(trainer_at(0), None, batch)
    expected = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0])  # max(R, 0)
    assert torch.equal(batch.advantages, expected)
    assert torch.equal(batch.token_advantages, expected[:, None].expand(8, 4))
    assert batch.keep.all()
    assert batch.metrics["control/direction"] == 1.0
    assert batch.metrics["control/entrocraft_kept_frac"] == 1.0


def test_hard_mode_nsr_below_the_band():
    # Rewards in {-1, +1}: NSR keeps the -1 of the failures, 0 elsewhere.
    pm = [2 * r - 1 for r in REWARDS]
    batch = hard_batch(0.3, pm)
    EntrocraftCallback(band=(0.6, 0.7), mode="hard").on_rollout_batch(trainer_at(0), None, batch)
    expected = torch.tensor([0.0, -1.0, -1.0, 0.0, 0.0, 0.0, 0.0, -1.0])  # min(R, 0)
    assert torch.equal(batch.advantages, expected)
    assert torch.equal(batch.token_advantages, expected[:, None].expand(8, 4))
    assert batch.metrics["control/direction"] == -1.0
    # 0/1 rewards: min(R, 0) is all zeros (no update) ...
    batch = hard_batch(0.3, REWARDS)
    EntrocraftCallback(band=(0.6, 0.7), mode="hard").on_rollout_batch(trainer_at(0), None, batch)
    assert torch.equal(batch.advantages, torch.zeros(8))
    # ... unless the offset maps {0, 1} to {-1, 0}: the same NSR as with {-1, +1} rewards.
    batch = hard_batch(0.3, REWARDS)
    EntrocraftCallback(band=(0.6, 0.7), mode="hard", nsr_reward_offset=1.0).on_rollout_batch(
        trainer_at(0), None, batch
    )
    assert torch.equal(batch.advantages, expected)


def test_hard_mode_inside_the_band_is_plain_grpo():
    batch = hard_batch(0.65, REWARDS)
    grpo = compute_advantages("grpo", torch.tensor(REWARDS), 4)
    before_tokens = batch.token_advantages
    EntrocraftCallback(band=(0.6, 0.7), mode="hard", nsr_reward_offset=1.0).on_rollout_batch(
        trainer_at(0), None, batch
    )
    assert torch.equal(batch.advantages, grpo)
    assert batch.token_advantages is before_tokens and torch.equal(before_tokens, grpo[:, None].expand(8, 4))
    assert batch.keep.all() and batch.metrics["control/direction"] == 0.0


def test_hard_mode_offset_does_not_touch_raft_pp():
    batch = hard_batch(0.9, REWARDS)
    EntrocraftCallback(band=(0.6, 0.7), mode="hard", nsr_reward_offset=1.0).on_rollout_batch(
        trainer_at(0), None, batch
    )
    assert torch.equal(batch.advantages, torch.tensor(REWARDS))
    with pytest.raises(ValueError, match="nsr_reward_offset"):
        EntrocraftCallback(mode="hard", nsr_reward_offset=float("nan"))


# ---- save and resume ------------------------------------------------------------------------------
ENTROPIES = [0.9, 0.8, 0.3, 0.62, 0.95, 0.2, 0.75, 0.1]


def run_iterations(cb: EntrocraftCallback, start: int, stop: int, max_epochs: int = 8) -> list[tuple]:
    out = []
    g = torch.Generator().manual_seed(11)
    advs = [torch.randn(32, generator=g) for _ in ENTROPIES]  # the same advantages whatever the split
    for it in range(start, stop):
        batch = make_batch(ENTROPIES[it], advs[it].tolist())
        # Counting samples, the schedule must not depend on the trainer's epoch counter at all.
        epoch = 0 if cb.progress_config.unit == "samples" else it
        cb.on_rollout_batch(trainer_at(epoch, max_epochs), None, batch)
        m = batch.metrics
        out.append((batch.keep.clone(), m["control/band_low"], m["control/band_high"],
                    m["control/target_entropy"], m["control/direction"], m["control/entrocraft_kept_frac"]))
    return out


def assert_same(a: list[tuple], b: list[tuple]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x[0], y[0])
        assert x[1:] == y[1:]  # bit-for-bit floats


@pytest.mark.parametrize("unit", ["iterations", "samples"])
def test_resume_mid_sequence_reproduces_keep_masks_and_band_bit_for_bit(unit):
    kwargs = dict(band={"kind": "cosine", "start": (0.6, 0.7), "end": (0.3, 0.4)}, gamma=2.0,
                  progress={"unit": unit, "total_samples": 32 * 7})
    reference = run_iterations(EntrocraftCallback(seed=5, **kwargs), 0, 8)
    first = EntrocraftCallback(seed=5, **kwargs)
    head = run_iterations(first, 0, 3)
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)  # through a checkpoint's serialisation
    buf.seek(0)
    resumed = EntrocraftCallback(seed=12345, **kwargs)  # a different seed: the state must win
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    tail = run_iterations(resumed, 3, 8)
    assert_same(head + tail, reference)
    keeps = torch.stack([r[0] for r in reference])
    assert not keeps.all() and keeps.any()  # the draws did something
    assert len({r[1] for r in reference}) > 3  # the band moved


def test_old_checkpoint_without_base_state_still_loads():
    a = EntrocraftCallback(seed=7)
    old = {"generator": a.generator.get_state(), "last": {"control/direction": 1.0}}
    b = EntrocraftCallback(seed=8)
    b.load_state_dict(old)
    assert torch.equal(b.generator.get_state(), a.generator.get_state())
    assert b.samples_seen == 0 and b.last == {"control/direction": 1.0}


def test_paper_mode_renormalises_each_prompt_over_its_kept_rows():
    from lit_entropy.objectives.entrocraft import group_renormalised_weights

    keep = torch.tensor([True, False, False, False, True, True, True, True, False, False, False, False])
    w = group_renormalised_weights(keep, 4)
    assert w.tolist() == [4.0, 0, 0, 0, 1.0, 1.0, 1.0, 1.0, 0, 0, 0, 0]
    cb = EntrocraftCallback(band=(0.6, 0.7), gamma=10.0, seed=3)
    batch = make_batch(0.9, [1.0, -1.0] * 50)  # groups of 2: one positive, one negative
    cb.on_rollout_batch(trainer_at(0), None, batch)
    kept_positive = batch.keep & (batch.advantages > 0)
    assert torch.all(batch.row_weight[kept_positive] == 2.0)  # 1 of 2 kept: G/|S_x| = 2
    assert torch.all(batch.row_weight[~batch.keep] == 0.0)
    assert "row_weight" in batch.minibatches(1)[0]


def test_paper_mode_without_renormalisation_only_drops_rows():
    cb = EntrocraftCallback(band=(0.6, 0.7), gamma=10.0, seed=3, renormalise="none")
    batch = make_batch(0.9, [1.0, -1.0] * 50)
    cb.on_rollout_batch(trainer_at(0), None, batch)
    assert batch.row_weight is None and cb.knobs == ("keep",)
    assert not batch.keep[batch.advantages < 0].all() and batch.keep[batch.advantages > 0].all()
    with pytest.raises(ValueError, match="renormalise"):
        EntrocraftCallback(renormalise="group")
