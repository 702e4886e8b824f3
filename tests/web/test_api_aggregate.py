"""`/api/series?aggregate=mean` in-process: the mean across sources, the min-max band, the outliers and the sources
drawn on top, checked against a naive oracle written here (per step: the mean of the finite values logged at it;
buckets: consecutive runs of those steps, as one source's series is bucketed; the EMA of the per-step mean)."""

from __future__ import annotations

import asyncio
import math
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

from mstail.parsers import Item
from mstail.tailer.live.hub import Hub
from mstail.tailer.history.store import WARM_CHECK_S, FoldBudget, Store
from mstail.web.app import create_app

from tests.tailer.test_series import _oracle
from tests.web.test_api import get, get_json

RANKS = 20
STEPS = 300
T0 = 1.7e9


def _value(rank: int, step: int) -> float:
    if rank == 3 and step == 150:
        return math.nan  # a NaN on one rank: listed, never in mean or band
    if rank == 7 and step == 222:
        return 500.0  # a spike on one rank: in the band
    if rank == 11:
        return 9.0 + 0.001 * step  # far from the others all along: the outlier
    return 2.0 + 5.0 * math.exp(-step / 80) + 0.01 * ((step * (rank + 3)) % 7)


def _steps(rank: int) -> List[int]:
    if rank == 5:
        return list(range(1, STEPS - 40 + 1))  # behind the others
    if rank == 6:
        return list(range(2, STEPS + 1, 2))  # logs every other step
    return list(range(1, STEPS + 1))


def ranks_store(ranks: int, records: Callable[[int], List[Dict[str, Any]]]) -> Store:
    """A Store of sources rank_0 .. rank_{ranks-1}, each holding `records(rank)`."""
    store = Store()
    for rank in range(ranks):
        source = f"rank_{rank}"
        store.add_source(source, f"/logs/{source}/info.log")
        store.add(source, [Item("record", record) for record in records(rank)])
    return store


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    store = ranks_store(RANKS, lambda rank: [{"step": s, "time": T0 + s + rank / 100, "loss": _value(rank, s)}
                                             for s in _steps(rank)])
    yield store
    store.close()


@pytest.fixture(scope="module")
def app(store: Store) -> Any:
    return create_app(store, Hub())


def _per_step(ranks: List[int], end: Optional[int] = None) -> Dict[int, List[Tuple[float, float]]]:
    cells: Dict[int, List[Tuple[float, float]]] = {}
    for rank in ranks:
        for s in _steps(rank):
            v = _value(rank, s)
            if math.isfinite(v) and (end is None or s <= end):
                cells.setdefault(s, []).append((v, T0 + s + rank / 100))
    return dict(sorted(cells.items()))


