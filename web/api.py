"""JSON routes: sources, series (exact or min/max buckets), records, events, health."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional

from fastapi import APIRouter, HTTPException, Query, Request

from mstail.parsers.record import MAX_NAME_CHARS

from .responses import RecordJSONResponse

if TYPE_CHECKING:
    from mstail.tailer.history.store import Store

# Every route is `async def`: the Store and the alert engine are touched from the event loop only (ARCHITECTURE.md,
# Threads); the charts' maths (series, folds, heatmaps) runs in the Store's query thread, so no query stalls the loop. response_model=None: the answers are already JSON-ready (non-finite numbers by name, `mstail.parsers.record`);
# a return annotation would otherwise make FastAPI validate them with pydantic, which writes NaN as null. Each
# route returns its `RecordJSONResponse` itself: FastAPI would otherwise walk a returned dict with its
# `jsonable_encoder`, value by value, before rendering it (two thirds of a /api/series answer's time).
router = APIRouter(prefix="/api", default_response_class=RecordJSONResponse)

MAX_POINTS = 20_000
MAX_LIMIT = 10_000
MAX_SEQ = 2**63 - 1  # seqs and steps are 64-bit: bigger numbers are malformed, not work
MIN_STEP = -(2**63)  # the least step an input can give (an event file's int64; a log's step is checked to fit)
MAX_SOURCES = 1024  # repeated ?source= values per request


def _store(request: Request) -> Store:
    return request.app.state.store


def _check_ids(*lists: Optional[List[str]]) -> None:
    """A 422 for more than MAX_SOURCES repeated source ids, or one longer than 1000 characters."""
    for ids in lists:
        if ids is not None and (len(ids) > MAX_SOURCES or any(len(s) > 1000 for s in ids)):
            raise HTTPException(422, f"at most {MAX_SOURCES} source ids of at most 1000 characters each")


@router.get("/sources", response_model=None)
async def sources(
    request: Request,
    compact: bool = Query(False, description="a table without the file-reading counters (what a page needs first)"),
) -> RecordJSONResponse:
    """Every source: id, path, format, state (waiting | following | idle | finished | died | stopped | gone |
    unreadable), how its run ended (`end_reason`, `end_guessed`), counts and steps. With `compact`:
    `{"keys", "metrics", "rows"}`, one row of values per source in the order of `keys`, `counters` left out but for
    `COMPACT_COUNTERS` (a key each) and each source's `metrics` as indexes into `metrics` (1,024 ranks: about a fifth
    of the size)."""
    entries = [info.as_json() for info in _store(request).sources.values()]
    return RecordJSONResponse(_compact(entries) if compact else entries)


#: The one counter a page needs first: `read_times` (its records' times are the moments their lines were read, which
#: its time axes say), a column of the compact table.
COMPACT_COUNTERS = ("read_times",)


def _compact(entries: List[Dict[str, Any]]) -> Dict[str, Any]:
    keys = [key for key in entries[0] if key != "counters"] + list(COMPACT_COUNTERS) if entries else []
    names: Dict[str, int] = {}
    rows = []
    for entry in entries:
        for name in COMPACT_COUNTERS:
            entry[name] = entry["counters"].get(name, 0)
        entry["metrics"] = [names.setdefault(name, len(names)) for name in entry["metrics"]]
        rows.append([entry[key] for key in keys])
    return {"keys": keys, "metrics": list(names), "rows": rows}


@router.get("/series", response_model=None)
async def series(
    request: Request,
    metric: str = Query(..., max_length=MAX_NAME_CHARS, description="metric name, e.g. loss"),
    source: Optional[List[str]] = Query(None, description="restrict to these source ids (repeatable)"),
    start: Optional[int] = Query(None, ge=MIN_STEP, le=MAX_SEQ, description="first step (inclusive)"),
    end: Optional[int] = Query(None, ge=MIN_STEP, le=MAX_SEQ, description="last step (inclusive)"),
    points: int = Query(2000, ge=1, le=MAX_POINTS, description="exact points up to this many, else buckets"),
    smooth: float = Query(0.0, ge=0.0, le=0.999, description="EMA weight: adds `smooth` (0 = none)"),
    axis: str = Query("step", pattern="^(step|samples)$", description="samples: adds `samples` where known"),
    aggregate: Optional[str] = Query(None, pattern="^mean$", description="mean: one series across the sources"),
    exclude: Optional[List[str]] = Query(None, description="with aggregate: leave these source ids out"),
    top: Optional[List[str]] = Query(None, description="with aggregate: these sources' own series too"),
) -> RecordJSONResponse:
    """One metric per (source, segment): x = steps, t = wall times; min/max/last equal when exact, else per
    bucket; `smooth` is the EMA of the full-resolution series at each x (see Store.series). With
    `aggregate=mean`: the mean across the sources with the min-max band and the outliers (Store.aggregate)."""
    _check_ids(source, exclude, top)
    store = _store(request)
    if aggregate is not None:
        return RecordJSONResponse({"metric": metric,  # and the seq the mean holds: its copy's
                                   **await store.aggregate(metric, sources=source, exclude=exclude or (), top=top or (),
                                                           start=start, end=end, points=points, smooth=round(smooth, 3))})
    return RecordJSONResponse({"metric": metric, **await store.series_answer(
        metric, sources=source, start=start, end=end, points=points, smooth=round(smooth, 3), axis=axis)})


@router.get("/heatmap", response_model=None)
async def heatmap(
    request: Request,
    metric: str = Query("step_time_ms", max_length=MAX_NAME_CHARS, description="metric name"),
    exclude: Optional[List[str]] = Query(None, description="leave these source ids out (repeatable)"),
    start: Optional[int] = Query(None, ge=MIN_STEP, le=MAX_SEQ, description="first step (inclusive)"),
    end: Optional[int] = Query(None, ge=MIN_STEP, le=MAX_SEQ, description="last step (inclusive)"),
    columns: int = Query(120, ge=1, le=2000, description="columns at most (runs of consecutive logged steps)"),
    rows: int = Query(32, ge=1, le=MAX_SOURCES, description="rows at most (beyond: neighbouring sources share one)"),
) -> RecordJSONResponse:
    """The metric of every source as a rows x columns matrix, each cell a source's mean in the column relative to
    the sources' median there (mstail.tailer.history.heatmap): the page's step-time heatmap in one small answer."""
    _check_ids(exclude)
    store = _store(request)
    seq = store.last_seq
    return RecordJSONResponse({"metric": metric, "seq": seq, **await store.heatmap(
        metric, exclude=exclude or (), start=start, end=end, columns=columns, rows=rows)})


@router.get("/records", response_model=None)
async def records(
    request: Request,
    after: int = Query(0, ge=0, le=MAX_SEQ, description="only records with seq > after"),
    limit: int = Query(1000, ge=1, le=MAX_LIMIT),
) -> RecordJSONResponse:
    """Raw records in seq order."""
    return RecordJSONResponse(_store(request).records_after(after, limit))


@router.get("/events", response_model=None)
async def events(
    request: Request,
    kind: Optional[str] = Query(None, max_length=50, description="only events of this kind (checkpoint, eval, ...)"),
    after: int = Query(0, ge=0, le=MAX_SEQ, description="only events with seq > after"),
    limit: int = Query(1000, ge=1, le=MAX_LIMIT, description="at most this many"),
    newest: bool = Query(False, description="the newest `limit` events instead of the first ones after `after`"),
) -> RecordJSONResponse:
    """Events (checkpoint, eval, error, end, start, alert ...) in seq order, a page at a time."""
    return RecordJSONResponse(_store(request).events(kind, after, limit, newest))


@router.get("/alerts", response_model=None)
async def alerts(request: Request) -> RecordJSONResponse:
    """The alert table: `active` (firing, newest first), `resolved` (recent), `count` (active ones)."""
    engine = request.app.state.alerts
    if engine is None:
        return RecordJSONResponse({"active": [], "resolved": [], "count": 0, "enabled": False})
    return RecordJSONResponse({**engine.table(), "enabled": True})
