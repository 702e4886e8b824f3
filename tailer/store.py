"""The history: every record and event in one sequence (`seq`), and per-metric columns for charts.

Records and events get a global, gap-free `seq` starting at 1, so the item with seq N sits at index N-1
of `self._items` and a replay after any seq is a slice. Each (source, metric, segment) also has a
columnar series — steps and values in `array`s — that `series()` answers from, exactly or as min/max
buckets, so no spike is hidden however far the chart is zoomed out.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from parsers import Item

from .encoding import finite_or_name, numbers, ordered

# Keys of a record that are not metrics.
_NOT_METRICS = frozenset({"seq", "source", "step", "epoch", "time", "segment", "line", "kind", "message"})


@dataclass
class Series:
    """One metric of one source in one run segment, in step order."""

    steps: array = field(default_factory=lambda: array("q"))
    values: array = field(default_factory=lambda: array("d"))
    nonfinite: List[int] = field(default_factory=list)  # indexes of NaN/Inf values, ascending

    def append(self, step: int, value: float) -> None:
        if not math.isfinite(value):
            self.nonfinite.append(len(self.values))
        self.steps.append(step)
        self.values.append(value)


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
    """In-memory history of all sources. Used from one thread (the event loop)."""

    def __init__(self) -> None:
        self._items: List[Dict[str, Any]] = []
        self._record_seqs: List[int] = []  # seqs of records only, for /api/records
        self._series: Dict[Tuple[str, str, int], Series] = {}
        self.sources: Dict[str, SourceInfo] = {}

    @property
    def last_seq(self) -> int:
        return len(self._items)

    def add_source(self, source_id: str, path: str) -> SourceInfo:
        info = self.sources.get(source_id)
        if info is None:
            info = self.sources[source_id] = SourceInfo(id=source_id, path=path)
        return info

    def add(self, source_id: str, items: Iterable[Item]) -> List[Dict[str, Any]]:
        """Append a source's parsed items; returns them as stored (with `seq` and `source`)."""
        info = self.sources[source_id]
        stored = []
        for item in items:
            data = dict(item.data)
            data.pop("line", None)  # line numbers belong to `mstail parse` output only
            data["seq"] = len(self._items) + 1
            data["source"] = source_id
            data = ordered(data)
            self._items.append(data)
            if item.kind == "record":
                self._record_seqs.append(data["seq"])
                self._index_record(info, data)
            stored.append(data)
        return stored

    def _index_record(self, info: SourceInfo, record: Dict[str, Any]) -> None:
        step, segment = record["step"], record.get("segment", 0)
        info.records += 1
        if info.first_step is None:
            info.first_step = step
        info.last_step = step
        info.last_time = record.get("time")
        for key, value in record.items():
            if key in _NOT_METRICS or not isinstance(value, (int, float)):
                continue
            series = self._series.get((info.id, key, segment))
            if series is None:
                series = self._series[(info.id, key, segment)] = Series()
                if key not in info.metrics:
                    info.metrics.append(key)
            series.append(step, float(value))

    # -- queries ------------------------------------------------------------------------------------------
    def items_after(self, seq: int, limit: Optional[int] = None) -> List[Dict[str, Any]]:
        """Records and events with seq > `seq`, in order (at most `limit`)."""
        start = max(seq, 0)
        end = len(self._items) if limit is None else min(len(self._items), start + limit)
        return self._items[start:end]

    def records_after(self, seq: int, limit: int) -> List[Dict[str, Any]]:
        index = bisect_right(self._record_seqs, seq)
        return [self._items[s - 1] for s in self._record_seqs[index : index + limit]]

    def events(self, kind: Optional[str] = None) -> List[Dict[str, Any]]:
        return [item for item in self._items if "kind" in item and (kind is None or item["kind"] == kind)]

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
    ) -> List[Dict[str, Any]]:
        """Per (source, segment) in [start, end]: exact points if there are at most `points`, else
        `points` min/max buckets (non-finite values never enter min/max; they are listed in `nonfinite`)."""
        out = []
        for (source, name, segment), series in self._series.items():
            if name != metric or (sources and source not in sources):
                continue
            lo = 0 if start is None else bisect_left(series.steps, start)
            hi = len(series.steps) if end is None else bisect_right(series.steps, end)
            entry = _bucketed(series, lo, hi, points) if hi - lo > points else _exact(series, lo, hi)
            entry.update(source=source, segment=segment)
            out.append(entry)
        return out


def _exact(series: Series, lo: int, hi: int) -> Dict[str, Any]:
    values = numbers(series.values[lo:hi])
    x = series.steps[lo:hi].tolist()
    return {"x": x, "min": values, "max": values, "last": values, "nonfinite": _nonfinite(series, lo, hi)}


def _bucketed(series: Series, lo: int, hi: int, points: int) -> Dict[str, Any]:
    steps, values, bad = series.steps, series.values, series.nonfinite
    size = -(-(hi - lo) // points)  # ceil: every bucket but the last holds `size` points
    xs, mins, maxs, lasts = [], [], [], []
    for a in range(lo, hi, size):
        b = min(a + size, hi)
        chunk = values[a:b]
        if bisect_left(bad, a) != bisect_left(bad, b):
            chunk = [v for v in chunk if math.isfinite(v)]  # rare: only buckets holding a NaN/Inf pay this
        xs.append(steps[b - 1])
        mins.append(min(chunk) if chunk else None)
        maxs.append(max(chunk) if chunk else None)
        lasts.append(finite_or_name(values[b - 1]))
    return {"x": xs, "min": mins, "max": maxs, "last": lasts, "nonfinite": _nonfinite(series, lo, hi)}


def _nonfinite(series: Series, lo: int, hi: int) -> Dict[str, List[Any]]:
    indexes = series.nonfinite[bisect_left(series.nonfinite, lo) : bisect_left(series.nonfinite, hi)]
    return {"x": [series.steps[i] for i in indexes], "value": [finite_or_name(series.values[i]) for i in indexes]}
