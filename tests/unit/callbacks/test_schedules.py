import math

import pytest

from lit_entropy.callbacks.schedules import (
    BandSchedule,
    CallableSchedule,
    ConstantSchedule,
    CosineSchedule,
    LinearSchedule,
    PiecewiseLinearSchedule,
    make_schedule,
    parse_schedule,
    progress,
)


def band(spec):
    return parse_schedule(spec, "callbacks.entropy.band", band=True)


def test_progress():
    assert progress(0, 10) == 0.0
    assert progress(9, 10) == 1.0
    assert progress(3, 7) == 0.5
    assert progress(0, 1) == 0.0
    assert progress(5, 0) == 0.0
    assert progress(20, 10) == 1.0


def test_constant():
    s = ConstantSchedule(0.3)
    assert [s(0.0), s(0.5), s(1.0)] == [0.3, 0.3, 0.3]


def test_linear():
    s = LinearSchedule(0.6, 0.4)
    assert s(0.0) == pytest.approx(0.6)
    assert s(0.5) == pytest.approx(0.5)
    assert s(1.0) == pytest.approx(0.4)
    assert s(0.25) == pytest.approx(0.55)


def test_cosine():
    s = CosineSchedule(0.6, 0.4)
    assert s(0.0) == pytest.approx(0.6)
    assert s(0.5) == pytest.approx(0.5)
    assert s(1.0) == pytest.approx(0.4)
    assert s(0.25) == pytest.approx(0.6 + (0.4 - 0.6) * (1 - math.cos(math.pi / 4)) / 2)


def test_clamps_progress():
    s = LinearSchedule(1.0, 2.0)
    assert s(-0.5) == 1.0
    assert s(3.0) == 2.0
    seen = []
    CallableSchedule(lambda p: seen.append(p) or p)(7.0)
    assert seen == [1.0]


def test_callable():
    s = CallableSchedule(lambda p: 1.0 - p * p)
    assert [s(0.0), s(0.5), s(1.0)] == [1.0, 0.75, 0.0]
    with pytest.raises(TypeError):
        CallableSchedule(3.0)


def test_make_schedule_kinds():
    assert isinstance(make_schedule("constant", 0.5), ConstantSchedule)
    lin = make_schedule("linear", 0.0, 1.0)
    cos = make_schedule("Cosine", 0.0, 1.0)
    assert lin(0.25) == pytest.approx(0.25)
    assert cos(0.25) == pytest.approx((1 - math.cos(math.pi / 4)) / 2)
    with pytest.raises(ValueError, match="end"):
        make_schedule("linear", 0.5)


def test_make_schedule_dotted_path():
    for path in ("math:sqrt", "math.sqrt"):
        s = make_schedule(path, 0.0)
        assert isinstance(s, CallableSchedule)
        assert s(0.25) == pytest.approx(0.5)
        assert s(1.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="cannot import"):
        make_schedule("math:no_such_function")
    with pytest.raises(ValueError, match="cannot import"):
        make_schedule("no_such_pkg_xyz.module:fn")
    with pytest.raises(ValueError, match="not callable"):
        make_schedule("math:pi")


def test_make_schedule_unknown_kind():
    with pytest.raises(ValueError, match="constant, linear, cosine, piecewise"):
        make_schedule("exponential", 0.1, 0.2)


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_band_from_endpoints(kind):
    b = band({"kind": kind, "start": (0.6, 0.7), "end": (0.4, 0.5)})
    assert b(0.0) == pytest.approx((0.6, 0.7))
    assert b(0.5) == pytest.approx((0.5, 0.6))
    assert b(1.0) == pytest.approx((0.4, 0.5))


def test_band_constant_uses_start():
    b = band({"kind": "constant", "start": (0.6, 0.7), "end": (0.4, 0.5)})
    assert b(0.0) == b(1.0) == (0.6, 0.7)
    assert band([0.6, 0.7])(0.3) == (0.6, 0.7)  # a fixed band


