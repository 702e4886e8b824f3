"""The history: every record and event in one sequence (`seq`), and per-metric columns for charts.

Records and events get a global, gap-free `seq` starting at 1 and are kept in SQLite (`tailer.state`), so a
replay after any seq is one indexed query and a restart with `--state-dir` continues the same numbering. Each (source, metric, segment) also has a
columnar series — steps and values in `array`s — that `series()` answers from, exactly or as min/max
buckets, so no spike is hidden however far the chart is zoomed out.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from parsers import Item

from .encoding import finite_or_name, numbers, ordered
from .state import StateDB

# Keys of a record that are not metrics.
_NOT_METRICS = frozenset({"seq", "source", "step", "epoch", "time", "segment", "line", "kind", "message"})


@dataclass
class Series:
    """One metric of one source in one run segment, in step order."""

    steps: array = field(default_factory=lambda: array("q"))
    values: array = field(default_factory=lambda: array("d"))
    nonfinite: List[int] = field(default_factory=list)  # indexes of NaN/Inf values, ascending
    times: array = field(default_factory=lambda: array("d"))  # the record's `time` (unix s; NaN if none)
    smoothed: Dict[float, "_Ema"] = field(default_factory=dict)  # weight -> EMA column, extended on demand
    blocks: Optional["_Blocks"] = None  # min/max per block of points, built and extended by queries

    def append(self, step: int, value: float, time: float = math.nan) -> None:
        if not math.isfinite(value):
            self.nonfinite.append(len(self.values))
        self.steps.append(step)
        self.values.append(value)
        self.times.append(time)


@dataclass
class SourceInfo:
    """What `/api/sources` tells about a source; `counters` come from its follower."""

    id: str
    path: str
    format: Optional[str] = None
    state: str = "waiting"
    records: int = 0
    first_step: Optional[int] = None
    last_step: Optional[int] = None
    last_time: Optional[float] = None
    total_steps: Optional[int] = None
    metrics: List[str] = field(default_factory=list)
    counters: Dict[str, int] = field(default_factory=dict)

    def as_json(self) -> Dict[str, Any]:
        return {
            "id": self.id,
            "path": self.path,
            "format": self.format,
            "state": self.state,
            "records": self.records,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "last_time": self.last_time,
            "total_steps": self.total_steps,
            "metrics": list(self.metrics),
            "counters": dict(self.counters),
        }


class Store:
    """The history of all sources. Used from one thread (the event loop).

    Items live in a `StateDB` (SQLite: persisted with `--state-dir`, else a private temporary file), so memory
    does not grow with the log; the per-metric columns the charts need stay in memory (16 bytes a point).

    Args:
        db: where items are kept; default a private temporary database (nothing survives a restart).
    """

    def __init__(self, db: Optional[StateDB] = None) -> None:
        self.db = db if db is not None else StateDB(None)
        self._last_seq = 0
        self._series: Dict[Tuple[str, str, int], Series] = {}
        self.sources: Dict[str, SourceInfo] = {}

    @property
    def last_seq(self) -> int:
        return self._last_seq

    def add_source(self, source_id: str, path: str) -> SourceInfo:
        info = self.sources.get(source_id)
        if info is None:
            info = self.sources[source_id] = SourceInfo(id=source_id, path=path)
        elif not info.path:
            info.path = path  # a source known from its items only (a part of a file: `ID/rank3`) until now
        return info

    def add(self, source_id: str, items: Iterable[Item]) -> List[Dict[str, Any]]:
        """Append a source's parsed items; returns them as stored (with `seq` and `source`). They are visible
        to queries at once and durable after the next `commit`."""
        info = self.sources[source_id]
        stored = []
        for item in items:
            data = dict(item.data)
            data.pop("line", None)  # line numbers belong to `mstail parse` output only
            self._last_seq += 1
            data["seq"] = self._last_seq
            data["source"] = source_id
            data = ordered(data)
            if item.kind == "record":
                self._index_record(info, data)
            stored.append(data)
        self.db.insert(stored)
        return stored

    def commit(self, checkpoints: Optional[Dict[str, Tuple[str, Dict[str, Any]]]] = None) -> None:
        """Make the items added so far durable, together with the sources' checkpoints (id -> (path, checkpoint))."""
        self.db.commit(checkpoints or {})

    def load(self, on_item: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Optional[Dict[str, Any]]]:
        """Rebuild sources and columns from the database (at start), passing every item to `on_item` too (the
        alert engine's `replay`); returns each saved source's checkpoint (source id -> checkpoint or None)."""
        saved = self.db.sources()
        for source_id, (path, checkpoint) in saved.items():
            info = self.add_source(source_id, path)
            if checkpoint is not None:
                info.counters = {**checkpoint["follower"]["counters"], **checkpoint["parser"]["counts"]}
        for data in self.db.all_items():
            self._last_seq = data["seq"]
            info = self.add_source(data["source"], saved.get(data["source"], ("", None))[0])
            if "kind" not in data:
                self._index_record(info, data)
            if on_item is not None:
                on_item(data)
        return {source_id: checkpoint for source_id, (_, checkpoint) in saved.items()}

    def close(self) -> None:
        self.db.close()

    def _index_record(self, info: SourceInfo, record: Dict[str, Any]) -> None:
        step, segment = record["step"], record.get("segment", 0)
        info.records += 1
        if info.first_step is None:
            info.first_step = step
        info.last_step = step
        info.last_time = record.get("time")
        when = info.last_time if isinstance(info.last_time, (int, float)) else math.nan
        for key, value in record.items():
            if key in _NOT_METRICS or not isinstance(value, (int, float)):
                continue
            series = self._series.get((info.id, key, segment))
            if series is None:
                series = self._series[(info.id, key, segment)] = Series()
                if key not in info.metrics:
                    info.metrics.append(key)
            series.append(step, float(value), when)

    # -- queries ------------------------------------------------------------------------------------------
    def items_after(self, seq: int, limit: int = 10_000) -> List[Dict[str, Any]]:
        """Records and events with seq > `seq`, in order (at most `limit`)."""
        return self.db.items_after(max(seq, 0), limit)

    def records_after(self, seq: int, limit: int) -> List[Dict[str, Any]]:
        return self.db.records_after(seq, limit)

    def events(self, kind: Optional[str] = None) -> List[Dict[str, Any]]:
        return self.db.events(kind)

    def metrics(self) -> List[str]:
        seen: Dict[str, None] = {}
        for info in self.sources.values():
            seen.update((m, None) for m in info.metrics)
        return list(seen)

    def latest_values(self) -> Dict[Tuple[str, str], Tuple[int, float]]:
        """(source, metric) -> (step, value) of its newest point, from the newest segment holding the metric.
        Computed on demand (a `/metrics` scrape): O(number of series), no work per record."""
        latest: Dict[Tuple[str, str], Tuple[int, float]] = {}
        for (source, metric, _segment), series in self._series.items():  # insertion order: newer segments later
            if series.values:
                latest[(source, metric)] = (series.steps[-1], series.values[-1])
        return latest

    def series(
        self,
        metric: str,
        sources: Optional[Sequence[str]] = None,
        start: Optional[int] = None,
        end: Optional[int] = None,
        points: int = 2000,
        smooth: float = 0.0,
        axis: str = "step",
    ) -> List[Dict[str, Any]]:
        """Per (source, segment) in [start, end]: exact points if there are at most `points`, else
        `points` min/max buckets (non-finite values never enter min/max; they are listed in `nonfinite`).

        Every entry also has `t` (the wall time of each x: the point's, or the bucket's last point's). With
        `smooth` in (0, 1) it has `smooth`: the debiased, step-aware EMA of the full-resolution series (see
        `_ema`) at each x, computed before bucketing, so neither zoom nor later steps change a value. With
        `axis="samples"` it has `samples` (consumed samples at each x) when the source logs `consumed_samples`
        or `global_batch_size`."""
        out = []
        for (source, name, segment), series in list(self._series.items()):
            if name != metric or (sources and source not in sources):
                continue
            lo = 0 if start is None else bisect_left(series.steps, start)
            hi = len(series.steps) if end is None else bisect_right(series.steps, end)
            bucketed = hi - lo > points
            entry = _bucketed(series, lo, hi, points) if bucketed else _exact(series, lo, hi)
            ends = _bucket_ends(lo, hi, points) if bucketed else list(range(lo, hi))
            times = series.times
            entry["t"] = [_finite_or_none(times[i]) for i in ends]
            if 0.0 < smooth < 1.0 and ends:
                values, state = _smoothed_at(series, smooth, ends)
                entry["smooth"] = [_finite_or_none(v) for v in values]
                if hi == len(series.steps):  # the newest point: what a client needs to continue the EMA live
                    entry["smooth_state"] = state
            if axis == "samples":
                samples = self._samples_at(source, segment, entry["x"])
                if samples is not None:
                    entry["samples"] = samples
            entry.update(source=source, segment=segment)
            out.append(entry)
        return out

    def _samples_at(self, source: str, segment: int, steps: List[int]) -> Optional[List[Optional[float]]]:
        """Consumed samples at each step: the logged `consumed_samples` (the latest at or before the step),
        else step × `global_batch_size`; None when the source logs neither."""
        consumed = self._series.get((source, "consumed_samples", segment))
        if consumed is not None and consumed.steps:
            out: List[Optional[float]] = []
            for step in steps:
                i = bisect_right(consumed.steps, step) - 1
                out.append(_finite_or_none(consumed.values[i]) if i >= 0 else None)
            return out
        batch = self._series.get((source, "global_batch_size", segment))
        if batch is not None and batch.steps:
            out = []
            for step in steps:
                i = max(bisect_right(batch.steps, step) - 1, 0)
                out.append(_finite_or_none(step * batch.values[i]))
            return out
        return None


