"""Schedules over training progress ``p ∈ [0, 1]`` (docs/design.md §7.4.1).

``p = iteration / (total − 1)``: 0 at the first iteration, 1 at the last (see :func:`progress`).
Every schedule clamps ``p`` to [0, 1] before evaluating.

Kinds (:func:`make_schedule`): ``constant`` (``start``), ``linear`` / ``cosine`` (``start`` → ``end``),
``piecewise`` (``points = [[p, value], ...]``, linear between the points) and any callable
``p -> float`` given as an import path. :class:`BandSchedule` pairs two of them into an entropy band.

:func:`parse_schedule` is the one config grammar: a controller's ``target`` (values are entropies) and
Entrocraft's ``band`` (values are ``[h_low, h_high]`` pairs) are both read by it.
"""

from __future__ import annotations

import importlib
import math
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from typing import Any

SCHEDULE_KINDS = ("constant", "linear", "cosine", "piecewise")
SPEC_KEYS = ("kind", "start", "end", "points")
"""The keys of a schedule mapping in a config."""


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


def _number(x: Any, what: str) -> float:
    try:
        value = float(x)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{what} must be a number, got {x!r}") from err
    if not math.isfinite(value):
        raise ValueError(f"{what} must be finite, got {value}")
    return value


class PiecewiseLinearSchedule(Schedule):
    """Linear interpolation through ``points = [(p0, v0), (p1, v1), ...]``, constant outside them.

    The ``p`` must lie in [0, 1] and be sorted (non-decreasing). Two points may share a ``p`` to make a
    jump; the schedule is then right-continuous (at that ``p`` it takes the later point's value). A
    single point is a constant.
    """

    def __init__(self, points: Sequence[Sequence[float]]) -> None:
        if points is None or isinstance(points, (str, bytes, Mapping)) or not hasattr(points, "__iter__"):
            raise ValueError(f"piecewise schedule needs a list of [p, value] points, got {points!r}")
        parsed: list[tuple[float, float]] = []
        for i, point in enumerate(points):
            if isinstance(point, (str, bytes)) or not hasattr(point, "__len__") or len(point) != 2:
                raise ValueError(f"piecewise schedule point {i} must be a [p, value] pair, got {point!r}")
            p = _number(point[0], f"piecewise schedule point {i}: p")
            v = _number(point[1], f"piecewise schedule point {i}: value")
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"piecewise schedule point {i}: p={p} is outside [0, 1]")
            parsed.append((p, v))
        if not parsed:
            raise ValueError("piecewise schedule needs at least one [p, value] point, got none")
        for i in range(1, len(parsed)):
            if parsed[i][0] < parsed[i - 1][0]:
                raise ValueError(
                    f"piecewise schedule points must be sorted by p: point {i} has p={parsed[i][0]} "
                    f"after p={parsed[i - 1][0]}"
                )
            if i >= 2 and parsed[i][0] == parsed[i - 2][0]:
                raise ValueError(
                    f"piecewise schedule has three points at p={parsed[i][0]}; at most two (a jump)"
                )
        self.points = tuple(parsed)
        self._ps = [p for p, _ in parsed]

    @property
    def knots(self) -> tuple[float, ...]:
        return tuple(self._ps)

    def value(self, p: float) -> float:
        pts = self.points
        if p < pts[0][0]:
            return pts[0][1]
        i = bisect_right(self._ps, p)  # pts[i - 1].p <= p < pts[i].p
        if i >= len(pts):
            return pts[-1][1]
        (p0, v0), (p1, v1) = pts[i - 1], pts[i]
        return v0 + (v1 - v0) * (p - p0) / (p1 - p0)

    def __repr__(self) -> str:
        return f"PiecewiseLinearSchedule({[list(pt) for pt in self.points]})"


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


