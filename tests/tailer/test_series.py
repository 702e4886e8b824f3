"""What the page's curves are made of (`Store.series`' query side), checked against oracles written here:
min/max buckets equal the naive per-point min/max, and the smoothing is the debiased, step-aware EMA of the full
series, whatever the zoom (bucketed or exact answers) and however long the run grows (TensorBoard #1518 / #3493 are
the opposite). The numpy path (`series.window`) is compared with a plain one-point-at-a-time reference written here
on random series: every number equal, the EMA within float rounding (its sums are grouped by block)."""

from __future__ import annotations

import math
import random
from bisect import bisect_left, bisect_right
from typing import Any, Dict, List, Optional, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mstail.parsers.record import finite_or_name
from mstail.tailer.history import series as series_module
from mstail.tailer.history.series import MARK, Series, _bucket_ends, _bucketed, _smoothed_at, window


def _series(n: int, seed: int = 1, nan_every: int = 0, gaps: bool = False) -> Series:
    rng = random.Random(seed)
    series = Series()
    step = 0
    for i in range(n):
        step += 50 if gaps and rng.random() < 0.01 else 1
        value = rng.random() * 3 + (500.0 if rng.random() < 1e-4 else 0.0)
        if nan_every and i % nan_every == 7:
            value = math.nan
        series.append(step, value, 1.7e9 + i)
    return series


def test_buckets_from_block_summaries_equal_the_naive_min_max() -> None:
    series = _series(60_000, nan_every=997)
    for lo, hi, points in [(0, 60_000, 660), (1234, 59_923, 100), (5, 60_000, 2000), (0, 60_000, 7), (100, 900, 3)]:
        got = _bucketed(series, lo, hi, points)
        size = -(-(hi - lo) // points)
        want_min, want_max = [], []
        for a in range(lo, hi, size):
            finite = [v for v in series.values[a:min(a + size, hi)] if math.isfinite(v)]
            want_min.append(min(finite) if finite else None)
            want_max.append(max(finite) if finite else None)
        assert got["min"] == want_min and got["max"] == want_max, (lo, hi, points)
        assert got["x"] == [series.steps[i] for i in _bucket_ends(lo, hi, points)]


def test_smoothing_is_the_full_series_ema_at_any_zoom_and_run_length() -> None:
    for gaps, nan_every in [(False, 0), (True, 500), (True, 3)]:
        series = _series(40_000, seed=2, nan_every=nan_every, gaps=gaps)
        for weight in (0.6, 0.9, 0.99):
            oracle = _oracle(list(series.steps), list(series.values), weight)
            views = [_bucket_ends(0, 40_000, 660), list(range(20_000, 20_200)), _bucket_ends(5_000, 30_000, 300), [0, 1, 2]]
            for ends in views:  # zoomed out (windowed or full pass), zoomed in (exact), the first points
                fresh = Series(steps=series.steps, values=series.values, nonfinite=series.nonfinite, times=series.times)
                got, _ = _smoothed_at(fresh, weight, ends)
                for i, value in zip(ends, got):
                    assert math.isclose(value, oracle[i], rel_tol=1e-10), (gaps, weight, i, value, oracle[i])
            assert math.isclose(_smoothed_at(series, weight, [0])[0][0], series.values[0], rel_tol=1e-12)  # debiased

    # Run length: values already shown do not move when the run grows (the cached column is extended).
    short = _series(3_000, seed=3)
    ends = list(range(0, 3_000, 7))
    before, _ = _smoothed_at(short, 0.9, ends)
    longer = _series(6_000, seed=3)
    for i in range(3_000, 6_000):
        short.append(longer.steps[i], longer.values[i], longer.times[i])
    after, state = _smoothed_at(short, 0.9, ends)
    assert after == before
    _, state = _smoothed_at(short, 0.9, [5_999])
    assert state["x"] == short.steps[-1] and 0 < state["den"] <= 1


def test_the_ema_states_are_kept_every_superblock_and_a_value_from_one_is_the_value_of_a_whole_pass() -> None:
    series = _series(50_000, seed=4, nan_every=101, gaps=True)
    ends = _bucket_ends(0, 50_000, 660)
    whole, state = _smoothed_at(series, 0.99, ends)  # from the first point: states kept as it goes
    marks = series.smoothed[0.99]
    assert len(marks.nums) == 50_000 // MARK + 1  # 24 bytes per 4,096 points
    zoomed = list(range(31_990, 32_050)) + [49_999]
    again, again_state = _smoothed_at(series, 0.99, zoomed)  # from the state before 31,990's superblock
    fresh = Series(steps=series.steps, values=series.values, nonfinite=series.nonfinite, times=series.times)
    assert (again, again_state) == _smoothed_at(fresh, 0.99, zoomed)  # (a pass from the first point)
    assert again_state == state and state["x"] == series.steps[-1]
    oracle = _reference_ema(list(series.steps), list(series.values), 0.99)
    assert all(math.isclose(v, oracle[e][0], rel_tol=1e-12) for e, v in zip(ends, whole))


def _oracle(steps: List[int], values: List[float], weight: float) -> List[float]:
    """The debiased EMA after each point (`_reference_ema`'s smoothed values; the API tests use it too)."""
    return [smoothed for smoothed, _, _ in _reference_ema(steps, values, weight)]


def _reference_ema(steps: List[int], values: List[float], weight: float) -> List[Tuple[float, float, Optional[int]]]:
    """(smoothed, den, last finite step) after each point, one point at a time, as the definition says: a decay of
    `weight ** (Δstep / stride)`, `weight` itself at one stride or when the step does not move on."""
    deltas = [b - a for a, b in zip(steps[:17], steps[1:17]) if b > a]
    stride = min(deltas) if deltas else 1
    num = den = 0.0
    last: Optional[int] = None
    out = []
    for x, v in zip(steps, values):
        if math.isfinite(v):
            dx = stride if last is None else x - last
            d = weight if dx == stride or dx <= 0 else weight ** (dx / stride)
            num, den, last = d * num + (1 - d) * v, d * den + (1 - d), x
        out.append((num / den if den > 0 else math.nan, den, last))
    return out


def _reference_window(series: Series, start: Optional[int], end: Optional[int], points: int,
                      smooth: float) -> Dict[str, Any]:
    """`window`'s answer, plainly: the points in range, cut into buckets of ceil(count / points) points."""
    steps, values, times = list(series.steps), list(series.values), list(series.times)
    lo = 0 if start is None else bisect_left(steps, start)
    hi = len(steps) if end is None else bisect_right(steps, end)
    size = -(-(hi - lo) // points) if hi - lo > points else 1
    buckets = [(a, min(a + size, hi)) for a in range(lo, hi, size)]
    finite = [[v for v in values[a:b] if math.isfinite(v)] for a, b in buckets]
    bad = [i for i in range(lo, hi) if not math.isfinite(values[i])]
    out: Dict[str, Any] = {
        "x": [steps[b - 1] for _, b in buckets], "t": [t if math.isfinite(t) else None for t in
                                                      (times[b - 1] for _, b in buckets)],
        "min": [min(f) if f else None for f in finite] if size > 1 else [finite_or_name(v) for v in values[lo:hi]],
        "max": [max(f) if f else None for f in finite] if size > 1 else [finite_or_name(v) for v in values[lo:hi]],
        "last": [finite_or_name(values[b - 1]) for _, b in buckets],
        "nonfinite": {"x": [steps[i] for i in bad], "value": [finite_or_name(values[i]) for i in bad]}}
    if 0 < smooth < 1 and buckets:
        ema = _reference_ema(steps, values, smooth)
        out["smooth"] = [ema[b - 1][0] for _, b in buckets]
        if hi == len(steps):
            deltas = [b - a for a, b in zip(steps[:17], steps[1:17]) if b > a]
            out["smooth_state"] = {"den": ema[hi - 1][1], "x": ema[hi - 1][2], "stride": min(deltas or [1])}
    return out


def _close(got: List[Optional[float]], want: List[float], scale: float) -> bool:
    """Equal within float rounding of sums grouped otherwise: 1e-12 of the values' scale (a point early or late,
    or an EMA not debiased, is off by orders more)."""
    return len(got) == len(want) and all(
        (g is None and not math.isfinite(w)) or (g is not None and abs(g - w) <= 1e-12 * scale)
        for g, w in zip(got, want))


_POINT = st.tuples(
    st.sampled_from([1] * 12 + [0, -3, 2, 7, 40]),  # the step's move: mostly one stride, some gaps, steps back
    st.one_of(st.floats(-1e3, 1e3), st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0])),
    st.booleans())  # a wall time or none


