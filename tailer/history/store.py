"""The history: every record and event in one sequence (`seq`), and per-metric columns for charts.

Records and events get a global, gap-free `seq` starting at 1 and are kept in SQLite (`mstail.tailer.history.db`), so a
replay after any seq is one indexed query and a restart with `--state-dir` continues the same numbering. Each
(source, metric, segment) also has a columnar `Series` in memory that `series()` answers from (the chart maths,
exact points or min/max buckets and the EMA, are `mstail.tailer.history.series`'s). The series of a source and segment
share their steps and times, and are saved in the state file as raw arrays, so a restart reads them back
instead of every record's JSON (`mstail.tailer.history.columns`).

Threads: a Store is touched from the event loop only (the tailer's passes deliver there; the API routes are
`async`), so it needs no lock (ARCHITECTURE.md, Threads). The charts' maths (windows, smoothing, folds, heatmaps)
runs in the query thread (`aggregate.in_query_thread`) over the series and the number of points each held when the
question was asked on the loop, so no query stalls the loop however long the history.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from array import array
from bisect import bisect_right
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from mstail.parsers.record import KEY_ORDER, RESERVED, Item, finite_or_name, ordered

from mstail.tailer.inputs.checkpoint import SourceCheckpoint
from mstail.tailer.history.aggregate import AggregateCache, Turns, aggregate, in_query_thread
from mstail.tailer.history.columns import Columns, Frame, SeriesKey
from mstail.tailer.history.db import StateDB, item_text
from mstail.tailer.history.heatmap import heatmap
from mstail.tailer.history.series import Series, finite_or_none, window

log = logging.getLogger("mstail.state")
WARM_SOURCES_MIN = 16  # the page's MANY_LINES: a metric of more sources is drawn as the mean of every source
HEATMAPS_KEPT = 16  # heatmap answers kept (a few KiB each) while their series do not grow
WARM_CHECK_S = 0.25  # how often the warmer looks for a fold that fell behind, when none was
WARM_SHARE = 0.25  # the share of a core the warmer's folds may take over time (a live run that keeps settling)
WARM_BURST_S = 3.0  # ... and the seconds of folds it may spend at once (about three rounds of 1,024 ranks' metrics)


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
    problem: Optional[str] = None  # what a person should know ("permission denied", "no format matches ...")
    #: how a silence is judged: "writer" (a process still writing the file is seen: silent and nobody writing is
    #: over, never hung), "time bound" (a network filesystem: writers there cannot be seen, the hang bound alone, and
    #: a fate judged by it is a guess)
    hang_rule: Optional[str] = None
    unplottable: int = 0  # values (or steps) kept in the history that no chart column can hold: beyond 64 bits
    run: Optional[str] = None  # the run of a file found below a folder (`mstail DIR`): the page groups by it
    #: how its run ended, in words, while `state` is its fate (finished | died | stopped: `tailer.fate`), else None;
    #: `end_guessed`: judged by the silence alone (writers on a network filesystem cannot be seen)
    end_reason: Optional[str] = None
    end_guessed: bool = False

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
            "counters": {**self.counters, "unplottable": self.unplottable} if self.unplottable else dict(self.counters),
            "problem": self.problem,
            "hang_rule": self.hang_rule,
            "run": self.run,
            "end_reason": self.end_reason,
            "end_guessed": self.end_guessed,
        }


#: items stored since the alert rules' state was last saved that make a commit save it again (what a restart after a
#: crash replays, about 0.3 s of CPU; a clean stop saves it whole), unless saving it took more than 1/ALERT_SAVE_COST_SHARE
#: of the time since (1,024 sources: about 0.1-0.3 s a save, so at most every 10-30 s)
ALERT_SAVE_ITEMS = 10_000
ALERT_SAVE_COST_SHARE = 100

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

#: how a series' x is told in consumed samples: ("consumed", the source's `consumed_samples`, its points) or
#: ("batch", its `global_batch_size`, its points)
Samples = Tuple[str, Series, int]
#: one series asked for, as taken on the loop: (source, segment, series, the points it held, its samples or None)
Asked = Tuple[str, int, Series, int, Optional[Samples]]


def _float(value: Any) -> float:
    """A number as a float; NaN for what is not a number or does not fit (an int of 400 digits)."""
    try:
        return float(value) if isinstance(value, (int, float)) else math.nan
    except OverflowError:
        return math.nan


def prepare(item: Item) -> Item:
    """`item` with its data as `Store.add` stores it but for the seq and source (their places left out: reserved keys
    first, no `line`), made beforehand (by a catch-up child, `tailer.catchup`); an amend as it is."""
    if item.kind == "amend":
        return item
    data = item.data
    out = {key: data[key] for key in _KEPT_FIRST if key in data}  # `ordered`'s layout, made in one copy
    out.update(data)
    for key in _ADDED:
        out.pop(key, None)
    return Item(item.kind, out)


_ADDED = ("seq", "source", "line")  # what the store sets, and drops (line numbers belong to `mstail parse` output only)
_KEPT_FIRST = tuple(key for key in KEY_ORDER if key not in _ADDED)  # the reserved keys a prepared item starts with


def _facts(info: SourceInfo) -> Dict[str, Any]:
    """What of a source the saved columns' manifest keeps: the facts its records gave."""
    return {"records": info.records, "first_step": info.first_step, "last_step": info.last_step,
            "last_time": info.last_time, "metrics": info.metrics, "unplottable": info.unplottable}


