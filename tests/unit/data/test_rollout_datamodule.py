"""Building the rollout batch from engine output, and the per-iteration rollout metrics."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.data.rollout_datamodule import build_batch, rollout_metrics
from lit_entropy.rollout import Generation

EOS, PAD = 2, 0


def gens():
    # Two prompts, G = 2. Prompt lengths differ; one completion is truncated (no EOS).
    return [
        [Generation([5, 6, EOS], [-0.1, -0.2, -0.3], False), Generation([7, EOS], [-0.4, -0.5], False)],
        [Generation([8, 9, 10], [-0.6, -0.7, -0.8], True), Generation([5, EOS], [-0.9, -1.0], False)],
    ]


def test_build_batch_aligns_tokens_masks_and_sampler_logprobs():
    prompts = [[1, 11, 12], [1, 13]]
    batch = build_batch(prompts, gens(), [1.0, 0.0, 0.0, 1.0], group_size=2, pad_id=PAD)
    assert batch.input_ids.tolist() == [
        [1, 11, 12, 5, 6, EOS],
        [1, 11, 12, 7, EOS, PAD],
        [1, 13, 8, 9, 10, PAD],
        [1, 13, 5, EOS, PAD, PAD],
    ]
    assert batch.response_mask.int().tolist() == [
        [0, 0, 0, 1, 1, 1],
        [0, 0, 0, 1, 1, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 1, 1, 0, 0],
    ]
    assert batch.attention_mask.sum(-1).tolist() == [6, 5, 5, 4]
    assert batch.sampler_logp[2, 2:5].tolist() == pytest.approx([-0.6, -0.7, -0.8])
    assert batch.sampler_logp[~batch.response_mask].abs().sum() == 0
    assert batch.group_index.tolist() == [0, 0, 1, 1]
    assert batch.keep.all()


def test_rollout_metrics_by_hand():
    batch = build_batch([[1, 11], [1, 13]], gens(), [1.0, 1.0, 0.0, 1.0], group_size=2, pad_id=PAD)
    flat = [g for p in gens() for g in p]
    texts = ["3+4", "4+3", "9", "3+4"]
    m = rollout_metrics(batch, flat, texts, threshold=1.0)
    assert m["rollout/accuracy"] == pytest.approx(0.75)
    assert m["rollout/reward_mean"] == pytest.approx(0.75)
    assert m["rollout/truncated_frac"] == pytest.approx(0.25)
    assert m["rollout/zero_std_frac"] == pytest.approx(0.5)  # the first group is all-correct
    assert m["rollout/distinct_correct"] == pytest.approx((2 + 1) / 2)
    assert m["rollout/response_len_mean"] == pytest.approx((3 + 2 + 3 + 2) / 4)


def test_wrong_number_of_completions_is_an_error():
    bad = [gens()[0][:1], gens()[1]]
    with pytest.raises(RuntimeError, match="expected 2"):
        build_batch([[1], [1]], bad, [0.0] * 3, group_size=2, pad_id=PAD)


def test_minibatches_cover_kept_rows_once():
    batch = build_batch([[1, 11], [1, 13]], gens(), [1.0, 0.0, 0.0, 1.0], group_size=2, pad_id=PAD)
    batch.keep = torch.tensor([True, True, False, True])
    mbs = batch.minibatches(2, generator=torch.Generator().manual_seed(0))
    rows = sorted(r for mb in mbs for r in mb["group_index"].tolist())
    assert len(mbs) == 2 and sum(mb["input_ids"].shape[0] for mb in mbs) == 3
    assert rows == [0, 0, 1]


def test_check_context_refuses_a_prompt_past_the_context_and_counts_cut_budgets():
    from lit_entropy.data.rollout_datamodule import check_context
    from lit_entropy.tasks.prompts import Prompt

    prompts = [Prompt("short", "1"), Prompt("long enough to cut", "2"), Prompt("far too long", "3")]
    ids = [[1] * 4, [1] * 10, [1] * 16]
    assert check_context(prompts[:2], ids[:2], context=16, max_new_tokens=4, iteration=0) == 0  # 10 + 4 fits 16
    assert check_context(prompts[:2], ids[:2], context=13, max_new_tokens=4, iteration=0) == 1  # 10 + 4 > 13
    assert check_context(prompts[:2], ids[:2], context=None, max_new_tokens=4, iteration=0) == 0
    with pytest.raises(ValueError, match=r"prompt 2 of iteration 7 \('far too long'.*16 tokens.*context is 16"):
        check_context(prompts, ids, context=16, max_new_tokens=4, iteration=7)


def test_chat_template_needs_a_tokenizer_that_has_one():
    from types import SimpleNamespace

    from lit_entropy.data.rollout_datamodule import RolloutDataModule
    from lit_entropy.policy.tokenizer import CharTokenizer
    from lit_entropy.rewards.config import RewardConfig
    from lit_entropy.rollout.base import SamplingConfig
    from lit_entropy.rollout.sampler import Sampler
    from lit_entropy.tasks.prompts import CountdownPrompts

    dm = RolloutDataModule(CountdownPrompts(), chat_template=True)
    with pytest.raises(ValueError, match="chat_template"):
        dm.start(SimpleNamespace(tokenizer=CharTokenizer.for_countdown()))
    with pytest.raises(ValueError, match="overlong_buffer"):
        Sampler(None, SamplingConfig(max_new_tokens=8), RewardConfig(overlong_buffer=9))
