"""Small helpers for running one RL iteration on W ranks with the results of one rank.

The rule everywhere: every rank holds the identical rollout batch. Generation is sharded by
contiguous blocks of prompts, put back together with an all-gather in rank order (exactly the one-rank
ordering); forward passes run the one-rank micro-batches, dealt out to the ranks, and their results
are gathered back to their rows. Reductions sum; they never average means.

All helpers are no-ops on one process (or when ``torch.distributed`` is not initialised), so the
single-device path runs the same code.
"""

from __future__ import annotations

import math
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


def cut(order: torch.Tensor, step: int, lengths: torch.Tensor | None = None, tokens: int = 0) -> list[torch.Tensor]:
    """``order`` (rows, longest first) cut into consecutive micro-batches of ``step`` rows, or, with a token
    budget ``tokens`` > 0 and ``lengths``, of as many rows (at least one, at most ``step``) as fit in ``tokens``
    once padded to the micro-batch's first (longest) row."""
    if tokens <= 0 or lengths is None:
        return [order[k : k + step] for k in range(0, len(order), step)]
    out, k = [], 0
    while k < len(order):
        width = max(1, int(lengths[order[k]]))
        take = min(step, len(order) - k, max(1, tokens // width))
        out.append(order[k : k + take])
        k += take
    return out


def micro_batches(
    n: int, step: int, lengths: torch.Tensor | None = None, world: int | None = None, rank_: int | None = None,
    tokens: int = 0,
) -> Iterator[tuple[torch.Tensor, bool, int | None]]:
    """``(rows, padding, width)`` for each of this rank's micro-batches of ``n`` rows.

    The rows are ordered (longest first by ``lengths``, a stable sort; row order without them), cut into
    micro-batches of ``step`` rows (with ``tokens`` > 0, as many rows as fit in that many padded tokens, at most
    ``step``: :func:`cut`), and the micro-batches are dealt round-robin to the ranks. The
    micro-batches themselves never depend on the number of ranks, so every row is computed in the same
    company, with the same shapes, on one rank or on W: per-row results are bitwise the same. ``width``
    is the longest length in the micro-batch (None without ``lengths``): the caller cuts the columns to
    it, so short rows are not padded up to the batch's longest. Every rank gets as many micro-batches as the
    rank that gets most (at least 1, so collectives stay in step); where a rank has run out, ``padding`` is True and ``rows`` is row 0, to be run with
    zero weight.
    """
    world = world_size() if world is None else world
    rank_ = rank() if rank_ is None else rank_
    order = torch.arange(n) if lengths is None else torch.sort(lengths.long(), descending=True, stable=True).indices
    chunks = cut(order, step, lengths, tokens)
    mine = chunks[rank_::world]

    def width(rows: torch.Tensor) -> int | None:
        if lengths is None:
            return None
        return max(1, int(lengths[rows].max())) if lengths.numel() else 1

    for k in range(max(1, math.ceil(len(chunks) / world))):
        rows, padding = (mine[k], False) if k < len(mine) else (torch.zeros(1, dtype=torch.long), True)
        yield rows, padding, width(rows)


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


def gather_scattered_rows(
    parts: list[tuple[torch.Tensor, list[torch.Tensor]]], shape: tuple[int, int]
) -> list[torch.Tensor]:
    """Full ``shape`` tensors from every rank's ``(rows, [values [len(rows), w], ...])`` parts: each value
    block is written at its rows and first ``w`` columns, zeros elsewhere (identical on every rank)."""
    everyone = [part for rank_parts in gather_objects(parts) for part in rank_parts]
    if not everyone:
        return []
    out = [torch.zeros(shape, dtype=v.dtype) for v in everyone[0][1]]
    for rows, values in everyone:
        for full, v in zip(out, values, strict=True):
            full[rows, : v.shape[1]] = v
    return out


def all_reduce_sum(values: dict[str, torch.Tensor], device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Sum each scalar over ranks (one collective for the whole dict); keys must match on every rank.

    ``device`` is where the sums are wanted: the module's device, the same kind on every rank. Under NCCL the
    collective runs there too, whatever device each value sits on: a rank whose micro-batches were all padding
    holds CPU zeros where the others hold CUDA sums, and NCCL must not be handed CPU tensors by one rank only.
    Other backends (gloo) reduce on CPU.
    """
    if world_size() == 1 or not values:
        return values
    keys = sorted(values)
    device = torch.device(device)
    flat = torch.stack([values[k].detach().to(torch.float64).reshape(()).cpu() for k in keys])
    on = device if dist.get_backend() == "nccl" else torch.device("cpu")
    flat = flat.to(on)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    return {k: flat[i].to(device=device, dtype=torch.float32) for i, k in enumerate(keys)}


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