class Stored(NamedTuple):
    """What `Store.add` stored."""

    #: the items as stored (with `seq` and `source`), in seq order
    items: List[Dict[str, Any]]
    #: seq -> the JSON the stream sends for an item, for those whose stored JSON gave it on the way
    #: (`StateDB.insert`; `ItemsMessage.texts`)
    texts: Dict[int, str]


class FoldBudget:
    """The seconds of folds the warmer may spend (`Store.keep_folds_warm`): `share` of a core over time and at most
    `burst` at once (a token bucket, full at first). A pause of three times each round, its earlier form, made the
    folds of a run's end wait out the pause of a round made just before the last records came (up to 3 s at 1,024
    ranks): the first visit after a catch-up then found its folds cold."""

    def __init__(self, share: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._share, self._burst, self._clock = share, burst, clock
        self._left, self._at = burst, clock()

    def left(self) -> float:
        """Seconds of folds that may be spent now (negative after an overrun, until earned back)."""
        now = self._clock()
        self._left, self._at = min(self._burst, self._left + (now - self._at) * self._share), now
        return self._left

    def spend(self, seconds: float) -> None:
        self._left = self.left() - seconds


class _NeedsCheck(Exception):
    """Saved chart columns that cannot be used, found while the state's check runs: damage, maybe; the check decides."""


class Store:
    """The history of all sources. Used from the event loop only.

    Items live in a `StateDB` (SQLite: persisted with `--state-dir`, else a private temporary file), so memory
    does not grow with the log; the per-metric columns the charts need stay in memory (8 bytes a point, plus 16
    a record for its step and time).

    Args:
        db: where items are kept; default a private temporary database (nothing survives a restart).
    """

    def __init__(self, db: Optional[StateDB] = None) -> None:
        self.db = db if db is not None else StateDB(None)
        self._forget()
        self._turns = Turns(lambda: self._last_seq)  # copies of series computed in the query thread, one at a time
        self._folds = AggregateCache(self._turns)  # across-source folds for `aggregate`
        self._heatmaps: Dict[Any, Tuple[int, Dict[str, Any]]] = {}  # the last heatmap answers, by question
        self._alert_state: Optional[Callable[[], Dict[str, Any]]] = None  # `save_alerts`
        self._alerts_saved = -1  # the seq of the alert rules' state last saved (-1: none saved by this process)
        self._alerts_next_save = 0.0  # monotonic time before which it is not saved again (but at close)

    def _forget(self) -> None:
        """No history: what a new store holds, and what `load` goes back to when what it read beside the state's
        check is not to be kept."""
        self._last_seq = 0
        self._columns = Columns()
        self._series: Dict[Tuple[str, str, int], Series] = self._columns.series
        self._last_record: Dict[str, Dict[str, Any]] = {}  # source -> its newest record as stored (what an amend is for)
        self.sources: Dict[str, SourceInfo] = {}
        self._by_metric: Dict[str, List[SeriesKey]] = {}  # metric -> its series' keys (`_metric_keys`)
        self._indexed = 0  # how many series `_by_metric` holds

    @property
    def last_seq(self) -> int:
        return self._last_seq

    @property
    def series_count(self) -> int:
        """How many chart series there are (with the sources: how much long-lived state the history holds)."""
        return len(self._series)

    def add_source(self, source_id: str, path: str) -> SourceInfo:
        info = self.sources.get(source_id)
        if info is None:
            info = self.sources[source_id] = SourceInfo(id=source_id, path=path)
        elif not info.path:
            info.path = path  # a source known from its items only (a part of a file: `ID/rank3`) until now
        return info

    def add(self, source_id: str, items: Iterable[Item], prepared: bool = False) -> Stored:
        """Append a source's parsed items; returns them as stored (with `seq` and `source`) and the stream's JSON
        of those whose stored JSON gave it (`Stored`). They are visible
        to queries at once and durable after the next `commit`. An amend (values a later line adds to the source's
        newest record, mstail.parsers.amends) replaces that record in the database with the values added, extends
        its charts, and is stored as an item of kind "amend" (so a stream replay after any seq applies it too);
        one that matches no stored record is dropped.

        Args:
            prepared: the items come from `prepare`, so that storing one is adding its seq and source (default False).
        """
        info = self.sources[source_id]
        stored: List[Dict[str, Any]] = []
        texts: Dict[int, str] = {}
        records: List[Dict[str, Any]] = []  # stored, not indexed yet: indexed together, before an amend or at the end
        queued = 0  # stored[:queued] is queued in the database: an amend's rewrite must find its record there
        #: seq -> a record of `records` with the values amends added, which the database takes instead of the record
        #: as it came (what the stream sends, then the amends)
        merged: Dict[int, Dict[str, Any]] = {}
        for item in items:
            if item.kind == "amend":
                amend = self._amend_unindexed(info, records, item.data)
                if amend is not None:
                    merged[records[-1]["seq"]] = records[-1]
                else:
                    self._index_records(info, records)
                    records = []
                    texts.update(self._insert(stored[queued:], merged))
                    queued = len(stored)
                    amend = self._amend(info, item.data)
                if amend is not None:
                    stored.append(amend)
                continue
            self._last_seq += 1
            if prepared:
                data = {"seq": self._last_seq, "source": source_id, **item.data}  # the stored order (`ordered`)
            else:
                data = {key: value for key, value in item.data.items() if key not in _ADDED}
                data["seq"] = self._last_seq
                data["source"] = source_id
                data = ordered(data)
            if item.kind == "record":
                records.append(data)
                self._last_record[source_id] = data
            stored.append(data)
        self._index_records(info, records)
        texts.update(self._insert(stored[queued:], merged))
        return Stored(stored, texts)

    def _insert(self, items: List[Dict[str, Any]], merged: Dict[int, Dict[str, Any]]) -> Dict[int, str]:
        """`StateDB.insert` of `items`, the records amended before they were queued as amended (`merged`); the
        stream's JSON of the others."""
        if not merged:
            return self.db.insert(items)
        texts = self.db.insert([merged.get(item["seq"], item) for item in items])
        for item in items:
            if item["seq"] in merged:  # the stream sends the record as it came
                streamed = item_text(item)[1]
                if streamed is None:
                    texts.pop(item["seq"], None)
                else:
                    texts[item["seq"]] = streamed
        return texts

    def _amend_unindexed(self, info: SourceInfo, records: List[Dict[str, Any]],
                         values: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """`_amend` of the source's newest record while it is the last of `records` (stored by this `add`, not
        indexed or queued yet: a catch-up's step and its amend): the values go into a new dict in its place, indexed
        and queued with the other records (a run of records with the same keys is indexed a column at a time).
        Returns the amend as stored, or None when `_amend` must judge it."""
        if not records:
            return None
        record = records[-1]
        step = record["step"]
        if step != values["step"] or record.get("segment", 0) != values.get("segment", 0) or not (
                isinstance(step, int) and _INT64_MIN <= step <= _INT64_MAX):  # (a chart-less step: as `_amend` does)
            return None
        new = {key: value for key, value in values.items() if key not in record and key not in RESERVED}
        if not new:
            return None
        records[-1] = self._last_record[info.id] = {**record, **new}
        return self._amend_item(info, record, new)

    def _amend(self, info: SourceInfo, values: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """Apply one amend to the source's newest record; returns the amend as stored, None when it adds nothing."""
        record = self._last_record.get(info.id) or self.db.last_record(info.id)  # after a restart: from the state
        if record is None or record["step"] != values["step"] or record.get("segment", 0) != values.get("segment", 0):
            return None
        new = {key: value for key, value in values.items() if key not in record and key not in RESERVED}
        if not new:
            return None
        merged = {**record, **new}  # a new dict: the old one may still be on its way to a client
        self._last_record[info.id] = merged
        self.db.replace(merged)
        frame = self._columns.frames.get((info.id, record.get("segment", 0)))
        if frame is not None and _INT64_MIN <= record["step"] <= _INT64_MAX:  # else kept, not drawn (`_index_record`)
            self._index_values(info, frame, record.get("segment", 0), {"seq": record["seq"], **new})
        return self._amend_item(info, record, new)

    def _amend_item(self, info: SourceInfo, record: Dict[str, Any], new: Dict[str, Any]) -> Dict[str, Any]:
        """The amend of `record` with the `new` values, as stored (the next seq)."""
        self._last_seq += 1
        return ordered({"seq": self._last_seq, "source": info.id, "step": record["step"], "time": record.get("time"),
                        "segment": record.get("segment", 0), "kind": "amend", **new})

    def queue(self, checkpoints: Dict[str, Tuple[str, SourceCheckpoint]]) -> None:
        """Keep the sources' checkpoints (id -> (path, checkpoint)) for the next `commit`, which writes them with the
        items added so far (these and those added until then): a restart after a crash resumes from the checkpoints
        committed before, and reads what followed them again."""
        self.db.queue(checkpoints)

    def commit(self, checkpoints: Optional[Dict[str, Tuple[str, SourceCheckpoint]]] = None,
               columns: bool = False, alerts: bool = False) -> None:
        """Make the items added so far durable, together with the sources' checkpoints (id -> (path, checkpoint)),
        the chart columns when `columns` is set or enough records came since they were last saved, and the alert
        rules' state (`save_alerts`) when `alerts` is set or every ALERT_SAVE_ITEMS items (at most 1 % of the time).
        After `StateDB.write_behind` this hands them to the state's writer thread and returns at once; while a
        commit is still being written, they are kept for the next (`StateDB.ready`)."""
        if not self.db.ready:
            self.db.queue(checkpoints or {})
            return
        flush = None
        if self.db.path is not None and (columns or self._columns.due()):
            flush = self._columns.flush(self._last_seq, {i: _facts(info) for i, info in self.sources.items()})
        state = None
        began = time.monotonic()
        if self._alert_state is not None and self.db.path is not None and (alerts or (
                self._last_seq - self._alerts_saved >= ALERT_SAVE_ITEMS and began >= self._alerts_next_save)):
            state = {**self._alert_state(), "seq": self._last_seq}

        def done(outcome: "Future[bool]") -> None:  # on the loop, once the batch is written or failed
            written = outcome.result()
            if flush is not None:
                self._columns.flushed(flush, written)
            if state is not None and written:
                self._alerts_saved = state["seq"]
                now = time.monotonic()  # the cost: the snapshot, its JSON and the write
                self._alerts_next_save = now + ALERT_SAVE_COST_SHARE * (now - began)

        self.db.commit(checkpoints or {}, flush, state).add_done_callback(done)

    def save_alerts(self, snapshot: Callable[[], Dict[str, Any]]) -> None:
        """From now on save `snapshot()`, the alert rules' state (`AlertEngine.snapshot`), with the items it has seen,
        in their transaction: every ALERT_SAVE_ITEMS items (at most 1 % of the time) and at `close`. A
        restart takes it back (`StateDB.saved_alerts`) and replays only the items after it. Call it once the
        rules have seen every stored item (after a replay), never before: a state saved is taken as complete."""
        self._alert_state = snapshot

    def load(self, beside_check: bool = False) -> Dict[str, Optional[SourceCheckpoint]]:
        """Rebuild sources and columns from the database (at start): the saved columns, and the records after
        them from their JSON; a state without saved columns (an earlier mstail's) has them rebuilt from every
        record, said once. Returns each saved source's checkpoint (source id -> checkpoint or None).

        Args:
            beside_check: while the state's integrity check runs (`StateDB.checking`: after a machine crash), read
                the saved columns beside it instead of waiting for it; the caller then waits for the check
                (`StateDB.verify`) before anything is written or tailed, and starts over from a fresh state if it
                fails (`serve`). A read that fails, or saved columns that cannot be used, wait for the check here
                and the load starts again from what it leaves. Default False: the check first, nothing read before.
        """
        if beside_check and self.db.checking:
            try:
                return self._load(rebuild=False)
            except Exception:  # noqa: BLE001 - a damaged page may fail SQLite, JSON or the columns: the check decides
                self._forget()  # and the load starts again from what it leaves, as without a check beside it
        self.db.verify()  # a state whose pages do not hold together is set aside here: nothing read from it yet
        return self._load(rebuild=True)

    def _load(self, rebuild: bool) -> Dict[str, Optional[SourceCheckpoint]]:
        """`load`'s reading; `rebuild` False: raise `_NeedsCheck` where the columns would be rebuilt from the items."""
        saved = self.db.sources()
        for source_id, (path, checkpoint) in saved.items():
            info = self.add_source(source_id, path)
            if checkpoint is not None:
                info.counters = {**checkpoint.follower.counters, **checkpoint.parser.counts}
        self._last_seq = self.db.last_seq()
        after = self._restore_columns(saved, rebuild)
        for batch in self.db.all_items(after):
            records: Dict[str, List[Dict[str, Any]]] = {}  # source -> its records in the batch, in order
            for data in batch:
                self.add_source(data["source"], saved.get(data["source"], ("", None))[0])
                if "kind" not in data:  # (an amend's values are in its record already)
                    records.setdefault(data["source"], []).append(data)
            for source_id, its in records.items():
                self._index_records(self.sources[source_id], its)
        if after == 0 and self._last_seq:
            self.commit(columns=True)  # the rebuilt columns, saved at once: the next start reads them
        return {source_id: checkpoint for source_id, (_, checkpoint) in saved.items()}

    def _restore_columns(self, saved: Dict[str, Tuple[str, Optional[SourceCheckpoint]]], rebuild: bool) -> int:
        """The saved columns and sources' facts, when the state has them and they hold together; returns the seq
        up to which records are in them (0: rebuild every column from the records, said once; with `rebuild`
        False, `_NeedsCheck` is raised instead)."""
        if not self._last_seq:
            return 0
        manifest = self.db.columns_manifest()
        problem: Optional[str] = "it has none (an earlier mstail wrote it)"
        if manifest is not None:
            problem = (f"they end at record {manifest['seq']}, which it does not hold" if
                       manifest["seq"] > 0 and not self.db.has_item(manifest["seq"]) else
                       self._columns.restore(manifest, self.db.column_pieces(), self.db.column_blocks()))
        if problem is not None:
            if not rebuild:
                raise _NeedsCheck(problem)
            log.warning("state %s: chart columns not usable (%s): rebuilding them from the %d stored items, once",
                        self.db.path, problem, self._last_seq)
            self._columns.clear()
            return 0
        for source_id, facts in manifest["sources"].items():  # type: ignore[index]  # no problem: a manifest
            info = self.add_source(source_id, saved.get(source_id, ("", None))[0])
            for name, value in facts.items():
                setattr(info, name, value)
        return self._columns.saved_seq

    def close(self) -> None:
        """Save the chart columns with what is left to commit (after the commit being written, if any), and close
        the state file."""
        self.db.finish_writes()
        self.commit(columns=self._columns.pending > 0, alerts=True)
        self.db.close()

    def _index_records(self, info: SourceInfo, records: List[Dict[str, Any]]) -> None:
        """Index a source's new records, in order: each run of records with the same keys at once (`_index_run`)
        where it can be, else one by one."""
        start = 0
        for end in range(1, len(records) + 1):
            if end == len(records) or records[end].keys() != records[start].keys():
                run = records[start:end]
                if len(run) > 2 and self._run_columns(info, run[0]) is None:
                    # a file's first slice (or a new metric): its first record makes the frame and series alone
                    self._index_record(info, run[0])
                    run = run[1:]
                if len(run) < 2 or not self._index_run(info, run):
                    for record in run:
                        self._index_record(info, record)
                start = end

    def _index_run(self, info: SourceInfo, run: List[Dict[str, Any]]) -> bool:
        """Index records with the same keys as `_index_record` would one by one, a column at a time (a catch-up
        stores tens of thousands: about a quarter of the work), when that is the same: one segment already charted,
        every step and metric plottable, every metric a series already. Returns False, having changed nothing,
        otherwise."""
        first = run[0]
        segment = first.get("segment", 0)
        found = self._run_columns(info, first)
        if found is None:
            return False
        frame, chosen = found
        try:
            if "segment" in first and any(record["segment"] != segment for record in run):
                return False
            steps = array("q", [record["step"] for record in run])  # a float step or one beyond 64 bits: refused
            times = (array("d", [record["time"] for record in run]) if "time" in first  # None: refused
                     else array("d", [math.nan]) * len(run))
            columns = [(series, array("d", [record[key] for record in run])) for key, series in chosen]
        except (TypeError, OverflowError):  # a value that is no number, or an int beyond the float range
            return False
        row = len(frame.steps)
        frame.steps.extend(steps)
        frame.times.extend(times)
        for series, values in columns:
            frame.extend(series, row, values)
        info.records += len(run)
        if info.first_step is None:
            info.first_step = steps[0]
        info.last_step = steps[-1]
        info.last_time = run[-1].get("time")
        self._columns.pending += len(run)
        return True

    def _run_columns(self, info: SourceInfo, first: Dict[str, Any]) -> Optional[Tuple[Frame, List[Tuple[str, Series]]]]:
        """The frame and the (metric, series) of a run whose first record is `first`, or None when the frame or a
        series does not exist yet."""
        segment = first.get("segment", 0)
        frame = self._columns.frames.get((info.id, segment))
        if frame is None:
            return None
        chosen = []
        for key in first:
            if key not in RESERVED:
                series = self._series.get((info.id, key, segment))
                if series is None:
                    return None
                chosen.append((key, series))
        return frame, chosen

    def _index_record(self, info: SourceInfo, record: Dict[str, Any]) -> None:
        step, segment = record["step"], record.get("segment", 0)
        info.records += 1
        if not (isinstance(step, int) and _INT64_MIN <= step <= _INT64_MAX):
            info.unplottable += 1  # a step no chart column can hold: the record is kept, not drawn
            return
        if info.first_step is None:
            info.first_step = step
        info.last_step = step
        info.last_time = record.get("time")
        frame = self._columns.frames.get((info.id, segment))
        if frame is None:
            frame = self._columns.frames[(info.id, segment)] = Frame()
        frame.steps.append(step)
        frame.times.append(_float(info.last_time))
        self._columns.pending += 1
        self._index_values(info, frame, segment, record)

    def _index_values(self, info: SourceInfo, frame: Frame, segment: int, record: Dict[str, Any]) -> None:
        """The numbers of `record`, the newest record of its source and segment, into their series."""
        row = len(frame.steps) - 1
        if record["seq"] <= self._columns.saved_seq:
            self._columns.dirty_below = True  # an amended record the saved columns hold without its new values
        series_of = self._series
        for key, value in record.items():
            if key in RESERVED:
                continue
            if type(value) is float:  # most values: nothing to convert (this loop runs for every metric stored)
                number = value
            elif isinstance(value, (int, float)):
                number = _float(value)
                if number != number and value == value:  # an int beyond the float range: kept, not drawn
                    info.unplottable += 1
                    continue
            else:
                continue
            series = series_of.get((info.id, key, segment))
            if series is None:
                series = series_of[(info.id, key, segment)] = frame.new_series()
                if key not in info.metrics:
                    info.metrics.append(key)
            frame.add(series, row, number)

    # -- queries ------------------------------------------------------------------------------------------
    def items_after(self, seq: int, limit: int = 10_000) -> List[Dict[str, Any]]:
        """Records and events with seq > `seq`, in order (at most `limit`)."""
        return self.db.items_after(max(seq, 0), limit)

    def records_after(self, seq: int, limit: int) -> List[Dict[str, Any]]:
        return self.db.records_after(seq, limit)

    def events(self, kind: Optional[str] = None, after: int = 0, limit: int = 1 << 62,
               newest: bool = False) -> List[Dict[str, Any]]:
        """Events in seq order (see `StateDB.events`); every one unless `limit` says otherwise."""
        return self.db.events(kind, after, limit, newest)

    def latest_values(self) -> Dict[Tuple[str, str], Tuple[int, float]]:
        """(source, metric) -> (step, value) of its newest point, from the newest segment holding the metric.
        Computed on demand (a `/metrics` scrape): O(number of series), no work per record."""
        latest: Dict[Tuple[str, str], Tuple[int, float]] = {}
        for (source, metric, _segment), series in self._series.items():  # insertion order: newer segments later
            if series.values:
                latest[(source, metric)] = (series.steps[len(series) - 1], series.values[-1])
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
        `points` min/max buckets, with wall times and, for `smooth` in (0, 1), the EMA (`series.window`). With
        `axis="samples"` it has `samples` (consumed samples at each x) when the source logs `consumed_samples`
        or `global_batch_size`. Computed here, in the caller's thread: the server's answers are `series_answer`'s."""
        return _windows(self._asked(metric, sources, axis), start, end, points, smooth)

    async def series_answer(self, metric: str, sources: Optional[Sequence[str]] = None, start: Optional[int] = None,
                            end: Optional[int] = None, points: int = 2000, smooth: float = 0.0,
                            axis: str = "step") -> Dict[str, Any]:
        """`{"seq", "series"}`: the `series()` answer about the points the store holds now, at `seq`, computed in
        the query thread (`in_query_thread`) while the loop goes on."""
        seq, asked = self._last_seq, self._asked(metric, sources, axis)
        return {"seq": seq, "series": await in_query_thread(_windows, asked, start, end, points, smooth)}

    def _asked(self, metric: str, sources: Optional[Sequence[str]], axis: str) -> List[Asked]:
        """The series of `metric` (of `sources`, default every one) with the points they hold now (`Asked`)."""
        out = []
        chosen = set(sources) if sources else None
        for key in self._metric_keys(metric):
            source, _, segment = key
            if chosen is None or source in chosen:
                series = self._series[key]
                samples = self._samples_of(source, segment) if axis == "samples" else None
                out.append((source, segment, series, len(series), samples))
        return out

    async def aggregate(
        self,
        metric: str,
        sources: Optional[Sequence[str]] = None,
        exclude: Sequence[str] = (),
        top: Sequence[str] = (),
        start: Optional[int] = None,
        end: Optional[int] = None,
        points: int = 2000,
        smooth: float = 0.0,
    ) -> Dict[str, Any]:
        """The metric across `sources` (default every one) but `exclude`: mean, min-max band and outliers
        (`mstail.tailer.history.aggregate`) plus `latest` (source -> its newest value); `seq`, the newest seq the mean
        holds (its copy's); and, in `series`, the `series()`
        answer for `top` and the outliers, so one request brings the mean and the few sources drawn on top. The
        fold (of a copy, `AggregateCache.fold`), the mean's window and the drawn series' run in the query thread; the
        series are chosen, and their newest values taken, on the loop."""
        keys = self._keys_of(metric, sources, exclude)
        chosen = [(key[0], self._series[key]) for key in keys]
        # each source's newest value (its newest segment's), for tables that show one number per source; taken
        # with the fold's copy, before the loop moves on
        latest = {source: finite_or_name(series.values[-1]) for source, series in chosen if series.values}
        fold = await self._folds.fold((metric, tuple(keys)), chosen)
        summary = await in_query_thread(aggregate, fold, start, end, points, smooth)
        summary["latest"] = latest
        drawn = list(dict.fromkeys([*top, *summary["outliers"]]))
        return {"seq": fold.seq, "aggregate": summary,
                "series": await in_query_thread(_windows, self._asked(metric, drawn, "step"), start, end, points,
                                                smooth) if drawn else []}

    async def keep_folds_warm(self, stop: asyncio.Event) -> None:
        """Until `stop`: keep the fold the page asks first (every source of a metric that more than
        WARM_SOURCES_MIN sources log) current once the history stopped growing (a finished run, the end of a
        catch-up, a restart), so a first visit then does not wait for cold folds (a fold of 1,024 ranks x 2,000
        steps: 0.1-0.3 s each, one after another). The store's seq is looked at every WARM_CHECK_S (one look costs
        nothing however many sources: the metrics are read only once it stood still); once nothing was stored for
        a look, the metrics behind are folded one after another (each in its turn in the query thread: a page's
        requests meanwhile go before the next), within a budget of WARM_SHARE of a core over time and WARM_BURST_S
        at once (`FoldBudget`). A live run whose steps pause for a look is folded after each step, from the fold
        before (a copy of its new steps, `AggregateCache.fold`: bounded however long the run). A history that never
        stands still is left to the page's first answer: a look at every metric's series four times a second
        would cost the loop more than the folds save."""
        said = False
        looked = -1  # the store's seq at the last look
        idle = False  # no fold was behind at `looked`: none is until the seq moves
        budget = FoldBudget(WARM_SHARE, WARM_BURST_S)
        while not stop.is_set():
            pause = WARM_CHECK_S
            try:
                seq = self._last_seq
                if seq != looked:  # stored since the last look: still growing; the folds wait for it to stop
                    looked, idle = seq, False
                elif not idle and budget.left() > 0:
                    folded = await self._warm_next()
                    if folded is None:
                        idle = True
                    else:
                        budget.spend(folded)
                        pause = 0.0
            except Exception:  # a failed fold leaves the request path to fold; said once
                if not said:
                    log.exception("keeping the across-source folds warm failed (the page folds when it asks)")
                    said = True
            try:
                await asyncio.wait_for(stop.wait(), pause)
            except asyncio.TimeoutError:
                pass

    async def _warm_next(self) -> Optional[float]:
        """Fold again the default selection of the first metric, in the order the records name them (the page's
        first charts, loss and the optimiser's, before the speed metrics), whose fold is behind (or missing).
        Returns the seconds the fold took, or None when no fold was behind."""
        self._metric_keys("")  # the index current
        for metric, keys in self._by_metric.items():
            if len({key[0] for key in keys}) <= WARM_SOURCES_MIN:
                continue
            chosen = [(key[0], self._series[key]) for key in keys]
            if self._folds.age((metric, tuple(keys)), chosen) is not None:
                fold = await self._folds.fold((metric, tuple(keys)), chosen, fresh=True)
                return fold.cost
        return None

    async def heatmap(self, metric: str, exclude: Sequence[str] = (), start: Optional[int] = None,
                      end: Optional[int] = None, columns: int = 120, rows: int = 32) -> Dict[str, Any]:
        """The metric across every source but `exclude` as a matrix of at most `rows` x `columns`
        (`mstail.tailer.history.heatmap`), computed in the query thread from a copy of the series taken here; the last
        HEATMAPS_KEPT answers are given again while their series have not grown."""
        keys = self._keys_of(metric, None, exclude)
        chosen = [(key[0], self._series[key]) for key in keys]
        # the same question about the same points (a finished run; each visit and a zoom back out ask it again)
        asked, version = (metric, tuple(keys), start, end, columns, rows), sum(len(s) for _, s in chosen)
        known = self._heatmaps.get(asked)
        if known is not None and known[0] == version:
            return known[1]
        answer = await self._turns.run(chosen, heatmap, start, end, columns, rows)
        self._heatmaps.pop(asked, None)
        self._heatmaps[asked] = (version, answer)
        while len(self._heatmaps) > HEATMAPS_KEPT:
            self._heatmaps.pop(next(iter(self._heatmaps)))
        return answer

    def _keys_of(self, metric: str, sources: Optional[Sequence[str]], exclude: Sequence[str]) -> List[SeriesKey]:
        """The (source, metric, segment) keys of `metric` of `sources` (default every one) but `exclude`."""
        chosen = set(sources) if sources else None
        left_out = set(exclude)
        return [key for key in self._metric_keys(metric) if (chosen is None or key[0] in chosen) and key[0] not in left_out]

    def _metric_keys(self, metric: str) -> List[SeriesKey]:
        """The series keys of `metric` in creation order, from an index rebuilt when series were added (1,024
        ranks x 9 metrics: a query reads its 1,024 keys, not all 9,216)."""
        if self._indexed != len(self._series):
            index: Dict[str, List[SeriesKey]] = {}
            for key in self._series:
                index.setdefault(key[1], []).append(key)
            self._by_metric, self._indexed = index, len(self._series)
        return self._by_metric.get(metric, [])

    def _samples_of(self, source: str, segment: int) -> Optional[Samples]:
        """How the source's x is told in consumed samples: the logged `consumed_samples`, else `global_batch_size`;
        None when it logs neither."""
        for how, metric in (("consumed", "consumed_samples"), ("batch", "global_batch_size")):
            series = self._series.get((source, metric, segment))
            if series is not None and series.values:
                return how, series, len(series)
        return None


def _windows(asked: List[Asked], start: Optional[int], end: Optional[int], points: int,
             smooth: float) -> List[Dict[str, Any]]:
    """`Store.series`'s answer about the series `asked` (`series.window` each, with `samples` where known)."""
    out = []
    for source, segment, series, n, samples in asked:
        entry = window(series, start, end, points, smooth, n)
        if samples is not None:
            entry["samples"] = _samples_at(samples, entry["x"])
        entry.update(source=source, segment=segment)
        out.append(entry)
    return out


def _samples_at(samples: Samples, steps: List[int]) -> List[Optional[float]]:
    """Consumed samples at each step: the logged `consumed_samples` (the latest at or before the step), else
    step × `global_batch_size`."""
    how, series, n = samples
    out: List[Optional[float]] = []
    for step in steps:
        i = bisect_right(series.steps, step, 0, n) - 1
        if how == "consumed":
            out.append(finite_or_none(series.values[i]) if i >= 0 else None)
        else:
            out.append(finite_or_none(step * series.values[max(i, 0)]))
    return out
