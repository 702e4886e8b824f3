"""The state file's format (schema 2): records and amends kept as compressed chunks, events as rows, full column
pieces packed. Every reader answers as from rows (the same history stored with chunks turned off is the reference):
replays after any seq, records, events of each kind (amends included), the newest records, item lookups, the alert
replay's batches, with rows still in memory (queued, rewritten) merged in; an amend of a record already in a chunk
rewrites that chunk; a commit killed (SIGKILL) in the middle of moving rows into chunks leaves the history as the
commit before it; a schema 1 file (every item a row, raw column pieces) is migrated in place, nothing lost."""

from __future__ import annotations

import json
import logging
import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from mstail.parsers import Item
from mstail.tailer.history import columns, db
from mstail.tailer.history.columns import pack, unpack
from mstail.tailer.history.db import StateDB
from mstail.tailer.history.store import Store

SOURCES = ("rank_0", "rank_1", "rank_2")


def _batches(seed: int, steps: int = 2_500) -> List[Tuple[str, List[Item]]]:
    """Deliveries of three sources: big ones (a catch-up's, chunked at once) and small ones (live steps, rows until
    compacted); records with a NaN, an infinity and an int beyond 64 bits, an amend after most steps, events."""
    rng = random.Random(seed)
    out: List[Tuple[str, List[Item]]] = []
    step = {source: 0 for source in SOURCES}
    while min(step.values()) < steps:
        source = rng.choice(SOURCES)
        items: List[Item] = []
        for _ in range(rng.choice([1, 3, 40, 2_500])):
            step[source] += 1
            s = step[source]
            record: Dict[str, Any] = {"step": s, "time": 1e9 + s / 3, "loss": rng.random(), "lr": 1e-4 * s}
            if s % 997 == 5:
                record["loss"] = rng.choice([math.nan, math.inf, 1 << 70])
            items.append(Item("record", record))
            if rng.random() < 0.8:
                items.append(Item("amend", {"step": s, "segment": 0, "samples_per_s": rng.random() * 100}))
            if s % 500 == 0:
                items.append(Item("event", {"kind": "checkpoint", "step": s, "time": 1e9 + s, "message": f"saved {s}"}))
        out.append((source, items))
    return out


def _store(path: Path, batches: List[Tuple[str, List[Item]]]) -> Store:
    store = Store(StateDB(path, expected="test"))
    store.load()
    for source in SOURCES:
        store.add_source(source, f"/logs/{source}.log")
    for source, items in batches:
        store.add(source, items)
        store.commit()
    return store


def _reference(tmp_path: Path, batches: List[Tuple[str, List[Item]]], monkeypatch: pytest.MonkeyPatch) -> Store:
    """The same history with every item a row (what the readers answered from before chunks)."""
    with monkeypatch.context() as patched:
        patched.setattr(db, "CHUNK_MIN", 1 << 40)
        patched.setattr(db, "COMPACT_ROWS", 1 << 40)
        reference = _store(tmp_path / "rows.sqlite", batches)
    assert not reference.db._rows("SELECT * FROM chunks")
    return reference


