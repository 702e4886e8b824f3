"""One metric of many sources as one answer: the mean across sources with the min-max band, for the page's mean
+ band at 17 to 1,024 ranks (one `/api/series?aggregate=mean` answer instead of one series per rank).

How: every (source, segment) series of the metric is folded, per step, into the mean of the finite values logged
at that step (each source logging it counts once), their min and max, and how many there were. The mean is then
a `Series` like any other, so `series.window` buckets it exactly as it buckets one source (exact points up to
`points`, else `points` buckets, each at its last step) and smooths it with the same debiased, step-aware EMA on
the full-resolution mean: zoom never changes a smoothed value. The band is the min and max over every source and
every step of the bucket, so no rank's spike is hidden. The sources farthest from the mean in the range are named
(`outliers`), so the page can draw them on top. Non-finite values never enter mean, min or max; they are listed
with their source.

Incremental: a selection's fold is kept as running per-step sums (`_Running`: count, min, max, and exact sums of the
values and of their wall times, as base 2**32 digits, `_Exact`), and each fold adds only the points its series
gained since (they only grow; a source appearing later joins at the end), so a fold of 1,024 ranks x 2,000 steps
after one more step adds 1,024 points, not 2 M. The sums being exact, the order and grouping the points came in do
not matter: a fold kept as the run grew answers what a fold of every point at once does, to the bit (and the mean
is within an ulp or two of the exact mean). The outliers are the one part computed over every point at each fold
(each step's mean moves as points come), by a pass over the store's arrays in place, on the event loop.

numpy does the per-step folding (2 M points in a few hundred ms; the same in Python takes seconds); it is imported on
the first aggregate query only. The points a fold adds are copied from the store's columns through the buffer
protocol, on the event loop (`Points`: an `array` that exports a buffer cannot grow, and the tailer appends to them
between queries); they are folded in a worker thread (`AggregateCache.fold`), which the loop's other requests and
passes do not wait for.
"""

from __future__ import annotations

import asyncio
import math
import time
from bisect import bisect_left, bisect_right
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from mstail.parsers.record import finite_or_name

from .series import Series, finite_or_none, window

OUTLIERS_MAX = 3  # sources named as farthest from the mean
OUTLIER_FACTOR = 3.0  # ... only when their distance is this many times the typical source's (a healthy run: none)
NONFINITE_MAX = 300  # non-finite values listed (the newest), as the page draws at most this many per chart
T = TypeVar("T")


#: the one thread folds and heatmaps run in: each holds copies of every point of a metric (1,024 ranks x 2,000
#: steps: about 100 MB at its peak), and memory freed by many threads at once stays with the process
_WORKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mstail-fold")


