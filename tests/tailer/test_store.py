"""Store: seq numbering, replay slices, and series that never hide a spike or a NaN."""

from __future__ import annotations

import math

from mstail.parsers import Item
from mstail.tailer.history.store import Store


def records(steps, metric="loss", value=lambda s: float(s), segment=0):  # type: ignore[no-untyped-def]
    return [Item("record", {"step": s, "time": 1.0, "segment": segment, metric: value(s)}) for s in steps]


def make_store(*batches) -> Store:  # type: ignore[no-untyped-def]
    store = Store()
    store.add_source("rank_0", "/x/rank_0/info.log")
    for batch in batches:
        store.add("rank_0", batch)
    return store


def test_seq_is_global_gap_free_and_replayable() -> None:
    store = make_store(records(range(1, 4)), [Item("event", {"kind": "checkpoint", "time": 2.0, "step": 3})], records(range(4, 6)))
    assert [i["seq"] for i in store.items_after(0)] == [1, 2, 3, 4, 5, 6]
    assert [i["seq"] for i in store.items_after(4)] == [5, 6]
    assert [r["step"] for r in store.records_after(3, 10)] == [4, 5]
    assert store.events("checkpoint")[0]["seq"] == 4
    assert store.items_after(0)[0]["source"] == "rank_0"


def test_exact_points_when_few() -> None:
    store = make_store(records(range(1, 11)))
    [series] = store.series("loss", points=10)
    assert series["x"] == list(range(1, 11))
    assert series["min"] == series["max"] == series["last"] == [float(s) for s in range(1, 11)]


def test_buckets_keep_the_spike() -> None:
    spike_at = 77_777
    store = make_store(records(range(1, 200_001), value=lambda s: 1000.0 if s == spike_at else 1.0))
    [series] = store.series("loss", points=100)
    assert len(series["x"]) == 100
    assert max(series["max"]) == 1000.0 and min(series["min"]) == 1.0
    bucket = next(i for i, x in enumerate(series["x"]) if x >= spike_at)
    assert series["max"][bucket] == 1000.0


def test_nan_is_listed_never_dropped_and_never_poisons_min_max() -> None:
    store = make_store(records(range(1, 10_001), value=lambda s: math.nan if s == 5000 else 2.0))
    [bucketed] = store.series("loss", points=50)
    assert bucketed["nonfinite"] == {"x": [5000], "value": ["NaN"]}
    assert set(bucketed["min"]) == {2.0} and set(bucketed["max"]) == {2.0}
    [exact] = store.series("loss", start=4999, end=5001)
    assert exact["last"] == [2.0, "NaN", 2.0]


def test_range_and_segments() -> None:
    store = make_store(records(range(1, 101)), records(range(50, 61), segment=1))
    out = store.series("loss", start=55, end=58)
    assert {(s["segment"], tuple(s["x"])) for s in out} == {(0, (55, 56, 57, 58)), (1, (55, 56, 57, 58))}
    info = store.sources["rank_0"]
    assert info.records == 111 and info.last_step == 60 and info.metrics == ["loss"]


def test_a_record_and_its_amend_in_one_add_read_amended_before_and_after_the_commit() -> None:
    # Until a commit (or while the disk refuses one) readers get queued items from memory: the amend's rewrite
    # must reach its record there, not wait for the file.
    store = make_store([Item("record", {"step": 1, "loss": 1.0}), Item("amend", {"step": 1, "segment": 0, "lr": 0.1}),
                        Item("record", {"step": 2, "loss": 2.0})])
    for _ in ("queued", "written"):
        assert [(r["step"], r.get("lr")) for r in store.records_after(0, 10)] == [(1, 0.1), (2, None)]
        assert [i["seq"] for i in store.items_after(0)] == [1, 2, 3]
        store.commit()
    store.close()
