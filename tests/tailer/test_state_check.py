"""The state file's integrity check runs in a thread of its own from the opening (so the server's imports run beside
it) and is waited for before anything is read from the state (`Store.load` -> `StateDB.verify`): a file damaged
inside, that still opens, is set aside there and the logs are read from the start, as a state damaged at its head
always was. A file exactly as its last clean close left it (the mark in its lock file, `_CleanClose`) is not read
whole again; any write to it since, a crash, or an opening that never checked it brings the check back."""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from pathlib import Path

import pytest

from mstail.parsers import Item
from mstail.tailer.db import StateDB, _CleanClose
from mstail.tailer.store import Store

RECORDS = 20_000


def _state(path: Path) -> None:
    store = Store(StateDB(path, expected="test"))
    store.add_source("rank_0", "/logs/rank_0.log")
    for start in range(0, RECORDS, 1_000):
        store.add("rank_0", [Item("record", {"step": step, "time": 1e9 + step, "loss": 1.0 / step, "lr": 1e-4})
                             for step in range(start + 1, start + 1_001)])
        store.commit()
    store.close()


def _damage_the_page_holding(path: Path, text: bytes, page: int = 4096) -> None:
    """Garbage over the whole database page that holds `text` (a row of the items table): the header stays intact,
    so the file opens as before."""
    data = path.read_bytes()
    at = data.index(text)
    with open(path, "r+b") as handle:
        handle.seek(at - at % page)
        handle.write(bytes(range(256)) * (page // 256))


def _checked_at_opening(path: Path) -> bool:
    """Whether an opening of `path` runs the integrity check (then waited for and closed cleanly)."""
    db = StateDB(path, expected="test")
    checked = db._check is not None and db._check.checks
    store = Store(db)
    store.load()
    store.close()
    return checked


def test_an_intact_state_passes_the_check_and_loads_whole(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    _state(path)
    path.with_name("state.sqlite.lock").write_bytes(b"")  # no clean close's mark: checked
    db = StateDB(path, expected="test")
    assert db._check is not None and db._check.checks
    store = Store(db)
    store.load()
    assert store.last_seq == RECORDS
    assert store.series("loss", points=RECORDS)[0]["x"][-1] == RECORDS
    assert not list(tmp_path.glob("*.corrupt-*"))
    store.close()


@pytest.mark.parametrize("times", ["changed", "put back"])
def test_a_state_damaged_inside_is_set_aside_before_anything_is_read(tmp_path: Path, times: str,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "state.sqlite"
    _state(path)  # closed cleanly: damaged while mstail was down
    before = os.stat(path)
    _damage_the_page_holding(path, b'"step":12345,')
    if times == "put back":  # as `touch -r` or a restore would: the status change time still tells
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    with caplog.at_level(logging.WARNING, logger="mstail.state"):
        store = Store(StateDB(path, expected="test"))  # opens: its head is intact
        assert store.load() == {}
    assert store.last_seq == 0 and not store.sources  # read from the start: nothing of the damaged file
    assert any("is corrupt" in r.getMessage() and "reading the logs from the start" in r.getMessage()
               for r in caplog.records)
    assert len(list(tmp_path.glob("state.sqlite.corrupt-*"))) == 1  # kept for a look, not deleted
    store.add_source("rank_0", "/logs/rank_0.log")  # the fresh state takes the history again
    store.add("rank_0", [Item("record", {"step": 1, "loss": 2.0})])
    store.commit()
    store.close()
    again = Store(StateDB(path, expected="test"))
    again.load()
    assert again.last_seq == 1
    again.close()


def test_a_state_closed_before_its_check_is_asked_for_closes_at_once_and_unlocked(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    _state(path)
    began = time.monotonic()
    StateDB(path, expected="test").close()  # the check is interrupted, not waited for to its end
    assert time.monotonic() - began < 5
    StateDB(path, expected="test").close()  # the lock is free: a second opening is not refused


def test_a_state_unchanged_since_its_clean_close_is_not_read_whole_again(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    _state(path)
    assert b"clean " in path.with_name("state.sqlite.lock").read_bytes()
    for _ in range(2):  # each clean close marks it again
        db = StateDB(path, expected="test")
        assert db._check is not None and not db._check.checks  # only what `Store.load` reads is read ahead
        assert path.with_name("state.sqlite.lock").read_bytes() == b""  # taken at the opening: a crash leaves none
        store = Store(db)
        store.load()
        assert store.last_seq == RECORDS
        assert store.series("loss", points=RECORDS)[0]["x"][-1] == RECORDS
        store.close()


def test_a_crash_or_a_close_before_the_check_ended_brings_the_check_back(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    _state(path)
    crashed = StateDB(path, expected="test")
    crashed._owner.close()  # type: ignore[union-attr]  # what a kill -9 leaves: the lock released, no mark written
    crashed._owner = None
    crashed.close()
    assert _checked_at_opening(path)
    StateDB(path, expected="test").close()  # trusted at opening: its close is clean again
    assert not _checked_at_opening(path)
    unchecked = StateDB(path.with_name("other.sqlite"), expected="test")  # a new file: sound, closed clean
    unchecked.close()
    assert not _checked_at_opening(path.with_name("other.sqlite"))
    path.with_name("state.sqlite.lock").write_bytes(b"")
    StateDB(path, expected="test").close()  # its check interrupted by the close: nothing proven, no mark
    assert _checked_at_opening(path)


def _damage_unseen(path: Path, text: bytes) -> None:
    """Damage the page holding `text` as a disk would, below the filesystem: no timestamp tells (the clean close's
    mark is made again for the damaged file)."""
    _damage_the_page_holding(path, text)
    lock = os.open(f"{path}.lock", os.O_RDWR)
    try:
        _CleanClose.mark(lock, path)
    finally:
        os.close(lock)


def test_a_page_damaged_unseen_is_found_when_read_and_the_next_start_checks(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    _state(path)
    _damage_unseen(path, b'"step":12345,')  # a page of the items, which a start does not read
    db = StateDB(path, expected="test")
    assert db._check is not None and not db._check.checks  # trusted: the mark matches
    store = Store(db)
    store.load()
    assert store.last_seq == RECORDS  # the chart columns are whole
    with pytest.raises(sqlite3.DatabaseError):
        store.db.records_after(12_340, 10)  # SQLite finds the damage when it reads the page
    store.close()  # not a clean close: nothing proves the file sound any more
    assert not list(tmp_path.glob("*.corrupt-*"))
    again = Store(StateDB(path, expected="test"))
    assert again.load() == {} and again.last_seq == 0  # checked at this start: set aside
    assert len(list(tmp_path.glob("state.sqlite.corrupt-*"))) == 1
    again.close()


def test_reopened_says_whether_the_opening_found_a_history_to_load(tmp_path: Path) -> None:
    """`serve` imports the web part beside `Store.load` only when there is a history to load (a restart)."""
    path = tmp_path / "state.sqlite"
    first = StateDB(path, expected="test")
    assert not first.reopened  # made by this opening
    first.close()
    again = StateDB(path, expected="test")
    assert again.reopened
    again.close()
    other = StateDB(path, expected="other")  # another fingerprint's file: set aside, a fresh one made
    assert not other.reopened
    other.close()
    assert not StateDB(None).reopened  # --no-state
