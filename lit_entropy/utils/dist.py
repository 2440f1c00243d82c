"""Small helpers for running one RL iteration on W ranks with the results of one rank.

The rule everywhere: every rank holds the identical rollout batch; work is sharded by contiguous
blocks of rows (or prompts) and put back together with an all-gather in rank order, so the
concatenation is exactly the one-rank ordering. Reductions sum; they never average means.

All helpers are no-ops on one process (or when ``torch.distributed`` is not initialised), so the
single-device path runs the same code.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def shard_bounds(n: int, world: int | None = None, rank_: int | None = None) -> tuple[int, int]:
    """Rows ``[start, stop)`` of rank ``rank_`` when ``n`` rows are split into ``world`` contiguous blocks.

    The blocks are :func:`torch.tensor_split`'s: the first ``n % world`` ranks get one row more.
    """
    world = world_size() if world is None else world
    rank_ = rank() if rank_ is None else rank_
    base, extra = divmod(n, world)
    start = rank_ * base + min(rank_, extra)
    return start, start + base + (1 if rank_ < extra else 0)


def num_steps(n: int, step: int, world: int | None = None) -> int:
    """Micro-batches every rank must run so that all ranks run the same number (ceil of the largest shard)."""
    world = world_size() if world is None else world
    largest = -(-n // world)
    return max(1, -(-largest // step))


def micro_batches(
    n: int, step: int, lengths: torch.Tensor | None = None
) -> Iterator[tuple[torch.Tensor | slice, bool, int | None]]:
    """``(rows, padding, width)`` for each micro-batch of this rank's block of ``n`` rows, ``step`` at a time.

    Every rank gets :func:`num_steps` of them (collectives stay in step); where a rank has run out of
    rows, ``padding`` is True and ``rows`` is the first row, to be run with zero weight.

    With ``lengths`` (each row's used length, e.g. ``attention_mask.sum(-1)``) the block's rows are
    taken longest first (a stable sort, so the order is deterministic), ``rows`` is an index tensor and
    ``width`` the longest length among them: the caller trims the micro-batch's columns to it, so a
    micro-batch of short rows does not compute on padding. Without ``lengths``, ``rows`` is a slice
    in row order and ``width`` is None (no trimming).
    """
    start, stop = shard_bounds(n)
    order = None
    if lengths is not None:
        local = lengths[start:stop].long()
        order = start + torch.sort(local, descending=True, stable=True).indices
    for k in range(num_steps(n, step)):
        lo, hi = start + k * step, min(stop, start + (k + 1) * step)
        padding = hi <= lo
        if order is None:
            yield (slice(0, 1), True, None) if padding else (slice(lo, hi), False, None)
            continue
        rows = torch.zeros(1, dtype=torch.long) if padding else order[lo - start : hi - start]
        yield rows, padding, max(1, int(lengths[rows].max())) if lengths.numel() else 1


def take_rows(batch: dict[str, torch.Tensor], rows: torch.Tensor | slice, width: int | None) -> dict[str, torch.Tensor]:
    """``rows`` of every tensor in ``batch``; [B, L] tensors also cut to their first ``width`` columns."""
    out = {}
    full = batch["input_ids"].shape[1] if "input_ids" in batch else None
    for key, v in batch.items():
        v = v[rows]
        if width is not None and v.dim() == 2 and v.shape[1] == full:
            v = v[:, :width]
        out[key] = v
    return out


def gather_objects(obj: Any) -> list[Any]:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank (``[obj]`` on one process)."""
    if world_size() == 1:
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_rows(local: list[torch.Tensor]) -> list[torch.Tensor]:
    """Concatenate each tensor's per-rank row blocks in rank order (CPU tensors in, CPU tensors out)."""
    if world_size() == 1:
        return local
    parts = gather_objects([t.cpu() for t in local])
    return [torch.cat([p[i] for p in parts]) for i in range(len(local))]


def all_reduce_sum(values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Sum each scalar over ranks (one collective for the whole dict); keys must match on every rank."""
    if world_size() == 1 or not values:
        return values
    keys = sorted(values)
    ref = values[keys[0]]
    flat = torch.stack([values[k].detach().to(torch.float64).reshape(()).cpu() for k in keys])
    backend = dist.get_backend()
    device = ref.device if backend == "nccl" else torch.device("cpu")
    flat = flat.to(device)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    return {k: flat[i].to(torch.float32).to(ref.device) for i, k in enumerate(keys)}


def is_dtensor(t: torch.Tensor) -> bool:
    return type(t).__name__ == "DTensor"


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (possibly sharded) FSDP2 DTensor; a plain tensor as it is. Collective for DTensors."""
    return t.full_tensor() if is_dtensor(t) else t


def full_state_items(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``(name, full tensor)`` for every entry of ``model.state_dict()``, gathering FSDP2 shards.

    Every rank must call it (each DTensor is all-gathered in the same order on every rank).
    """
    return [(name, full_tensor(t.detach())) for name, t in model.state_dict().items()]
