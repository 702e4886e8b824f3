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

numpy does the per-step folding (2 M points in tens of ms; the same in Python takes seconds; a step logged by one
point only, as one source's, takes no sums at all); it is imported by the first query, in the query thread. The
store's columns are counted on the event loop and copied a slice at a time in the query thread (`Points`: a numpy
view would stop the `array` growing, and the tailer appends to them meanwhile), where the fold of that copy runs
too (`AggregateCache.fold`: 1,024 ranks x 2,000 steps take 0.3-1 s on a loaded machine, which the loop's other
requests and passes do not wait for). A fold of series that
grew is made from the one before and a copy of their last steps only (`Points` with `after`): the per-step sums of
the steps before the first one a series grew at do not change, so a live run's fold costs its new steps (1,024
ranks: a few ms), not its history (at 10,000 steps every fold copied and folded 10 M points: 0.4 s).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import threading
import time
from bisect import bisect_left, bisect_right
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from mstail.parsers.record import finite_or_name

from mstail.tailer.history.series import Series, column_copy, finite_or_none, window

OUTLIERS_MAX = 3  # sources named as farthest from the mean
OUTLIERS_MIN = 3  # ... among this many sources with a value at least
OUTLIER_FACTOR = 3.0  # ... only when their distance is this many times the typical source's (a healthy run: none)
NONFINITE_MAX = 300  # non-finite values listed (the newest), as the page draws at most this many per chart
T = TypeVar("T")


#: the one thread the charts' maths runs in (folds, heatmaps, windows and smoothing: `in_query_thread`), never the
#: event loop's: a fold holds copies of every point of a metric (1,024 ranks x 2,000 steps: about 100 MB at its
#: peak), and memory freed by many threads at once stays with the process (what one thread keeps is given back when
#: it is idle: `_Waiting`); one thread also keeps the loop's share of the GIL, and extends the series' EMA states
#: alone (`series`)
_WORKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mstail-query", initializer=lambda: _yield_to_loop())


