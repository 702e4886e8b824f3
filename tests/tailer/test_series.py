"""What the page's curves are made of (`Store.series`' query side), checked against oracles written here:
min/max buckets read from block summaries equal the naive per-point min/max, and the smoothing is the
debiased, step-aware EMA of the full series, whatever the zoom (bucketed or exact answers) and however long the
run grows (TensorBoard #1518 / #3493 are the opposite)."""

from __future__ import annotations

import math
import random
from typing import List, Optional

from mstail.tailer.history.series import Series, _bucket_ends, _bucketed, _smoothed_at


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


def _oracle(steps: List[int], values: List[float], weight: float) -> List[float]:
    """Debiased EMA; a gap of k strides (the smallest step difference among the first 16) decays like k points."""
    deltas = [b - a for a, b in zip(steps[:17], steps[1:17]) if b > a]
    stride = min(deltas) if deltas else 1
    num = den = 0.0
    last: Optional[int] = None
    out = []
    for x, v in zip(steps, values):
        if math.isfinite(v):
            d = weight ** (((x - last) if last is not None else stride) / stride)
            num, den, last = d * num + (1 - d) * v, d * den + (1 - d), x
        out.append(num / den if den else math.nan)
    return out


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


def test_the_cached_ema_is_the_full_pass_exactly_and_keeps_a_mark_every_16_points() -> None:
    from mstail.tailer.history.series import EMA_MARK, _fold

    series = _series(50_000, seed=4, nan_every=101, gaps=True)
    ends = _bucket_ends(0, 50_000, 660)
    got, state = _smoothed_at(series, 0.99, ends)  # windows would cover the series: the full pass, cached
    cached = series.smoothed[0.99]
    assert len(cached.nums) == 50_000 // EMA_MARK + 1  # 1.5 bytes a point, not a column of 8
    stride = cached.stride
    want, num, den, last_x, pos = [], 0.0, 0.0, None, -1
    for e in ends:  # one sequential pass over every point: what a column of every value held
        num, den, last_x = _fold(series, pos + 1, e + 1, 0.99, stride, num, den, last_x)
        pos = e
        want.append(num / den)
    assert got == want
    zoomed = list(range(31_990, 32_050))
    again, _ = _smoothed_at(series, 0.99, zoomed)  # from the cache now
    num, den, last_x = _fold(series, 0, 31_990, 0.99, stride, 0.0, 0.0, None)
    for e, value in zip(zoomed, again):
        num, den, last_x = _fold(series, e, e + 1, 0.99, stride, num, den, last_x)
        assert value == num / den
    assert state == {"den": cached.den, "x": series.steps[-1], "stride": stride}
