"""`StateDB.events` through the kind index: every kind but amends (`alert` sorts before `amend`, `checkpoint`
after), in seq order, first or newest, with records and amends in between, queued or written; and the query plan
reads the kind index, not every row by seq (a 2 M-record history with a few events took 5 s on the event loop)."""

from __future__ import annotations

import sqlite3
from typing import Any, Dict, List

from mstail.parsers import Item
from mstail.tailer.history.db import StateDB
from mstail.tailer.history.store import Store


def _store() -> Store:
    store = Store()
    store.add_source("a", "/logs/a")
    items: List[Item] = []
    for step in range(1, 301):
        items.append(Item("record", {"step": step, "loss": 1.0}))
        if step % 50 == 0:
            items.append(Item("event", {"kind": "checkpoint", "step": step}))
        if step % 70 == 0:
            items.append(Item("event", {"kind": "alert", "step": step, "message": "x"}))
        if step % 3 == 0:
            items.append(Item("amend", {"step": step, "segment": 0, "lr": 0.1}))
    store.add("a", items)
    return store


def _kinds(events: List[Dict[str, Any]]) -> List[Any]:
    return [(e["kind"], e["step"]) for e in events]


def test_events_are_every_kind_but_amends_in_seq_order() -> None:
    store = _store()
    for committed in (False, True):  # queued in memory, then written to the file
        if committed:
            store.commit()
        every = store.events()
        want = sorted([("checkpoint", s) for s in range(50, 301, 50)] + [("alert", s) for s in range(70, 301, 70)],
                      key=lambda kind_step: (kind_step[1], kind_step[0] == "alert"))
        assert _kinds(every) == want
        assert [e["seq"] for e in every] == sorted(e["seq"] for e in every)
        assert _kinds(store.events(newest=True, limit=3)) == want[-3:]
        assert _kinds(store.events(after=every[2]["seq"], limit=2)) == want[3:5]
        assert _kinds(store.events(kind="alert")) == [("alert", s) for s in range(70, 301, 70)]
    store.close()


def test_the_events_query_reads_the_kind_index() -> None:
    plans: List[str] = []
    db = StateDB(None)
    conn: sqlite3.Connection = db.conn
    conn.set_trace_callback(lambda sql: plans.append(sql) if "FROM items" in sql and "kind" in sql else None)
    db.events(newest=True, limit=10)
    db.events(after=0, limit=10)
    conn.set_trace_callback(None)
    assert len(plans) == 2
    for sql in plans:  # the statements as run (parameters written in)
        detail = " ".join(str(row[-1]) for row in conn.execute("EXPLAIN QUERY PLAN " + sql.replace("?", "0")))
        assert "items_by_kind" in detail and "PRIMARY KEY" not in detail, (sql, detail)
    db.close()
