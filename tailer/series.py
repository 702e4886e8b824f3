"""The chart maths of one series: exact points or min/max buckets, wall times, and the debiased EMA.

A `Series` is one metric of one source in one run segment, in step order, as `array`s: 8 bytes a point for
the value, plus 16 for its step and time unless it shares those with the other metrics of its source and segment
(the store's frames: then `steps` and `times` may run ahead of `values`, and the series is its first
`len(values)` points). `window()` answers a `/api/series` query over it: exactly when the range holds at most `points`
points, else as `points` min/max buckets (non-finite values never enter min/max; they are listed apart), so no
spike is hidden however far the chart is zoomed out. The EMA columns and block summaries it caches are extended
as the series grows; like the `Store` that owns the series, they are touched from the event loop only.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from mstail.parsers.record import finite_or_name, numbers


@dataclass
class Series:
    """One metric of one source in one run segment, in step order: `len(series)` points, `steps[i]`, `values[i]`
    and `times[i]` for i below it (`steps` and `times` may be longer: shared with other series)."""

    steps: array = field(default_factory=lambda: array("q"))
    values: array = field(default_factory=lambda: array("d"))
    nonfinite: List[int] = field(default_factory=list)  # indexes of NaN/Inf values, ascending
    times: array = field(default_factory=lambda: array("d"))  # the record's `time` (unix s; NaN if none)
    smoothed: Dict[float, "_Ema"] = field(default_factory=dict)  # weight -> EMA column, extended on demand
    blocks: Optional["Blocks"] = None  # min/max per block of points, built and extended by queries and flushes

    def __len__(self) -> int:
        return len(self.values)

    def append(self, step: int, value: float, time: float = math.nan) -> None:
        if not math.isfinite(value):
            self.nonfinite.append(len(self.values))
        self.steps.append(step)
        self.values.append(value)
        self.times.append(time)


def window(series: Series, start: Optional[int], end: Optional[int], points: int, smooth: float) -> Dict[str, Any]:
    """The series between steps `start` and `end` (inclusive; None = open): `x`, `min`, `max`, `last` and
    `nonfinite`, exact or bucketed; `t`, the wall time of each x (the point's, or the bucket's last point's); with
    `smooth` in (0, 1), `smooth`: the debiased, step-aware EMA of the full-resolution series (`_ema`) at each x,
    computed before bucketing, so neither zoom nor later steps change a value, and `smooth_state` when the window
    reaches the newest point (what a client needs to continue the EMA live)."""
    n = len(series.values)
    lo = 0 if start is None else bisect_left(series.steps, start, 0, n)
    hi = n if end is None else bisect_right(series.steps, end, 0, n)
    bucketed = hi - lo > points
    entry = _bucketed(series, lo, hi, points) if bucketed else _exact(series, lo, hi)
    ends = _bucket_ends(lo, hi, points) if bucketed else list(range(lo, hi))
    times = series.times
    entry["t"] = [finite_or_none(times[i]) for i in ends]
    if 0.0 < smooth < 1.0 and ends:
        values, state = _smoothed_at(series, smooth, ends)
        entry["smooth"] = [finite_or_none(v) for v in values]
        if hi == n:
            entry["smooth_state"] = state
    return entry


def finite_or_none(value: float) -> Optional[float]:
    """`value`, or None when it is not finite (wall times, smoothed values: a gap, not a point)."""
    return value if value - value == 0 else None


class _Ema:
    """The EMA column of one series for one weight, and the state to extend it when the series grows."""

    __slots__ = ("column", "den", "last_x", "num", "stride")

    def __init__(self, stride: int) -> None:
        self.stride = stride
        self.column = array("d")
        self.num = 0.0
        self.den = 0.0
        self.last_x: Optional[int] = None


_EMA_WEIGHTS_KEPT = 2  # EMA columns cached per series (the slider's current and previous value)


def _stride(series: Series) -> int:
    """The logging stride of a series: the smallest positive step difference among its first 16. It is fixed
    once a series has 17 points, so a growing run never changes it."""
    steps, best = series.steps, 0
    for i in range(1, min(len(series.values), 17)):
        delta = steps[i] - steps[i - 1]
        if delta > 0 and (best == 0 or delta < best):
            best = delta
    return best or 1


def _ema(series: Series, weight: float) -> array:
    """Debiased exponential moving average over the full-resolution series, aware of step gaps.

    Each finite value enters with decay `d = weight ** (Δstep / stride)` (Δstep = its step distance to the
    previous finite value; `stride` = the series' logging stride), and the running sums are debiased:
    `num = d·num + (1-d)·v`, `den = d·den + (1-d)`, smoothed = num / den. For evenly logged steps this is
    TensorBoard's debiased EMA; a gap of k strides decays like k points. The value at a point depends only on
    the points before it, so it never changes when the run grows, and it is computed before any bucketing, so
    zoom cannot change it. Non-finite values are skipped (the smoothed value carries over). The column is
    cached per weight and extended incrementally."""
    stride = _stride(series)
    state = series.smoothed.pop(weight, None)
    if state is None or state.stride != stride:
        state = _Ema(stride)
    series.smoothed[weight] = state  # most recently used last
    while len(series.smoothed) > _EMA_WEIGHTS_KEPT:
        del series.smoothed[next(iter(series.smoothed))]
    column = state.column
    n = len(series.values)
    if len(column) >= n:
        return column
    state.num, state.den, state.last_x = _fold(series, len(column), n, weight, stride, state.num, state.den,
                                                state.last_x, column)
    return column


def _fold(series: Series, a: int, b: int, weight: float, stride: int, num: float, den: float,
          last_x: Optional[int], column: Optional[array] = None) -> Tuple[float, float, Optional[int]]:
    """Fold points a..b-1 into the running EMA sums (num, den, last finite step); with `column`, append the
    smoothed value at each point to it. Non-finite values are skipped (the smoothed value carries over)."""
    values, steps = series.values, series.steps
    for i in range(a, b):
        v = values[i]
        if v - v == 0:  # finite
            x = steps[i]
            dx = stride if last_x is None else x - last_x
            d = weight if dx == stride or dx <= 0 else weight ** (dx / stride)
            num = d * num + (1.0 - d) * v
            den = d * den + (1.0 - d)
            last_x = x
        if column is not None:
            column.append(num / den if den > 0 else math.nan)
    return num, den, last_x


_EMA_EPSILON = 1e-13  # a value whose EMA weight fell below this (relative) is left out of a windowed EMA


def _smoothed_at(series: Series, weight: float, ends: List[int]) -> Tuple[List[float], Dict[str, Any]]:
    """The EMA of `_ema` at the indexes `ends` (ascending), and the state at the last of them.

    From the cached column when it covers the series. Otherwise, when cheaper than a full pass, each value is
    computed over a window: the points within K strides before it, where weight ** K <= 1e-13, so the points
    left out carry less than 1e-13 of the weight (relative error below 1e-13 × max|v| / |EMA|); windows that
    overlap are scanned once. A full pass (cached, extended as the series grows) is used when the windows
    would cover half the series or more."""
    state = series.smoothed.get(weight)
    if state is not None and len(state.column) == len(series.values) and state.stride == _stride(series):
        column = state.column
        return [column[i] for i in ends], {"den": state.den, "x": state.last_x, "stride": state.stride}
    stride = _stride(series)
    reach = stride * math.ceil(math.log(_EMA_EPSILON) / math.log(weight))
    steps = series.steps
    starts = [bisect_left(steps, steps[e] - reach, 0, e) for e in ends]
    cost = 0
    covered = -1
    for s_, e in zip(starts, ends):
        cost += e - max(s_, covered + 1) + 1
        covered = e
    if cost * 2 >= len(series.values):
        column = _ema(series, weight)
        state = series.smoothed[weight]
        if ends[-1] == len(column) - 1:
            tail = {"den": state.den, "x": state.last_x, "stride": state.stride}
        else:
            tail = {"den": 1.0, "x": steps[ends[-1]], "stride": stride}
        return [column[i] for i in ends], tail
    values, bad = series.values, series.nonfinite
    keep = 1.0 - weight
    out: List[float] = []
    num = den = 0.0
    last_x: Optional[int] = None
    pos = -1  # the last index folded into num/den
    for s_, e in zip(starts, ends):
        if s_ > pos + 1:  # a gap: start afresh at this window
            num = den = 0.0
            pos = s_ - 1
            # the first point decays from the finite value before it, as in the full pass (that value's own
            # weight is what the window leaves out)
            j = s_ - 1
            while j >= 0 and not math.isfinite(values[j]):
                j -= 1
            last_x = steps[j] if j >= 0 else None
        a, b = pos + 1, e + 1
        first_x = last_x + stride if last_x is not None else steps[a] if a < b else 0
        if b - a > 8 and bisect_left(bad, a) == bisect_left(bad, b) and (
            steps[a:b] == array("q", range(first_x, first_x + (b - a) * stride, stride))
        ):
            # The common case, every value finite and one stride apart: d is the weight at every point, so
            # num/(1-w) runs as acc = acc·w + v, and den has a closed form.
            acc = num / keep
            for v in values[a:b]:
                acc = acc * weight + v
            num = acc * keep
            decay = weight ** (b - a)
            den = den * decay + (1.0 - decay)
            last_x = steps[b - 1]
            pos = e
            out.append(num / den if den > 0 else math.nan)
            continue
        num, den, last_x = _fold(series, pos + 1, e + 1, weight, stride, num, den, last_x)
        pos = e
        out.append(num / den if den > 0 else math.nan)
    return out, {"den": den, "x": last_x, "stride": stride}


BLOCK = 64  # points per block of the min/max summary


class Blocks:
    """Min and max of each complete block of `BLOCK` points (non-finite values left out: a block of only
    NaN has min +inf and max -inf), so a wide bucket reads a few block values instead of every point."""

    __slots__ = ("maxs", "mins")

    def __init__(self, mins: Optional[array] = None, maxs: Optional[array] = None) -> None:
        self.mins = mins if mins is not None else array("d")
        self.maxs = maxs if maxs is not None else array("d")

    def extend(self, series: Series) -> None:
        values, bad = series.values, series.nonfinite
        for k in range(len(self.mins), len(values) // BLOCK):
            a, b = k * BLOCK, (k + 1) * BLOCK
            chunk = values[a:b]
            if bisect_left(bad, a) != bisect_left(bad, b):
                chunk = [v for v in chunk if math.isfinite(v)]
            self.mins.append(min(chunk) if chunk else math.inf)
            self.maxs.append(max(chunk) if chunk else -math.inf)


def summary(series: Series) -> Blocks:
    """The series' block summary, extended to its newest complete block."""
    blocks = series.blocks = series.blocks or Blocks()
    blocks.extend(series)
    return blocks


def _bucket_ends(lo: int, hi: int, points: int) -> List[int]:
    """The index of the last point of each bucket `_bucketed` makes (hi > lo)."""
    size = -(-(hi - lo) // points)
    return [*range(lo + size - 1, hi - 1, size), hi - 1]


def _exact(series: Series, lo: int, hi: int) -> Dict[str, Any]:
    values = numbers(series.values[lo:hi])
    x = series.steps[lo:hi].tolist()
    return {"x": x, "min": values, "max": values, "last": values, "nonfinite": _nonfinite(series, lo, hi)}


def _bucketed(series: Series, lo: int, hi: int, points: int) -> Dict[str, Any]:
    steps, values, bad = series.steps, series.values, series.nonfinite
    size = -(-(hi - lo) // points)  # ceil: every bucket but the last holds `size` points
    blocks = None
    if size >= 4 * BLOCK:  # wide buckets: whole blocks from the summary, only the ragged edges point by point
        blocks = summary(series)
    inf = math.inf

    def edge(a: int, b: int) -> Tuple[float, float]:
        chunk = values[a:b]
        if bisect_left(bad, a) != bisect_left(bad, b):
            chunk = [v for v in chunk if math.isfinite(v)]  # rare: only buckets holding a NaN/Inf pay this
        return (min(chunk), max(chunk)) if chunk else (inf, -inf)

    xs, mins, maxs, lasts = [], [], [], []
    for a in range(lo, hi, size):
        b = min(a + size, hi)
        if blocks is not None and b - a >= 2 * BLOCK:
            first, end = -(-a // BLOCK), b // BLOCK
            low, high = edge(a, first * BLOCK)
            low2, high2 = edge(end * BLOCK, b)
            low = min(low, low2, min(blocks.mins[first:end]))
            high = max(high, high2, max(blocks.maxs[first:end]))
        else:
            low, high = edge(a, b)
        xs.append(steps[b - 1])
        mins.append(low if low != inf else None)
        maxs.append(high if high != -inf else None)
        lasts.append(finite_or_name(values[b - 1]))
    return {"x": xs, "min": mins, "max": maxs, "last": lasts, "nonfinite": _nonfinite(series, lo, hi)}


def _nonfinite(series: Series, lo: int, hi: int) -> Dict[str, List[Any]]:
    indexes = series.nonfinite[bisect_left(series.nonfinite, lo) : bisect_left(series.nonfinite, hi)]
    return {"x": [series.steps[i] for i in indexes], "value": [finite_or_name(series.values[i]) for i in indexes]}