@pytest.mark.parametrize("lane, mark, chunk", [(16, 16 ** 3, 64), (2, 2 ** 3, 3)])  # the real blocks, and tiny ones
# (every seam crossed)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # the
# same constants for every example
@given(points=st.lists(_POINT, max_size=700), stride=st.sampled_from([1, 10]),
       smooth=st.sampled_from([0.0, 0.3, 0.6, 0.9, 0.99, 0.999]), asked=st.integers(1, 60),
       bounds=st.tuples(st.none() | st.integers(-20, 800), st.none() | st.integers(-20, 800)),
       grown=st.integers(0, 700))
def test_the_numpy_window_is_the_plain_one_on_random_series(
        monkeypatch: pytest.MonkeyPatch, lane: int, mark: int, chunk: int, points: List[Tuple[int, float, bool]], stride: int,
        smooth: float, asked: int, bounds: Tuple[Optional[int], Optional[int]], grown: int) -> None:
    monkeypatch.setattr(series_module, "LANE", lane)
    monkeypatch.setattr(series_module, "MARK", mark)
    monkeypatch.setattr(series_module, "CHUNK_MARKS", chunk)
    series, step = Series(), 0
    for move, value, timed in points:
        step += move * stride
        series.append(step, value, 1.7e9 + step if timed else math.nan)
    cut = min(grown, len(points))  # the series as it was when first asked (its EMA states cached), then grown
    early = Series(steps=series.steps, values=series.values, nonfinite=series.nonfinite, times=series.times)
    window(early, *bounds, asked, smooth, cut)
    got, want = window(early, *bounds, asked, smooth), _reference_window(series, *bounds, asked, smooth)
    scale = max([abs(v) for v in series.values if math.isfinite(v)] + [1.0])
    smoothed, state = got.pop("smooth", None), got.pop("smooth_state", None)
    want_smoothed, want_state = want.pop("smooth", None), want.pop("smooth_state", None)
    assert got == want
    assert (smoothed is None) == (want_smoothed is None) and (state is None) == (want_state is None)
    if smoothed is not None:
        assert _close(smoothed, want_smoothed, scale), (smoothed, want_smoothed)
    if state is not None:
        assert (state["x"], state["stride"]) == (want_state["x"], want_state["stride"])
        assert abs(state["den"] - want_state["den"]) <= 1e-12
    # a value never depends on when or how it was asked: the same from a series asked nothing before
    fresh = Series(steps=series.steps, values=series.values, nonfinite=series.nonfinite, times=series.times)
    again = window(fresh, *bounds, asked, smooth)
    assert again.get("smooth") == smoothed and again.get("smooth_state") == state