def _answers(store: Store) -> Dict[str, Any]:
    """What every reader of the history answers (as JSON text: NaN == NaN)."""
    last = store.last_seq
    probes = sorted({0, 1, 7, last // 3, last // 2, last - 50, last - 1, last})
    answers: Dict[str, Any] = {
        "last_seq": store.db.last_seq(),
        "all": [item for batch in store.db.all_items(0, batch=3_001) for item in batch],
        "has": [store.db.has_item(seq) for seq in (1, last // 2, last, last + 1)],
        "newest": {source: store.db.last_record(source) for source in SOURCES},
    }
    for seq in probes:
        for limit in (1, 10, 5_000):
            answers[f"after {seq} {limit}"] = store.items_after(seq, limit)
            answers[f"records {seq} {limit}"] = store.records_after(seq, limit)
        for kind in (None, "checkpoint", "amend"):
            answers[f"events {kind} {seq}"] = store.events(kind, after=seq, limit=300)
            answers[f"newest {kind} {seq}"] = store.events(kind, after=seq, limit=300, newest=True)
    return json.loads(json.dumps(answers))


@pytest.fixture
def small_compactions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(db, "CHUNK_ITEMS", 512)  # many chunks, so readers cross their edges
    monkeypatch.setattr(db, "COMPACT_ROWS", 300)  # live rows moved into chunks often


@pytest.mark.parametrize("seed", [1, 2])
def test_every_reader_answers_from_chunks_as_from_rows(tmp_path: Path, seed: int, small_compactions: None,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    batches = _batches(seed)
    reference = _reference(tmp_path, batches, monkeypatch)
    expected = _answers(reference)
    store = _store(tmp_path / "chunks.sqlite", batches)
    chunked = store.db._rows("SELECT count(*) FROM chunks")[0][0]
    rows = store.db._rows("SELECT count(*), sum(kind IS NULL) FROM items")[0]
    assert chunked > 10 and rows[0] < 1_000 and rows[1] <= 300 + len(SOURCES)  # most items in chunks
    assert _answers(store) == expected
    for each in (store, reference):
        each.close()
    again, reference_again = Store(StateDB(tmp_path / "chunks.sqlite", expected="test")), Store(
        StateDB(tmp_path / "rows.sqlite", expected="test"))
    again.load()
    reference_again.load()
    assert _answers(again) == _answers(reference_again) == expected
    assert again.series("samples_per_s", points=10_000) == reference_again.series("samples_per_s", points=10_000)
    again.close()
    reference_again.close()


def test_unsaved_items_and_rewrites_merge_with_the_chunks_read(tmp_path: Path, small_compactions: None,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Items queued and not committed follow those read from chunks; a rewrite queued for a chunked record (what an
    amend after a restart queues) is read at once, and written into its chunk by the next commit."""
    batches = _batches(3, steps=1_500)
    stores = [_reference(tmp_path, batches, monkeypatch), _store(tmp_path / "chunks.sqlite", batches)]
    for store in stores:
        store.add("rank_1", [Item("record", {"step": 10**6 + i, "time": 2e9, "loss": 0.5}) for i in range(30)])
        chunked = store.records_after(100, 1)[0]
        store.db.replace({**chunked, "lr": -1.0, "note": "rewritten"})
        assert store.db.unsaved == 30
    reference, store = stores
    assert store.db._rows("SELECT count(*) FROM items WHERE seq = ?", store.records_after(100, 1)[0]["seq"]) == [(0,)]
    assert _answers(store) == _answers(reference)
    for each in stores:
        each.commit()
    assert store.db.unsaved == 0 and store.records_after(100, 1)[0]["note"] == "rewritten"
    assert _answers(store) == _answers(reference)
    for each in stores:
        each.close()
    again = Store(StateDB(tmp_path / "chunks.sqlite", expected="test"))
    again.load()
    assert again.records_after(100, 1)[0]["note"] == "rewritten"
    again.close()


def test_a_catch_up_batch_is_chunked_but_each_sources_newest_record(tmp_path: Path) -> None:
    """The newest record of each source stays a row (what an amend rewrites, after a restart too), the rest of a big
    commit goes into chunks at once."""
    store = Store(StateDB(tmp_path / "s.sqlite", expected="test"))
    store.load()
    store.add_source("a", "")
    store.add("a", [Item("record", {"step": s, "time": 1.0, "loss": 1.0 / s}) for s in range(1, 5_001)])
    store.commit()
    assert store.db._rows("SELECT seq, kind FROM items") == [(5_000, None)]
    assert store.db._rows("SELECT first_seq, last_seq FROM chunks") == [(1, 4_096), (4_097, 4_999)]
    store.close()
    again = Store(StateDB(tmp_path / "s.sqlite", expected="test"))
    again.load()
    again.add("a", [Item("amend", {"step": 5_000, "segment": 0, "samples_per_s": 9.0})])
    again.commit()
    assert again.records_after(4_999, 1)[0]["samples_per_s"] == 9.0 and again.series("samples_per_s")[0]["x"] == [5_000]
    again.close()


_KILLED_MID_COMPACTION = """
import os, signal, sys
from pathlib import Path
from mstail.parsers import Item
from mstail.tailer.history import db
from mstail.tailer.history.db import StateDB
from mstail.tailer.history.store import Store

db.COMPACT_ROWS = 1_000
store = Store(StateDB(Path(sys.argv[1]), expected="test"))
store.load()
store.add_source("a", "")
compact = StateDB._compact
def killed(self, conn, loose):
    compact(self, conn, loose)  # the chunks written, the rows deleted, not committed
    print(step - 100, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
step = 0
while step < 5_000:  # live steps, 100 a commit: rows, until the second commit that moves them into chunks
    store.add("a", [Item("record", {"step": s, "time": 1.0, "loss": s / 7}) for s in range(step + 1, step + 101)])
    step += 100
    if step > 1_000:  # (the first compaction, at 1,000, written)
        StateDB._compact = killed
    store.commit()
"""


@pytest.mark.slow  # a child process, killed
def test_a_commit_killed_while_it_moves_rows_into_chunks_leaves_the_commit_before(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    child = subprocess.run([sys.executable, "-c", _KILLED_MID_COMPACTION, str(path)], capture_output=True,
                           text=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr
    committed = int(child.stdout.split()[-1])
    store = Store(StateDB(path, expected="test"))
    store.load()
    assert [r["step"] for r in store.records_after(0, 10_000)] == list(range(1, committed + 1))
    assert store.db._rows("SELECT first_seq, last_seq FROM chunks") == [(1, 999)]  # the first compaction's
    assert store.series("loss", points=10_000)[0]["x"] == list(range(1, committed + 1))
    store.add("a", [Item("record", {"step": committed + 1, "time": 1.0, "loss": 0.0})])
    store.close()
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def _as_schema_1(path: Path) -> None:
    """Make a state what mstail wrote before chunks: every item a row, raw column pieces, no auto vacuum."""
    with sqlite3.connect(path) as conn:
        rows = [item for (data,) in conn.execute("SELECT data FROM chunks") for item in db._unpack_chunk(data)]
        conn.executemany("INSERT INTO items VALUES (?, ?, ?, ?)", [(s, source, kind, db._text(text))
                                                                   for s, source, kind, text in rows])
        conn.execute("DROP TABLE chunks")
        for table, blobs in (("frames", ("steps", "times")), ("columns", ("steps", "times", "vals", "bad"))):
            for rowid, *packed in conn.execute(f"SELECT rowid, {', '.join(blobs)} FROM {table}").fetchall():
                conn.execute(f"UPDATE {table} SET {', '.join(f'{b} = ?' for b in blobs)} WHERE rowid = ?",
                             [None if p is None else bytes(unpack(p)) for p in packed] + [rowid])
        manifest = json.loads(conn.execute("SELECT value FROM meta WHERE key = 'columns'").fetchone()[0])
        del manifest["packed"]
        conn.execute("UPDATE meta SET value = ? WHERE key = 'columns'", (json.dumps(manifest),))
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema'")
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA auto_vacuum = NONE")
        conn.execute("VACUUM")


def test_a_schema_1_state_is_migrated_in_place_and_said(tmp_path: Path, small_compactions: None,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(columns, "PIECE_POINTS", 600)  # packed pieces
    monkeypatch.setattr(columns, "PACKED_POINTS", 150)
    batches = _batches(4, steps=1_500)
    path = tmp_path / "s.sqlite"
    _store(path, batches).close()
    _as_schema_1(path)
    with sqlite3.connect(path) as conn:
        assert not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'chunks'").fetchall()
    expected = _answers(_reference(tmp_path, batches, monkeypatch))
    with caplog.at_level(logging.WARNING, logger="mstail.state"):
        store = Store(StateDB(path, expected="test"))
        store.load()
    [said] = caplog.records
    assert "earlier mstail (schema 1): migrated in place" in said.getMessage()
    assert _answers(store) == expected  # read as it is, before anything was written
    store.add("rank_0", [Item("record", {"step": 10**6, "time": 2e9, "loss": 0.5})])
    store.commit()  # migrates: the chunks' table, the columns saved again packed, rows compacted
    served = {metric: store.series(metric, points=10_000) for metric in ("loss", "lr", "samples_per_s")}
    store.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mstail.state"):
        again = Store(StateDB(path, expected="test"))
        again.load()
    assert not caplog.records  # schema 2 now, its columns read back (no rebuild)
    assert again.db._rows("SELECT value FROM meta WHERE key = 'schema'") == [("2",)]
    assert again.db._rows("SELECT count(*) FROM chunks")[0][0] > 0
    assert again.db.columns_manifest()["packed"] == 1  # type: ignore[index]
    assert {metric: again.series(metric, points=10_000) for metric in served} == served
    assert _answers(again)["records 0 5000"][:-1] == expected["records 0 5000"][:4_999]
    again.close()


def test_a_long_piece_is_packed_and_unpacked_bit_for_bit() -> None:
    from array import array

    rng = random.Random(5)
    special = [math.nan, -math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-324, 1.7976931348623157e308]
    values = array("d", [rng.choice(special) if rng.random() < 0.01 else rng.gauss(0, 1e6)
                         for _ in range(columns.PACKED_POINTS + 3)])
    steps = array("q", [-(1 << 63), (1 << 63) - 1] + [rng.randrange(-(1 << 63), 1 << 63)
                                                         for _ in range(columns.PACKED_POINTS + 1)])
    for column in (values, steps):
        blob = pack(column, 1, len(column))
        assert blob[0] == columns.PLANES
        assert bytes(unpack(blob)) == column[1:].tobytes()
        assert pack(column, 5, 900) == b"\0" + column[5:900].tobytes()  # a short piece: raw
        assert bytes(unpack(pack(column, 5, 900))) == column[5:900].tobytes()


def test_a_long_history_takes_few_bytes_a_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records in chunks and full column pieces packed: a steady run's 8 metrics take about 5 bytes a value on
    disk, WAL checkpointed and free pages included (46 with every record a JSON row and raw pieces)."""
    monkeypatch.setattr(columns, "PACKED_POINTS", 2_048)
    path = tmp_path / "s.sqlite"
    store = Store(StateDB(path, expected="test"))
    store.load()
    store.add_source("a", "")
    steps = 40_000
    for first in range(1, steps + 1, 3_000):
        store.add("a", [Item("record", {
            "step": s, "time": round(1.7e9 + s * 0.5, 3), "loss": round(2 + 8 * math.exp(-s / 3e4), 6),
            "lr": float(f"{1e-4 * min(1.0, s / 2000):.6g}"), "grad_norm": round(0.8 + math.sin(s) ** 2, 6),
            "loss_scale": 65536.0, "overflow": int(s % 5000 == 0), "step_time_ms": 500 + s % 17,
            "throughput": round(120000 / (500 + s % 17), 3), "samples_per_s": round(8000 / (500 + s % 17), 4)})
            for s in range(first, min(first + 3_000, steps + 1))])
        store.commit()
    store.close()
    size = sum(os.path.getsize(f"{path}{suffix}") for suffix in ("", "-wal") if os.path.exists(f"{path}{suffix}"))
    assert size / (steps * 8) <= 8.0