class Turns:
    """Copies of series and the computations on them, one at a time: a copy is taken (on the event loop) when
    its turn comes, then computed in the fold thread. Several at once (a page's first screen asks for six folds
    and a heatmap together) held six copies and grew the sidecar's RSS by 700 MB for good."""

    def __init__(self, seq: Callable[[], int]) -> None:
        self._seq = seq  # the store's newest seq: what a copy holds
        self._lock: Optional[asyncio.Lock] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    async def run(self, series: Sequence[Tuple[str, Series]], function: Callable[..., T], *args: Any,
                  starts: Sequence[int] = ()) -> T:
        """`function(points, *args)` in the fold thread, `points` a copy of `series` (with the seq it holds), each
        from its point `starts[i]` (default 0) on."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a lock belongs to one loop (tests run several, one after another)
            self._lock, self._loop = asyncio.Lock(), loop
        async with self._lock:  # type: ignore[union-attr]
            points = Points(series, self._seq(), starts)
            return await loop.run_in_executor(_WORKER, function, points, *args)


class AggregateCache:
    """Folds of recent selections, each kept as a `_Running` fold that takes only the points its series gained
    since (they only grow; a selection's new sources come after its old ones), so zooming, re-drawing, the page's
    other charts and a first visit after a long catch-up read a fold without folding every point again. A fold
    is valid while its series have the same number of points. Bounded by CACHED_BYTES_MAX of folds in all
    (about 176 B a step and selection, sums and fold, whatever the number of sources: 1,024 ranks x 2,000 steps
    x 9 metrics, 3.2 MB)."""

    def __init__(self, turns: Turns) -> None:
        self._turns = turns
        self._folds: Dict[Any, "_Fold"] = {}
        self._running: Dict[Any, "_Running"] = {}  # the per-step sums behind each cached fold
        self._order: Dict[Any, None] = {}  # selections with a fold or running sums, least recently used first
        self._folding: Dict[Any, "asyncio.Future[_Fold]"] = {}  # folds under way, shared by callers

    async def fold(self, key: Any, series: Sequence[Tuple[str, Series]], fresh: bool = False) -> "_Fold":
        """The fold of `series` (the selection `key`): cached while they have not grown, else the points they
        gained folded into the selection's running sums from a copy in the fold thread (one fold per selection
        at a time: concurrent callers share it). A fold that took STALE_COST_S or more is still served for
        STALE_FOR_S after its copy was taken, however the series grew (its `seq` says what it holds; the page's
        stream brings the rest); `fresh` (default off): never. On the event loop."""
        version = sum(len(s) for _, s in series)
        fold = self._folds.get(key)
        if not fresh and fold is not None and fold.version < version and fold.cost >= STALE_COST_S \
                and time.monotonic() - fold.made < STALE_FOR_S:
            version = fold.version
        while fold is None or fold.version < version:
            under_way = self._folding.get(key)
            if under_way is None:
                under_way = self._start(key, series, True)
            fold = await asyncio.shield(under_way)
            if fold is None:  # that was `advance` (no fold taken): now take one
                continue
            known = self._folds.get(key)
            if known is not None and known.version > fold.version:
                fold = known  # a newer fold was stored meanwhile
            version = fold.version  # what it holds is what the series held when its turn came: current enough
        self._folds.pop(key, None)
        self._folds[key] = fold  # most recently used last
        self._used(key)
        return fold

    def behind(self, key: Any, series: Sequence[Tuple[str, Series]]) -> int:
        """How many points of `series` the selection's running sums do not hold yet."""
        running = self._running.get(key)
        held = sum(running.lengths) if running is not None and running.extends(series) else 0
        return sum(len(s) for _, s in series) - held

    async def advance(self, key: Any, series: Sequence[Tuple[str, Series]]) -> float:
        """Fold what `series` gained into the selection's running sums without taking a fold (no outliers: their
        pass reads every point), so a fold asked later folds only what came after (a live run's first visit;
        `Store.keep_folds_warm`). Returns the seconds it took (0 when a fold of the selection was under way)."""
        if key in self._folding:
            return 0.0
        began = time.perf_counter()
        await asyncio.shield(self._start(key, series, False))
        self._used(key)
        return time.perf_counter() - began

    def _start(self, key: Any, series: Sequence[Tuple[str, Series]], take: bool) -> "asyncio.Future[Optional[_Fold]]":
        under_way = self._folding[key] = asyncio.ensure_future(self._fold(key, series, take))
        under_way.add_done_callback(lambda _, k=key: self._folding.pop(k, None))
        return under_way

    async def _fold(self, key: Any, series: Sequence[Tuple[str, Series]], take: bool) -> "Optional[_Fold]":
        """Bring the selection's running sums up to `series` (as they are when its turn comes) and, if `take`,
        take its fold."""
        running = self._running.get(key)
        if running is None or not running.extends(series):
            running = _Running()  # new, or its sources are not those folded (a restart of the selection)
        try:
            fold = await self._turns.run(series, running.add, take, starts=running.lengths)
        except BaseException:
            self._running.pop(key, None)  # half folded: folded again from the start when asked
            raise
        self._running[key] = running
        if fold is not None:
            fold.outliers = _outliers(series, running.lengths, fold)  # on the loop: reads the store's arrays
            fold.cost = time.perf_counter() - fold.began
        return fold

    def _used(self, key: Any) -> None:
        """`key` used last; the least recently used selections dropped beyond CACHED_BYTES_MAX."""
        self._order.pop(key, None)
        self._order[key] = None
        cached = sum(self._bytes(k) for k in self._order)
        while cached > CACHED_BYTES_MAX and len(self._order) > 1:
            oldest = next(iter(self._order))
            cached -= self._bytes(oldest)
            del self._order[oldest]
            self._folds.pop(oldest, None)
            self._running.pop(oldest, None)

    def _bytes(self, key: Any) -> int:
        fold, running = self._folds.get(key), self._running.get(key)
        return (fold.nbytes if fold is not None else 0) + (running.nbytes if running is not None else 0)

    def age(self, key: Any, series: Sequence[Tuple[str, Series]]) -> Optional[float]:
        """Seconds since the copy behind the cached fold of `series` (the selection `key`) was taken; None when
        that fold holds them as they are now, infinity when there is none."""
        fold = self._folds.get(key)
        if fold is None:
            return float("inf")
        return None if fold.version >= sum(len(s) for _, s in series) else time.monotonic() - fold.made


