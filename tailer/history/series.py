"""The chart maths of one series: exact points or min/max buckets, wall times, and the debiased EMA.

A `Series` is one metric of one source in one run segment, in step order, as `array`s: 8 bytes a point for
the value, plus 16 for its step and time unless it shares those with the other metrics of its source and segment
(the store's frames: then `steps` and `times` may run ahead of `values`, and the series is its first
`len(values)` points). `window()` answers a `/api/series` query over it: exactly when the range holds at most `points`
points, else as `points` min/max buckets (non-finite values never enter min/max; they are listed apart), so no
spike is hidden however far the chart is zoomed out. The EMA sums and block summaries it caches are extended
as the series grows; like the `Store` that owns the series, they are touched from the event loop only.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mstail.parsers.record import finite_or_name, numbers


@dataclass
class Series:
    """One metric of one source in one run segment, in step order: `len(series)` points, `steps[i]`, `values[i]`
    and `times[i]` for i below it (`steps` and `times` may be longer: shared with other series)."""

    steps: array = field(default_factory=lambda: array("q"))
    values: array = field(default_factory=lambda: array("d"))
    nonfinite: List[int] = field(default_factory=list)  # indexes of NaN/Inf values, ascending
    times: array = field(default_factory=lambda: array("d"))  # the record's `time` (unix s; NaN if none)
    smoothed: Dict[float, "_Ema"] = field(default_factory=dict)  # weight -> cached EMA sums, extended on demand
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


#: points between two saved states of a cached EMA (`_Ema`): a value is at most this many folds from its mark
EMA_MARK = 16


class _Ema:
    """The full-series EMA of one series for one weight, cached as the running sums every EMA_MARK points (24 bytes
    a mark: 1.5 bytes a point, where a column of every value was 8) and the sums after the newest point, so the
    cache is extended as the series grows; a value is the fold of at most EMA_MARK points from its mark, the same
    operations in the same order as a full pass, so the same number."""

    __slots__ = ("den", "dens", "last_x", "length", "num", "nums", "stride", "xs")

    def __init__(self, stride: int) -> None:
        self.stride = stride
        self.nums, self.dens, self.xs = array("d", [0.0]), array("d", [0.0]), array("q", [0])  # mark k: sums after
        self.num = self.den = 0.0  # k * EMA_MARK points; no finite value yet (den 0) means no last step
        self.last_x: Optional[int] = None
        self.length = 0  # points folded into num/den

    def mark(self, k: int) -> Tuple[float, float, Optional[int]]:
        den = self.dens[k]
        return self.nums[k], den, self.xs[k] if den > 0 else None


_EMA_WEIGHTS_KEPT = 2  # EMAs cached per series (the slider's current and previous value)


def _stride(series: Series) -> int:
    """The logging stride of a series: the smallest positive step difference among its first 16. It is fixed
    once a series has 17 points, so a growing run never changes it."""
    steps, best = series.steps, 0
    for i in range(1, min(len(series.values), 17)):
        delta = steps[i] - steps[i - 1]
        if delta > 0 and (best == 0 or delta < best):
            best = delta
    return best or 1


def _ema(series: Series, weight: float) -> _Ema:
    """Debiased exponential moving average over the full-resolution series, aware of step gaps.

    Each finite value enters with decay `d = weight ** (Δstep / stride)` (Δstep = its step distance to the
    previous finite value; `stride` = the series' logging stride), and the running sums are debiased:
    `num = d·num + (1-d)·v`, `den = d·den + (1-d)`, smoothed = num / den. For evenly logged steps this is
    TensorBoard's debiased EMA; a gap of k strides decays like k points. The value at a point depends only on
    the points before it, so it never changes when the run grows, and it is computed before any bucketing, so
    zoom cannot change it. Non-finite values are skipped (the smoothed value carries over). The sums are
    cached per weight (`_Ema`) and extended incrementally."""
    stride = _stride(series)
    state = series.smoothed.pop(weight, None)
    if state is None or state.stride != stride:
        state = _Ema(stride)
    series.smoothed[weight] = state  # most recently used last
    while len(series.smoothed) > _EMA_WEIGHTS_KEPT:
        del series.smoothed[next(iter(series.smoothed))]
    n = len(series.values)
    while state.length < n:
        stop = min(n, (state.length // EMA_MARK + 1) * EMA_MARK)
        state.num, state.den, state.last_x = _fold(series, state.length, stop, weight, stride, state.num, state.den,
                                                    state.last_x)
        state.length = stop
        if stop % EMA_MARK == 0:
            state.nums.append(state.num)
            state.dens.append(state.den)
            state.xs.append(state.last_x if state.last_x is not None else 0)
    return state


def _ema_at(series: Series, weight: float, state: _Ema, ends: List[int]) -> List[float]:
    """The full-series EMA at the indexes `ends` (ascending), each folded from the mark before it (or from the
    end before it, when nearer)."""
    out: List[float] = []
    num = den = 0.0
    last_x: Optional[int] = None
    pos = -1  # the last index folded into num/den
    for e in ends:
        k = e // EMA_MARK
        if k * EMA_MARK > pos + 1:
            num, den, last_x = state.mark(k)
            pos = k * EMA_MARK - 1
        num, den, last_x = _fold(series, pos + 1, e + 1, weight, state.stride, num, den, last_x)
        pos = e
        out.append(num / den if den > 0 else math.nan)
    return out


def _fold(series: Series, a: int, b: int, weight: float, stride: int, num: float, den: float,
          last_x: Optional[int]) -> Tuple[float, float, Optional[int]]:
    """Fold points a..b-1 into the running EMA sums (num, den, last finite step). Non-finite values are skipped
    (the smoothed value carries over)."""
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
    return num, den, last_x


_EMA_EPSILON = 1e-13  # a value whose EMA weight fell below this (relative) is left out of a windowed EMA


def _smoothed_at(series: Series, weight: float, ends: List[int]) -> Tuple[List[float], Dict[str, Any]]:
    """The EMA of `_ema` at the indexes `ends` (ascending), and the state at the last of them.

    From the cached sums (`_Ema`) when they cover the series. Otherwise, when cheaper than a full pass, each value is
    computed over a window: the points within K strides before it, where weight ** K <= 1e-13, so the points
    left out carry less than 1e-13 of the weight (relative error below 1e-13 × max|v| / |EMA|); windows that
    overlap are scanned once. A full pass (its sums cached every EMA_MARK points, extended as the series grows)
    is used when the windows would cover half the series or more."""
    state = series.smoothed.get(weight)
    if state is not None and state.length == len(series.values) and state.stride == _stride(series):
        return _ema_at(series, weight, state, ends), {"den": state.den, "x": state.last_x, "stride": state.stride}
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
        state = _ema(series, weight)
        if ends[-1] == state.length - 1:
            tail = {"den": state.den, "x": state.last_x, "stride": state.stride}
        else:
            tail = {"den": 1.0, "x": steps[ends[-1]], "stride": stride}
        return _ema_at(series, weight, state, ends), tail
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
            chunk: Sequence[float] = values[a:b]
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
        chunk: Sequence[float] = values[a:b]
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
