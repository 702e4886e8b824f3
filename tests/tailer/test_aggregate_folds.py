"""Folds grown from the fold before (`aggregate.Points` with `after`, `aggregate._Fold` from a base): the same fold
as one of every point, at every growth, and a copy of the new steps only.

The oracle is a fold of a full copy (`Points(series)` without `after`), the path every fold took before; the
`/api/series?aggregate=mean` answers of that path are checked against a naive oracle in tests/web/test_api_aggregate.py.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import threading
from typing import Any, List, Tuple

import numpy as np
import pytest

from mstail.tailer.history import aggregate as aggregate_module
from mstail.tailer.history.aggregate import AggregateCache, Points, Turns, _Fold, aggregate, in_query_thread
from mstail.tailer.history.series import Series

Selection = List[Tuple[str, Series]]


def assert_same_fold(grown: _Fold, whole: _Fold) -> None:
    """Every number a fold answers with equal (the outliers' distance sums up to rounding: summed in other groups)."""
    for name in ("steps", "low", "high", "count"):
        assert np.array_equal(getattr(grown, name), getattr(whole, name), equal_nan=True), name
        assert getattr(grown, name).dtype == getattr(whole, name).dtype, name
    assert (grown.mean.steps.tobytes(), grown.mean.values.tobytes(), grown.mean.times.tobytes()) == \
        (whole.mean.steps.tobytes(), whole.mean.values.tobytes(), whole.mean.times.tobytes())
    assert (grown.bad, grown.outliers, grown.sources, grown.newest) == \
        (whole.bad, whole.outliers, whole.sources, whole.newest)
    assert (grown.version, grown.lengths, grown.seq) == (whole.version, whole.lengths, whole.seq)
    assert np.array_equal(grown.counted, whole.counted)
    assert np.allclose(grown.distance, whole.distance, rtol=1e-12, atol=1e-12)
    for start, end in ((None, None), (5, 40), (30, None)):
        assert aggregate(grown, start, end, 17, 0.6) == aggregate(whole, start, end, 17, 0.6)


def _grow(series: Selection, rng: random.Random, round_: int) -> None:
    """A round of a live run: each series a few steps on (some lag, some log every other step, some skip the round),
    with NaN and infinite values and missing times now and then."""
    for i, (_, s) in enumerate(series):
        if rng.random() < 0.2:
            continue
        step = s.steps[len(s) - 1] if len(s) else i % 3
        for _ in range(rng.randint(1, 4)):
            step += 2 if i % 5 == 0 else 1
            value = [math.nan, math.inf, -math.inf][rng.randrange(3)] if rng.random() < 0.03 \
                else (9.0 if i == 4 else 2.0) + rng.random() + 0.01 * round_
            s.append(step, value, math.nan if rng.random() < 0.05 else 1.7e9 + step + i / 100)


@pytest.mark.parametrize("seed", range(6))
def test_a_grown_fold_equals_the_fold_of_every_point(seed: int) -> None:
    rng = random.Random(seed)
    # 12 sources, two of them with a second segment (a source's series are folded together)
    series: Selection = [(f"rank_{i}", Series()) for i in range(12)] + [("rank_1", Series()), ("rank_7", Series())]
    seq = [0]
    cache = AggregateCache(Turns(lambda: seq[0]))
    grown_from = []

    async def run() -> None:
        for round_ in range(40):
            _grow(series, rng, round_)
            seq[0] += 1
            known = cache._folds.get("key")
            fold = await cache.fold("key", series, fresh=True)
            if known is not None:  # grown: copied the points at and after the lowest step a series grew at
                cut = min(s.steps[old] for (_, s), old in zip(series, known.lengths) if len(s) > old)
                grown_from.append(fold.copied == sum(1 for _, s in series for x in s.steps[:len(s)] if x >= cut))
            assert_same_fold(fold, _Fold(Points(series, seq[0])))

    asyncio.run(run())
    assert all(grown_from) and len(grown_from) == 39


def test_a_live_runs_copy_holds_its_new_steps_not_its_history() -> None:
    # 64 ranks x 2,000 steps folded; one more step each (a live run between two looks of the warmer): the next copy
    # holds those 64 points, not 128,064, however long the run.
    series: Selection = [(f"rank_{i}", Series()) for i in range(64)]
    for i, (_, s) in enumerate(series):
        for step in range(1, 2001):
            s.append(step, 1.0 + i + step / 1000, 1.7e9 + step)
    fold = _Fold(Points(series, 1))
    for i, (_, s) in enumerate(series):
        s.append(2001, 5.0 + i, 1.7e9 + 2001)
    points = Points(series, 2, fold)
    assert points.base is fold and points.cut == 2001 and len(points.steps) == 64 and not points.held.any()
    assert_same_fold(_Fold(points), _Fold(Points(series, 2)))

    # rank_3 lags: its step 2001 comes after the others' 2002; the copy is steps 2001 on, those of the fold too
    grown = _Fold(points)
    for i, (_, s) in enumerate(series):
        if i != 3:
            s.append(2002, 6.0 + i, 1.7e9 + 2002)
    lagging = _Fold(Points(series, 3, grown))
    series[3][1].append(2002, 7.0, 1.7e9 + 2002)
    points = Points(series, 4, lagging)
    assert points.cut == 2002 and len(points.steps) == 64 and int(points.held.sum()) == 63
    assert_same_fold(_Fold(points), _Fold(Points(series, 4)))


def test_a_series_whose_steps_go_back_is_copied_whole() -> None:
    # Points below the cut could then be new: the fold is made from every point again.
    series: Selection = [(f"rank_{i}", Series()) for i in range(4)]
    for i, (_, s) in enumerate(series):
        for step in range(1, 11):
            s.append(step, float(i + step))
    fold = _Fold(Points(series))
    series[2][1].append(11, 3.0)
    series[2][1].append(4, 8.0)  # back
    points = Points(series, 1, fold)
    assert points.base is None and len(points.steps) == 42
    grown = _Fold(points)
    assert_same_fold(grown, _Fold(Points(series, 1)))
    series[0][1].append(11, 1.0)
    assert Points(series, 2, grown).base is None  # never grown again: its steps went back


@pytest.mark.parametrize("change", ["other series", "shorter", "nothing new"])
def test_a_fold_of_other_series_is_not_grown(change: str) -> None:
    series: Selection = [(f"rank_{i}", Series()) for i in range(3)]
    for i, (_, s) in enumerate(series):
        for step in range(1, 6):
            s.append(step, float(i))
    fold = _Fold(Points(series))
    asked: Any = series
    if change == "other series":
        asked = series + [("rank_9", Series())]
        asked[-1][1].append(6, 1.0)
    elif change == "shorter":
        asked = [(source, Series()) if i == 0 else (source, s) for i, (source, s) in enumerate(series)]
        asked[1][1].append(6, 1.0)
    points = Points(asked, 1, fold)
    assert points.base is None and len(points.steps) == sum(len(s) for _, s in asked)


def test_a_fold_of_non_finite_values_only_is_grown() -> None:
    # The base has no step with a finite value (nothing to keep) and lists the NaNs; the copy brings the first ones.
    series: Selection = [(f"rank_{i}", Series()) for i in range(3)]
    for _, s in series:
        s.append(1, math.nan)
    fold = _Fold(Points(series))
    for i, (_, s) in enumerate(series):
        s.append(2, 1.0 + i)
    points = Points(series, 1, fold)
    assert points.base is fold and points.cut == 2 and len(points.steps) == 3
    assert_same_fold(_Fold(points), _Fold(Points(series, 1)))


def test_a_fold_too_big_to_keep_is_made_for_its_question_and_not_folded_again_by_the_warmer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    series: Selection = [(f"rank_{i}", Series()) for i in range(20)]
    for i, (_, s) in enumerate(series):
        for step in range(1, 501):
            s.append(step, float(i + step))
    small: Selection = series[:2]
    cache = AggregateCache(Turns(lambda: 1))
    size = _Fold(Points(series)).nbytes
    assert size >= 500 * 48  # the steps' arrays: 48 bytes a step at least
    monkeypatch.setattr(aggregate_module, "FOLDS_BYTES_MAX", size - 1)

    async def run() -> None:
        big = await cache.fold("big", series)
        assert_same_fold(big, _Fold(Points(series, 1)))
        assert "big" not in cache._folds  # made, answered, not kept
        assert cache.age("big", series) is None  # the warmer sees nothing to do
        await cache.fold("small", small)
        assert list(cache._folds) == ["small"]
        series[0][1].append(501, 1.0)
        assert cache.age("big", series) == float("inf")  # grown: folded again when asked

    asyncio.run(run())


def test_the_query_thread_gives_memory_back_once_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    """glibc's malloc_trim, run in the query thread once no question came for GIVE_BACK_AFTER_S: never while one
    waits, once after a burst."""
    given: List[int] = []
    done = threading.Event()

    def trim() -> None:
        given.append(aggregate_module._WAITING._count)
        done.set()

    monkeypatch.setattr(aggregate_module, "_TRIM", trim)
    monkeypatch.setattr(aggregate_module, "GIVE_BACK_AFTER_S", 0.05)

    async def burst() -> List[int]:
        return await asyncio.gather(*(in_query_thread(sum, range(k)) for k in range(40)))

    assert asyncio.run(burst()) == [sum(range(k)) for k in range(40)]
    assert done.wait(30)
    assert given == [0]


def test_the_query_thread_gives_way_to_the_event_loop() -> None:
    """The query thread runs QUERY_NICE above the process's nice (Linux: a thread's own), so the loop's thread gets a
    core first when both want one."""
    def own_nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    loop_nice = own_nice()
    assert asyncio.run(in_query_thread(own_nice)) == min(19, loop_nice + aggregate_module.QUERY_NICE)
