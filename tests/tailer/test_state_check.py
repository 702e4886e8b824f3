"""The state file's integrity check runs in a thread of its own from the opening (so the server's imports run beside
it) and is waited for before anything is read from the state (`Store.load` -> `StateDB.verify`): a file damaged
inside, that still opens, is set aside there and the logs are read from the start, as a state damaged at its head
always was. A file exactly as its last clean close left it, or as the last commit of a process killed while the
machine kept running left it (the owner's mark in its lock file, `_OwnerMark`), is not read whole again; any write to
it or its WAL since, a machine restart, a failed read, or an opening that never checked it brings the check back.
A history may be loaded beside the check (`Store.load(beside_check=True)`, what `serve` does after a machine crash):
nothing is written to the file before the check passed, and when it fails nothing read from the file is kept.
The crashes are real: a child process holding the state is killed with SIGKILL."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from array import array
from pathlib import Path
from typing import Optional, Tuple

import pytest

from mstail.parsers import Item
from mstail.tailer.history.db import StateDB, _OwnerMark
from mstail.tailer.history.store import Store

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


def _after_a_machine_crash(tmp_path: Path, damage: Optional[bytes] = None) -> Tuple[Path, Store]:
    """A state of RECORDS records (the page holding `damage` overwritten, if given), opened as after a machine
    crash (no mark its owner left holds: another boot's, or none): (its path, its store, not loaded yet)."""
    path = tmp_path / "state.sqlite"
    _state(path)
    if damage is not None:
        _damage_the_page_holding(path, damage)
    path.with_name("state.sqlite.lock").write_bytes(b"")
    store = Store(StateDB(path, expected="test"))
    assert store.db.checking
    return path, store


def _one_more(store: Store) -> None:
    store.add("rank_0", [Item("record", {"step": RECORDS + 1, "time": 1e9, "loss": 0.5, "lr": 1e-4})])
    store.commit()


def test_a_history_loaded_beside_its_check_is_written_to_only_once_the_check_passed(tmp_path: Path) -> None:
    path, store = _after_a_machine_crash(tmp_path)
    store.load(beside_check=True)
    assert store.db.checking  # loaded: the check has not even begun (it waits for the load's reads)
    assert store.last_seq == RECORDS and store.series("loss", points=RECORDS)[0]["x"][-1] == RECORDS
    _one_more(store)
    assert store.db.unsaved == 1  # kept in memory, not written into a file the check may still set aside
    assert store.db.verify() is None and not store.db.checking
    store.commit()
    assert store.db.unsaved == 0
    store.close()
    again = Store(StateDB(path, expected="test"))
    again.load()
    assert again.last_seq == RECORDS + 1 and not list(tmp_path.glob("*.corrupt-*"))
    again.close()


def test_a_history_loaded_beside_a_check_that_fails_is_dropped_and_nothing_written(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path, store = _after_a_machine_crash(tmp_path, b'"step":12345,')  # an items page: the load does not read it
    store.load(beside_check=True)
    assert store.last_seq == RECORDS  # served meanwhile (`serve` says the file is being checked)
    _one_more(store)
    with caplog.at_level(logging.WARNING, logger="mstail.state"):
        reason = store.db.verify()
    assert reason is not None and reason.startswith("corrupt")
    assert any("is corrupt" in r.getMessage() and "reading the logs from the start" in r.getMessage()
               for r in caplog.records)
    [aside] = tmp_path.glob("state.sqlite.corrupt-*")
    assert sqlite3.connect(aside).execute("SELECT max(seq) FROM items").fetchone()[0] != RECORDS + 1  # not written
    store.db.close()  # `serve` starts over from the fresh file: nothing of what was read goes into it
    fresh = Store(StateDB(path, expected="test"))
    assert fresh.load() == {} and fresh.last_seq == 0
    fresh.close()


def test_saved_columns_that_fail_to_read_beside_the_check_wait_for_it(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    _, store = _after_a_machine_crash(tmp_path, array("d", [1.0 / 12345]).tobytes())  # a page of the loss column
    with caplog.at_level(logging.WARNING, logger="mstail.state"):
        assert store.load(beside_check=True) == {}  # the read failed: the check decided, before anything was served
    assert store.last_seq == 0 and not store.sources and not store.db.checking
    assert any("is corrupt" in r.getMessage() for r in caplog.records)
    assert len(list(tmp_path.glob("state.sqlite.corrupt-*"))) == 1
    store.close()


def test_a_store_closed_while_its_check_runs_leaves_the_file_to_be_checked_again(tmp_path: Path) -> None:
    path, store = _after_a_machine_crash(tmp_path)
    store.load(beside_check=True)
    store.db.start_check()
    store.close()  # Ctrl-C while the check runs: it is interrupted, and proves nothing
    assert path.with_name("state.sqlite.lock").read_bytes() == b""
    assert _checked_at_opening(path)


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
        assert path.with_name("state.sqlite.lock").read_bytes().startswith(b"open ")  # taken; the owner's in its place
        store = Store(db)
        store.load()
        assert store.last_seq == RECORDS
        assert store.series("loss", points=RECORDS)[0]["x"][-1] == RECORDS
        store.close()


def test_a_close_before_the_check_ended_brings_the_check_back(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    _state(path)
    StateDB(path, expected="test").close()  # trusted at opening: its close is clean again
    assert not _checked_at_opening(path)
    unchecked = StateDB(path.with_name("other.sqlite"), expected="test")  # a new file: sound, closed clean
    unchecked.close()
    assert not _checked_at_opening(path.with_name("other.sqlite"))
    path.with_name("state.sqlite.lock").write_bytes(b"")
    StateDB(path, expected="test").close()  # its check interrupted by the close: nothing proven, no mark
    assert _checked_at_opening(path)


#: a state's owner in a process of its own, killed by the test once it printed "ready"; argv: the state file, then
#: what it does first: "commit" (loads, stores 100 more records, commits), "shared" (the same after another process
#: read the state), "read" (loads, reads a damaged page), "open" (opens the file and leaves its check running)
_OWNER = """
import sqlite3, subprocess, sys, time
from pathlib import Path
from mstail.parsers import Item
from mstail.tailer.history.db import StateDB
from mstail.tailer.history.store import Store

db = StateDB(Path(sys.argv[1]), expected="test")
print("checked" if db._check.checks else "trusted", flush=True)
if sys.argv[2] != "open":
    store = Store(db)
    store.load()
if sys.argv[2] == "shared":  # another program reads the state meanwhile
    reader = f"import sqlite3; c = sqlite3.connect({sys.argv[1]!r}); c.execute('SELECT count(*) FROM items'); c.close()"
    subprocess.run([sys.executable, "-c", reader], check=True, timeout=60)
if sys.argv[2] in ("commit", "shared"):
    last = store.last_seq
    store.add("rank_0", [Item("record", {"step": step, "time": 1e9 + step, "loss": 1.0 / step, "lr": 1e-4})
                         for step in range(last + 1, last + 101)])
    store.commit()
elif sys.argv[2] == "read":
    try:
        store.db.records_after(12_340, 10)
    except sqlite3.DatabaseError:
        pass
print("ready", flush=True)
time.sleep(600)
"""


def _killed_owner(path: Path, does: str) -> str:
    """Run `_OWNER` over the state at `path`, SIGKILL it once it is ready; returns whether its opening checked the
    file ("checked") or trusted it ("trusted")."""
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, str(path), does], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        opened, ready = owner.stdout.readline(), owner.stdout.readline()  # type: ignore[union-attr]
        assert ready == "ready\n", owner.stderr.read() if owner.poll() is not None else ready  # type: ignore[union-attr]
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
        owner.stdout.close()  # type: ignore[union-attr]
        owner.stderr.close()  # type: ignore[union-attr]
    assert owner.returncode == -signal.SIGKILL
    return opened.strip()


@pytest.mark.slow  # an owner process
def test_a_process_killed_in_this_boot_leaves_a_file_trusted_with_its_last_commit(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    _state(path)
    assert _killed_owner(path, "commit") == "trusted"  # the clean close's mark
    assert path.with_name("state.sqlite-wal").stat().st_size  # killed with its last commit in the WAL only
    assert _killed_owner(path, "commit") == "trusted"  # the open mark of the last commit, this boot
    db = StateDB(path, expected="test")
    assert db._check is not None and not db._check.checks
    store = Store(db)
    store.load()
    assert store.last_seq == RECORDS + 200  # both killed owners' commits, replayed from the WAL
    assert store.series("loss", points=RECORDS + 200)[0]["x"][-1] == RECORDS + 200
    store.close()
    assert not list(tmp_path.glob("*.corrupt-*"))


@pytest.mark.slow  # an owner process
def test_a_file_left_by_a_killed_process_is_checked_after_a_machine_restart(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    _state(path)
    _killed_owner(path, "commit")
    lock = path.with_name("state.sqlite.lock")
    mark = lock.read_text()
    assert mark.startswith("open ")
    facts = mark.split(" ", 2)[2]
    lock.write_text(f"open {uuid.uuid4()} {facts}")  # the mark as the boot before this one left it
    db = StateDB(path, expected="test")
    assert db._check is not None and db._check.checks  # a disk may have lost what it said it had written
    store = Store(db)
    store.load()
    assert store.last_seq == RECORDS + 100  # intact: checked, and loaded whole
    store.close()


@pytest.mark.slow  # an owner process
@pytest.mark.parametrize("written", ["state.sqlite", "state.sqlite-wal"])
def test_a_file_written_after_its_owner_was_killed_is_checked_and_a_damaged_one_set_aside(
        tmp_path: Path, written: str, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "state.sqlite"
    _state(path)
    _killed_owner(path, "commit")
    if written == "state.sqlite":
        _damage_the_page_holding(path, b'"step":12345,')
    else:  # the same bytes again: only the status change time tells
        target = tmp_path / written
        target.write_bytes(target.read_bytes())
    with caplog.at_level(logging.WARNING, logger="mstail.state"):
        db = StateDB(path, expected="test")
        assert db._check is not None and db._check.checks
        store = Store(db)
        store.load()
    damaged = written == "state.sqlite"
    assert store.last_seq == (0 if damaged else RECORDS + 100)
    assert any("is corrupt" in r.getMessage() for r in caplog.records) == damaged
    assert len(list(tmp_path.glob("state.sqlite.corrupt-*"))) == damaged
    store.close()


@pytest.mark.slow  # an owner process
@pytest.mark.parametrize("does", ["read", "open"])
def test_a_process_killed_after_a_failed_read_or_before_its_check_ended_leaves_no_trust(
        tmp_path: Path, does: str) -> None:
    path = tmp_path / "state.sqlite"
    _state(path)
    if does == "read":
        _damage_unseen(path, b'"step":12345,')
    else:
        path.with_name("state.sqlite.lock").write_bytes(b"")  # no mark: the owner's opening checks the file
    assert _killed_owner(path, does) == ("trusted" if does == "read" else "checked")
    assert path.with_name("state.sqlite.lock").read_bytes() == b""  # the read failed / nothing proven yet: no mark
    assert _checked_at_opening(path)
    assert len(list(tmp_path.glob("state.sqlite.corrupt-*"))) == (does == "read")


def _damage_unseen(path: Path, text: bytes) -> None:
    """Damage the page holding `text` as a disk would, below the filesystem: no timestamp tells (the clean close's
    mark is made again for the damaged file)."""
    _damage_the_page_holding(path, text)
    lock = os.open(f"{path}.lock", os.O_RDWR)
    try:
        _OwnerMark.mark(lock, path, running=False)
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



@pytest.mark.slow  # an owner process
@pytest.mark.parametrize("mark", ["none", "clean"])
def test_another_program_reading_the_state_meanwhile_leaves_mstail_its_wal(tmp_path: Path, mark: str) -> None:
    """The check reads the file in order through a descriptor of its own: closed while SQLite had the file open, it
    dropped SQLite's shared lock (POSIX locks are the process's, whichever descriptor), and another program's
    connection, closing, took itself for the last one and deleted the WAL the owner went on committing to: lost
    at the owner's crash."""
    path = tmp_path / "state.sqlite"
    _state(path)
    if mark == "none":
        path.with_name("state.sqlite.lock").write_bytes(b"")
    assert _killed_owner(path, "shared") == ("checked" if mark == "none" else "trusted")
    again = Store(StateDB(path, expected="test"))
    again.load()
    assert again.last_seq == RECORDS + 100
    again.close()
