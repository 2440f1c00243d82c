"""Reward shaping that depends on the completion, not on its correctness."""

from __future__ import annotations


def soft_overlong_penalty(length: int, max_len: int, buffer: int, factor: float = 1.0) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025), added to the task reward.

    ``0`` while ``length <= max_len − buffer``; inside the last ``buffer`` tokens it falls linearly,
    ``factor·(max_len − buffer − length)/buffer``; at and past ``max_len`` it is ``−factor``.
    """
    if buffer <= 0 or not 0 < buffer <= max_len:
        raise ValueError(f"overlong buffer must be in (0, max_len={max_len}], got {buffer}")
    free = max_len - buffer
    if length <= free:
        return 0.0
    if length >= max_len:
        return -float(factor)
    return float(factor) * (free - length) / buffer
