"""JSON routes: sources, series (exact or min/max buckets), records, events, health."""

from __future__ import annotations

from typing import List, Optional

from fastapi import APIRouter, Query, Request

from .responses import RecordJSONResponse

router = APIRouter(prefix="/api", default_response_class=RecordJSONResponse)

MAX_POINTS = 20_000
MAX_LIMIT = 10_000


def _store(request: Request):  # type: ignore[no-untyped-def]
    return request.app.state.store


@router.get("/sources")
def sources(request: Request) -> list:
    """Every source: id, path, format, state (waiting | following | idle | gone), counts and steps."""
    return [info.as_json() for info in _store(request).sources.values()]


@router.get("/series")
def series(
    request: Request,
    metric: str = Query(..., max_length=200, description="metric name, e.g. loss"),
    source: Optional[List[str]] = Query(None, description="restrict to these source ids (repeatable)"),
    start: Optional[int] = Query(None, description="first step (inclusive)"),
    end: Optional[int] = Query(None, description="last step (inclusive)"),
    points: int = Query(2000, ge=1, le=MAX_POINTS, description="exact points up to this many, else buckets"),
) -> dict:
    """One metric per (source, segment): x = steps; min/max/last equal when exact, else per bucket."""
    store = _store(request)
    return {
        "metric": metric,
        "seq": store.last_seq,
        "series": store.series(metric, sources=source, start=start, end=end, points=points),
    }


@router.get("/records")
def records(
    request: Request,
    after: int = Query(0, ge=0, description="only records with seq > after"),
    limit: int = Query(1000, ge=1, le=MAX_LIMIT),
) -> list:
    """Raw records in seq order."""
    return _store(request).records_after(after, limit)


@router.get("/events")
def events(request: Request, kind: Optional[str] = Query(None, max_length=50)) -> list:
    """Events (checkpoint, eval, error, end, start, resume ...), optionally of one kind."""
    return _store(request).events(kind)