def _yield_to_loop() -> None:
    """The query thread at QUERY_NICE above the process's nice (Linux: a thread's own): the event loop's thread
    goes first when both want a core."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + QUERY_NICE)
    except (AttributeError, OSError):  # no per-thread priorities here
        pass


QUERY_NICE = 5


async def in_query_thread(function: Callable[..., T], *args: Any) -> T:
    """`function(*args)` in the query thread, after the questions asked before it (in their order)."""
    future = _WORKER.submit(function, *args)
    _WAITING.add(future)
    return await asyncio.wrap_future(future)


class _Waiting:
    """The questions handed to the query thread and not yet answered (or dropped): once none was left for
    GIVE_BACK_AFTER_S, the thread gives the memory its allocator kept from their copies back to the system
    (`_give_back`). Without that, the freed copies of 40 queries over 1 M points stayed in the sidecar's RSS
    (+270 MB) for good; given back after each question, the next one paid for the pages again (page faults: a
    third of a query's CPU)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._asked = 0  # questions so far: a give-back waits for none to come meanwhile

    def add(self, future: "Future[Any]") -> None:
        with self._lock:
            self._count += 1
            self._asked += 1
        future.add_done_callback(self._done)

    def _done(self, _: "Future[Any]") -> None:
        with self._lock:
            self._count -= 1
            idle, asked = self._count == 0, self._asked
        if idle:
            timer = threading.Timer(GIVE_BACK_AFTER_S, self._give_back_if_idle, (asked,))
            timer.daemon = True
            timer.start()

    def _give_back_if_idle(self, asked: int) -> None:
        with self._lock:
            if self._count or self._asked != asked:
                return
        try:
            _WORKER.submit(_give_back)
        except RuntimeError:  # the interpreter is shutting the thread down
            pass


GIVE_BACK_AFTER_S = 1.0


_WAITING = _Waiting()


def _give_back() -> None:
    """glibc's `malloc_trim(0)`: the free memory of every arena (the query thread's own, where its copies were made)
    returned to the system. Elsewhere (another C library) nothing."""
    global _TRIM
    if _TRIM is None:
        _TRIM = _malloc_trim()
    _TRIM()


def _malloc_trim() -> Callable[[], Any]:
    try:
        if not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
            return lambda: None
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (AttributeError, OSError, ValueError):  # no confstr, no glibc, no malloc_trim
        return lambda: None
    trim.argtypes = [ctypes.c_size_t]
    return lambda: trim(0)


_TRIM: Optional[Callable[[], Any]] = None


class Turns:
    """Copies of series and the computations on them, one at a time: the series' lengths are taken (on the event
    loop) when its turn comes, then the copy of those points is made and computed in the query thread. Several at
    once (a page's first screen asks for six folds and a heatmap together) held six copies and grew the sidecar's
    RSS by 700 MB for good."""

    def __init__(self, seq: Callable[[], int]) -> None:
        self._seq = seq  # the store's newest seq: what a copy holds
        self._lock: Optional[asyncio.Lock] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    async def run(self, series: Sequence[Tuple[str, Series]], function: Callable[..., T], *args: Any,
                  after: Optional["_Fold"] = None) -> T:
        """`function(points, *args)` in the query thread, `points` a copy of `series` (with the seq it holds): of
        what `after`, a fold of the same series (default None: none), lacks where it can be grown (`Points`)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a lock belongs to one loop (tests run several, one after another)
            self._lock, self._loop = asyncio.Lock(), loop
        async with self._lock:  # type: ignore[union-attr]  # made just above
            lengths = tuple(len(s) for _, s in series)
            return await in_query_thread(_on_copy, function, series, self._seq(), after, lengths, *args)


def _on_copy(function: Callable[..., T], series: Sequence[Tuple[str, Series]], seq: int, after: Optional["_Fold"],
             lengths: Sequence[int], *args: Any) -> T:
    """`function(points, *args)`, `points` the copy (`Points`) of the first `lengths` points of `series`."""
    return function(Points(series, seq, after, lengths), *args)


class AggregateCache:
    """Folds of recent selections, each valid while its series have the same number of points (they only grow),
    so zooming, re-drawing and the page's other charts re-use one fold (and its mean's EMA states).
    Bounded by FOLDS_BYTES_MAX bytes of folds in all (`_Fold.nbytes`, about 48 bytes a step: 1,024 ranks x 2,000
    steps, 0.1 MiB a fold; a fold of more steps than fit, 1 M steps, is made for its question and not kept)."""

    def __init__(self, turns: Turns) -> None:
        self._turns = turns
        self._folds: Dict[Any, "_Fold"] = {}
        self._folding: Dict[Any, "asyncio.Future[_Fold]"] = {}  # folds under way, shared by callers
        self._unkept: Dict[Any, int] = {}  # selection -> version of its fold, made but too big to keep

    async def fold(self, key: Any, series: Sequence[Tuple[str, Series]], fresh: bool = False) -> "_Fold":
        """The fold of `series` (the selection `key`): cached while they have not grown, else folded from a copy
        in the query thread (one fold per selection at a time: concurrent callers share it), the cached fold grown
        by what it lacks where it can be (`Points`: a live run's fold costs its new steps, not its history). A
        fold that took STALE_COST_S or more is still served for STALE_FOR_S after its copy was taken, however the
        series grew (its `seq` says what it holds; the page's stream brings the rest): a live run of 1,024 ranks
        would otherwise make every visit and zoom wait for a fold; `fresh` (default off): never. On the event
        loop."""
        version = sum(len(s) for _, s in series)
        fold = self._folds.get(key)
        if not fresh and fold is not None and fold.version < version and fold.cost >= STALE_COST_S \
                and time.monotonic() - fold.made < STALE_FOR_S:
            version = fold.version
        while fold is None or fold.version < version:
            under_way = self._folding.get(key)
            if under_way is None:
                under_way = self._folding[key] = asyncio.ensure_future(
                    self._turns.run(series, _Fold, after=self._folds.get(key)))
                under_way.add_done_callback(lambda _, k=key: self._folding.pop(k, None))  # type: ignore[misc]  # its default
            fold = await asyncio.shield(under_way)
            known = self._folds.get(key)
            if known is not None and known.version > fold.version:
                fold = known  # a newer fold was stored meanwhile
            version = fold.version  # what it holds is what the series held when its turn came: current enough
        self._folds.pop(key, None)
        self._folds[key] = fold  # most recently used last
        cached = sum(f.nbytes for f in self._folds.values())
        while cached > FOLDS_BYTES_MAX and self._folds:
            oldest = next(iter(self._folds))
            cached -= self._folds.pop(oldest).nbytes
        if key not in self._folds:
            self._unkept.pop(key, None)
            self._unkept[key] = fold.version
            while len(self._unkept) > UNKEPT_MAX:
                del self._unkept[next(iter(self._unkept))]
        return fold

    def age(self, key: Any, series: Sequence[Tuple[str, Series]]) -> Optional[float]:
        """Seconds since the copy behind the cached fold of `series` (the selection `key`) was taken; None when
        that fold holds them as they are now (or was made of them as they are now, too big to keep), infinity when
        there is none."""
        fold = self._folds.get(key)
        version = sum(len(s) for _, s in series)
        if fold is None:
            return None if self._unkept.get(key) == version else float("inf")
        return None if fold.version >= version else time.monotonic() - fold.made


FOLDS_BYTES_MAX = 32 << 20
UNKEPT_MAX = 64  # selections whose fold was too big to keep, remembered (so the warmer does not fold them again)
FEW_POINTS = 64  # points a series copied at most, on average, for which slices joined beat numpy (`Points`)
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
    non-finite values, and the outliers over the whole run.

    Made from a copy of every point, or grown from the fold a copy extends (`Points.base`): its steps before the
    copy's `cut` kept, those after folded from the copy, which holds every point at them. The per-step sums,
    extremes and counts are then those of the same points in the same order, so the same numbers as a fold of
    everything; the sources' distance sums (the outliers) are the base's with its points at those steps taken out
    and the copy's put in (equal up to rounding)."""

    # numpy arrays (numpy is imported where a fold is made), declared for the base a fold grows from
    steps: Any
    low: Any
    high: Any
    count: Any
    distance: Any
    counted: Any
    mean: Series

    def __init__(self, points: "Points") -> None:
        import numpy as np

        began = time.perf_counter()
        self.lengths = points.lengths  # each series' points folded: what the next copy starts after
        self.version, self.seq, self.made = sum(points.lengths), points.seq, points.made  # seq, time of the copy
        self.copied = len(points.steps)  # the points copied for it (all of them, or those a grown fold needed)
        self.sources = sorted(points.sources)
        steps, mean, low, high, count, when, position = _per_step(points, np)
        size = len(points.sources)
        distance, counted = _distances(points.values, points.owner, mean, position, size, np)
        bad = _nonfinite(points, np)
        base = points.base
        if base is None:
            self.ascending = _ascending(points.steps, points.lengths, np)  # a later copy may extend this fold
            self.newest = int(points.steps.max()) if len(points.steps) else 0
        else:  # the steps before the cut as the base has them, the others from the copy
            keep = int(np.searchsorted(base.steps, points.cut))
            base_mean, base_when = base.mean.values, base.mean.times
            steps, mean, low, high, count, when = (
                np.concatenate((old[:keep], new)) for old, new in
                zip((base.steps, base_mean, base.low, base.high, base.count, base_when),
                    (steps, mean, low, high, count, when)))
            held = points.held  # the base's points in the copy: their distances to the base's mean taken out
            gone, gone_counted = _distances(points.values[held], points.owner[held], base_mean,
                                            np.searchsorted(base.steps, points.steps[held]), size, np)
            distance = base.distance - gone + distance
            counted = base.counted - gone_counted + counted
            kept = bisect_left(base.bad[0], points.cut)
            bad = (base.bad[0][:kept] + bad[0], base.bad[1][:kept] + bad[1], base.bad[2][:kept] + bad[2])
            self.ascending = True  # the copy was checked (`Points`)
            self.newest = max(base.newest, int(points.steps.max()))
        self.steps, self.low, self.high, self.count = steps, low, high, count
        # numpy columns (`series.window` reads those too): the mean never grows, a fold is made again
        self.mean = Series(steps=steps, values=mean, times=when)
        self.distance, self.counted = distance, counted  # per source (in `points.sources` order): what grows them
        self.outliers = _outliers(points.sources, distance, counted, np)
        self.bad: Tuple[List[int], List[str], List[Any]] = bad  # the non-finite values' steps, sources, values
        self.cost = time.perf_counter() - began  # seconds the fold took (what serving it stale saves)
        arrays = {id(a): a.nbytes for a in (steps, mean, low, high, count, when, distance, counted)}  # (some shared)
        self.nbytes = sum(arrays.values()) + 100 * len(bad[0])  # and the non-finite values listed

    def nonfinite(self, start: Optional[int], end: Optional[int]) -> Dict[str, List[Any]]:
        """The newest NONFINITE_MAX non-finite values between `start` and `end`, by step."""
        steps, sources, values = self.bad
        lo = 0 if start is None else bisect_left(steps, start)
        hi = len(steps) if end is None else bisect_right(steps, end)
        lo = max(lo, hi - NONFINITE_MAX)
        return {"x": steps[lo:hi], "source": sources[lo:hi], "value": values[lo:hi]}


class Points:
    """Points of the series in flat numpy arrays (copies of the first `lengths` points of each, default every one,
    made a slice at a time, `series.column_copy`, so the copy may be made in the query thread while the store grows):
    `steps`, `values`, `times`, and `owner`, the index in `sources` of the source each point belongs to; `seq`, the
    store's seq when their lengths were taken; `lengths`.

    Every point, or with `after` (a fold of the same series; default None) only what a fold grown from it needs:
    `base` is then `after`, and the copy holds every point at or after `cut`, the lowest step a series grew at
    (the new points, and the base's at those steps: `held`). A live run's copy is then its last steps, not its
    history. Every point is copied (`base` None) when `after` cannot be grown: other series, one shorter, none
    grown, or steps that go back within a series (points below the cut could then be new)."""

    def __init__(self, series: Sequence[Tuple[str, Series]], seq: int = 0, after: Optional[_Fold] = None,
                 lengths: Optional[Sequence[int]] = None) -> None:
        import numpy as np

        self.seq = seq  # the store's newest seq when the lengths were taken (what the copy holds)
        self.made = time.monotonic()  # when
        self.lengths = tuple(len(s) for _, s in series) if lengths is None else tuple(lengths)

        self.sources: List[str] = []
        index: Dict[str, int] = {}
        for source, _ in series:
            if source not in index:
                index[source] = len(self.sources)
                self.sources.append(source)
        owners = np.array([index[source] for source, _ in series], dtype=np.int64)

        self.base, self.cut = after, 0
        starts = self._grown_from(series, after)
        if starts is not None:
            self._copy(series, starts, owners, np)
            if _ascending(self.steps, [n - start for n, start in zip(self.lengths, starts)], np):
                # each series' first points in the copy (its length in the base less its start) are the base's
                copied = np.array(self.lengths, dtype=np.int64) - np.array(starts, dtype=np.int64)
                before = np.array(after.lengths, dtype=np.int64) - np.array(starts, dtype=np.int64)  # type: ignore[union-attr]  # a fold grows from `after`
                first = np.repeat(np.cumsum(copied) - copied, copied)
                self.held = np.arange(len(self.steps)) - first < np.repeat(before, copied)
                return
        self.base = None
        self._copy(series, [0] * len(series), owners, np)
        self.held = None  # (no base)

    def _grown_from(self, series: Sequence[Tuple[str, Series]], after: Optional[_Fold]) -> Optional[List[int]]:
        """Each series' first index at or after the cut when `after` can be grown (setting `cut`), else None."""
        if after is None or not after.ascending or len(after.lengths) != len(series):
            return None
        firsts = []
        for (_, s), old, now in zip(series, after.lengths, self.lengths):
            if now < old:
                return None
            if now > old:
                firsts.append(s.steps[old])
        if not firsts:
            return None
        cut = self.cut = min(firsts)
        # (most series' points before their new ones are below the cut: no search)
        return [old if old == 0 or s.steps[old - 1] < cut else bisect_left(s.steps, cut, 0, old)
                for (_, s), old in zip(series, after.lengths)]

    def _copy(self, series: Sequence[Tuple[str, Series]], starts: Sequence[int], owners: Any, np: Any) -> None:
        """`steps`, `values`, `times` and `owner` of each series from its index in `starts` on."""
        counts = [n - start for n, start in zip(self.lengths, starts)]
        few = sum(counts) <= FEW_POINTS * len(series)

        def column(name: str, dtype: Any) -> Any:
            if few:  # a live run's last steps: slices of the arrays joined (numpy per series costs more than they do)
                return np.frombuffer(b"".join([getattr(s, name)[start:n] for (_, s), start, n
                                               in zip(series, starts, self.lengths)]), dtype=dtype)
            if len(series) == 1:
                return column_copy(getattr(series[0][1], name), starts[0], self.lengths[0], np)
            out, at = np.empty(sum(counts), dtype), 0
            for (_, s), start, n in zip(series, starts, self.lengths):
                out[at:at + n - start] = column_copy(getattr(s, name), start, n, np)
                at += n - start
            return out

        self.steps = column("steps", np.int64)
        self.values = column("values", np.float64)
        self.times = column("times", np.float64)
        self.owner = np.repeat(owners, counts)


def _ascending(steps: Any, lengths: Sequence[int], np: Any) -> bool:
    """Whether `steps`, series of `lengths` points one after another, never go back within a series."""
    back = np.flatnonzero(steps[1:] < steps[:-1]) + 1  # (a byte a point, where np.diff's steps take eight)
    return bool(np.isin(back, np.cumsum(lengths)).all())


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


def _per_step(points: Points, np: Any) -> Tuple[Any, ...]:
    """Per distinct step with at least one finite value: (steps, mean, min, max, count, mean time), and for each
    point its step's index in them (-1 for a non-finite value; None: each point's index, every one finite and a
    step of its own)."""
    finite = np.isfinite(points.values)
    if finite.all():  # the usual case: no copies of 2 M points through a mask
        steps, values, times = points.steps, points.values, points.times
    else:
        steps, values, times = points.steps[finite], points.values[finite], points.times[finite]
    if not len(steps):
        position = np.full(len(points.values), -1, dtype=np.int64)
        nothing = np.zeros(0)
        return np.zeros(0, np.int64), nothing, nothing, nothing, np.zeros(0, np.int64), nothing, position
    if bool((steps[1:] > steps[:-1]).all()):
        # one point a step (one series, or several one after another): each step's fold is its point (+ 0.0: as a
        # sum, never -0.0)
        distinct, mean, low, high, index = steps, values + 0.0, values, values, None
        count = np.ones(len(steps), np.int64)
        when = times if np.isfinite(times).all() else np.where(np.isfinite(times), times, np.nan)
    else:
        distinct, index = step_index(steps, np)
        distinct, mean, low, high, count, when = _sums(distinct, index, values, times, np)
    if len(steps) == len(points.values):  # every value finite: each point's position is its step's index
        position = index
    else:
        position = np.full(len(points.values), -1, dtype=np.int64)
        position[finite] = np.arange(len(steps)) if index is None else index
    return distinct, mean, low, high, count, when, position


def _sums(distinct: Any, index: Any, values: Any, times: Any, np: Any) -> Tuple[Any, ...]:
    """Per distinct step (`index`: each value's step in `distinct`): (steps, mean, min, max, count, mean time)."""
    size = len(distinct)
    count = np.bincount(index, minlength=size)
    total = np.bincount(index, weights=values, minlength=size)
    low = np.full(size, np.inf)
    high = np.full(size, -np.inf)
    np.minimum.at(low, index, values)
    np.maximum.at(high, index, values)
    timed = np.isfinite(times)
    if timed.all():  # the usual case again: every step with a finite value has a time
        time_total, time_count = np.bincount(index, weights=times, minlength=size), count
    else:
        time_total = np.bincount(index[timed], weights=times[timed], minlength=size)
        time_count = np.bincount(index[timed], minlength=size)
    when = np.full(size, np.nan)
    some = time_count > 0
    when[some] = time_total[some] / time_count[some]
    return distinct.astype(np.int64), total / count, low, high, count, when


def _distances(values: Any, owner: Any, mean: Any, position: Any, size: int, np: Any) -> Tuple[Any, Any]:
    """Per source (`owner` indexes `size` of them): the sum of |value - mean at its step| over its finite values
    (`position`: the index of each value's step in `mean`, anything at a non-finite value; None: each value's own
    index, every one finite) and how many. Zeros for fewer than OUTLIERS_MIN sources (none is ever an outlier, and
    a fold grown from this one has the same sources)."""
    if size < OUTLIERS_MIN:
        return np.zeros(size), np.zeros(size, dtype=np.int64)
    if position is None:
        gaps = np.abs(values - mean)
    else:
        finite = np.isfinite(values)
        if not finite.all():  # the usual case skips these copies of 2 M points through a mask
            values, owner, position = values[finite], owner[finite], position[finite]
        gaps = np.abs(values - mean[position])
    return np.bincount(owner, weights=gaps, minlength=size), np.bincount(owner, minlength=size)


def _outliers(sources: List[str], distance: Any, counted: Any, np: Any) -> List[str]:
    """Up to OUTLIERS_MAX `sources` whose mean distance from the mean (`distance` / `counted`: their sums over
    their finite values) is at least OUTLIER_FACTOR times the median source's, farthest first."""
    has = np.flatnonzero(counted)
    if len(has) < OUTLIERS_MIN:
        return []
    scores = distance[has] / counted[has]
    typical = float(np.median(scores))
    ranked = sorted(zip((-scores).tolist(), [sources[i] for i in has.tolist()]))
    return [source for score, source in ranked[:OUTLIERS_MAX] if -score > 0 and -score >= OUTLIER_FACTOR * typical]


def _nonfinite(points: Points, np: Any) -> Tuple[List[int], List[str], List[Any]]:
    """The non-finite values of `points` by step (in copy order within one): their steps, sources and values."""
    bad = np.flatnonzero(~np.isfinite(points.values))
    bad = bad[np.argsort(points.steps[bad], kind="stable")]
    return (points.steps[bad].tolist(), [points.sources[i] for i in points.owner[bad].tolist()],
            [finite_or_name(v) for v in points.values[bad].tolist()])
