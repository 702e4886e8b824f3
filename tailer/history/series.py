"""The chart maths of one series: exact points or min/max buckets, wall times, and the debiased EMA.

A `Series` is one metric of one source in one run segment, in step order, as `array`s: 8 bytes a point for
the value, plus 16 for its step and time unless it shares those with the other metrics of its source and segment
(the store's frames: then `steps` and `times` may run ahead of `values`, and the series is its first
`len(values)` points). `window()` answers a `/api/series` query over it: exactly when the range holds at most `points`
points, else as `points` min/max buckets (non-finite values never enter min/max; they are listed apart), so no
spike is hidden however far the chart is zoomed out. The buckets and the EMA are computed with numpy over copies of
the range's columns (`column_copy`), so a query over 1 M points takes milliseconds, most of them in numpy's loops,
which let the event loop's thread run meanwhile.

Threads: a series grows on the event loop (the `Store` that owns it) while `window()` reads it in the query thread
(`Store.series_answer`): it reads the first `n` points, counted on the loop, which never change (a series only
grows, `values` last: `append`), copied a slice at a time (a numpy view of an `array` would stop it growing); the
EMA's cached states are extended by that one thread only, and the block summaries, extended by the columns' flush
on the loop, under a lock (`summary`).
"""

from __future__ import annotations

import math
import threading
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from mstail.parsers.record import finite_or_name, numbers


@dataclass
class Series:
    """One metric of one source in one run segment, in step order: `len(series)` points, `steps[i]`, `values[i]`
    and `times[i]` for i below it (`steps` and `times` may be longer: shared with other series)."""

    steps: array = field(default_factory=lambda: array("q"))
    values: array = field(default_factory=lambda: array("d"))
    nonfinite: List[int] = field(default_factory=list)  # indexes of NaN/Inf values, ascending
    times: array = field(default_factory=lambda: array("d"))  # the record's `time` (unix s; NaN if none)
    smoothed: Dict[float, "_Marks"] = field(default_factory=dict)  # weight -> cached EMA states, extended on demand
    blocks: Optional["Blocks"] = None  # min/max per block of points, built and extended by the columns' flushes

    def __len__(self) -> int:
        return len(self.values)

    def append(self, step: int, value: float, time: float = math.nan) -> None:
        self.steps.append(step)
        self.times.append(time)
        if not math.isfinite(value):
            self.nonfinite.append(len(self.values))
        self.values.append(value)  # last: a point counted (`len`) has its step, time and mark (another thread reads)


def window(series: Series, start: Optional[int], end: Optional[int], points: int, smooth: float,
           n: Optional[int] = None) -> Dict[str, Any]:
    """The series between steps `start` and `end` (inclusive; None = open): `x`, `min`, `max`, `last` and
    `nonfinite`, exact or bucketed; `t`, the wall time of each x (the point's, or the bucket's last point's); with
    `smooth` in (0, 1), `smooth`: the debiased, step-aware EMA of the full-resolution series (`_smoothed_at`) at each x,
    computed before bucketing, so neither zoom nor later steps change a value, and `smooth_state` when the window
    reaches the newest point (what a client needs to continue the EMA live). Of the series' first `n` points
    (default every one): those it held when the question was asked."""
    n = len(series.values) if n is None else n
    lo = 0 if start is None else bisect_left(series.steps, start, 0, n)
    hi = n if end is None else bisect_right(series.steps, end, 0, n)
    bucketed = hi - lo > points
    entry = _bucketed(series, lo, hi, points) if bucketed else _exact(series, lo, hi)
    ends = _bucket_ends(lo, hi, points) if bucketed else list(range(lo, hi))
    entry["t"] = [finite_or_none(t) for t in _at(series.times, ends)]
    if 0.0 < smooth < 1.0 and ends:
        values, state = _smoothed_at(series, smooth, ends, n)
        entry["smooth"] = [finite_or_none(v) for v in values]
        if hi == n:
            entry["smooth_state"] = state
    return entry


def finite_or_none(value: float) -> Optional[float]:
    """`value`, or None when it is not finite (wall times, smoothed values: a gap, not a point)."""
    return value if value - value == 0 else None