def make_schedule(
    kind: str | Callable[[float], float],
    start: float | None = None,
    end: float | None = None,
    points: Sequence[Sequence[float]] | None = None,
) -> Schedule:
    """Schedule factory; callers may pass a YAML mapping as ``make_schedule(**{kind, start, end, points})``.

    ``kind`` is one of

    * ``constant`` — ``start``;
    * ``linear`` / ``cosine`` — ``start`` → ``end``;
    * ``piecewise`` — ``points = [[p, value], ...]`` (:class:`PiecewiseLinearSchedule`);
    * an import path ``"pkg.module:function"`` / ``"pkg.module.function"`` to a callable ``p -> float``
      (wrapped in :class:`CallableSchedule`; ``start``, ``end`` and ``points`` are then unused);
    * a :class:`Schedule` (returned as is) or any callable (wrapped).
    """
    if isinstance(kind, Schedule):
        return kind
    if callable(kind):
        return CallableSchedule(kind)
    if not isinstance(kind, str):
        raise ValueError(f"schedule kind must be a string, a Schedule or a callable, got {kind!r}")
    name = kind.strip().lower()
    if name == "piecewise":
        if points is None:
            raise ValueError("schedule kind 'piecewise' needs points=[[p, value], ...]")
        if start is not None or end is not None:
            raise ValueError(
                f"schedule kind 'piecewise' takes points, not start/end (got start={start}, end={end})"
            )
        return PiecewiseLinearSchedule(points)
    if name in SCHEDULE_KINDS:
        if points is not None:
            raise ValueError(f"schedule kind {kind!r} takes start/end, not points; use kind='piecewise'")
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


def probe_points(*schedules: Schedule, n: int = 101) -> list[float]:
    """Progress values that cover ``schedules``: a grid of ``n`` points plus every piecewise knot."""
    ps = {k / (n - 1) for k in range(n)} if n > 1 else {0.0, 1.0}
    for schedule in schedules:
        ps.update(getattr(schedule, "knots", ()))
    return sorted(ps)


class BandSchedule:
    """An entropy band ``(h_low(p), h_high(p))``: two schedules, one per edge.

    Validated at ``p = 0`` and ``p = 1`` on construction and again at every call: both ends finite and
    non-negative, ``h_low <= h_high``. :func:`parse_schedule` also checks it at every piecewise knot
    (and on a grid for callables), so a crossing mid-run fails at start-up, not when training gets there.
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

    def centre(self, p: float) -> float:
        """``(h_low + h_high) / 2`` at ``p``: the target entropy a band controller logs."""
        low, high = self(p)
        return 0.5 * (low + high)

    def check(self, n: int = 101) -> None:
        """Validate the band at every :func:`probe_points` value (raises ``ValueError`` naming ``p``)."""
        for p in probe_points(self.low, self.high, n=n):
            self(p)

    def max_high(self, n: int = 101) -> float:
        """The highest ``h_high`` over :func:`probe_points` (exact for constant/linear/cosine/piecewise)."""
        return max(self(p)[1] for p in probe_points(self.low, self.high, n=n))

    def __repr__(self) -> str:
        return f"BandSchedule(low={self.low!r}, high={self.high!r})"


class PairComponent(Schedule):
    """One edge of a band given as one callable ``p -> (h_low, h_high)``: ``index`` 0 is h_low, 1 is h_high."""

    def __init__(self, fn: Callable[[float], Sequence[float]], index: int) -> None:
        self.fn = fn
        self.index = index

    def value(self, p: float) -> float:
        return _pair(self.fn(p), f"the band function's value at p={p}")[self.index]

    def __repr__(self) -> str:
        return f"PairComponent({self.fn!r}, {self.index})"


def _pair(value: Any, what: str) -> tuple[float, float]:
    """Two floats (finiteness is :class:`BandSchedule`'s check)."""
    try:
        if isinstance(value, (str, bytes, Mapping)) or len(value) != 2:
            raise TypeError
        return float(value[0]), float(value[1])
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be an [h_low, h_high] pair of numbers, got {value!r}") from None


def _probe_grid(*schedules: Schedule) -> int:
    """Grid size that validates ``schedules``: their knots and ends are exact except for callables."""
    return 101 if any(isinstance(s, (CallableSchedule, PairComponent)) for s in schedules) else 2


def _split_band_points(points: Any) -> tuple[list[tuple[Any, Any]], list[tuple[Any, Any]]]:
    """``[[p, h_low, h_high], ...]`` into the two edges' ``[[p, value], ...]`` (one table, the same knots)."""
    if points is None or isinstance(points, (str, bytes, Mapping)) or not hasattr(points, "__iter__"):
        raise ValueError(f"kind 'piecewise' needs points=[[p, h_low, h_high], ...], got {points!r}")
    rows = []
    for i, row in enumerate(points):
        if isinstance(row, (str, bytes)) or not hasattr(row, "__len__") or len(row) != 3:
            raise ValueError(f"band point {i} must be a [p, h_low, h_high] triple, got {row!r}")
        rows.append(tuple(row))
    return [(r[0], r[1]) for r in rows], [(r[0], r[2]) for r in rows]


def _from_mapping(spec: Mapping, band: bool) -> Schedule | BandSchedule:
    """A schedule mapping. Each kind reads its own keys: ``constant`` ``start``, ``linear`` / ``cosine``
    ``start`` and ``end``, ``piecewise`` ``points``, an import path none. Keys another kind reads are
    ignored (a config merge leaves the defaults' ``start`` / ``end`` behind), except ``points``: set
    without ``kind: piecewise`` it is a mistake."""
    unknown = sorted(set(spec) - set(SPEC_KEYS))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown}; a schedule mapping takes {', '.join(SPEC_KEYS)}")
    kind = spec.get("kind", "linear")
    name = kind.strip().lower() if isinstance(kind, str) else None
    start, end, points = spec.get("start"), spec.get("end"), spec.get("points")
    if points is not None and name != "piecewise":
        raise ValueError(f"points are used only with kind='piecewise', not {kind!r}")
    if name not in SCHEDULE_KINDS:  # an import path or a callable: p -> value
        schedule = make_schedule(kind)  # checks the name, imports the path
        if not band:
            return schedule
        fn = getattr(schedule, "fn", schedule)
        return BandSchedule(PairComponent(fn, 0), PairComponent(fn, 1))
    if not band:
        if name == "piecewise":
            return make_schedule(name, points=points)
        return make_schedule(name, start, None if name == "constant" else end)
    if name == "piecewise":
        low_points, high_points = _split_band_points(points)
        return BandSchedule(make_schedule(name, points=low_points), make_schedule(name, points=high_points))
    lo0, hi0 = _pair(start, "start")
    if name == "constant":
        return BandSchedule(ConstantSchedule(lo0), ConstantSchedule(hi0))
    if end is None:
        raise ValueError(f"kind {kind!r} needs an end band (got start={list(start)}, end=None)")
    lo1, hi1 = _pair(end, "end")
    return BandSchedule(make_schedule(name, lo0, lo1), make_schedule(name, hi0, hi1))