CACHED_BYTES_MAX = 128 << 20
STALE_COST_S = 0.05  # folds that took this long or longer may be served ...
STALE_FOR_S = 5.0  # ... this long after their copy was taken, while a newer one is made (Store.keep_folds_warm)


def aggregate(fold: "_Fold", start: Optional[int], end: Optional[int], points: int, smooth: float) -> Dict[str, Any]:
    """The mean of a fold's series between steps `start` and `end` (inclusive; None = open), as `points` buckets
    at most.

    Returns `{"sources", "x", "t", "mean", "min", "max", "n", "nonfinite", "outliers"}` plus `smooth` (and
    `smooth_state` when the answer reaches the newest step) for `smooth` in (0, 1): `mean` is the mean at each
    x (a bucket's last step), `min`/`max` the band over the bucket, `n` how many sources logged a finite value
    at x, `t` the mean wall time at x; `nonfinite` lists `x`, `source`, `value` (the newest NONFINITE_MAX in the
    range); `outliers` up to three source ids, farthest from the mean over the whole run first."""
    import numpy as np

    entry = window(fold.mean, start, end, points, smooth)
    out: Dict[str, Any] = {"sources": len(fold.sources), "x": entry["x"], "t": entry["t"], "mean": entry["last"],
                           "min": [], "max": [], "n": [], "nonfinite": fold.nonfinite(start, end),
                           "outliers": fold.outliers}
    if not entry["x"]:
        return out
    steps = fold.steps
    ends = np.searchsorted(steps, np.asarray(entry["x"], dtype=np.int64))
    first = int(np.searchsorted(steps, steps[0] if start is None else start))
    starts = np.concatenate(([first], ends[:-1] + 1))
    stop = int(ends[-1]) + 1  # reduceat's last bucket would run to the end of the array
    out["min"] = [finite_or_none(v) for v in np.minimum.reduceat(fold.low[:stop], starts).tolist()]
    out["max"] = [finite_or_none(v) for v in np.maximum.reduceat(fold.high[:stop], starts).tolist()]
    out["n"] = fold.count[ends].tolist()
    if "smooth" in entry:
        out["smooth"] = entry["smooth"]
        if "smooth_state" in entry and (end is None or end >= fold.newest):  # the answer reaches the newest step
            out["smooth_state"] = entry["smooth_state"]
    return out


