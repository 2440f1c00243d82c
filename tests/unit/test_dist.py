"""Row sharding for W ranks: contiguous blocks in rank order, equal micro-batch counts."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.utils import dist


@pytest.mark.parametrize("n,world", [(7, 2), (28, 3), (2, 4), (0, 2), (10, 1)])
def test_shard_bounds_are_tensor_splits_blocks_in_rank_order(n, world):
    blocks = [dist.shard_bounds(n, world, r) for r in range(world)]
    expected = [(int(c[0]), int(c[-1]) + 1) if c.numel() else None for c in torch.tensor_split(torch.arange(n), world)]
    assert [b if b[1] > b[0] else None for b in blocks] == expected
    assert sum(b - a for a, b in blocks) == n
    assert all(blocks[r][1] == blocks[r + 1][0] for r in range(world - 1))


@pytest.mark.parametrize("n,step,world,expected", [(10, 4, 2, 2), (9, 4, 2, 2), (8, 4, 2, 1), (1, 4, 2, 1),
                                                   (0, 4, 2, 1), (13, 3, 1, 5)])
def test_every_rank_runs_the_micro_batches_of_the_largest_shard(n, step, world, expected):
    assert dist.num_steps(n, step, world) == expected
    for r in range(world):
        a, b = dist.shard_bounds(n, world, r)
        assert -(-(b - a) // step) <= expected


def test_single_process_helpers_are_identity():
    x = [torch.arange(6).view(3, 2)]
    assert dist.gather_rows(x) is x
    assert dist.gather_objects("a") == ["a"]
    sums = {"a": torch.tensor(2.0)}
    assert dist.all_reduce_sum(sums) is sums
    assert dist.full_tensor(x[0]) is x[0]


def test_micro_batches_on_one_process_cover_every_row_once():
    assert list(dist.micro_batches(10, 4)) == [
        (slice(0, 4), False, None), (slice(4, 8), False, None), (slice(8, 10), False, None)]
    assert list(dist.micro_batches(0, 4)) == [(slice(0, 1), True, None)]


def test_micro_batches_by_length_run_longest_first_and_give_the_width():
    lengths = torch.tensor([3, 9, 5, 9, 1, 4, 7])
    out = list(dist.micro_batches(7, 3, lengths))
    assert [r.tolist() for r, _, _ in out] == [[1, 3, 6], [2, 5, 0], [4]]  # stable: ties keep row order
    assert [w for _, _, w in out] == [9, 5, 1]
    assert not any(p for _, p, _ in out)
    rows = torch.cat([r for r, _, _ in out])
    assert sorted(rows.tolist()) == list(range(7))
    (pad,) = list(dist.micro_batches(0, 3, torch.zeros(0, dtype=torch.long)))
    assert pad[1] is True


def test_take_rows_cuts_only_row_by_column_tensors():
    batch = {"input_ids": torch.arange(12).view(3, 4), "advantages": torch.tensor([1.0, 2.0, 3.0]),
             "old_logp": torch.ones(3, 4)}
    mb = dist.take_rows(batch, torch.tensor([2, 0]), 2)
    assert mb["input_ids"].tolist() == [[8, 9], [0, 1]]
    assert mb["advantages"].tolist() == [3.0, 1.0]
    assert mb["old_logp"].shape == (2, 2)