def test_band_validation():
    with pytest.raises(ValueError, match="0.8"):
        band({"start": (0.8, 0.7), "end": (0.4, 0.5)})
    with pytest.raises(ValueError, match="h_low"):
        band({"kind": "cosine", "start": (0.6, 0.7), "end": (0.5, 0.4)})
    with pytest.raises(ValueError, match="non-negative"):
        band({"start": (-0.1, 0.7), "end": (0.4, 0.5)})
    with pytest.raises(ValueError, match="non-negative"):
        band({"start": (0.1, float("inf")), "end": (0.4, 0.5)})
    with pytest.raises(ValueError, match="non-negative"):
        band({"kind": "constant", "start": (float("nan"), 0.7)})
    with pytest.raises(ValueError, match="valid kinds"):
        band({"kind": "step", "start": (0.6, 0.7), "end": (0.4, 0.5)})
    with pytest.raises(ValueError, match="end"):
        band({"kind": "linear", "start": (0.6, 0.7)})
    with pytest.raises(ValueError, match=r"^callbacks\.entropy\.band: a fixed band must be an \[h_low, h_high\] pair"):
        band(0.5)
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['stop'\]"):
        band({"start": (0.6, 0.7), "stop": (0.4, 0.5)})
    # A callable band that crosses in the middle is caught when evaluated there.
    b = BandSchedule(CallableSchedule(lambda p: 0.5), CallableSchedule(lambda p: 0.6 - 0.8 * p * (1 - p)))
    with pytest.raises(ValueError):
        b(0.5)


def test_scalar_grammar_is_the_band_grammar_with_numbers():
    key = "callbacks.entropy.target"
    assert parse_schedule(0.4, key)(0.7) == 0.4
    assert parse_schedule({"kind": "linear", "start": 0.6, "end": 0.4, "points": None}, key)(0.5) == pytest.approx(0.5)
    assert parse_schedule({"kind": "piecewise", "start": 0.6, "points": [[0, 0.5], [1, 0.3]]}, key)(0.5) == 0.4
    assert parse_schedule({"kind": "math:sqrt"}, key)(0.25) == 0.5
    with pytest.raises(ValueError, match=r"^callbacks\.entropy\.target: must be a finite entropy >= 0"):
        parse_schedule({"kind": "linear", "start": 0.5, "end": -0.1}, key)
    with pytest.raises(ValueError, match=r"^callbacks\.entropy\.target: points are used only with kind='piecewise'"):
        parse_schedule({"kind": "linear", "start": 0.6, "end": 0.4, "points": [[0, 0.5]]}, key)


# ---- piecewise ------------------------------------------------------------------------------------
def test_piecewise_interpolates_between_points():
    s = PiecewiseLinearSchedule([(0.0, 0.5), (0.5, 0.4), (1.0, 0.3)])
    assert s(0.0) == 0.5 and s(0.5) == 0.4 and s(1.0) == 0.3
    assert s(0.25) == pytest.approx(0.45)
    assert s(0.75) == pytest.approx(0.35)
    assert s.knots == (0.0, 0.5, 1.0)


def test_piecewise_is_constant_outside_its_points():
    s = PiecewiseLinearSchedule([[0.2, 1.0], [0.8, 2.0]])
    assert [s(0.0), s(0.1), s(0.2)] == [1.0, 1.0, 1.0]
    assert [s(0.8), s(0.9), s(1.0), s(5.0)] == [2.0, 2.0, 2.0, 2.0]
    assert s(0.5) == pytest.approx(1.5)
    assert PiecewiseLinearSchedule([(0.3, 0.7)])(0.9) == 0.7  # one point: a constant


def test_piecewise_jump_is_right_continuous():
    s = PiecewiseLinearSchedule([(0.0, 1.0), (0.5, 1.0), (0.5, 0.2), (1.0, 0.0)])
    assert s(0.4999) == pytest.approx(1.0)
    assert s(0.5) == 0.2
    assert s(0.75) == pytest.approx(0.1)


@pytest.mark.parametrize(
    "points, message",
    [
        ([], "at least one"),
        ([(0.5, 0.4), (0.2, 0.3)], "sorted by p"),
        ([(0.0, 0.4), (1.5, 0.3)], r"outside \[0, 1\]"),
        ([(-0.1, 0.4)], r"outside \[0, 1\]"),
        ([(0.0, 0.4, 0.5)], r"\[p, value\] pair"),
        ([0.4], r"\[p, value\] pair"),
        ([(0.0, "high")], "value must be a number"),
        ([(0.0, float("nan"))], "value must be finite"),
        ([(0.0, 1.0), (0.5, 1.0), (0.5, 0.5), (0.5, 0.2)], "three points"),
        ("0,0.5", "list of"),
        (None, "list of"),
    ],
)
def test_piecewise_validation_names_the_problem(points, message):
    with pytest.raises(ValueError, match=message):
        PiecewiseLinearSchedule(points)