class _Fold:
    """Every point of some series folded per step (what any range of their aggregate reads): `steps` (those with
    a finite value), `mean` (a `Series`, so `window` buckets and smooths it), `low`, `high`, `count`, the
    non-finite values, and the outliers over the whole run (`_outliers`, set on the loop). Taken from a
    `_Running` fold in the fold thread; `version` (points folded), `seq` and `made` say what it holds."""

    def __init__(self, running: "_Running", points: "Points", began: float) -> None:
        np = running.np
        self.began = began  # when its fold began (`cost`: the seconds it took, serving it stale saves)
        self.version, self.seq, self.made = sum(running.lengths), points.seq, points.made
        self.sources = sorted(running.sources)
        self.newest = 0 if running.newest is None else running.newest
        self.steps, self.count = running.steps.copy(), running.count.copy()
        self.low, self.high = running.low.copy(), running.high.copy()
        self.means = running.sums.total() / self.count
        when = np.full(len(self.steps), np.nan)
        timed = running.timed > 0
        when[timed] = running.times.total()[timed] / running.timed[timed]
        self.mean = Series()
        self.mean.steps.frombytes(self.steps.tobytes())
        self.mean.values.frombytes(self.means.tobytes())
        self.mean.times.frombytes(when.tobytes())
        bad = sorted(running.bad)  # by step, then as a fold of every point at once lists them
        self._bad = ([b[0] for b in bad], [running.sources[b[3]] for b in bad], [finite_or_name(b[4]) for b in bad])
        self.outliers: List[str] = []
        self.cost = 0.0
        self.nbytes = 8 * 9 * len(self.steps) + 100 * len(bad)  # its arrays and its mean's `Series`

    def nonfinite(self, start: Optional[int], end: Optional[int]) -> Dict[str, List[Any]]:
        """The newest NONFINITE_MAX non-finite values between `start` and `end`, by step."""
        steps, sources, values = self._bad
        lo = 0 if start is None else bisect_left(steps, start)
        hi = len(steps) if end is None else bisect_right(steps, end)
        lo = max(lo, hi - NONFINITE_MAX)
        return {"x": steps[lo:hi], "source": sources[lo:hi], "value": values[lo:hi]}


#: what a double's lowest bit (2**-1074, a 53-bit mantissa's bit 52) is as a digit's bit in `_Exact`
_BIT0 = 1126
_DIGIT = 0xFFFFFFFF
_EXACT_CHUNK = 1 << 20  # values added at once: their float sums of 33-bit parts stay exact


def _column(magnitude: float) -> int:
    """The `_Exact` column of a positive value's lowest mantissa bit."""
    return (math.frexp(magnitude)[1] + (_BIT0 - 53)) >> 5


