"""Chart columns: shared steps and times in memory, saved in the state file and read back at a restart.

The oracle is the simplest reading of the records: per (source, metric, segment), the (step, value, time) of
every record that has the metric, in order. Every column the store serves, live or after a restart from saved
columns, from a crash between flushes, from an earlier mstail's state or from a damaged one, must equal it.
"""

from __future__ import annotations

import json
import logging
import math
import random
import sqlite3
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from mstail.parsers import Item
from mstail.tailer.history import columns
from mstail.tailer.history.db import StateDB
from mstail.tailer.history.series import Series, summary
from mstail.tailer.history.store import Store, prepare
from tests.conftest import start_mstail, wait_until

SOURCES = ("rank_0", "rank_1")


def _history(seed: int = 7, steps: int = 3_000) -> List[Tuple[str, List[Item]]]:
    """Batches of items as a tailer delivers them: two sources; dense metrics (loss, lr), a NaN and an Inf, a
    metric that starts late, one that skips records (eval every 10 steps), one missing in a record then back
    (an aligned column that must get its own steps), a value beyond the float range, a step beyond 64 bits,
    a resume (segment 1) and events."""
    rng = random.Random(seed)
    batches: List[Tuple[str, List[Item]]] = []
    for source in SOURCES:
        segment, step = 0, 0
        items: List[Item] = [Item("event", {"kind": "start", "time": 0.0, "message": "go"})]
        for i in range(steps):
            if i == steps // 2:
                segment, step = 1, 100  # a resume: steps go back, a new segment
            step += 1
            record: Dict[str, Any] = {"step": step, "time": 1e9 + i * 0.5, "segment": segment,
                                      "loss": rng.random(), "lr": 1e-4}
            if i == 500:
                record["loss"] = math.nan
            if i == 501:
                record["lr"] = math.inf
            if i >= 40:
                record["grad_norm"] = rng.random()
            if i % 10 == 0:
                record["eval_loss"] = rng.random()
            if i != 700:
                record["throughput"] = 100 + i  # missing once: detached then
            if i == 900:
                record["lr"] = 10 ** 400  # beyond the float range: kept in the history, not drawn
            if i == 901:
                record["step"] = 1 << 70  # a step no column holds
            items.append(Item("record", record))
            if i % 997 == 0:
                items.append(Item("event", {"kind": "checkpoint", "step": step, "time": 1e9 + i}))
            if len(items) >= rng.randint(1, 400):
                batches.append((source, items))
                items = []
        batches.append((source, items))
    return batches


def _oracle(batches: List[Tuple[str, List[Item]]]) -> Dict[Tuple[str, str, int], List[Tuple[int, str, str]]]:
    out: Dict[Tuple[str, str, int], List[Tuple[int, str, str]]] = {}
    for source, items in batches:
        for item in items:
            data = item.data
            if item.kind != "record" or data["step"] >= 1 << 63:
                continue
            for key, value in data.items():
                if key in ("step", "time", "segment") or (isinstance(value, int) and abs(value) > 1e308):
                    continue
                out.setdefault((source, key, data["segment"]), []).append(
                    (data["step"], repr(float(value)), repr(float(data["time"]))))
    return out


def _served(store: Store) -> Dict[Tuple[str, str, int], List[Tuple[int, str, str]]]:
    out = {}
    for (source, metric, segment), series in store._series.items():
        n = len(series)
        assert len(series.steps) >= n and len(series.times) >= n
        assert series.nonfinite == [i for i in range(n) if not math.isfinite(series.values[i])]
        out[(source, metric, segment)] = [(series.steps[i], repr(series.values[i]), repr(series.times[i]))
                                          for i in range(n)]
    return out


def _facts(store: Store) -> Dict[str, Any]:
    return {source: {k: v for k, v in info.as_json().items() if k not in ("counters", "path")}  # paths come with checkpoints
            for source, info in store.sources.items()}


def _fill(path: Path, batches: List[Tuple[str, List[Item]]], close: bool = True) -> Store:
    store = Store(StateDB(path, expected="test"))
    for source in SOURCES:
        store.add_source(source, f"/logs/{source}.log")
    for source, items in batches:
        store.add(source, items)
        store.commit()
    if close:
        store.close()
    return store