def test_make_schedule_piecewise_and_yaml_mapping():
    s = make_schedule("piecewise", points=[[0, 0.5], [0.5, 0.4], [1, 0.3]])
    assert isinstance(s, PiecewiseLinearSchedule)
    assert s(0.25) == pytest.approx(0.45)
    # Callers pass a YAML mapping straight through; unused keys come as None.
    for spec in (
        {"kind": "piecewise", "start": None, "end": None, "points": [[0, 0.5], [1, 0.3]]},
        {"kind": "linear", "start": 0.5, "end": 0.3, "points": None},
        {"kind": "cosine", "start": 0.5, "end": 0.3},
    ):
        assert make_schedule(**spec)(0.5) == pytest.approx(0.4)
    assert make_schedule(**{"kind": "constant", "start": 0.2, "end": None, "points": None})(0.7) == 0.2


def test_make_schedule_piecewise_errors():
    with pytest.raises(ValueError, match="needs points"):
        make_schedule("piecewise")
    with pytest.raises(ValueError, match="not start/end"):
        make_schedule("piecewise", start=0.1, points=[[0, 0.5]])
    with pytest.raises(ValueError, match="not points"):
        make_schedule("linear", 0.1, 0.2, points=[[0, 0.5]])


def test_make_schedule_accepts_callables_and_schedules():
    lin = LinearSchedule(0.0, 1.0)
    assert make_schedule(lin) is lin
    s = make_schedule(lambda p: 2 * p)
    assert isinstance(s, CallableSchedule) and s(0.25) == 0.5


# ---- bands ----------------------------------------------------------------------------------------
def test_band_piecewise_points_are_p_low_high_rows():
    b = band({"kind": "piecewise", "points": [[0.0, 0.6, 0.7], [0.5, 0.5, 0.6], [1.0, 0.3, 0.5]]})
    assert b(0.0) == (0.6, 0.7)
    assert b(0.25) == pytest.approx((0.55, 0.65))
    assert b(0.75) == pytest.approx((0.4, 0.55))
    assert b(1.0) == (0.3, 0.5)
    assert b.max_high() == 0.7


def test_band_piecewise_validation():
    # Crossing at a middle knot is caught at construction, not when training gets there.
    with pytest.raises(ValueError, match="h_low=0.6 > h_high=0.5 at p=0.5"):
        band({"kind": "piecewise", "points": [[0, 0.4, 0.5], [0.5, 0.6, 0.5], [1, 0.2, 0.3]]})
    with pytest.raises(ValueError, match=r"\[p, h_low, h_high\] triple"):
        band({"kind": "piecewise", "points": [[0, 0.4]]})
    with pytest.raises(ValueError, match="needs points"):
        band({"kind": "piecewise"})
    with pytest.raises(ValueError, match="sorted by p"):
        band({"kind": "piecewise", "points": [[1, 0.4, 0.5], [0, 0.4, 0.5]]})
    with pytest.raises(ValueError, match="only with kind='piecewise'"):
        band({"start": (0.1, 0.2), "end": (0.1, 0.2), "points": [[0, 0.4, 0.5]]})


def band_edges(p: float) -> tuple[float, float]:
    return 0.5 - 0.2 * p, 0.6 - 0.2 * p * p


def crossing_band(p: float) -> tuple[float, float]:
    return 0.5, 0.6 - 0.8 * p * (1 - p)  # h_high below h_low around p = 0.5


def test_band_callable_from_an_import_path():
    for path in (f"{__name__}:band_edges", f"{__name__}.band_edges"):
        b = band({"kind": path, "start": [9, 9], "end": None})  # start/end: left behind by a merge, unused
        assert b(0.0) == pytest.approx((0.5, 0.6))
        assert b(0.5) == pytest.approx((0.4, 0.55))
        assert b(1.0) == pytest.approx((0.3, 0.4))
    assert band(band_edges)(1.0) == pytest.approx((0.3, 0.4))  # from Python: the callable itself


def test_band_callable_validation():
    with pytest.raises(ValueError, match="cannot import"):
        band({"kind": "math:nope"})
    # The grid check finds a crossing in the middle at construction.
    with pytest.raises(ValueError, match="h_low"):
        band({"kind": f"{__name__}:crossing_band"})
    with pytest.raises(ValueError, match=r"\[h_low, h_high\] pair"):
        band({"kind": "math:sqrt"})