class _Exact:
    """Exact sums of float64 values, one per row: base 2**32 digits in int64 columns (column j weighs
    2**(32 * (lo + j) - _BIT0)), kept normalised (every column but the top one in [0, 2**32)). Whatever the order
    and grouping the values came in, the digits are the same, and so is `total()`: a fold taken in pieces as the
    run grows equals one of every point at once. A value adds to 3 digits; a sum of values of the same
    magnitude (a metric's) spans 4 to 6 columns (32 to 48 bytes a row)."""

    def __init__(self, np: Any) -> None:
        self.np = np
        self.digits = np.zeros((0, 0), np.int64)
        self.lo = 0

    @property
    def nbytes(self) -> int:
        return int(self.digits.nbytes)

    def rows(self, size: int, moved: Any) -> None:
        """`size` rows, row i of before at row `moved[i]`, the others zero."""
        grown = self.np.zeros((size, self.digits.shape[1]), self.np.int64)
        grown[moved] = self.digits
        self.digits = grown

    def add(self, rows: Any, values: Any) -> None:
        """Add each of `values` (finite float64) to its row in `rows`."""
        for at in range(0, len(values), _EXACT_CHUNK):
            self._add(rows[at:at + _EXACT_CHUNK], values[at:at + _EXACT_CHUNK])

    def _add(self, rows: Any, values: Any) -> None:
        np = self.np
        keep = values != 0
        if not keep.all():
            rows, values = rows[keep], values[keep]
        if not len(values):
            return
        # value = mantissa * 2**(exponent - 53): its bit 0 is bit `exponent + 1073` of the digits (>= 0), in
        # column `bit // 32`; scaled to that column's unit it is an integer below 2**85 (exact as a float), whose
        # three base 2**32 digits are cut off by floor (exact too: each holds some of its 53 bits)
        sign = np.sign(values)
        magnitude = np.abs(values)  # the cuts below need no borrow
        smallest, largest = _column(float(magnitude.min())), _column(float(magnitude.max()))
        if smallest == largest:  # the usual case (a metric's values, wall times): one column for all, no per-value one
            column: Any = smallest
            scaled = np.ldexp(magnitude, _BIT0 - 32 * smallest)
        else:
            column = (np.frexp(magnitude)[1].astype(np.int64) + (_BIT0 - 53)) >> 5
            scaled = np.ldexp(magnitude, _BIT0 - 32 * column)
        top = np.floor(scaled * 2.0 ** -64)
        rest = scaled - top * 2.0 ** 64
        middle = np.floor(rest * 2.0 ** -32)
        self._span(smallest, largest + 4)  # the values' 3 digits and one for carries
        width = self.digits.shape[1]
        flat = self.digits.reshape(-1)
        at = rows * width + (column - self.lo)
        first = int(at.min())
        at -= first
        span = int(at.max()) + 3
        for j, part in enumerate((rest - middle * 2.0 ** 32, middle, top)):
            # float sums of parts below 2**33 are exact up to 2**20 of them a digit (`add` takes at most 2**20)
            flat[first:first + span] += np.bincount(at + j, part * sign, minlength=span).astype(np.int64)
        self._normalise(self.digits)

    def total(self) -> Any:
        """Each row's sum as a float64: the digits of its magnitude added from the top one down (within 1 ulp of the
        exact sum; zeros add nothing, so the columns' span does not matter)."""
        np = self.np
        rows = self.digits.shape[0]
        if not self.digits.shape[1]:
            return np.zeros(rows)
        digits = self.digits.copy()
        negative = digits[:, -1] < 0
        digits[negative] = -digits[negative]
        self._normalise(digits)
        out = np.zeros(rows)
        with np.errstate(over="ignore"):  # a sum beyond the float range: infinity, as adding the values gives
            for j in range(digits.shape[1] - 1, -1, -1):
                out += np.ldexp(digits[:, j].astype(np.float64), 32 * (self.lo + j) - _BIT0)
        out[negative] = -out[negative]
        return out

    def _span(self, first: int, end: int) -> None:
        """Columns for digits `first` to `end` (exclusive) at least."""
        width = self.digits.shape[1]
        if width and first >= self.lo and end <= self.lo + width:
            return
        lo, hi = (first, end) if not width else (min(first, self.lo), max(end, self.lo + width))
        wider = self.np.zeros((self.digits.shape[0], hi - lo), self.np.int64)
        wider[:, self.lo - lo:self.lo - lo + width] = self.digits
        self.digits, self.lo = wider, lo

    @staticmethod
    def _normalise(digits: Any) -> None:
        for j in range(digits.shape[1] - 1):
            carry = digits[:, j] >> 32
            digits[:, j] -= carry << 32
            digits[:, j + 1] += carry


