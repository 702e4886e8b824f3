"""`/api/heatmap` and `/api/sources?compact=true` in-process, and the aggregate fold off the event loop.

The heatmap is checked against a naive oracle written here: columns are the distinct logged steps in the range cut
into at most `columns` consecutive runs, a cell the mean of a source's finite values in the column over the median
of those means, rows of `per` neighbouring sources in natural order showing their highest cell."""

from __future__ import annotations

import math
import statistics
import threading
from typing import Any, Dict, Iterator, List, Optional

import pytest

from mstail.parsers import Item
from mstail.tailer.history import aggregate as aggregate_module
from mstail.tailer.history.heatmap import natural_key
from mstail.tailer.live.hub import Hub
from mstail.tailer.history.store import Store
from mstail.web.app import create_app

from tests.web.test_api import get, get_json
from tests.web.test_api_aggregate import ranks_store

RANKS = 12
STEPS = 90
T0 = 1.7e9


def _steps(rank: int) -> List[int]:
    if rank == 4:
        return list(range(2, STEPS + 1, 2))  # logs every other step
    if rank == 9:
        return list(range(1, STEPS - 30 + 1))  # behind the others
    return list(range(1, STEPS + 1))


def _ms(rank: int, step: int) -> float:
    if rank == 2 and step == 40:
        return math.nan  # never in a cell
    return (150.0 if rank == 7 else 100.0) + (step * 7 + rank) % 5  # rank 7: the straggler


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    store = ranks_store(RANKS, lambda rank: [{"step": s, "time": T0 + s, "step_time_ms": _ms(rank, s), "loss": 1.0}
                                             for s in _steps(rank)])
    yield store
    store.close()


@pytest.fixture(scope="module")
def app(store: Store) -> Any:
    return create_app(store, Hub())


