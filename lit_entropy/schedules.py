"""Schedules over training progress ``p ∈ [0, 1]`` (DESIGN §7.4).

``p = iteration / (total − 1)``: 0 at the first iteration, 1 at the last (see :func:`progress`).
Every schedule clamps ``p`` to [0, 1] before evaluating.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable

SCHEDULE_KINDS = ("constant", "linear", "cosine")


def progress(iteration: int, total: int) -> float:
    """``p = iteration / (total − 1)`` clamped to [0, 1]; 0.0 when ``total <= 1``."""
    if total <= 1:
        return 0.0
    return min(1.0, max(0.0, iteration / (total - 1)))


def _clamp(p: float) -> float:
    return min(1.0, max(0.0, float(p)))


class Schedule:
    """A value ``h(p)`` over progress ``p``; call it with ``p`` (clamped to [0, 1])."""

    def __call__(self, p: float) -> float:
        return float(self.value(_clamp(p)))

    def value(self, p: float) -> float:
        """``h(p)`` for ``p`` already in [0, 1]."""
        raise NotImplementedError


class ConstantSchedule(Schedule):
    """``h(p) = value``."""

    def __init__(self, value: float) -> None:
        self.start = float(value)

    def value(self, p: float) -> float:
        return self.start

    def __repr__(self) -> str:
        return f"ConstantSchedule({self.start})"


class LinearSchedule(Schedule):
    """``h(p) = h0 + (h1 − h0)·p``."""

    def __init__(self, start: float, end: float) -> None:
        self.start = float(start)
        self.end = float(end)

    def value(self, p: float) -> float:
        return self.start + (self.end - self.start) * p

    def __repr__(self) -> str:
        return f"LinearSchedule({self.start}, {self.end})"


class CosineSchedule(Schedule):
    """``h(p) = h0 + (h1 − h0)·(1 − cos πp)/2`` (slow start, slow finish, midpoint at ``p = 0.5``)."""

    def __init__(self, start: float, end: float) -> None:
        self.start = float(start)
        self.end = float(end)

    def value(self, p: float) -> float:
        return self.start + (self.end - self.start) * (1.0 - math.cos(math.pi * p)) / 2.0

    def __repr__(self) -> str:
        return f"CosineSchedule({self.start}, {self.end})"


class CallableSchedule(Schedule):
    """``h(p) = fn(p)`` for any user callable ``p -> float``."""

    def __init__(self, fn: Callable[[float], float]) -> None:
        if not callable(fn):
            raise TypeError(f"CallableSchedule needs a callable, got {fn!r}")
        self.fn = fn

    def value(self, p: float) -> float:
        return float(self.fn(p))

    def __repr__(self) -> str:
        return f"CallableSchedule({self.fn!r})"


def _resolve_callable(path: str) -> Callable[[float], float]:
    """Import ``"pkg.module:function"`` or ``"pkg.module.function"`` (the attribute may be dotted)."""
    if ":" in path:
        module_name, attr = path.split(":", 1)
    else:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"cannot parse callable path {path!r}; use 'pkg.module:function'")
    try:
        obj = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"cannot import schedule callable {path!r}: {err}") from err
    if not callable(obj):
        raise ValueError(f"{path!r} resolves to {obj!r}, which is not callable")
    return obj


def make_schedule(kind: str, start: float | None = None, end: float | None = None) -> Schedule:
    """Schedule factory.

    ``kind`` is one of ``constant`` (``start``), ``linear`` / ``cosine`` (``start`` → ``end``), or an
    import path ``"pkg.module:function"`` / ``"pkg.module.function"`` to a callable ``p -> float``
    (wrapped in :class:`CallableSchedule`; ``start`` and ``end`` are then unused).
    """
    name = kind.strip().lower()
    if name in SCHEDULE_KINDS:
        if start is None:
            raise ValueError(f"schedule kind {kind!r} needs a start value")
        if name == "constant":
            return ConstantSchedule(start)
        if end is None:
            raise ValueError(f"schedule kind {kind!r} needs an end value (got start={start}, end=None)")
        return LinearSchedule(start, end) if name == "linear" else CosineSchedule(start, end)
    if "." in kind or ":" in kind:
        return CallableSchedule(_resolve_callable(kind.strip()))
    raise ValueError(
        f"unknown schedule kind {kind!r}; valid kinds: {', '.join(SCHEDULE_KINDS)}, "
        "or an import path 'pkg.module:function'"
    )


class BandSchedule:
    """An entropy band ``(h_low(p), h_high(p))``.

    Validated at ``p = 0`` and ``p = 1`` on construction (linear and cosine interpolation then keep the
    order in between) and again at every call: both ends finite and non-negative, ``h_low <= h_high``.
    """

    def __init__(self, low: Schedule, high: Schedule) -> None:
        self.low = low
        self.high = high
        self(0.0)
        self(1.0)

    def __call__(self, p: float) -> tuple[float, float]:
        lo, hi = self.low(p), self.high(p)
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo < 0 or hi < 0:
            raise ValueError(f"entropy band must be finite and non-negative, got ({lo}, {hi}) at p={p}")
        if lo > hi:
            raise ValueError(f"entropy band has h_low={lo} > h_high={hi} at p={p}")
        return lo, hi

    @classmethod
    def from_endpoints(
        cls,
        start: tuple[float, float],
        end: tuple[float, float] | None = None,
        kind: str = "linear",
    ) -> BandSchedule:
        """Band moving from ``start = (lo0, hi0)`` to ``end = (lo1, hi1)``.

        ``kind`` is ``linear``, ``cosine`` or ``constant`` (which uses ``start``; ``end`` may be None).
        """
        name = kind.strip().lower()
        if name not in SCHEDULE_KINDS:
            raise ValueError(f"unknown band kind {kind!r}; valid kinds: {', '.join(SCHEDULE_KINDS)}")
        lo0, hi0 = start
        if name == "constant":
            return cls(ConstantSchedule(lo0), ConstantSchedule(hi0))
        if end is None:
            raise ValueError(f"band kind {kind!r} needs an end band (got start={start}, end=None)")
        lo1, hi1 = end
        return cls(make_schedule(name, lo0, lo1), make_schedule(name, hi0, hi1))

    def __repr__(self) -> str:
        return f"BandSchedule(low={self.low!r}, high={self.high!r})"