def _reopen(path: Path) -> Store:
    store = Store(StateDB(path, expected="test"))
    store.load()
    return store


@pytest.fixture
def small_flushes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(columns, "FLUSH_RECORDS", 256)  # many flushes, so pieces merge
    monkeypatch.setattr(columns, "PIECE_POINTS", 600)  # and long columns are cut in pieces of at most this
    monkeypatch.setattr(columns, "PACKED_POINTS", 150)  # the longer ones packed


def test_live_columns_equal_the_records_and_dense_metrics_share_steps() -> None:
    batches = _history()
    store = Store()
    for source in SOURCES:
        store.add_source(source, "")
    for source, items in batches:
        store.add(source, items)
    assert _served(store) == _oracle(batches)
    frame = store._columns.frames[("rank_0", 0)]
    assert store._series[("rank_0", "loss", 0)].steps is frame.steps  # 8 bytes a point, not 24
    assert store._series[("rank_0", "loss", 0)].times is frame.times
    assert store._series[("rank_0", "lr", 0)].steps is not frame.steps  # a value beyond the float range: missed one
    assert store._series[("rank_0", "grad_norm", 0)].steps is not frame.steps  # started late
    assert store._series[("rank_0", "throughput", 0)].steps is not frame.steps  # missed a record


def _uneven(seed: int) -> List[Tuple[str, List[Item]]]:
    """`_history` with what a run of records indexed a column at a time must refuse or keep: amends between
    records, values that are no float (an int, a bool, None, a string), a time of None, a float step, a metric
    that appears mid-run, and prepared items (reserved keys first, as a catch-up child hands them)."""
    rng = random.Random(seed)
    out = []
    for source, items in _history(seed, steps=1_200):
        mixed: List[Item] = []
        for item in items:
            data = {**item.data, "line": len(mixed) + 1}  # a line number: `mstail parse`'s, never stored
            if item.kind == "record":
                roll = rng.random()
                if roll < 0.01:
                    data["loss"] = rng.choice([3, True, None, "n/a"])
                elif roll < 0.015:
                    data["time"] = None
                elif roll < 0.02:
                    data["step"] = data["step"] + 0.5
                elif roll < 0.025:
                    data[f"late_{rng.randint(0, 3)}"] = rng.random()
            mixed.append(Item(item.kind, data))
            if item.kind == "record" and rng.random() < 0.05:
                mixed.append(Item("amend", {"step": data["step"], "segment": data["segment"], "extra": rng.random()}))
        out.append((source, mixed))
    return out