COPY_POINTS = 1 << 18  # points of a column copied at once (2 MiB): the loop's thread waits no longer for the GIL


def column_copy(column: array, lo: int, hi: int, np: Any) -> Any:
    """Points lo..hi-1 of a store's column as a numpy array of their own: a slice of the `array` (a copy, made while
    the loop's thread waits; more than COPY_POINTS, a slice at a time, then joined); a numpy view of the `array`
    itself would make the loop's next append to it fail (an array exporting a buffer cannot grow). A column that is
    a numpy array already (a fold's mean, which never grows) is viewed."""
    if not isinstance(column, array):
        return column[lo:hi]
    dtype = np.int64 if column.typecode == "q" else np.float64
    if hi - lo <= COPY_POINTS:
        return np.frombuffer(column[lo:hi], dtype=dtype) if hi > lo else np.zeros(0, dtype)
    return np.concatenate([np.frombuffer(column[a:min(a + COPY_POINTS, hi)], dtype=dtype)
                           for a in range(lo, hi, COPY_POINTS)])


def _at(column: array, indexes: Sequence[int]) -> List[Any]:
    """The column's values at `indexes`, as Python numbers (of an `array` or a numpy column: `column_copy`)."""
    return [column[i] for i in indexes] if isinstance(column, array) else column[list(indexes)].tolist()


# -- the EMA --------------------------------------------------------------------------------------------------

LANE = 16  # maps composed at once in the EMA's scan: points of a block, blocks of a superblock, superblocks of a mark
MARK = LANE ** 3  # points between two states of the EMA cached (`_Marks`), composed one after another
CHUNK_MARKS = 64  # marks scanned at once (262,144 points: a few MiB of arrays at a time)
_EMA_WEIGHTS_KEPT = 2  # EMAs cached per series (the slider's current and previous value)


class _Marks:
    """The EMA of one series for one weight, cached as its state (the running sums and the last finite step) before
    every MARK-th point: 24 bytes per 4,096 points (6 KiB a 1 M-point series), so a zoomed-in window is scanned from
    the mark before it, and a grown series from its last mark."""

    __slots__ = ("dens", "nums", "stride", "xs")

    def __init__(self, stride: int) -> None:
        self.stride = stride
        self.nums, self.dens, self.xs = array("d", [0.0]), array("d", [0.0]), array("q", [0])  # the state before
        # point k·MARK; no finite value yet (den 0) means no last step

    def state(self, k: int) -> Tuple[float, float, Optional[int]]:
        den = self.dens[k]
        return self.nums[k], den, self.xs[k] if den > 0 else None


def _stride(series: Series, n: int) -> int:
    """The logging stride of a series of `n` points: the smallest positive step difference among its first 16. It
    is fixed once a series has 17 points, so a growing run never changes it."""
    steps, best = series.steps, 0
    for i in range(1, min(n, 17)):
        delta = steps[i] - steps[i - 1]
        if delta > 0 and (best == 0 or delta < best):
            best = delta
    return int(best or 1)