def parse_schedule(spec: Any, key: str, *, band: bool = False) -> Schedule | BandSchedule:
    """The config grammar for a value that follows training progress; errors start with ``key``.

    A *value* is an entropy in nats (``band=False``: a controller's ``target``) or an ``[h_low, h_high]``
    pair (``band=True``: Entrocraft's ``band``). ``spec`` is

    * a value: fixed for the whole run;
    * ``{kind: constant, start: value}``;
    * ``{kind: linear | cosine, start: value, end: value}`` (``kind`` defaults to ``linear``);
    * ``{kind: piecewise, points: [[p, value...], ...]}``: ``[p, h]`` rows, or ``[p, h_low, h_high]``
      rows for a band (one table keeps both edges on the same knots);
    * ``{kind: "pkg.module:function"}``: a callable ``p -> value``;
    * from Python, also a built :class:`Schedule` / :class:`BandSchedule` or a callable ``p -> value``.

    Every value must be finite and non-negative: checked at both ends and every piecewise knot, and on a
    grid of 101 progress values for callables, so a band that crosses mid-run fails here, not mid-run.
    """
    try:
        if band:
            if isinstance(spec, BandSchedule):
                out = spec
            elif isinstance(spec, Mapping):
                out = _from_mapping(spec, band=True)
            elif callable(spec):
                out = BandSchedule(PairComponent(spec, 0), PairComponent(spec, 1))
            else:
                lo, hi = _pair(spec, "a fixed band")
                out = BandSchedule(ConstantSchedule(lo), ConstantSchedule(hi))
            out.check(_probe_grid(out.low, out.high))
            return out
        if isinstance(spec, Mapping):
            out = _from_mapping(spec, band=False)
        elif isinstance(spec, Schedule) or callable(spec):
            out = make_schedule(spec)
        else:
            out = ConstantSchedule(_number(spec, "a fixed value"))
        for p in probe_points(out, n=_probe_grid(out)):
            value = out(p)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"must be a finite entropy >= 0 (nats), got {value} at p={p}")
        return out
    except (ValueError, TypeError) as err:
        raise ValueError(f"{key}: {err}") from err
