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
    assert list(dist.micro_batches(10, 4)) == [(slice(0, 4), False), (slice(4, 8), False), (slice(8, 10), False)]
    assert list(dist.micro_batches(0, 4)) == [(slice(0, 1), True)]
