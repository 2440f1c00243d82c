"""TOPR (lit_entropy/objectives/losses/topr.py): hand-computed weights, values and gradients, the on-policy case,
extremes, the presets (topr on GRPO's advantages, topr_paper on the paper's ±1 rewards with no baseline), the pairs
refused at start-up and the token-level masks it refuses (its ratio is the whole sampled sequence's)."""

from __future__ import annotations

import math

import pytest
import torch

from lit_entropy.algo import AlgoConfig
from lit_entropy.callbacks.adapo import ADAPOCallback
from lit_entropy.iteration import assign_advantages
from lit_entropy.objectives import losses
from lit_entropy.objectives.losses.topr import TAPER_TOL, topr_surrogate, topr_weights
from lit_entropy.objectives.rollout_correction import CorrectionConfig, check_with_algo
from lit_entropy.rollout.batch import BatchConfig
from lit_entropy.train import check_batch_and_algo, check_controllers_and_algo
from tests.helpers import compose_train, small_rollout_batch

OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -1.0], [-0.3, -0.7, -2.0], [-1.5, -0.2, -0.9]])
# row 0: A > 0, moved down; row 1: A < 0, moved up by 0.1 + 0.2 (ratio e^0.3 > 1, truncated to 1);
# row 2: A < 0, moved down by 0.2 + 0.3 (taper e^-0.5); row 3: A < 0, its third token off the mask, moved down 0.4
# there and by 0.1 on the first two (taper e^-0.2: only masked tokens count).
MOVE = torch.tensor([[-0.3, -0.1, 0.0], [0.1, 0.2, 0.0], [-0.2, -0.3, 0.0], [-0.05, -0.05, -0.4]])
ADV = torch.tensor([1.0, -1.0, -2.0, -0.5])
MASK = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 0]], dtype=torch.bool)


def test_weights_by_hand():
    w, negative, log_ratio = topr_weights(OLD + MOVE, OLD, ADV, MASK)
    assert negative.tolist() == [False, True, True, True]
    assert torch.allclose(log_ratio, torch.tensor([-0.4, 0.3, -0.5, -0.1]), atol=1e-6)
    assert torch.allclose(w, torch.tensor([1.0, 1.0, math.exp(-0.5), math.exp(-0.1)]), atol=1e-6)


def test_values_gradients_and_what_counts_as_tapered():
    logp = (OLD + MOVE).requires_grad_(True)
    loss, info = topr_surrogate(logp, OLD, ADV, MASK)
    w = torch.tensor([1.0, 1.0, math.exp(-0.5), math.exp(-0.1)])
    want = torch.where(MASK, -(w * ADV)[:, None] * (OLD + MOVE), 0.0)
    assert torch.allclose(loss, want, atol=1e-6)
    (grad,) = torch.autograd.grad(loss.sum(), logp)  # −sg(w)·A on every masked token, no ratio in the gradient
    assert torch.allclose(grad, torch.where(MASK, -(w * ADV)[:, None], 0.0), atol=1e-6)
    assert info["clipped_low"].tolist() == [[False] * 3, [False] * 3, [True, True, False], [True, True, False]]
    assert info["clipped_high"].tolist() == [[False] * 3, [True] * 3, [False] * 3, [False] * 3]


def test_on_policy_it_is_reinforce_and_nothing_is_tapered():
    noise = torch.tensor([[1e-7, -1e-7, 0.0]] * 4)  # the pre-update pass against the update's own forward
    logp = (OLD + noise).requires_grad_(True)
    loss, info = topr_surrogate(logp, OLD, ADV, MASK)
    assert torch.allclose(loss, torch.where(MASK, -ADV[:, None] * logp.detach(), 0.0), atol=1e-6)
    assert not info["clipped_low"].any()
    assert TAPER_TOL > 1e-6


def test_long_sequences_neither_overflow_nor_produce_nan():
    old = torch.full((2, 400), -1.0)
    logp = old + torch.tensor([[0.5], [-0.5]])  # log ratios +200 and −200 over the sequence
    loss, _ = topr_surrogate(logp, old, torch.tensor([-1.0, -1.0]), torch.ones(2, 400, dtype=torch.bool))
    assert torch.isfinite(loss).all()
    assert torch.allclose(loss[0], -0.5 * torch.ones(400))  # w = 1: −(−1)·(−0.5) and torch.allclose(loss[1], torch.zeros(400), atol=1e-30)


def test_nan_off_the_mask_cannot_reach_the_result():
    logp, old = OLD + MOVE, OLD.clone()
    logp[2, 2], old[3, 2] = float("nan"), float("nan")
    loss, _ = topr_surrogate(logp, old, ADV, MASK)
    assert torch.isfinite(loss).all()