def _oracle(ranks: List[int], start: Optional[int], end: Optional[int], columns: int, rows: int) -> Dict[str, Any]:
    inside = lambda s: (start is None or s >= start) and (end is None or s <= end)  # noqa: E731
    ids = sorted((f"rank_{r}" for r in ranks), key=lambda i: int(i.split("_")[1]))
    values = {f"rank_{r}": {s: _ms(r, s) for s in _steps(r) if inside(s) and math.isfinite(_ms(r, s))} for r in ranks}
    distinct = sorted({s for v in values.values() for s in v})
    cols = min(columns, len(distinct))
    col_of = {s: i * cols // len(distinct) for i, s in enumerate(distinct)}
    last = [max(s for s in distinct if col_of[s] == c) for c in range(cols)]
    means = {i: [statistics.fmean([v for s, v in values[i].items() if col_of[s] == c] or [math.nan])
                 for c in range(cols)] for i in ids}
    medians = [statistics.median([means[i][c] for i in ids if not math.isnan(means[i][c])]) for c in range(cols)]
    per = -(-len(ids) // rows)
    ratio, value, source = [], [], []
    for first in range(0, len(ids), per):
        group = ids[first:first + per]
        cells = [max(((means[i][c] / medians[c], means[i][c], ids.index(i)) for i in group  # ties: the first
                      if not math.isnan(means[i][c])), default=None, key=lambda cell: cell[0]) for c in range(cols)]
        ratio.append([None if x is None else round(x[0], 3) for x in cells])
        value.append([None if x is None else round(x[1], 3) for x in cells])
        source.append([None if x is None else x[2] for x in cells])
    return {"ids": ids, "per": per, "columns": last, "ratio": ratio, "value": value, "source": source}


@pytest.mark.parametrize("start,end,columns,rows", [
    (None, None, 120, 32),   # fewer steps than columns: a column per logged step
    (None, None, 7, 32),     # columns of several steps, ragged
    (10, 33, 5, 4),          # a zoomed range, rows of 3 ranks each
    (None, None, 20, 5),     # rows of 3 (the last one short)
])
def test_heatmap_matches_the_oracle(app: Any, start: Optional[int], end: Optional[int], columns: int,
                                    rows: int) -> None:
    params = {k: v for k, v in {"start": start, "end": end}.items() if v is not None}
    answer = get_json(app, "/api/heatmap", metric="step_time_ms", columns=columns, rows=rows, **params)
    expected = _oracle(list(range(RANKS)), start, end, columns, rows)
    for key in ("ids", "per", "columns", "source"):
        assert answer[key] == expected[key], key
    for key in ("ratio", "value"):
        assert [[None if v is None else pytest.approx(v, abs=1e-3) for v in row] for row in answer[key]] == expected[key]
    assert all(any(v is not None for v in col) for col in zip(*answer["ratio"]))  # no empty column


def test_heatmap_finds_the_straggler_and_leaves_out_excluded_sources(app: Any) -> None:
    answer = get_json(app, "/api/heatmap", exclude=["rank_0", "rank_11"])
    assert answer["ids"] == [f"rank_{r}" for r in range(1, 11)] and answer["per"] == 1
    hot = answer["ids"].index("rank_7")
    assert all(r >= 1.4 for r in answer["ratio"][hot])
    others = [r for i, row in enumerate(answer["ratio"]) if i != hot for r in row if r is not None]
    assert max(others) < 1.1
    grouped = get_json(app, "/api/heatmap", rows=3)  # 12 ranks in rows of 4: rank_7's row is hot, and names it
    assert grouped["per"] == 4 and len(grouped["ratio"]) == 3
    assert all(grouped["ids"][s] == "rank_7" for s in grouped["source"][1])


def test_heatmap_of_nothing_and_bad_values(app: Any) -> None:
    assert get_json(app, "/api/heatmap", metric="nope")["columns"] == []
    assert get_json(app, "/api/heatmap", start=STEPS + 1)["ratio"] == []
    assert get(app, "/api/heatmap", columns=0).status_code == 422
    assert get(app, "/api/heatmap", exclude=[f"r{i}" for i in range(1025)]).status_code == 422


def test_natural_order() -> None:
    names = ["rank_10", "rank_2", "Rank_1", "rank_1/x", "a"]
    assert sorted(names, key=natural_key) == ["a", "Rank_1", "rank_1/x", "rank_2", "rank_10"]


def test_compact_sources_are_the_sources_without_counters(app: Any) -> None:
    full = get_json(app, "/api/sources")
    table = get_json(app, "/api/sources", compact="true")
    assert "counters" not in table["keys"]
    rebuilt = []
    for row in table["rows"]:
        entry = dict(zip(table["keys"], row))
        entry["metrics"] = [table["metrics"][i] for i in entry["metrics"]]
        rebuilt.append(entry)
    assert rebuilt == [{**{k: v for k, v in e.items() if k != "counters"}, "read_times": e["counters"].get("read_times", 0)}
                       for e in full]
    assert len(get(app, "/api/sources", compact="true").content) < len(get(app, "/api/sources").content) / 2


def test_the_aggregate_fold_runs_in_a_worker_thread(app: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    threads = []
    fold = aggregate_module._Fold

    def spy(points: Any) -> Any:
        threads.append(threading.get_ident())
        return fold(points)

    monkeypatch.setattr(aggregate_module, "_Fold", spy)
    answer = get_json(app, "/api/series", metric="step_time_ms", aggregate="mean", exclude=["rank_3"])
    assert answer["aggregate"]["sources"] == RANKS - 1
    assert threads and threading.get_ident() not in threads  # get() runs the event loop in this thread


def test_the_same_heatmap_is_answered_again_without_computing_it_while_nothing_grew(monkeypatch: Any) -> None:
    # Each visit asks the same matrix of a finished run (and a zoom back out asks it again): 0.5 s of the fold
    # thread for 1,024 ranks, computed once now, and again once a source logged more.
    store = ranks_store(8, lambda rank: [{"step": s, "time": T0 + s, "step_time_ms": 500.0 + rank} for s in range(1, 41)])
    app = create_app(store, Hub())
    computed: List[int] = []
    real = store._turns.run

    async def counting(series: Any, function: Any, *args: Any) -> Any:
        computed.append(len(series))
        return await real(series, function, *args)

    monkeypatch.setattr(store._turns, "run", counting)
    try:
        first = get_json(app, "/api/heatmap", columns=10, rows=8)
        assert get_json(app, "/api/heatmap", columns=10, rows=8) == first and len(computed) == 1
        assert get_json(app, "/api/heatmap", columns=10, rows=4)["per"] == 2 and len(computed) == 2  # another question
        store.add("rank_0", [Item("record", {"step": 41, "time": T0 + 41, "step_time_ms": 900.0})])
        grown = get_json(app, "/api/heatmap", columns=10, rows=8)
        assert len(computed) == 3 and grown["columns"][-1] == 41 and grown["seq"] > first["seq"]
    finally:
        store.close()
