"""The state's writer thread (`StateDB.write_behind`): commits leave the event loop, and readers see every item once,
in order, whether it is queued, being written, waiting for another connection's lock, or on disk; a batch the lock
refused is written on its retry with what came after it, the amend of a record being written included."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Callable, List

from mstail.parsers import Item
from mstail.tailer.history.db import BUSY_TIMEOUT_S, StateDB
from mstail.tailer.history.store import Store

SOURCE = "rank_0"


def records(steps: range) -> List[Item]:
    return [Item("record", {"step": s, "time": 1.0, "loss": float(s)}) for s in steps]


def test_items_being_written_or_refused_by_a_lock_are_read_once_in_order_and_written_once(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"

    async def run() -> None:
        store = Store(StateDB(path, expected="test"))
        store.load()
        store.db.write_behind(asyncio.get_running_loop())
        store.add_source(SOURCE, "/x/info.log")
        answers: List[List[int]] = []

        def read() -> None:  # what the API and a stream's replay get: every seq once, in order, amends applied
            items = store.items_after(0, 1000)
            answers.append([item["seq"] for item in items])
            assert answers[-1] == list(range(1, store.last_seq + 1))
            assert [r["step"] for r in store.records_after(0, 1000)] == sorted({i.get("step") for i in items} - {None})

        async def until(done: Callable[[], bool]) -> None:
            deadline = time.monotonic() + 10
            while not done() and time.monotonic() < deadline:
                read()
                await asyncio.sleep(0.002)

        store.add(SOURCE, records(range(1, 6)))
        store.commit()
        assert not store.db.ready and store.db.unsaved == 5  # handed to the writer: commit returned at once
        read()
        await until(lambda: store.db.ready)
        assert store.db.write_error is None and store.db.unsaved == 0

        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")  # another connection's lock: the next commit waits for it in the thread
        store.add(SOURCE, records(range(6, 11)))
        began = time.monotonic()
        store.commit()
        assert time.monotonic() - began < BUSY_TIMEOUT_S  # the writer waits for the lock, not the loop (which would
        #                                               wait that long at least)
        store.add(SOURCE, [Item("amend", {"step": 10, "segment": 0, "lr": 0.5})])  # of a record being written
        store.commit()  # joins the queue: one batch is written at a time
        read()
        assert store.records_after(0, 1000)[-1]["lr"] == 0.5
        await until(lambda: store.db.write_error is not None)
        assert store.db.write_error == "database is locked" and store.db.unsaved == 6
        read()
        store.add(SOURCE, records(range(11, 13)))
        read()

        other.execute("ROLLBACK")
        released = time.monotonic()
        await until(lambda: store.db.write_error is None and not store.db.unsaved)  # retried without a commit
        assert store.db.write_error is None and store.db.unsaved == 0 and time.monotonic() - released < 2
        read()
        assert store.records_after(0, 1000)[9]["lr"] == 0.5
        other.close()
        store.close()

    asyncio.run(run())
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT seq, kind, data FROM items ORDER BY seq").fetchall()
    assert [seq for seq, _, _ in rows] == list(range(1, 14))
    steps = [json.loads(data)["step"] for _, kind, data in rows if kind is None]
    assert steps == list(range(1, 13)) and json.loads(rows[9][2])["lr"] == 0.5


def test_without_wal_the_writer_shares_the_readers_connection_and_they_read_every_item_once(tmp_path: Path) -> None:
    # A state on a network filesystem keeps SQLite's rollback journal: a commit's lock there would fail another
    # connection's reads, so the writer thread commits on the readers' connection (behind its lock).
    path = tmp_path / "state.sqlite"

    async def run() -> None:
        store = Store(StateDB(path, expected="test", network=True))
        store.load()
        store.db.write_behind(asyncio.get_running_loop())
        store.add_source(SOURCE, "/x/info.log")
        for first in range(1, 400, 20):
            store.add(SOURCE, records(range(first, first + 20)))
            store.commit()  # handed over, or queued behind the batch being written
            assert [r["step"] for r in store.records_after(0, 1000)] == list(range(1, first + 20))
            await asyncio.sleep(0)
        while store.db.unsaved:
            store.commit()
            await asyncio.sleep(0.01)
        assert store.db.write_error is None
        store.close()

    asyncio.run(run())
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        steps = [json.loads(data)["step"] for (data,) in conn.execute("SELECT data FROM items ORDER BY seq")]
    assert steps == list(range(1, 401))