def test_per_token_advantages_split_on_the_rows_mean():
    tok = torch.tensor([[1.0, 1.0, -0.5], [-1.0, -1.0, 0.5]])
    _, negative, _ = topr_weights(OLD[:2], OLD[:2], tok, MASK[:2])
    assert negative.tolist() == [False, True]


def test_registered_with_its_dose_and_no_clip():
    loss = losses.LOSSES["topr"]
    assert not loss.ppo_clip and not loss.per_sequence and loss.dose.tag == "train/clipfrac_low"


def test_preset_composes_and_the_clip_pairs_are_refused():
    cfg = compose_train(["algo=topr", "paths.output_dir=/tmp/lit-entropy-test-out"])
    algo = AlgoConfig(**{k: v for k, v in cfg.algo.items() if k != "_target_"})
    assert (algo.loss, algo.loss_agg) == ("topr", "seq-mean-token-mean")
    with pytest.raises(ValueError, match="ADAPOCallback drives eps_high.*topr"):
        check_controllers_and_algo([ADAPOCallback()], algo)
    with pytest.raises(ValueError, match="dual_clip"):
        AlgoConfig(**{**{k: v for k, v in cfg.algo.items() if k != "_target_"}, "dual_clip": 3.0})


def algo_of(preset: str) -> AlgoConfig:
    cfg = compose_train([f"algo={preset}", "paths.output_dir=/tmp/lit-entropy-test-out"])
    return AlgoConfig(**{k: v for k, v in cfg.algo.items() if k != "_target_"})


def test_the_paper_preset_trains_on_plus_minus_one_with_no_baseline():
    """algo=topr_paper: TOPR's loss on A = 2R − 1 (the paper's ±1 rewards, no baseline); algo=topr keeps GRPO's."""
    paper, grpo_based = algo_of("topr_paper"), algo_of("topr")
    assert (paper.name, paper.loss, paper.loss_agg, paper.advantage) == ("topr_paper", "topr", "seq-mean-token-mean",
                                                                         "signed")
    assert grpo_based.advantage == "grpo" and paper.token_shaping is None and paper.reward_transform is None
    rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]  # groups of 4: mixed, all right, all wrong
    batch = small_rollout_batch(0.5, [0.0] * 12, rewards, group_size=4)
    assign_advantages(paper, batch)
    want = [2 * r - 1 for r in rewards]  # exactly ±1: no group mean subtracted, no std divided
    assert batch.advantages.tolist() == want
    assert batch.token_advantages.tolist() == [[a] * 4 for a in want]
    assign_advantages(grpo_based, batch)  # GRPO's: the flat groups get 0 and the mixed one a group-normalised value
    assert batch.advantages[4:].tolist() == [0.0] * 8 and batch.advantages[0] > 1.0
    with pytest.raises(ValueError, match="dynamic_sampling .* algo.advantage=signed has no baseline"):
        check_batch_and_algo(BatchConfig(dynamic_sampling=True), paper)


@pytest.mark.parametrize("rule, args", [("forking", {}), ("clip_b", {}), ("clip_v", {})])
def test_token_level_selection_is_refused(rule, args):
    """Its weight is the ratio of the whole sampled sequence: a rule that takes tokens out of the loss mask would
    make it the ratio of the tokens left, so the pair is refused at start-up."""
    assert losses.LOSSES["topr"].sequence_ratio
    with pytest.raises(ValueError, match=rf"algo.loss=topr weighs each row by the ratio of its whole sampled "
                                         rf"sequence; algo.selection={rule}"):
        AlgoConfig(loss="topr", selection=rule, selection_args=args)
    AlgoConfig(loss="ppo", selection=rule, selection_args=args)  # per-token losses keep them


def test_token_level_correction_masks_are_refused_row_level_ones_kept():
    topr = AlgoConfig(loss="topr")
    with pytest.raises(ValueError, match="correction.level=token with mode=mask .* algo.loss=topr"):
        check_with_algo(CorrectionConfig(level="token", mode="mask", threshold=2.0, threshold_low=0.5), topr)
    for kept in (CorrectionConfig(level="sequence", mode="mask"), CorrectionConfig(level="geometric", mode="mask"),
                 CorrectionConfig(level="token"), CorrectionConfig(reject="k1_mean", reject_threshold=0.1),
                 CorrectionConfig(veto=1e-4), CorrectionConfig(opsm_delta=0.1), CorrectionConfig(bypass=True)):
        check_with_algo(kept, topr)  # whole rows out, or weights only: a kept row's ratio is its whole sequence's
    check_with_algo(CorrectionConfig(level="token", mode="mask"), AlgoConfig(loss="ppo"))