@pytest.mark.parametrize("seed", [4, 5])
def test_records_indexed_a_run_at_a_time_equal_one_at_a_time(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs of records with the same keys go into the columns a column at a time (`Store._index_run`): the
    columns, their sharing of the frame's steps, non-finite indexes, the stored items (prepared ones against
    plain ones) and the sources' facts are those of storing the same items one by one; and most records of the
    batches do go that way."""
    batches = _uneven(seed)
    one_by_one, in_runs = Store(), Store()
    for store in (one_by_one, in_runs):
        for source in SOURCES:
            store.add_source(source, "")
    for source, items in batches:
        for item in items:
            one_by_one.add(source, [item])
    singles = []
    index_record = Store._index_record
    monkeypatch.setattr(Store, "_index_record", lambda self, info, record: (singles.append(1),
                                                                            index_record(self, info, record)))
    for source, items in batches:
        in_runs.add(source, list(map(prepare, items)), prepared=True)
    assert _served(in_runs) == _served(one_by_one)
    for store in (one_by_one, in_runs):
        store.commit()  # (an amend of a record stored in the same call is written at the commit)
    assert in_runs.items_after(0, 1 << 20) == one_by_one.items_after(0, 1 << 20)
    assert _facts(in_runs) == _facts(one_by_one)
    assert in_runs._columns.pending == one_by_one._columns.pending
    for key, series in one_by_one._series.items():
        frame = one_by_one._columns.frames[(key[0], key[2])]
        twin = in_runs._series[key]
        assert (twin.steps is in_runs._columns.frames[(key[0], key[2])].steps) == (series.steps is frame.steps), key
    records = sum(item.kind == "record" for _, items in batches for item in items)
    assert len(singles) < records / 4  # the runs did the rest


def test_a_files_first_slice_goes_in_as_a_run_after_its_first_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """A source's first batch has no frame or series yet: its first record makes them, and the rest of the run goes
    in at once (1,024 small files' history: each file's first slice was indexed record by record), with the same
    columns and facts as one by one."""
    first = [Item("record", {"step": step, "time": 1e9 + step, "loss": 1.0 / step, "lr": 1e-4}) for step in range(1, 101)]
    one_by_one, at_once = Store(), Store()
    for store in (one_by_one, at_once):
        store.add_source("rank_0", "")
    for item in first:
        one_by_one.add("rank_0", [item])
    singles = []
    index_record = Store._index_record
    monkeypatch.setattr(Store, "_index_record", lambda self, info, record: (singles.append(1),
                                                                            index_record(self, info, record)))
    at_once.add("rank_0", first)
    assert len(singles) == 1
    assert _served(at_once) == _served(one_by_one) and _facts(at_once) == _facts(one_by_one)
    series = at_once._series[("rank_0", "loss", 0)]
    assert series.steps is at_once._columns.frames[("rank_0", 0)].steps  # the run shares the frame's steps


def test_a_value_one_line_later_keeps_a_column_aligned() -> None:
    """A record whose metric arrives with its next line (an amend) keeps sharing the frame's steps."""
    store = Store()
    info = store.add_source("a", "")
    for step in range(1, 6):
        [stored] = store.add("a", [Item("record", {"step": step, "time": 1.0, "loss": 1.0})]).items
        store._index_values(info, store._columns.frames[("a", 0)], 0, {**stored, "samples_per_s": step * 2.0})
    series = store._series[("a", "samples_per_s", 0)]
    assert series.steps is store._columns.frames[("a", 0)].steps
    assert store.series("samples_per_s")[0]["x"] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_restart_reads_the_saved_columns_back(tmp_path: Path, small_flushes: None, seed: int,
                                                caplog: pytest.LogCaptureFixture) -> None:
    batches = _history(seed)
    live = _fill(tmp_path / "s.sqlite", batches, close=False)
    expected, facts, latest = _served(live), _facts(live), live.latest_values()
    live.close()
    with caplog.at_level(logging.WARNING):
        store = _reopen(tmp_path / "s.sqlite")
    assert not caplog.records
    assert _served(store) == expected == _oracle(batches)
    assert _facts(store) == facts and store.latest_values() == latest
    for series in store._series.values():  # the block summaries came back as a fresh build makes them
        assert series.blocks is not None
        fresh = Series(steps=series.steps, values=series.values, nonfinite=series.nonfinite, times=series.times)
        assert (series.blocks.mins, series.blocks.maxs) == (summary(fresh).mins, summary(fresh).maxs)
    assert store.last_seq == live.last_seq
    for saved in store._columns._saved.values():  # merged up to the piece size: few pieces, none too long
        assert len(saved.pieces) <= 12 and all(points <= 600 for _, points in saved.pieces)
    # and it goes on: new records after a restart join the restored columns, and survive the next one
    more = [Item("record", {"step": 5000 + i, "time": 2e9, "segment": 1, "loss": 0.5, "lr": 1.0, "throughput": 1})
            for i in range(300)]
    store.add("rank_0", more)
    store.close()
    again = _reopen(tmp_path / "s.sqlite")
    assert _served(again) == _oracle(batches + [("rank_0", more)])
    again.close()


def test_a_crash_between_flushes_indexes_only_the_records_after_the_last(tmp_path: Path, small_flushes: None) -> None:
    batches = _history()
    crashed = _fill(tmp_path / "s.sqlite", batches, close=False)
    saved_seq = crashed._columns.saved_seq
    assert 0 < saved_seq < crashed.last_seq  # some records are in no flush
    crashed.db.close()  # as `kill -9` leaves it: the last commit, no final flush
    store = _reopen(tmp_path / "s.sqlite")
    assert store._columns.saved_seq == saved_seq
    assert _served(store) == _oracle(batches)
    assert _facts(store) == _facts(crashed)