class _Running:
    """A selection's points folded per step so far: the steps with a finite value (ascending), their count, min
    and max, the exact sums of the values and of their wall times (`_Exact`), the non-finite values, the newest
    step, and the series folded with how many points of each (`lengths`). The points a series gains are
    folded in as they are (`add`, in the fold thread, one fold at a time), and what it holds is what a fold of
    every point at once gives (tests/web/test_api_aggregate.py). Memory: about 104 bytes a step (digits of 4
    columns)."""

    def __init__(self) -> None:
        import numpy as np

        self.np = np
        self.series: List[Tuple[str, Series]] = []
        self.lengths: List[int] = []
        self.sources: List[str] = []
        self.steps = np.zeros(0, np.int64)
        self.count = np.zeros(0, np.int64)
        self.timed = np.zeros(0, np.int64)  # values with a finite wall time
        self.low = np.zeros(0)
        self.high = np.zeros(0)
        self.sums, self.times = _Exact(np), _Exact(np)
        self.newest: Optional[int] = None
        self.bad: List[Tuple[int, int, int, int, float]] = []  # (step, series, point, source, value), non-finite

    @property
    def nbytes(self) -> int:
        return 40 * len(self.steps) + self.sums.nbytes + self.times.nbytes + 100 * len(self.bad)

    def extends(self, series: Sequence[Tuple[str, Series]]) -> bool:
        """Are the series folded the first of `series` (the selection only gained sources)?"""
        return len(series) >= len(self.series) and all(
            a[0] == b[0] and a[1] is b[1] for a, b in zip(self.series, series))

    def add(self, points: "Points", take: bool = True) -> Optional[_Fold]:
        """Fold in `points` (the points the series gained since the last `add`) and, if `take`, take the fold."""
        began = time.perf_counter()
        np = self.np
        self.series, self.lengths, self.sources = points.series, points.ends, points.sources
        steps, values, times = points.steps, points.values, points.times
        if len(steps):
            newest = int(steps.max())
            self.newest = newest if self.newest is None else max(self.newest, newest)
        finite = np.isfinite(values)
        if not finite.all():  # the usual case skips this: no copies of 2 M points through a mask
            self._nonfinite(points, np.flatnonzero(~finite))
            steps, values, times = steps[finite], values[finite], times[finite]
        if len(steps):
            distinct, index = step_index(steps, np)
            row = self._rows(distinct)[index]
            size = len(self.steps)
            self.count += np.bincount(row, minlength=size)
            np.minimum.at(self.low, row, values)
            np.maximum.at(self.high, row, values)
            self.sums.add(row, values)
            timed = np.isfinite(times)
            if not timed.all():
                row, times = row[timed], times[timed]
            self.timed += np.bincount(row, minlength=size)
            self.times.add(row, times)
        return _Fold(self, points, began) if take else None

    def _nonfinite(self, points: "Points", bad: Any) -> None:
        offsets = [0]
        for count in points.counts:
            offsets.append(offsets[-1] + count)
        which = self.np.searchsorted(self.np.asarray(offsets), bad, side="right") - 1
        for i, k in zip(bad.tolist(), which.tolist()):
            self.bad.append((int(points.steps[i]), k, points.starts[k] + i - offsets[k], int(points.owner[i]),
                             float(points.values[i])))

    def _rows(self, distinct: Any) -> Any:
        """Rows for the steps `distinct` (ascending): the rows of those already held, new ones in step order for
        the others; returns the row of each."""
        np = self.np
        held = self.steps
        if not len(held):
            merged = distinct
        elif distinct[0] > held[-1]:  # the usual case: the run moved on
            merged = np.concatenate((held, distinct))
        else:  # a source behind the others, or an amend adding a metric to an old step
            merged = np.union1d(held, distinct)
        if len(merged) != len(held):
            size, moved = len(merged), np.searchsorted(merged, held)

            def grown(column: Any, fill: Any) -> Any:
                out = np.full(size, fill, column.dtype)
                out[moved] = column
                return out

            self.count, self.timed = grown(self.count, 0), grown(self.timed, 0)
            self.low, self.high = grown(self.low, np.inf), grown(self.high, -np.inf)
            self.sums.rows(size, moved)
            self.times.rows(size, moved)
            self.steps = merged
        return np.searchsorted(self.steps, distinct)


