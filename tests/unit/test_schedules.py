import math

import pytest

from lit_entropy.schedules import (
    BandSchedule,
    CallableSchedule,
    ConstantSchedule,
    CosineSchedule,
    LinearSchedule,
    make_schedule,
    progress,
)


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
    with pytest.raises(ValueError, match="constant, linear, cosine"):
        make_schedule("exponential", 0.1, 0.2)


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_band_from_endpoints(kind):
    band = BandSchedule.from_endpoints(start=(0.6, 0.7), end=(0.4, 0.5), kind=kind)
    assert band(0.0) == pytest.approx((0.6, 0.7))
    assert band(0.5) == pytest.approx((0.5, 0.6))
    assert band(1.0) == pytest.approx((0.4, 0.5))


def test_band_constant_uses_start():
    band = BandSchedule.from_endpoints(start=(0.6, 0.7), end=(0.4, 0.5), kind="constant")
    assert band(0.0) == band(1.0) == (0.6, 0.7)


def test_band_validation():
    with pytest.raises(ValueError, match="0.8"):
        BandSchedule.from_endpoints(start=(0.8, 0.7), end=(0.4, 0.5))
    with pytest.raises(ValueError, match="h_low"):
        BandSchedule.from_endpoints(start=(0.6, 0.7), end=(0.5, 0.4), kind="cosine")
    with pytest.raises(ValueError, match="non-negative"):
        BandSchedule.from_endpoints(start=(-0.1, 0.7), end=(0.4, 0.5))
    with pytest.raises(ValueError, match="non-negative"):
        BandSchedule.from_endpoints(start=(0.1, float("inf")), end=(0.4, 0.5))
    with pytest.raises(ValueError, match="non-negative"):
        BandSchedule.from_endpoints(start=(float("nan"), 0.7), kind="constant")
    with pytest.raises(ValueError, match="valid kinds"):
        BandSchedule.from_endpoints(start=(0.6, 0.7), end=(0.4, 0.5), kind="step")
    with pytest.raises(ValueError, match="end"):
        BandSchedule.from_endpoints(start=(0.6, 0.7), kind="linear")
    # A callable band that crosses in the middle is caught when evaluated there.
    band = BandSchedule(CallableSchedule(lambda p: 0.5), CallableSchedule(lambda p: 0.6 - 0.8 * p * (1 - p)))
    with pytest.raises(ValueError):
        band(0.5)
