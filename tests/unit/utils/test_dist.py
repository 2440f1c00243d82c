"""Row sharding for W ranks: contiguous blocks in rank order, micro-batches dealt out, equal counts."""

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
                                                   (0, 4, 2, 1), (13, 3, 1, 5), (28, 4, 2, 4)])
def test_every_rank_runs_as_many_micro_batches_as_the_busiest(n, step, world, expected):
    for r in range(world):
        assert len(list(dist.micro_batches(n, step, world=world, rank_=r))) == expected


def test_single_process_helpers_are_identity():
    x = [torch.arange(6).view(3, 2)]
    assert dist.gather_rows(x) is x
    assert dist.gather_objects("a") == ["a"]
    sums = {"a": torch.tensor(2.0)}
    assert dist.all_reduce_sum(sums) is sums
    assert dist.full_tensor(x[0]) is x[0]


def test_micro_batches_on_one_process_cover_every_row_once():
    out = [(r.tolist(), p, w) for r, p, w in dist.micro_batches(10, 4)]
    assert out == [([0, 1, 2, 3], False, None), ([4, 5, 6, 7], False, None), ([8, 9], False, None)]
    assert [(r.tolist(), p) for r, p, _ in dist.micro_batches(0, 4)] == [([0], True)]


def test_micro_batches_by_length_run_longest_first_and_give_the_width():
    lengths = torch.tensor([3, 9, 5, 9, 1, 4, 7])
    out = list(dist.micro_batches(7, 3, lengths))
    assert [r.tolist() for r, _, _ in out] == [[1, 3, 6], [2, 5, 0], [4]]  # stable: ties keep row order
    assert [w for _, _, w in out] == [9, 5, 1]
    assert not any(p for _, p, _ in out)
    (pad,) = list(dist.micro_batches(0, 3, torch.zeros(0, dtype=torch.long)))
    assert pad[1] is True


@pytest.mark.parametrize("n,step,world", [(28, 4, 2), (7, 3, 2), (10, 4, 3), (3, 4, 2)])
def test_ranks_share_out_the_one_rank_micro_batches(n, step, world):
    """The micro-batches do not depend on W: each rank runs some of the one-rank ones, never split."""
    lengths = torch.randint(1, 20, (n,), generator=torch.Generator().manual_seed(n))
    single = {tuple(r.tolist()): w for r, _, w in dist.micro_batches(n, step, lengths, world=1, rank_=0)}
    seen = []
    for r in range(world):
        for rows, padding, width in dist.micro_batches(n, step, lengths, world=world, rank_=r):
            if not padding:
                assert single[tuple(rows.tolist())] == width
                seen.append(tuple(rows.tolist()))
    assert sorted(seen) == sorted(single)


def test_gather_scattered_rows_puts_every_block_back_at_its_rows():
    parts = [(torch.tensor([2, 0]), [torch.tensor([[1.0, 2.0], [3.0, 4.0]])]), (torch.tensor([1]), [torch.tensor([[5.0]])])]
    (full,) = dist.gather_scattered_rows(parts, (3, 3))
    assert full.tolist() == [[3.0, 4.0, 0.0], [5.0, 0.0, 0.0], [1.0, 2.0, 0.0]]


def test_take_rows_cuts_only_row_by_column_tensors():
    batch = {"input_ids": torch.arange(12).view(3, 4), "advantages": torch.tensor([1.0, 2.0, 3.0]),
             "old_logp": torch.ones(3, 4)}
    mb = dist.take_rows(batch, torch.tensor([2, 0]), 2)
    assert mb["input_ids"].tolist() == [[8, 9], [0, 1]]
    assert mb["advantages"].tolist() == [3.0, 1.0]
    assert mb["old_logp"].shape == (2, 2)


@pytest.mark.parametrize("backend,collective_on", [("nccl", "meta"), ("gloo", "cpu")])
def test_the_reduction_runs_on_the_modules_device_not_on_a_keys(monkeypatch, backend, collective_on):
    """A rank that ran only padding holds CPU zeros; under NCCL the collective must still run on the module's
    device (``meta`` stands in for ``cuda`` here), and the sums come back there on every backend."""
    seen = []
    monkeypatch.setattr(dist, "world_size", lambda: 2)
    monkeypatch.setattr(dist.dist, "get_backend", lambda *a: backend)
    monkeypatch.setattr(dist.dist, "all_reduce", lambda t, op=None: seen.append(t.device.type))
    out = dist.all_reduce_sum({"a_padding": torch.zeros(()), "loss": torch.tensor(2.0)}, device="meta")
    assert seen == [collective_on]
    assert {v.device.type for v in out.values()} == {"meta"} and set(out) == {"a_padding", "loss"}


def test_a_token_budget_fills_micro_batches_by_padded_tokens_longest_first():
    lengths = torch.tensor([10, 40, 12, 20, 30, 11, 9, 41])
    out = [(r.tolist(), w) for r, _, w in dist.micro_batches(8, 8, lengths, tokens=80)]
    # sorted 41, 40, 30, 20, 12, 11, 10, 9: 2 x 41 > 80 (one row), 2 x 40, 4 x 20, the rest
    assert out == [([7], 41), ([1, 4], 40), ([3, 2, 5, 0], 20), ([6], 9)]
    assert all(len(r) * w <= 80 or len(r) == 1 for r, w in out)
    assert sorted(i for r, _ in out for i in r) == list(range(8))
    capped = [r.tolist() for r, _, _ in dist.micro_batches(8, 2, lengths, tokens=1000)]
    assert capped == [[7, 1], [4, 3], [2, 5], [0, 6]]  # micro_batch_size stays the cap
    assert [r.tolist() for r, _, _ in dist.micro_batches(3, 2, torch.tensor([500, 3, 3]), tokens=100)] == [[0], [1, 2]]


@pytest.mark.parametrize("world", [2, 3])
def test_token_budget_micro_batches_are_dealt_like_row_count_ones(world):
    lengths = torch.randint(1, 60, (29,), generator=torch.Generator().manual_seed(5))
    single = [tuple(r.tolist()) for r, _, _ in dist.micro_batches(29, 16, lengths, world=1, rank_=0, tokens=120)]
    per_rank = [list(dist.micro_batches(29, 16, lengths, world=world, rank_=r, tokens=120)) for r in range(world)]
    assert len({len(p) for p in per_rank}) == 1  # every rank runs as many (padding ones where it ran out)
    real = [tuple(r.tolist()) for p in per_rank for r, padding, _ in p if not padding]
    assert sorted(real) == sorted(single)