class Points:
    """Every point of the series in flat numpy arrays (copies, so a worker thread may read them while the store
    grows): `steps`, `values`, `times`, and `owner`, the index in `sources` of the source each point belongs to;
    `seq`, the store's seq when they were copied. With `starts`, series i from its point `starts[i]` on (what it
    gained since a fold: `counts[i]` points, up to `ends[i]`)."""

    def __init__(self, series: Sequence[Tuple[str, Series]], seq: int = 0, starts: Sequence[int] = ()) -> None:
        import numpy as np

        self.seq = seq  # the store's newest seq when the copy was taken (what it holds)
        self.made = time.monotonic()  # when
        self.series = list(series)
        self.ends = [len(s) for _, s in series]
        self.starts = [starts[i] if i < len(starts) else 0 for i in range(len(self.series))]
        self.counts = [end - start for start, end in zip(self.starts, self.ends)]

        self.sources: List[str] = []
        index: Dict[str, int] = {}
        for source, _ in series:
            if source not in index:
                index[source] = len(self.sources)
                self.sources.append(source)

        def column(name: str, dtype: Any) -> Any:
            # np.concatenate copies: the views on the store's arrays end with this call
            parts = [np.frombuffer(getattr(s, name), dtype=dtype)[start:end]
                     for (_, s), start, end in zip(series, self.starts, self.ends)]
            return np.concatenate(parts) if parts else np.zeros(0, dtype)

        self.steps = column("steps", np.int64)
        self.values = column("values", np.float64)
        self.times = column("times", np.float64)
        self.owner = np.repeat(np.array([index[source] for source, _ in series], dtype=np.int64), self.counts)


def step_index(steps: Any, np: Any) -> Tuple[Any, Any]:
    """The distinct values of `steps` (a non-empty int64 array), ascending, and each step's index in them. A dense
    step range (the usual case) is indexed through a table by step, without sorting 2 M points."""
    base, span = int(steps.min()), int(steps.max()) - int(steps.min()) + 1
    if span > max(4 * len(steps), 1 << 20):  # sparse steps: sort
        return np.unique(steps, return_inverse=True)
    offset = steps - base
    present = np.zeros(span, dtype=bool)
    present[offset] = True
    index_of = np.cumsum(present) - 1
    return np.flatnonzero(present) + base, index_of[offset]


def _outliers(series: Sequence[Tuple[str, Series]], lengths: Sequence[int], fold: _Fold) -> List[str]:
    """Up to OUTLIERS_MAX sources whose mean distance from the mean (over their finite values among the first
    `lengths` points of each series: those in `fold`) is at least OUTLIER_FACTOR times the median source's,
    farthest first. On the event loop: it reads the store's arrays in place (a pass over every point, 20-50 ms
    at 1,024 ranks x 2,000 steps: the one part of a fold that is not incremental, as each step's mean moves)."""
    import numpy as np

    total: Dict[str, float] = {}
    n: Dict[str, int] = {}
    if not len(fold.steps):
        return []
    base, span = int(fold.steps[0]), int(fold.steps[-1]) - int(fold.steps[0]) + 1
    table = None
    if span <= max(4 * len(fold.steps), 1 << 16):  # dense steps (the usual case): a step's row looked up, not searched
        table = np.zeros(span, np.int64)
        table[fold.steps - base] = np.arange(len(fold.steps))
    for (source, s), length in zip(series, lengths):
        values = np.frombuffer(s.values, np.float64, length)
        steps = np.frombuffer(s.steps, np.int64, length)
        finite = np.isfinite(values)
        if not finite.all():
            values, steps = values[finite], steps[finite]
        rows = np.searchsorted(fold.steps, steps) if table is None else table[steps - base]
        distance = np.abs(values - fold.means[rows])
        del values, steps  # the views: the store's arrays may grow again
        if len(distance):
            total[source] = total.get(source, 0.0) + float(distance.sum())
            n[source] = n.get(source, 0) + len(distance)
    if len(n) < 3:
        return []
    scores = [(total[source] / count, source) for source, count in n.items()]
    typical = float(np.median([score for score, _ in scores]))
    ranked = sorted((-score, source) for score, source in scores)
    return [source for score, source in ranked[:OUTLIERS_MAX] if -score > 0 and -score >= OUTLIER_FACTOR * typical]
