"""RolloutBatch's row operations (lit_entropy/rollout/batch.py): ``take`` and ``replace_rows`` (AEPO's rows)."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.data.rollout_datamodule import build_batch
from tests.unit.data.test_rollout_datamodule import EOS, PAD, gens


def two_batches():
    main = build_batch([[1, 11, 12], [1, 13]], gens(), [1.0, 0.0, 0.0, 1.0], group_size=2, pad_id=PAD)
    main.prompts, main.completions = ["p0", "p0", "p1", "p1"], ["a", "b", "c", "d"]
    from lit_entropy.rollout import Generation

    long = [[Generation([5, 6, 7, 8, 9, EOS], [-0.1] * 6, False), Generation([7, EOS], [-0.2, -0.3], False)]]
    extra = build_batch([[1, 14, 15]], long, [1.0, 0.0], group_size=2, pad_id=PAD)
    extra.prompts, extra.completions = ["q", "q"], ["x", "y"]
    return main, extra


def test_take_keeps_every_field_of_the_rows_and_their_texts():
    main, _ = two_batches()
    part = main.take(torch.tensor([3, 0]))
    assert part.batch_size == 2 and part.group_size == 2 and part.metrics == {}
    assert torch.equal(part.input_ids, main.input_ids[[3, 0]])
    assert torch.equal(part.rewards, torch.tensor([1.0, 1.0]))
    assert part.prompts == ["p1", "p0"] and part.completions == ["d", "a"]


def test_replace_rows_pads_both_sides_and_overwrites_the_first_rows():
    main, extra = two_batches()
    width = extra.input_ids.shape[1]  # 9: wider than the main batch's 6
    rows = extra.take(torch.tensor([0]))
    main.replace_rows(rows, pad_id=PAD)
    assert main.input_ids.shape == (4, width) and main.response_mask.shape == (4, width)
    assert main.input_ids[0].tolist() == [1, 14, 15, 5, 6, 7, 8, 9, EOS]
    assert main.input_ids[1].tolist() == [1, 11, 12, 7, EOS, PAD, PAD, PAD, PAD]  # padded with pad_id
    assert not main.response_mask[1, 5:].any() and not main.attention_mask[1, 5:].any()
    assert main.rewards.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert main.prompts == ["q", "p0", "p1", "p1"] and main.completions == ["x", "b", "c", "d"]
    assert main.sampler_logp[0, 3:9].tolist() == pytest.approx([-0.1] * 6)


def test_replace_rows_refuses_rows_missing_a_field_of_the_batch():
    main, extra = two_batches()
    main.old_logp = torch.zeros_like(main.sampler_logp)
    with pytest.raises(ValueError, match="no old_logp"):
        main.replace_rows(extra.take(torch.tensor([0])), pad_id=PAD)
    with pytest.raises(ValueError, match="cannot replace"):
        extra.replace_rows(main, pad_id=PAD)  # 4 rows into a batch of 2