def _smoothed_at(series: Series, weight: float, ends: Sequence[int],
                 n: Optional[int] = None) -> Tuple[List[float], Dict[str, Any]]:
    """The debiased, step-aware EMA of the series' first `n` points (default every one) at the indexes `ends`
    (ascending, below `n`), and its state at the last of them (`{"den", "x", "stride"}`).

    Each finite value enters with decay `d = weight ** (Δstep / stride)` (Δstep = its step distance to the
    previous finite value; `stride` = the series' logging stride), and the running sums are debiased:
    `num = d·num + (1-d)·v`, `den = d·den + (1-d)`, smoothed = num / den. For evenly logged steps this is
    TensorBoard's debiased EMA; a gap of k strides decays like k points. Non-finite values are skipped (the smoothed
    value carries over).

    Computed over numpy columns (`_scan`) in a fixed order tied to the points' indexes (blocks of LANE points,
    superblocks of LANE blocks, marks of LANE superblocks, from the state before each mark), so the value at a point
    depends only on the points up to it: it never changes when the run grows or the chart zooms. It differs from the
    one-point-at-a-time fold by float rounding only (sums grouped by block: a few units in the last place of the
    values' scale). The states at the marks are cached per weight (`_Marks`, _EMA_WEIGHTS_KEPT weights a series)."""
    import numpy as np

    n = len(series.values) if n is None else n
    stride = _stride(series, n)
    marks = series.smoothed.pop(weight, None)
    if marks is None or marks.stride != stride:
        marks = _Marks(stride)
    series.smoothed[weight] = marks  # most recently used last
    while len(series.smoothed) > _EMA_WEIGHTS_KEPT:
        del series.smoothed[next(iter(series.smoothed))]
    at = np.asarray(ends, dtype=np.int64)
    nums, dens, xs = np.empty(len(at)), np.empty(len(at)), np.empty(len(at), dtype=np.int64)
    i = 0
    while i < len(at):  # from the state before the superblock of the next end (or the newest one known)
        first = min(int(at[i]) // MARK, len(marks.nums) - 1)
        stop = min(first + CHUNK_MARKS, int(at[-1]) // MARK + 1)
        j = int(np.searchsorted(at, stop * MARK))
        _scan(series, weight, marks, first, min(stop * MARK, n), n, at[i:j], (nums[i:j], dens[i:j], xs[i:j]), np)
        i = j
    values = np.divide(nums, dens, out=np.full(len(at), np.nan), where=dens > 0)
    den = float(dens[-1])
    return values.tolist(), {"den": den, "x": int(xs[-1]) if den > 0 else None, "stride": stride}


def _scan(series: Series, weight: float, marks: _Marks, first: int, b: int, n: int, at: Any,
          out: Tuple[Any, Any, Any], np: Any) -> None:
    """The EMA over points first·MARK..b-1 from the state cached before them: its sums and last finite step at the
    indexes `at` into `out`, and the states at the marks that follow, below `n`, into `marks`.

    Each point is a map `s -> d·s + (1-d)·v` of the sums (a non-finite value: the identity), composed by
    `_compose_maps` from one mark to the next. Where every point is finite and a stride after the one before (the
    usual case), the marks are composed together, with one block's decays for all; a mark holding another point (a
    NaN, a gap) is composed alone, with the decays of each point."""
    a = first * MARK
    num0, den0, last_x = marks.state(first)
    values, steps = column_copy(series.values, a, b, np), column_copy(series.steps, a, b, np)
    finite = np.isfinite(values)
    every = bool(finite.all())
    shown: Any = np.flatnonzero(finite) if not every else None  # the finite points' indexes (None: every point)
    fx = steps if every else steps[shown]
    dx = np.empty(len(fx), dtype=np.int64)  # to the finite point before (the first's: a stride when there is none)
    if len(fx):
        dx[0] = fx[0] - last_x if last_x is not None else marks.stride
        np.subtract(fx[1:], fx[:-1], out=dx[1:])
    odd_marks: Set[int] = set()  # the marks holding a NaN or a finite point not a stride after the one before
    if not (every and dx.min() == dx.max() == marks.stride):
        odd = np.flatnonzero(dx != marks.stride)
        odd_marks.update(((odd if every else shown[odd]) // MARK).tolist())
        odd_marks.update((np.flatnonzero(~finite) // MARK).tolist())
    last = _last_steps(fx, shown, last_x, np)  # the last finite step at or before a point
    state = (num0, den0)
    i = at - a
    count = -(-(b - a) // MARK)
    k = 0
    while k < count:  # runs of marks alike: usual ones together, odd ones one at a time
        stop = k + 1
        if k not in odd_marks:
            while stop < count and stop not in odd_marks:
                stop += 1
        lo, hi = k * MARK, min(stop * MARK, b - a)
        if k in odd_marks:  # each point's decay (a gap of k strides: weight ** k), the identity at a NaN
            if every:
                finite_at, gaps = np.arange(lo, hi), dx[lo:hi]
            else:
                j0, j1 = np.searchsorted(shown, lo), np.searchsorted(shown, hi)
                finite_at, gaps = shown[j0:j1], dx[j0:j1]
            decays = np.full(len(gaps), weight)
            irregular = np.flatnonzero((gaps != marks.stride) & (gaps > 0))
            decays[irregular] = weight ** (gaps[irregular] / marks.stride)
            d, sums = np.ones(MARK), np.zeros(MARK)
            d[finite_at - lo] = decays
            sums[finite_at - lo] = (1.0 - decays) * values[finite_at]
        else:
            d, sums = None, values[lo:hi]
        asked = (i >= lo) & (i < hi)
        state, states = _compose_maps(weight, d, sums, stop - k, state, i[asked] - lo, out, asked, np)
        for m, mark in enumerate(states, start=k + 1):  # the marks below n not cached yet
            if first + m == len(marks.nums) and a + m * MARK <= n:
                marks.nums.append(mark[0])
                marks.dens.append(mark[1])
                marks.xs.append(int(last(np.array([m * MARK - 1]))[0]))
        k = stop
    out[2][:] = last(i)


def _compose_maps(weight: float, d: Any, sums: Any, count: int, state: Tuple[float, float], ends: Any,
                  out: Tuple[Any, Any, Any], asked: Any, np: Any) -> Tuple[Tuple[float, float], List[Tuple[float, float]]]:
    """The maps of `count` marks of points (`d`, each point's decay, and `sums`, its `(1-d)·v`; `d` None: every
    decay `weight` and `sums` the values, not yet times 1-weight), composed from `state`: the sums at the indexes
    `ends` into `out` where `asked`, the state after the points and after each mark.

    Within a block of LANE points, the maps are composed point after point, every block at once (numpy over the
    blocks: LANE steps); within a superblock, the blocks' maps likewise, and within a mark the superblocks'; across
    marks, one state after another. Points are padded to whole marks (what follows a point never changes its
    value)."""
    size = count * MARK
    if d is None:  # one block's decays for all
        keep = 1.0 - weight
        if len(sums) < size:
            sums = np.concatenate((sums, np.zeros(size - len(sums))))
        total = np.multiply(sums.reshape(size // LANE, LANE).T, keep, out=np.empty((LANE, size // LANE)))
        levels = [(np.full((LANE, 1), weight), total, np.full((LANE, 1), keep))]
    else:
        levels = [(_lanes(d, size // LANE), _lanes(sums, size // LANE), _lanes(1.0 - d, size // LANE))]
    _compose(*levels[0])
    runs = size // LANE
    while runs > count:  # the runs' maps composed LANE at a time, up to one map a mark
        runs //= LANE
        levels.append(tuple(_lanes(m[-1], runs) for m in levels[-1]))
        _compose(*levels[-1])
    # one mark after another: the state before each, and after
    before_num, before_den = np.empty(count), np.empty(count)
    num, den = state
    states = []
    for k, (md, mn, mb) in enumerate(zip(*(_per(m[-1], count).tolist() for m in levels[-1]))):
        before_num[k], before_den[k] = num, den
        num, den = md * num + mn, md * den + mb
        states.append((num, den))
    # at each end: the mark's state, through the runs before the end's at each level down to its block
    end_num, end_den = before_num[ends // MARK], before_den[ends // MARK]
    for level in range(len(levels) - 1, -1, -1):
        decay, total, debias = levels[level]
        unit = LANE ** level  # points of the runs this level composes
        u, column = ends // unit % LANE, ends // (unit * LANE)
        uniform = 0 if decay.shape[1] == 1 else column
        if level:  # the runs before the end's one
            began, prior = u > 0, np.maximum(u - 1, 0)
            end_num = np.where(began, decay[prior, uniform] * end_num + total[prior, column], end_num)
            end_den = np.where(began, decay[prior, uniform] * end_den + debias[prior, uniform], end_den)
        else:  # its block's points up to it
            end_num = decay[u, uniform] * end_num + total[u, column]
            end_den = decay[u, uniform] * end_den + debias[u, uniform]
    out[0][asked], out[1][asked] = end_num, end_den
    return (num, den), states


def _lanes(column: Any, count: int) -> Any:
    """`column`, `count` runs of LANE values one after another (or one value for all), as LANE rows of `count`
    (or one) values: row t holds the t-th value of every run, contiguous."""
    if column.size == 1:
        return column.reshape(1, 1).repeat(LANE, axis=0)
    return column.reshape(count, LANE).T.copy()


def _per(row: Any, count: int) -> Any:
    """A row of `_lanes` as `count` values (one value for all repeated)."""
    return row.repeat(count) if row.size == 1 else row


def _compose(decay: Any, total: Any, debias: Any) -> None:
    """In place, along the rows (`_lanes`): each map `s -> decay·s + total` (and `s -> decay·s + debias`: the sums'
    denominator, which shares its decay) becomes the composition of the maps up to it from the run's first."""
    for t in range(1, LANE):
        total[t] += decay[t] * total[t - 1]
        debias[t] += decay[t] * debias[t - 1]
        decay[t] *= decay[t - 1]


def _last_steps(fx: Any, shown: Any, last_x: Optional[int], np: Any) -> Any:
    """A function of points' indexes (an array): the step of the last finite point at or before each (`fx`, the
    finite points' steps, at the indexes `shown`; None: every point is finite), else `last_x` (the one before them,
    0 for none)."""
    def last(indexes: Any) -> Any:
        if shown is None:
            return fx[indexes]
        j = np.searchsorted(shown, indexes, side="right") - 1
        known = fx[np.maximum(j, 0)] if len(fx) else np.zeros(len(indexes), dtype=np.int64)
        return np.where(j >= 0, known, last_x or 0)

    return last


# -- buckets --------------------------------------------------------------------------------------------------

BLOCK = 64  # points per block of the min/max summary


class Blocks:
    """Min and max of each complete block of `BLOCK` points (non-finite values left out: a block of only
    NaN has min +inf and max -inf), saved with the columns (`columns.Flush`)."""

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


#: the block summaries are extended by the columns' flush (the event loop) and may be read elsewhere
_SUMMARIES = threading.Lock()


def summary(series: Series) -> Blocks:
    """The series' block summary, extended to its newest complete block."""
    with _SUMMARIES:
        blocks = series.blocks = series.blocks or Blocks()
        blocks.extend(series)
    return blocks


def _bucket_ends(lo: int, hi: int, points: int) -> List[int]:
    """The index of the last point of each bucket `_bucketed` makes (hi > lo)."""
    size = -(-(hi - lo) // points)
    return [*range(lo + size - 1, hi - 1, size), hi - 1]


def _exact(series: Series, lo: int, hi: int) -> Dict[str, Any]:
    values = numbers(series.values[lo:hi].tolist())
    x = series.steps[lo:hi].tolist()
    return {"x": x, "min": values, "max": values, "last": values, "nonfinite": _nonfinite(series, lo, hi)}


def _bucketed(series: Series, lo: int, hi: int, points: int) -> Dict[str, Any]:
    """`points` buckets of ceil((hi - lo) / points) points (the last one shorter): the min and max of each
    (np.minimum/maximum.reduceat over a copy of the range's values, non-finite ones set to +inf/-inf), at its last
    point's step, with that point's value (`last`)."""
    import numpy as np

    size = -(-(hi - lo) // points)  # ceil: every bucket but the last holds `size` points
    values = column_copy(series.values, lo, hi, np)
    bad = series.nonfinite
    low = high = values
    first_bad, end_bad = bisect_left(bad, lo), bisect_left(bad, hi)
    if first_bad != end_bad:  # rare: the NaN/Inf values of the range out of min and max
        where = np.array(bad[first_bad:end_bad], dtype=np.int64) - lo
        low = values.copy()
        low[where], high[where] = np.inf, -np.inf
    starts = np.arange(0, hi - lo, size)
    ends = _bucket_ends(lo, hi, points)
    return {"x": _at(series.steps, ends), "min": [v if v != math.inf else None for v in
                                                np.minimum.reduceat(low, starts).tolist()],
            "max": [v if v != -math.inf else None for v in np.maximum.reduceat(high, starts).tolist()],
            "last": [finite_or_name(v) for v in _at(series.values, ends)], "nonfinite": _nonfinite(series, lo, hi)}


def _nonfinite(series: Series, lo: int, hi: int) -> Dict[str, List[Any]]:
    indexes = series.nonfinite[bisect_left(series.nonfinite, lo) : bisect_left(series.nonfinite, hi)]
    return {"x": [series.steps[i] for i in indexes], "value": [finite_or_name(series.values[i]) for i in indexes]}
