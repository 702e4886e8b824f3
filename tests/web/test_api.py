"""The JSON routes in-process: `create_app(store, hub)` over a Store fed known items, called through httpx's ASGI
transport on one event loop (no server process, no browser, no socket). Answers are checked against oracles
written here: naive per-bucket min/max/last and a naive debiased EMA.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import threading
from typing import Any, Callable, Dict, Iterator, List

import httpx
import pytest
from fastapi.routing import APIRoute

from mstail.parsers import Item
from mstail.parsers.record import MAX_NAME_CHARS
from mstail.tailer.alerts.engine import AlertEngine
from mstail.tailer.live.hub import Hub
from mstail.tailer.history.store import Store
from mstail.web.app import create_app

from tests.tailer.test_series import _oracle

T0 = 1.7e9
BIG = 10_000  # rank_1's points: more than `points`, so it is answered in buckets
SPIKE_AT = 7_777


def _rank0_value(metric: str, step: int) -> float:
    if metric == "loss":
        return math.nan if step == 4 else 3.0 - 0.125 * step
    if metric == "grad_norm":
        return {6: math.inf, 7: -math.inf}.get(step, 1.0 + step / 8)
    return 1e-4 * step  # lr


def _rank1_loss(step: int) -> float:
    return 1000.0 if step == SPIKE_AT else 1.0 + 0.01 * (step % 7)


def _fill(store: Store) -> Store:
    """rank_0 (following): 10 records of loss (NaN at step 4), lr, grad_norm (+Inf at 6, -Inf at 7) and
    global_batch_size, a checkpoint after step 5 and an eval at the end. rank_1 (idle): BIG records of loss with
    a spike, and an error event."""
    rank0 = store.add_source("rank_0", "/logs/output/log/rank_0/info.log")
    rank0.format, rank0.state, rank0.counters = "mindformers", "following", {"lines": 20, "bytes": 2048}
    rank1 = store.add_source("rank_1", "/logs/output/log/rank_1/info.log")
    rank1.state = "idle"

    def rank0_record(step: int) -> Item:
        # Keys in a non-canonical order on purpose: the store puts the reserved ones first.
        return Item("record", {"loss": _rank0_value("loss", step), "step": step, "lr": _rank0_value("lr", step),
                               "time": T0 + step, "epoch": 1, "grad_norm": _rank0_value("grad_norm", step),
                               "global_batch_size": 32})

    store.add("rank_0", [rank0_record(s) for s in range(1, 6)])
    store.add("rank_0", [Item("event", {"kind": "checkpoint", "step": 5, "time": T0 + 5.5, "message": "saved ckpt_5"})])
    store.add("rank_1", [Item("record", {"step": s, "time": T0 + s / 10, "loss": _rank1_loss(s)})
                         for s in range(1, BIG + 1)])
    store.add("rank_1", [Item("event", {"kind": "error", "step": BIG, "time": T0 + BIG, "message": "boom"})])
    store.add("rank_0", [rank0_record(s) for s in range(6, 11)])
    store.add("rank_0", [Item("event", {"kind": "eval", "step": 10, "time": T0 + 10.5, "message": "eval done"})])
    return store


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    store = _fill(Store())
    yield store
    store.close()


@pytest.fixture(scope="module")
def app(store: Store) -> Any:
    return create_app(store, Hub(), health=lambda: {"passes": 7})


def get(app: Any, path: str, **params: Any) -> httpx.Response:
    """One GET through the ASGI transport, on an event loop in this thread (list values repeat the key)."""

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
            return await client.get(path, params=params)

    return asyncio.run(go())


def get_json(app: Any, path: str, **params: Any) -> Any:
    response = get(app, path, **params)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    return response.json()


def _name(value: float) -> Any:
    return value if math.isfinite(value) else "NaN" if value != value else "Infinity" if value > 0 else "-Infinity"


def _api_routes(routes: List[Any]) -> Iterator[APIRoute]:
    for route in routes:
        included = getattr(route, "original_router", None)  # newer FastAPI keeps an included router as one route
        if included is not None:
            yield from _api_routes(included.routes)
        elif isinstance(route, APIRoute):
            yield route


# -- the thread contract ---------------------------------------------------------------------------------
def test_every_api_route_runs_on_the_event_loop(store: Store) -> None:
    """The Store and the alert engine are used from the event loop only: every /api route is a coroutine (a
    plain `def` route would run in FastAPI's thread pool), and the store is read in the loop's thread."""

    class Spy(Store):
        def __init__(self) -> None:
            super().__init__()
            self.threads: Dict[str, set] = {}

        def _saw(self, what: str) -> None:
            self.threads.setdefault(what, set()).add(threading.get_ident())

        async def series_answer(self, *args: Any, **kwargs: Any) -> Dict[str, Any]:
            self._saw("series")
            return await super().series_answer(*args, **kwargs)

        def records_after(self, *args: Any, **kwargs: Any) -> List[Dict[str, Any]]:
            self._saw("records_after")
            return super().records_after(*args, **kwargs)

        def events(self, *args: Any, **kwargs: Any) -> List[Dict[str, Any]]:
            self._saw("events")
            return super().events(*args, **kwargs)

    class SpySources(dict):  # type: ignore[type-arg]
        def __init__(self, spy: Spy, *args: Any) -> None:
            super().__init__(*args)
            self.spy = spy

        def values(self):  # type: ignore[no-untyped-def]
            self.spy._saw("sources")
            return super().values()

    class SpyAlerts:
        def __init__(self, spy: Spy) -> None:
            self.spy = spy

        def table(self) -> Dict[str, Any]:
            self.spy._saw("alerts")
            return {"active": [], "resolved": [], "count": 0}

    spy = _fill(Spy())
    spy.sources = SpySources(spy, spy.sources)
    app = create_app(spy, Hub(), alerts=SpyAlerts(spy))  # type: ignore[arg-type]
    api = {route.path: route.endpoint for route in _api_routes(app.routes) if route.path.startswith("/api/")}
    assert set(api) >= {"/api/sources", "/api/series", "/api/records", "/api/events", "/api/alerts", "/api/stream"}
    assert [path for path, endpoint in api.items() if not inspect.iscoroutinefunction(endpoint)] == []

    async def calls() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
            for path in ("/api/sources", "/api/series?metric=loss&smooth=0.9", "/api/records", "/api/events",
                         "/api/alerts"):
                assert (await client.get(path)).status_code == 200, path

    asyncio.run(calls())
    here = {threading.get_ident()}
    assert spy.threads == {k: here for k in ("sources", "series", "records_after", "events", "alerts")}
    spy.close()


# -- /healthz and /api/sources ----------------------------------------------------------------------------
def test_healthz_answers_503_with_the_problems(store: Store) -> None:
    failing = create_app(store, Hub(), health=lambda: {"problems": ["tailing has stopped"]})
    response = get(failing, "/healthz")
    assert response.status_code == 503
    assert response.json()["status"] == "failing" and response.json()["problems"] == ["tailing has stopped"]


def test_healthz(app: Any, store: Store) -> None:
    assert get_json(app, "/healthz") == {"status": "ok", "sources": 2, "last_seq": store.last_seq, "clients": 0,
                                         "passes": 7, "problems": []}
    assert store.last_seq == 10 + BIG + 3


def test_sources(app: Any) -> None:
    got = get_json(app, "/api/sources")
    assert [s["id"] for s in got] == ["rank_0", "rank_1"]
    rank0, rank1 = got
    assert list(rank0) == ["id", "path", "format", "state", "records", "first_step", "last_step", "last_time",
                           "total_steps", "metrics", "counters", "problem", "hang_rule", "run", "end_reason",
                           "end_guessed"]
    assert rank0 == {
        "id": "rank_0", "path": "/logs/output/log/rank_0/info.log", "format": "mindformers", "state": "following",
        "records": 10, "first_step": 1, "last_step": 10, "last_time": T0 + 10, "total_steps": None,
        "metrics": ["loss", "lr", "grad_norm", "global_batch_size"], "counters": {"lines": 20, "bytes": 2048},
        "problem": None, "hang_rule": None, "run": None, "end_reason": None, "end_guessed": False,
    }
    assert (rank1["state"], rank1["records"], rank1["first_step"], rank1["last_step"], rank1["metrics"]) == (
        "idle", BIG, 1, BIG, ["loss"])


# -- /api/series ------------------------------------------------------------------------------------------
def test_series_exact_with_non_finite_values(app: Any, store: Store) -> None:
    answer = get_json(app, "/api/series", metric="loss", source="rank_0")
    assert (answer["metric"], answer["seq"]) == ("loss", store.last_seq)
    [entry] = answer["series"]
    steps = list(range(1, 11))
    want = [_name(_rank0_value("loss", s)) for s in steps]
    assert want[3] == "NaN"
    assert entry == {"x": steps, "min": want, "max": want, "last": want, "nonfinite": {"x": [4], "value": ["NaN"]},
                     "t": [T0 + s for s in steps], "source": "rank_0", "segment": 0}
    [norms] = get_json(app, "/api/series", metric="grad_norm")["series"]
    assert norms["last"][5:7] == ["Infinity", "-Infinity"]
    assert norms["nonfinite"] == {"x": [6, 7], "value": ["Infinity", "-Infinity"]}


def test_series_buckets_keep_min_max_last_and_the_spike(app: Any) -> None:
    [entry] = get_json(app, "/api/series", metric="loss", source="rank_1", points=100)["series"]
    values = [_rank1_loss(s) for s in range(1, BIG + 1)]
    size = -(-BIG // 100)
    buckets = [(a, min(a + size, BIG)) for a in range(0, BIG, size)]
    assert len(buckets) == 100
    assert entry["x"] == [b for _, b in buckets]  # steps are 1-based: step b is index b - 1, the bucket's last
    assert entry["min"] == [min(values[a:b]) for a, b in buckets]
    assert entry["max"] == [max(values[a:b]) for a, b in buckets]
    assert entry["last"] == [values[b - 1] for _, b in buckets]
    assert entry["t"] == [T0 + b / 10 for _, b in buckets]
    spiked = next(i for i, x in enumerate(entry["x"]) if x >= SPIKE_AT)
    assert entry["max"][spiked] == 1000.0 and max(entry["max"]) == 1000.0 and min(entry["min"]) == 1.0
    assert entry["nonfinite"] == {"x": [], "value": []}
    # Exact again as soon as the range holds no more than `points` points.
    [exact] = get_json(app, "/api/series", metric="loss", source="rank_1", start=SPIKE_AT - 2, end=SPIKE_AT + 2,
                       points=5)["series"]
    assert exact["x"] == list(range(SPIKE_AT - 2, SPIKE_AT + 3)) and exact["max"][2] == 1000.0


def test_series_smooth_is_the_full_series_ema_at_each_x(app: Any) -> None:
    steps = list(range(1, 11))
    [entry] = get_json(app, "/api/series", metric="loss", source="rank_0", smooth=0.9)["series"]
    want = _oracle(steps, [_rank0_value("loss", s) for s in steps], 0.9)
    assert entry["smooth"] == pytest.approx(want, rel=1e-12)
    # The NaN at step 4 is skipped, but step 5 decays from step 3 like two points: den is that of 10 points.
    assert entry["smooth_state"] == {"den": pytest.approx(1 - 0.9 ** 10, rel=1e-12), "x": 10, "stride": 1}
    # Bucketed: the EMA of the full-resolution series at each bucket's x.
    [bucketed] = get_json(app, "/api/series", metric="loss", source="rank_1", smooth=0.95, points=50)["series"]
    full = _oracle(list(range(1, BIG + 1)), [_rank1_loss(s) for s in range(1, BIG + 1)], 0.95)
    assert bucketed["smooth"] == pytest.approx([full[x - 1] for x in bucketed["x"]], rel=1e-9)
    # A range that stops before the newest point has no `smooth_state` (nothing to continue live from).
    [ended] = get_json(app, "/api/series", metric="loss", source="rank_0", smooth=0.9, end=8)["series"]
    assert ended["smooth"] == entry["smooth"][:8] and "smooth_state" not in ended
    # The weight is rounded to 3 decimals; 0 means no smoothing.
    assert get_json(app, "/api/series", metric="loss", smooth=0.9004)["series"][0]["smooth"] == entry["smooth"]
    assert "smooth" not in get_json(app, "/api/series", metric="loss", smooth=0)["series"][0]


def test_series_start_end_and_source_filter(app: Any) -> None:
    def xs(**params: Any) -> Dict[str, List[int]]:
        return {e["source"]: e["x"] for e in get_json(app, "/api/series", metric="loss", **params)["series"]}

    assert xs(start=3, end=6) == {"rank_0": [3, 4, 5, 6], "rank_1": [3, 4, 5, 6]}
    assert xs(start=-5, end=2, source="rank_0") == {"rank_0": [1, 2]}
    assert xs(start=9, source="rank_0") == {"rank_0": [9, 10]}
    assert xs(start=BIG + 1) == {"rank_0": [], "rank_1": []}  # past the end: no points, the series stay listed
    assert list(xs(source=["rank_1", "rank_0"], end=1)) == ["rank_0", "rank_1"]  # store order
    assert xs(source="rank_9") == {}
    assert get_json(app, "/api/series", metric="no_such_metric")["series"] == []


def test_series_axis_samples(app: Any) -> None:
    by_source = {e["source"]: e for e in get_json(app, "/api/series", metric="loss", axis="samples", end=4)["series"]}
    assert by_source["rank_0"]["samples"] == [32.0, 64.0, 96.0, 128.0]  # step × global_batch_size
    assert "samples" not in by_source["rank_1"]  # logs neither consumed_samples nor global_batch_size
    assert "samples" not in get_json(app, "/api/series", metric="loss", source="rank_0")["series"][0]


# -- /api/records, /api/events, /api/alerts --------------------------------------------------------------
def test_records_after_limit_key_order_and_non_finite(app: Any, store: Store) -> None:
    first = get_json(app, "/api/records", after=0, limit=3)
    assert [r["seq"] for r in first] == [1, 2, 3]
    assert list(first[0]) == ["seq", "source", "step", "epoch", "time", "loss", "lr", "grad_norm", "global_batch_size"]
    assert first[0] == {"seq": 1, "source": "rank_0", "step": 1, "epoch": 1, "time": T0 + 1, "loss": 2.875,
                        "lr": 1e-4, "grad_norm": 1.125, "global_batch_size": 32}
    page = get_json(app, "/api/records", after=3, limit=4)
    assert [r["seq"] for r in page] == [4, 5, 7, 8]  # seq 6 is the checkpoint event: records only
    assert [r["source"] for r in page] == ["rank_0", "rank_0", "rank_1", "rank_1"]
    rank0 = [r for r in get_json(app, "/api/records", after=0, limit=10_000) if r["source"] == "rank_0"]
    rank0 += [r for r in get_json(app, "/api/records", after=10_000, limit=10_000) if r["source"] == "rank_0"]
    assert [r["step"] for r in rank0] == list(range(1, 11))
    # Non-finite numbers by name, as everywhere else (FastAPI must not validate the answer: pydantic writes null).
    assert rank0[3]["loss"] == "NaN"
    assert (rank0[5]["grad_norm"], rank0[6]["grad_norm"]) == ("Infinity", "-Infinity")
    assert get_json(app, "/api/records", after=store.last_seq) == []
    assert len(get_json(app, "/api/records")) == 1000  # the default limit


def test_events_and_kind_filter(app: Any) -> None:
    events = get_json(app, "/api/events")
    assert [(e["kind"], e["source"]) for e in events] == [("checkpoint", "rank_0"), ("error", "rank_1"),
                                                          ("eval", "rank_0")]
    assert events[0] == {"seq": 6, "source": "rank_0", "step": 5, "time": T0 + 5.5, "kind": "checkpoint",
                         "message": "saved ckpt_5"}
    assert [e["message"] for e in get_json(app, "/api/events", kind="eval")] == ["eval done"]
    assert get_json(app, "/api/events", kind="resume") == []


def test_alerts_off_and_on(store: Store) -> None:
    off = create_app(store, Hub())
    assert get_json(off, "/api/alerts") == {"active": [], "resolved": [], "count": 0, "enabled": False}
    on = create_app(store, Hub(), alerts=AlertEngine())
    assert get_json(on, "/api/alerts") == {"active": [], "resolved": [], "count": 0, "enabled": True}


# -- query validation -------------------------------------------------------------------------------------
@pytest.mark.parametrize("path, params", [
    ("/api/series", {}),
    ("/api/series", {"metric": "m" * (MAX_NAME_CHARS + 1)}),
    ("/api/series", {"metric": "loss", "points": 0}),
    ("/api/series", {"metric": "loss", "points": 20_001}),
    ("/api/series", {"metric": "loss", "points": "1.5"}),
    ("/api/series", {"metric": "loss", "smooth": -0.1}),
    ("/api/series", {"metric": "loss", "smooth": 1.0}),
    ("/api/series", {"metric": "loss", "smooth": "nan"}),
    ("/api/series", {"metric": "loss", "axis": "time"}),
    ("/api/series", {"metric": "loss", "start": 2**63}),
    ("/api/series", {"metric": "loss", "end": -(2**63) - 1}),  # -2^63 is a step an event file can have
    ("/api/series", {"metric": "loss", "source": ["rank_0"] * 1025}),
    ("/api/series", {"metric": "loss", "source": "r" * 1001}),
    ("/api/records", {"after": -1}),
    ("/api/records", {"after": 2**63}),
    ("/api/records", {"limit": 0}),
    ("/api/records", {"limit": 10_001}),
    ("/api/events", {"kind": "k" * 51}),
])
def test_bad_queries_answer_422(app: Any, path: str, params: Dict[str, Any]) -> None:
    response = get(app, path, **params)
    assert response.status_code == 422, (params, response.text)
    assert "detail" in json.loads(response.text)


def test_bounds_are_inclusive(app: Any) -> None:
    ok: List[Callable[[], httpx.Response]] = [
        lambda: get(app, "/api/series", metric="m" * 200, points=20_000, smooth=0.999, start=2**63 - 1,
                    end=-(2**63 - 1)),
        lambda: get(app, "/api/series", metric="loss", source=["rank_0"] * 1024),
        lambda: get(app, "/api/records", after=2**63 - 1, limit=10_000),
        lambda: get(app, "/api/events", kind="k" * 50),
    ]
    for call in ok:
        response = call()
        assert response.status_code == 200, response.text