def _finite_or_none(value: float) -> Optional[float]:
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


def _stride(steps: array) -> int:
    """The logging stride of a series: the smallest positive step difference among its first 16. It is fixed
    once a series has 17 points, so a growing run never changes it."""
    best = 0
    for i in range(1, min(len(steps), 17)):
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
    stride = _stride(series.steps)
    state = series.smoothed.pop(weight, None)
    if state is None or state.stride != stride:
        state = _Ema(stride)
    series.smoothed[weight] = state  # most recently used last
    while len(series.smoothed) > _EMA_WEIGHTS_KEPT:
        del series.smoothed[next(iter(series.smoothed))]
    values, steps, column = series.values, series.steps, state.column
    n = len(values)
    if len(column) >= n:
        return column
    num, den, last_x = state.num, state.den, state.last_x
    nan = math.nan
    for i in range(len(column), n):
        v = values[i]
        if v - v == 0:  # finite
            x = steps[i]
            dx = stride if last_x is None else x - last_x
            d = weight if dx == stride or dx <= 0 else weight ** (dx / stride)
            num = d * num + (1.0 - d) * v
            den = d * den + (1.0 - d)
            last_x = x
        column.append(num / den if den > 0 else nan)
    state.num, state.den, state.last_x = num, den, last_x
    return column