def _oracle_answer(ranks: List[int], start: Optional[int], end: Optional[int], points: int,
                   smooth: float) -> Dict[str, Any]:
    cells = _per_step(ranks, end)
    steps = [s for s in cells if (start is None or s >= start)]
    size = max(1, -(-len(steps) // points)) if len(steps) > points else 1
    buckets = [steps[a:a + size] for a in range(0, len(steps), size)]
    mean = {s: sum(v for v, _ in c) / len(c) for s, c in cells.items()}
    out = {
        "x": [b[-1] for b in buckets],
        "mean": [mean[b[-1]] for b in buckets],
        "min": [min(v for s in b for v, _ in cells[s]) for b in buckets],
        "max": [max(v for s in b for v, _ in cells[s]) for b in buckets],
        "n": [len(cells[b[-1]]) for b in buckets],
        "t": [sum(t for _, t in cells[b[-1]]) / len(cells[b[-1]]) for b in buckets],
    }
    if smooth:
        full = list(cells)
        ema = dict(zip(full, _oracle(full, [mean[s] for s in full], smooth)))
        out["smooth"] = [ema[x] for x in out["x"]]
    return out


@pytest.mark.parametrize("start,end,points,smooth", [
    (None, None, 2000, 0.0),  # exact: one x per step any rank logged
    (None, None, 37, 0.0),  # bucketed
    (100, 260, 2000, 0.0),  # a range, exact
    (100, 260, 9, 0.9),  # a range, bucketed, smoothed (the EMA runs from the first step)
    (None, None, 50, 0.6),
])
def test_aggregate_matches_the_oracle(app: Any, start: Optional[int], end: Optional[int], points: int,
                                      smooth: float) -> None:
    params: Dict[str, Any] = {"metric": "loss", "aggregate": "mean", "points": points, "smooth": smooth}
    if start is not None:
        params.update(start=start, end=end)
    answer = get_json(app, "/api/series", **params)
    agg = answer["aggregate"]
    want = _oracle_answer(list(range(RANKS)), start, end, points, smooth)
    assert agg["sources"] == RANKS
    assert agg["x"] == want["x"]
    for key in ("mean", "min", "max", "t") + (("smooth",) if smooth else ()):
        assert agg[key] == pytest.approx(want[key], rel=1e-12), key
    assert agg["n"] == want["n"]
    assert len(agg["x"]) <= points
    if smooth:
        assert ("smooth_state" in agg) == (end is None)
    else:
        assert "smooth" not in agg


def test_aggregate_keeps_spikes_and_lists_non_finite_values(app: Any) -> None:
    agg = get_json(app, "/api/series", metric="loss", aggregate="mean", points=10)["aggregate"]
    assert max(agg["max"]) == 500.0  # one rank's spike inside a bucket of 30 steps x 20 ranks
    assert agg["nonfinite"] == {"x": [150], "source": ["rank_3"], "value": ["NaN"]}
    assert all(math.isfinite(v) for v in agg["mean"])


def test_aggregate_names_the_outliers_and_brings_its_series_and_the_asked_ones(app: Any) -> None:
    answer = get_json(app, "/api/series", metric="loss", aggregate="mean", points=100, top=["rank_2", "rank_11"])
    # rank_11 runs far from the others all along; rank_7's one spike of 500 puts it far too, on average
    assert answer["aggregate"]["outliers"] == ["rank_11", "rank_7"]
    assert [s["source"] for s in answer["series"]] == ["rank_2", "rank_7", "rank_11"]  # store order, once each
    plain = get_json(app, "/api/series", metric="loss", points=100, source=["rank_2", "rank_7", "rank_11"])["series"]
    assert answer["series"] == plain


def test_aggregate_over_chosen_or_all_but_excluded_sources(app: Any) -> None:
    without = get_json(app, "/api/series", metric="loss", aggregate="mean", exclude=["rank_11", "rank_7"])["aggregate"]
    ranks = [r for r in range(RANKS) if r not in (7, 11)]
    want = _oracle_answer(ranks, None, None, 2000, 0.0)
    assert without["sources"] == RANKS - 2 and without["mean"] == pytest.approx(want["mean"], rel=1e-12)
    assert max(without["max"]) < 10 and without["outliers"] == []
    chosen = get_json(app, "/api/series", metric="loss", aggregate="mean", source=["rank_1", "rank_2", "rank_6"])
    assert chosen["aggregate"]["sources"] == 3
    assert chosen["aggregate"]["mean"] == pytest.approx(_oracle_answer([1, 2, 6], None, None, 2000, 0)["mean"], rel=1e-12)


def test_aggregate_of_finite_values_only_matches_the_oracle(app: Any) -> None:
    # Without rank_3's NaN every value is finite: the fold skips its masks then (each point's step index is its
    # position, the outliers' distances read every point); the answer is the oracle's all the same.
    answer = get_json(app, "/api/series", metric="loss", aggregate="mean", points=2000, exclude=["rank_3"])
    agg, want = answer["aggregate"], _oracle_answer([r for r in range(RANKS) if r != 3], None, None, 2000, 0.0)
    assert agg["x"] == want["x"] and agg["n"] == want["n"] and agg["nonfinite"]["x"] == []
    for key in ("mean", "min", "max", "t"):
        assert agg[key] == pytest.approx(want[key], rel=1e-12), key
    assert agg["outliers"] == ["rank_11", "rank_7"]


def test_aggregate_of_nothing_and_bad_values(app: Any) -> None:
    empty = get_json(app, "/api/series", metric="nope", aggregate="mean")
    assert empty["aggregate"]["x"] == [] and empty["series"] == []
    assert get_json(app, "/api/series", metric="loss", aggregate="mean", start=STEPS + 1)["aggregate"]["x"] == []
    assert get(app, "/api/series", metric="loss", aggregate="median").status_code == 422
    assert get(app, "/api/series", metric="loss", aggregate="mean",
               exclude=[f"r{i}" for i in range(1025)]).status_code == 422


def test_aggregate_leaves_the_columns_free_to_grow(store: Store, app: Any) -> None:
    # numpy reads the store's arrays through their buffers; a view left behind would make the next append raise
    # BufferError ("cannot resize an array that is exporting buffers").
    get_json(app, "/api/series", metric="loss", aggregate="mean", smooth=0.5, start=10, end=200)
    store.add_source("rank_99", "/logs/rank_99/info.log")
    store.add("rank_0", [Item("record", {"step": STEPS + 1, "time": T0, "loss": 1.0})])
    assert get_json(app, "/api/series", metric="loss", aggregate="mean", start=STEPS + 1)["aggregate"]["n"] == [1]


def _warm_for(store: Store, seconds: float) -> None:
    """Run `Store.keep_folds_warm` for `seconds`, then stop it (it must end when told)."""
    async def run() -> None:
        stop = asyncio.Event()
        warming = asyncio.ensure_future(store.keep_folds_warm(stop))
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.wait_for(warming, 5)

    asyncio.run(run())


def test_folds_are_kept_warm_before_any_page_asks() -> None:
    # A first visit to 1,024 ranks waited for a cold fold per chart; the warmer folds every metric of more than
    # 16 sources (what the page draws as the mean of all) on its own once it stopped growing, and again after the
    # run grew and stopped again (the same warmer, which stopped looking while nothing moved).
    def records(rank: int) -> List[Dict[str, Any]]:
        return [{"step": s, "time": T0 + s, "loss": 1.0 + rank, "lr": 0.1} for s in range(1, 51)]

    store = ranks_store(RANKS, records)
    few = ranks_store(3, records)
    try:
        def age(s: Store, metric: str) -> Optional[float]:
            keys = s._keys_of(metric, None, ())
            return s._folds.age((metric, tuple(keys)), [(k[0], s._series[k]) for k in keys])

        async def current(s: Store) -> None:  # bounded: a look, another that sees the metrics settled, two folds
            for _ in range(200):
                if age(s, "loss") is None and age(s, "lr") is None:
                    return
                await asyncio.sleep(0.05)
            raise AssertionError("the warmer did not fold loss and lr within 10 s")

        async def run() -> None:
            stop = asyncio.Event()
            warming = asyncio.ensure_future(store.keep_folds_warm(stop))
            await current(store)  # nobody asked
            await asyncio.sleep(4 * WARM_CHECK_S)  # idle: nothing behind, nothing grew
            store.add("rank_0", [Item("record", {"step": 51, "time": T0 + 51, "loss": 1.0, "lr": 0.1})])
            assert age(store, "loss") is not None  # behind the run now
            await current(store)
            stop.set()
            await asyncio.wait_for(warming, 5)

        assert age(store, "loss") == math.inf
        asyncio.run(run())
        _warm_for(few, 0.3)
        assert age(few, "loss") == math.inf  # 3 sources: the page overlays them, no fold wanted
    finally:
        store.close()
        few.close()


def test_an_expensive_fold_is_served_while_young_and_says_what_it_holds(monkeypatch: Any) -> None:
    # A fold that took long is served for a while after the series grew, with its own seq (the page's stream
    # brings the records after it); a cheap one, or a stale one asked `fresh`, is folded again.
    from mstail.tailer.history import aggregate as aggregate_module

    store = ranks_store(RANKS, lambda rank: [{"step": s, "time": T0 + s, "loss": 1.0 + rank} for s in range(1, 51)])
    app = create_app(store, Hub())
    try:
        first = get_json(app, "/api/series", metric="loss", aggregate="mean")
        store.add("rank_0", [Item("record", {"step": 51, "time": T0 + 51, "loss": 1.0})])
        cheap = get_json(app, "/api/series", metric="loss", aggregate="mean")
        assert cheap["seq"] > first["seq"] and cheap["aggregate"]["x"][-1] == 51  # cheap: folded again

        monkeypatch.setattr(aggregate_module, "STALE_COST_S", 0.0)  # every fold counts as expensive
        store.add("rank_1", [Item("record", {"step": 52, "time": T0 + 52, "loss": 2.0})])
        stale = get_json(app, "/api/series", metric="loss", aggregate="mean")
        assert stale["seq"] == cheap["seq"] and stale["aggregate"]["x"][-1] == 51  # the young fold, as it is

        keys = store._keys_of("loss", None, ())
        fresh = asyncio.run(store._folds.fold(("loss", tuple(keys)), [(k[0], store._series[k]) for k in keys], fresh=True))
        assert fresh.seq == store.last_seq and int(fresh.steps[-1]) == 52

        monkeypatch.setattr(aggregate_module, "STALE_FOR_S", 0.0)  # too old to serve: folded again
        store.add("rank_2", [Item("record", {"step": 53, "time": T0 + 53, "loss": 3.0})])
        assert get_json(app, "/api/series", metric="loss", aggregate="mean")["aggregate"]["x"][-1] == 53
    finally:
        store.close()


def test_nothing_is_warmed_while_the_history_grows() -> None:
    # A live run is left to the page's first answer (folding it in turn cost a steady share of a core), and a look
    # while it grows reads no metric (at 1,024 ranks reading them four times a second cost 3 % of a core): the
    # folds come once nothing was stored for a look (the end of a run or of a catch-up).
    store = ranks_store(RANKS, lambda rank: [{"step": s, "time": T0 + s, "loss": 1.0} for s in range(1, 31)])
    try:
        keys = store._keys_of("loss", None, ())

        def age() -> Optional[float]:
            return store._folds.age(("loss", tuple(keys)), [(k[0], store._series[k]) for k in keys])

        read = []
        metric_keys = store._metric_keys
        store._metric_keys = lambda *a: read.append(1) or metric_keys(*a)  # type: ignore[method-assign]

        async def run() -> None:
            stop = asyncio.Event()
            warming = asyncio.ensure_future(store.keep_folds_warm(stop))
            for step in range(31, 31 + int(6 * WARM_CHECK_S / 0.05)):  # a record every 0.05 s: 6 looks' time
                store.add("rank_0", [Item("record", {"step": step, "time": T0 + step, "loss": 1.0})])
                await asyncio.sleep(0.05)
            assert age() == math.inf and not read  # growing all along: no metric read, nothing folded
            for _ in range(200):  # bounded: the next look sees the seq still, then the fold
                if age() is None:
                    break
                await asyncio.sleep(0.05)
            stop.set()
            await asyncio.wait_for(warming, 5)

        asyncio.run(run())
        assert age() is None and read
    finally:
        store.close()


def test_the_warmers_budget_lets_the_folds_of_a_runs_end_go_at_once() -> None:
    # A catch-up settles between its batches, so the warmer folds then; a pause after each such round (three times
    # its cost) once made the folds of the run's end wait it out, and the first visit found them cold. The budget:
    # a quarter of a core over time, up to 3 s at once.
    now = [0.0]
    budget = FoldBudget(share=0.25, burst=3.0, clock=lambda: now[0])
    assert budget.left() == 3.0  # full at first
    budget.spend(1.0)  # a round between two batches
    now[0] = 0.5
    assert budget.left() == 2.125  # the run's end half a second later: its folds go at once
    budget.spend(2.5)
    assert budget.left() == -0.375  # overrun: nothing more ...
    now[0] = 0.5 + 0.375 / 0.25
    assert budget.left() == 0.0  # ... until a quarter of a core earned it back
    now[0] = 100.0
    assert budget.left() == 3.0  # never more than the burst


def test_the_warmer_folds_in_the_order_the_records_name_the_metrics() -> None:
    # The page's first screen shows loss and the optimiser's metrics, which the records name first: folded first,
    # whichever fold is oldest (here step_time_ms's, folded before the others when a page asked).
    metrics = ("loss", "lr", "step_time_ms")
    store = ranks_store(RANKS, lambda rank: [{"step": s, "time": T0 + s, "loss": 1.0, "lr": 0.1, "step_time_ms": 5.0}
                                             for s in range(1, 31)])
    try:
        def selection(metric: str) -> Any:
            keys = store._keys_of(metric, None, ())
            return (metric, tuple(keys)), [(k[0], store._series[k]) for k in keys]

        for metric in reversed(metrics):
            asyncio.run(store._folds.fold(*selection(metric)))
        store.add("rank_0", [Item("record", {"step": 31, "time": T0 + 31, "loss": 1.0, "lr": 0.1, "step_time_ms": 5.0})])
        for folded in (["loss"], ["loss", "lr"], ["loss", "lr", "step_time_ms"]):  # every one behind
            assert asyncio.run(store._warm_next()) is not None
            assert [m for m in metrics if store._folds.age(*selection(m)) is None] == folded
        assert asyncio.run(store._warm_next()) is None
    finally:
        store.close()