def test_an_earlier_mstails_state_is_rebuilt_once_and_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    batches = _history()
    _fill(tmp_path / "s.sqlite", batches)
    with sqlite3.connect(tmp_path / "s.sqlite") as conn:  # what a state written before the columns holds
        conn.execute("DELETE FROM frames")
        conn.execute("DELETE FROM columns")
        conn.execute("DELETE FROM blocks")
        conn.execute("DELETE FROM meta WHERE key = 'columns'")
    with caplog.at_level(logging.WARNING):
        store = _reopen(tmp_path / "s.sqlite")
    [said] = caplog.records
    assert "earlier mstail" in said.getMessage() and "rebuilding" in said.getMessage()
    assert _served(store) == _oracle(batches)
    store.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        again = _reopen(tmp_path / "s.sqlite")
    assert not caplog.records and _served(again) == _oracle(batches)
    again.close()


@pytest.mark.parametrize("damage", [
    "DELETE FROM columns WHERE rowid IN (SELECT rowid FROM columns LIMIT 1)",
    "DELETE FROM frames",
    "UPDATE meta SET value = json_set(value, '$.seq', 10000000) WHERE key = 'columns'",
    "UPDATE columns SET vals = x'00' WHERE rowid IN (SELECT rowid FROM columns LIMIT 1)",
    "UPDATE blocks SET mins = x'0000000000000000' WHERE rowid IN (SELECT rowid FROM blocks LIMIT 1)",
])
def test_damaged_columns_are_rebuilt_from_the_records(tmp_path: Path, small_flushes: None, damage: str,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    batches = _history()
    _fill(tmp_path / "s.sqlite", batches)
    with sqlite3.connect(tmp_path / "s.sqlite") as conn:
        conn.execute(damage)
    with caplog.at_level(logging.WARNING):
        store = _reopen(tmp_path / "s.sqlite")
    [said] = caplog.records
    assert "not usable" in said.getMessage()
    assert _served(store) == _oracle(batches)
    store.close()


def test_manifest_is_json_the_state_can_be_inspected_with(tmp_path: Path) -> None:
    _fill(tmp_path / "s.sqlite", _history(steps=200))
    with sqlite3.connect(tmp_path / "s.sqlite") as conn:
        manifest = json.loads(conn.execute("SELECT value FROM meta WHERE key = 'columns'").fetchone()[0])
    assert manifest["seq"] == conn.execute("SELECT MAX(seq) FROM items").fetchone()[0]
    assert {s for s, *_ in manifest["frames"]} == set(SOURCES)


@pytest.mark.slow
def test_a_restarted_mstail_serves_the_saved_history_restores_its_alert_then_reads_on(tmp_path: Path) -> None:
    """Real processes: the history from the saved columns (no rebuild said), the alert that was firing firing
    again with the same id and no second `alert` event, then a line written meanwhile read."""
    log = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "time": 1e9 + s, "loss": "NaN" if s > 2995 else 2.0 + (s % 7) / 10})
             for s in range(1, 3001)]
    log.write_text("\n".join(lines) + "\n")
    args = ["--jsonl", str(log), "--state-dir", str(tmp_path / "state")]

    def seen(server: Any) -> Tuple[Any, List[str], List[Any]]:
        [series] = server.get_json("/api/series?metric=loss&points=5000")["series"]
        active = [(a["id"], a["rule"]) for a in server.get_json("/api/alerts")["active"]]
        alerts = [e["id"] for e in server.get_json("/api/events?kind=alert")]
        return (series["x"], series["last"]), active, alerts

    first = start_mstail([], tmp_path / "run0", args=args)
    try:
        first.wait_records(3000, timeout=60)
        wait_until(lambda: seen(first)[1], 30)
        before = seen(first)
    finally:
        assert first.stop() == 0
    assert ("nonfinite" in {rule for _, rule in before[1]}) and len(before[0][0]) == 3000

    second = start_mstail([], tmp_path / "run1", args=args)
    try:
        wait_until(lambda: second.get_json("/healthz")["restoring_alerts"] is None, 60)
        assert seen(second) == before
        with open(log, "a") as f:
            f.write(json.dumps({"step": 3001, "time": 1e9 + 3001, "loss": 1.0}) + "\n")
        second.wait_records(3001, timeout=30)
    finally:
        assert second.stop() == 0
    assert "rebuilding" not in second.stderr_path.read_text()