_EMA_EPSILON = 1e-13  # a value whose EMA weight fell below this (relative) is left out of a windowed EMA


def _smoothed_at(series: Series, weight: float, ends: List[int]) -> Tuple[List[float], Dict[str, Any]]:
    """The EMA of `_ema` at the indexes `ends` (ascending), and the state at the last of them.

    From the cached column when it covers the series. Otherwise, when cheaper than a full pass, each value is
    computed over a window: the points within K strides before it, where weight ** K <= 1e-13, so the points
    left out carry less than 1e-13 of the weight (relative error below 1e-13 × max|v| / |EMA|); windows that
    overlap are scanned once. A full pass (cached, extended as the series grows) is used when the windows
    would cover half the series or more."""
    state = series.smoothed.get(weight)
    if state is not None and len(state.column) == len(series.values) and state.stride == _stride(series.steps):
        column = state.column
        return [column[i] for i in ends], {"den": state.den, "x": state.last_x, "stride": state.stride}
    stride = _stride(series.steps)
    reach = stride * math.ceil(math.log(_EMA_EPSILON) / math.log(weight))
    steps = series.steps
    starts = [bisect_left(steps, steps[e] - reach) for e in ends]
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
        for i in range(pos + 1, e + 1):
            v = values[i]
            if v - v == 0:
                x = steps[i]
                dx = stride if last_x is None else x - last_x
                d = weight if dx == stride or dx <= 0 else weight ** (dx / stride)
                num = d * num + (1.0 - d) * v
                den = d * den + (1.0 - d)
                last_x = x
        pos = e
        out.append(num / den if den > 0 else math.nan)
    return out, {"den": den, "x": last_x, "stride": stride}


_BLOCK = 64  # points per block of the min/max summary


class _Blocks:
    """Min and max of each complete block of `_BLOCK` points (non-finite values left out: a block of only
    NaN has min +inf and max -inf), so a wide bucket reads a few block values instead of every point."""

    __slots__ = ("maxs", "mins")

    def __init__(self) -> None:
        self.mins = array("d")
        self.maxs = array("d")

    def extend(self, series: Series) -> None:
        values, bad = series.values, series.nonfinite
        for k in range(len(self.mins), len(values) // _BLOCK):
            a, b = k * _BLOCK, (k + 1) * _BLOCK
            chunk = values[a:b]
            if bisect_left(bad, a) != bisect_left(bad, b):
                chunk = [v for v in chunk if math.isfinite(v)]
            self.mins.append(min(chunk) if chunk else math.inf)
            self.maxs.append(max(chunk) if chunk else -math.inf)


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
    if size >= 4 * _BLOCK:  # wide buckets: whole blocks from the summary, only the ragged edges point by point
        blocks = series.blocks = series.blocks or _Blocks()
        blocks.extend(series)
    inf = math.inf

    def edge(a: int, b: int) -> Tuple[float, float]:
        chunk = values[a:b]
        if bisect_left(bad, a) != bisect_left(bad, b):
            chunk = [v for v in chunk if math.isfinite(v)]  # rare: only buckets holding a NaN/Inf pay this
        return (min(chunk), max(chunk)) if chunk else (inf, -inf)

    xs, mins, maxs, lasts = [], [], [], []
    for a in range(lo, hi, size):
        b = min(a + size, hi)
        if blocks is not None and b - a >= 2 * _BLOCK:
            first, end = -(-a // _BLOCK), b // _BLOCK
            low, high = edge(a, first * _BLOCK)
            low2, high2 = edge(end * _BLOCK, b)
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
