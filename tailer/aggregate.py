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

numpy does the per-step folding (2 M points in tens of ms; the same in Python takes seconds); it is imported on
the first aggregate query only. The store's columns are read through the buffer protocol and copied at once, on
the event loop (`Points`: an `array` that exports a buffer cannot grow, and the tailer appends to them between
queries); the fold of that copy runs in a worker thread (`AggregateCache.fold`: 1,024 ranks x 2,000 steps take
0.3-1 s on a loaded machine, which the loop's other requests and passes no longer wait for).
"""

from __future__ import annotations

import asyncio
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

    async def run(self, series: Sequence[Tuple[str, Series]], function: Callable[..., T], *args: Any) -> T:
        """`function(points, *args)` in the fold thread, `points` a copy of `series` (with the seq it holds)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a lock belongs to one loop (tests run several, one after another)
            self._lock, self._loop = asyncio.Lock(), loop
        async with self._lock:  # type: ignore[union-attr]
            points = Points(series, self._seq())
            return await loop.run_in_executor(_WORKER, function, points, *args)


class AggregateCache:
    """Folds of recent selections, each valid while its series have the same number of points (they only grow),
    so zooming, re-drawing and the page's other charts re-use one fold (and its mean's EMA and block summaries).
    Bounded by CACHED_STEPS_MAX distinct steps in all (a 2,000-step run: 1,000 folds; a 1 M-step one: 2)."""

    def __init__(self, turns: Turns) -> None:
        self._turns = turns
        self._folds: Dict[Any, "_Fold"] = {}
        self._folding: Dict[Any, "asyncio.Future[_Fold]"] = {}  # folds under way, shared by callers

    async def fold(self, key: Any, series: Sequence[Tuple[str, Series]], fresh: bool = False) -> "_Fold":
        """The fold of `series` (the selection `key`): cached while they have not grown, else folded from a copy
        in the fold thread (one fold per selection at a time: concurrent callers share it). A fold that took
        STALE_COST_S or more is still served for STALE_FOR_S after its copy was taken, however the series grew
        (its `seq` says what it holds; the page's stream brings the rest): a live run of 1,024 ranks would
        otherwise make every visit and zoom wait for a fold; `fresh` (default off): never. On the event loop."""
        version = sum(len(s) for _, s in series)
        fold = self._folds.get(key)
        if not fresh and fold is not None and fold.version < version and fold.cost >= STALE_COST_S \
                and time.monotonic() - fold.made < STALE_FOR_S:
            version = fold.version
        while fold is None or fold.version < version:
            under_way = self._folding.get(key)
            if under_way is None:
                under_way = self._folding[key] = asyncio.ensure_future(self._turns.run(series, _Fold))
                under_way.add_done_callback(lambda _, k=key: self._folding.pop(k, None))
            fold = await asyncio.shield(under_way)
            known = self._folds.get(key)
            if known is not None and known.version > fold.version:
                fold = known  # a newer fold was stored meanwhile
            version = fold.version  # what it holds is what the series held when its turn came: current enough
        self._folds.pop(key, None)
        self._folds[key] = fold  # most recently used last
        cached = sum(len(f.steps) for f in self._folds.values())
        while cached > CACHED_STEPS_MAX and len(self._folds) > 1:
            oldest = next(iter(self._folds))
            cached -= len(self._folds.pop(oldest).steps)
        return fold

    def age(self, key: Any, series: Sequence[Tuple[str, Series]]) -> Optional[float]:
        """Seconds since the copy behind the cached fold of `series` (the selection `key`) was taken; None when
        that fold holds them as they are now, infinity when there is none."""
        fold = self._folds.get(key)
        if fold is None:
            return float("inf")
        return None if fold.version >= sum(len(s) for _, s in series) else time.monotonic() - fold.made


CACHED_STEPS_MAX = 2_000_000
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
    non-finite values, and the outliers over the whole run."""

    def __init__(self, points: "Points") -> None:
        import numpy as np

        began = time.perf_counter()
        self.version, self.seq, self.made = len(points.steps), points.seq, points.made  # points folded; seq, time then
        self.sources = sorted(points.sources)
        self.newest = int(points.steps.max()) if len(points.steps) else 0
        self.steps, mean, self.low, self.high, self.count, when, position = _per_step(points, np)
        self.mean = Series()
        self.mean.steps.frombytes(self.steps.tobytes())
        self.mean.values.frombytes(mean.tobytes())
        self.mean.times.frombytes(when.tobytes())
        self.outliers = _outliers(points, mean, position, np)
        bad = np.flatnonzero(~np.isfinite(points.values))
        bad = bad[np.argsort(points.steps[bad], kind="stable")]
        self._bad = (points.steps[bad].tolist(), [points.sources[i] for i in points.owner[bad].tolist()],
                     [finite_or_name(v) for v in points.values[bad].tolist()])
        self.cost = time.perf_counter() - began  # seconds the fold took (what serving it stale saves)

    def nonfinite(self, start: Optional[int], end: Optional[int]) -> Dict[str, List[Any]]:
        """The newest NONFINITE_MAX non-finite values between `start` and `end`, by step."""
        steps, sources, values = self._bad
        lo = 0 if start is None else bisect_left(steps, start)
        hi = len(steps) if end is None else bisect_right(steps, end)
        lo = max(lo, hi - NONFINITE_MAX)
        return {"x": steps[lo:hi], "source": sources[lo:hi], "value": values[lo:hi]}


class Points:
    """Every point of the series in flat numpy arrays (copies, so a worker thread may read them while the store
    grows): `steps`, `values`, `times`, and `owner`, the index in `sources` of the source each point belongs to;
    `seq`, the store's seq when they were copied."""

    def __init__(self, series: Sequence[Tuple[str, Series]], seq: int = 0) -> None:
        import numpy as np

        self.seq = seq  # the store's newest seq when the copy was taken (what it holds)
        self.made = time.monotonic()  # when

        self.sources: List[str] = []
        index: Dict[str, int] = {}
        for source, _ in series:
            if source not in index:
                index[source] = len(self.sources)
                self.sources.append(source)

        def column(name: str, dtype: Any) -> Any:
            # np.concatenate copies: the views on the store's arrays end with this call
            parts = [np.frombuffer(getattr(s, name), dtype=dtype)[:len(s)] for _, s in series]
            return np.concatenate(parts) if parts else np.zeros(0, dtype)

        self.steps = column("steps", np.int64)
        self.values = column("values", np.float64)
        self.times = column("times", np.float64)
        self.owner = np.repeat(np.array([index[source] for source, _ in series], dtype=np.int64),
                               [len(s) for _, s in series])


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
    point its step's index in them (-1 for a non-finite value)."""
    finite = np.isfinite(points.values)
    if finite.all():  # the usual case: no copies of 2 M points through a mask
        steps, values, times = points.steps, points.values, points.times
    else:
        steps, values, times = points.steps[finite], points.values[finite], points.times[finite]
    if not len(steps):
        position = np.full(len(points.values), -1, dtype=np.int64)
        return (np.zeros(0, np.int64),) + tuple(np.zeros(0) for _ in range(5)) + (position,)
    distinct, index = step_index(steps, np)
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
    if len(index) == len(points.values):  # every value finite: each point's position is its step's index
        position = index
    else:
        position = np.full(len(points.values), -1, dtype=np.int64)
        position[finite] = index
    return (distinct.astype(np.int64), total / count, low, high, count, when, position)


def _outliers(points: Points, mean: Any, position: Any, np: Any) -> List[str]:
    """Up to OUTLIERS_MAX sources whose mean distance from the mean (over their finite values) is at least
    OUTLIER_FACTOR times the median source's, farthest first. `position`: each point's index in `mean`."""
    ok = position >= 0
    if ok.all():  # the usual case: no copies of 2 M points through a mask
        distance, owner = np.abs(points.values - mean[position]), points.owner
    elif ok.any():
        distance, owner = np.abs(points.values[ok] - mean[position[ok]]), points.owner[ok]
    else:
        return []
    n = np.bincount(owner, minlength=len(points.sources))
    has = np.flatnonzero(n)
    if len(has) < 3:
        return []
    scores = np.bincount(owner, weights=distance, minlength=len(points.sources))[has] / n[has]
    typical = float(np.median(scores))
    ranked = sorted(zip((-scores).tolist(), [points.sources[i] for i in has.tolist()]))
    return [source for score, source in ranked[:OUTLIERS_MAX] if -score > 0 and -score >= OUTLIER_FACTOR * typical]
