"""Where the history and the read positions survive restarts: one SQLite file per set of followed logs.

Records, events and every source's checkpoint (file offsets + parser state) are committed in one
transaction per tailing pass, so after `kill -9` or a reboot mstail resumes exactly where the committed
history ends: nothing lost, nothing shown twice. The file lives on local disk in a per-user folder
(`--state-dir`, default `$XDG_STATE_HOME/mstail` or `~/.local/state/mstail`), never in a log directory.
Its name carries a fingerprint of what is followed and how it is parsed; a state written for other
logs or formats is never reused, and a corrupt one is moved aside — both mean "read from the start".

SQLite runs in WAL mode with `synchronous=NORMAL` (a commit is durable against a killed process and the
database is never left inconsistent by a power loss); on a network filesystem WAL is unsafe (its shared
memory index needs one host), so the rollback journal is used there.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import math
import os
import re
import sqlite3
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import cramjam
import orjson

from mstail.parsers.record import jsonable, orjson_exact

from mstail.tailer.inputs.checkpoint import SourceCheckpoint
from mstail.tailer.history.columns import Flush, Piece

log = logging.getLogger("mstail.state")

SCHEMA_VERSION = 2
#: schema 1 had no `chunks` (every item a row) and its chart columns' pieces were raw array bytes: such a file is
#: migrated as it is used (`StateDB._migrate_schema`)
_SCHEMAS_READ = ("1", str(SCHEMA_VERSION))
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS items (seq INTEGER PRIMARY KEY, source TEXT NOT NULL, kind TEXT, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS items_by_kind ON items (kind, seq) WHERE kind IS NOT NULL;
CREATE TABLE IF NOT EXISTS sources (id TEXT PRIMARY KEY, path TEXT NOT NULL, checkpoint TEXT);
CREATE TABLE IF NOT EXISTS frames (source TEXT NOT NULL, segment INTEGER NOT NULL, start INTEGER NOT NULL,
    steps BLOB NOT NULL, times BLOB NOT NULL, PRIMARY KEY (source, segment, start));
CREATE TABLE IF NOT EXISTS columns (source TEXT NOT NULL, segment INTEGER NOT NULL, metric TEXT NOT NULL,
    start INTEGER NOT NULL, steps BLOB, times BLOB, vals BLOB NOT NULL, bad BLOB NOT NULL,
    PRIMARY KEY (source, segment, metric, start));
CREATE TABLE IF NOT EXISTS blocks (source TEXT NOT NULL, segment INTEGER NOT NULL, metric TEXT NOT NULL,
    mins BLOB NOT NULL, maxs BLOB NOT NULL, PRIMARY KEY (source, segment, metric));
"""
#: made with a new file, or by the first commit into a schema 1 file (never before: that file may not be checked yet)
_CHUNKS_TABLE = "CREATE TABLE IF NOT EXISTS chunks (first_seq INTEGER PRIMARY KEY, last_seq INTEGER NOT NULL, data BLOB NOT NULL)"
# The chart columns (`mstail.tailer.history.columns`) were added to schema 1 without changing it: a state written before
# them has empty `frames`/`columns`/`blocks` tables and no `columns` row in `meta`, and its columns are rebuilt once.


#: how long a commit waits for another program's lock on the state file (a `sqlite3` shell's transaction, a backup)
#: before it gives up and its batch waits in memory; also how long a read on the event loop may wait for one
BUSY_TIMEOUT_S = 0.1
#: how soon a commit that found the file locked tries again (every other failure backs off from 1 s to 30 s):
#: a retry costs the writer thread one BUSY_TIMEOUT_S and the loop nothing, and the history is written again
#: within a moment of the lock's release
BUSY_RETRY_S = 0.5
_SEQ_MAX = (1 << 63) - 1  # above every seq: "no item in memory" as a bound of the file's part of an answer

# Records and amends (the bulk of a history) are kept as chunks: up to CHUNK_ITEMS of them, in seq order, as one
# zstd-compressed blob (`_pack_chunk`: about 4 bytes a metric value, where a row of JSON takes about 30). Events stay
# rows (few, read by kind), and so does the newest record of each source (what an amend rewrites). A commit of at
# least CHUNK_MIN such items (a catch-up's) writes them as chunks at once; smaller ones (live steps) are rows until
# COMPACT_ROWS of them gathered, which a commit then moves into chunks (`StateDB._compact`), in its transaction.
CHUNK_ITEMS = 4096
CHUNK_MIN = 2048
COMPACT_ROWS = 65_536
_CHUNKED = "kind IS NULL OR kind = 'amend'"  # the rows a chunk may take (a record's newest aside)
_ZSTD_LEVEL = 1  # 4 bytes a value at 0.4-2 us a record; higher levels cost 2-4 times that for 5 % less

#: an item not yet on disk: (seq, source, kind, JSON)
Row = Tuple[int, str, Optional[str], str]


def _pack_chunk(rows: Sequence[Row]) -> bytes:
    """Items as a chunk: a line of their seqs, sources and kinds (JSON), then their JSON a line each, compressed."""
    head = orjson.dumps([[row[0] for row in rows], [row[1] for row in rows], [row[2] for row in rows]])
    text = b"\n".join([head, *(row[3].encode("utf-8", "surrogatepass") for row in rows)])  # JSON has no raw newline
    return bytes(cramjam.zstd.compress(text, level=_ZSTD_LEVEL))


def _unpack_chunk(data: bytes) -> List[Tuple[int, str, Optional[str], bytes]]:
    """A chunk's items: (seq, source, kind, JSON bytes)."""
    lines = bytes(cramjam.zstd.decompress(data)).split(b"\n")
    seqs, sources, kinds = orjson.loads(lines[0])
    return list(zip(seqs, sources, kinds, lines[1:]))


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogatepass")


def _any_kind(kind: Optional[str]) -> bool:
    return True


def _is_record(kind: Optional[str]) -> bool:
    return kind is None


def _is_amend(kind: Optional[str]) -> bool:
    return kind == "amend"


def _first(memory: List[Row]) -> int:
    """The seq below which every item is in the file (`StateDB._in_memory`)."""
    return memory[0][0] if memory else _SEQ_MAX


class StateError(Exception):
    """A user-facing reason the state folder cannot be used (not writable, inside a log directory)."""


def fingerprint(parts: Sequence[str]) -> str:
    """A short digest of what decides the history: followed patterns (absolute) and parsing options."""
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:16]


def state_file(state_dir: Path, label: str, digest: str) -> Path:
    """`<state_dir>/<readable label>-<digest>.sqlite`; the label only helps a person find the file."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_")[-48:] or "state"
    return state_dir / f"{slug}-{digest}.sqlite"


def _private_folder(folder: Path) -> None:
    """Make `folder` and its missing parents 0700 (whatever the umask); a folder that exists is left as it is."""
    missing = [p for p in [folder, *folder.parents] if not p.exists()]
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue  # made meanwhile by someone else: theirs, left as it is
        os.chmod(path, 0o700)  # mkdir's mode went through the umask


def _private_file(path: str, flags: int) -> int:
    """Open (create) `path` readable and writable by its owner only (0600, whatever the umask)."""
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, 0o600)
    with contextlib.suppress(OSError):  # another user's file (a shared --state-dir): its mode is theirs to set
        os.fchmod(fd, 0o600)
    return fd


# NaN/Infinity stay floats on the way back (json.loads reads its own non-standard tokens).
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


#: the names the stream writes non-finite numbers by (`finite_or_name`), as JSON strings, and the stored JSON's tokens
_NAMED = ((b'"NaN"', b"NaN"), (b'"Infinity"', b"Infinity"), (b'"-Infinity"', b"-Infinity"))


def item_text(item: Dict[str, Any]) -> Tuple[str, Optional[str]]:
    """A stored item's JSON, and the JSON the stream sends for it (`json_bytes`'s) where made on the way, else None.
    orjson's text where it writes what `_dumps` would (most items), which the stream sends as it is; an item with
    NaN or an infinity among its own values: the stream's text (orjson's, each by name) with those names made the
    json module's tokens, where that text holds no other such name (about `_dumps`'s cost, 7 µs a catch-up record,
    with the stream's text made on the way); else `_dumps`'s (an int beyond 64 bits, a lone surrogate, a non-finite
    number in a nested value, a value or key "NaN" beside one)."""
    data = orjson_exact(item)
    if data is not None:
        text = data.decode()
        return text, text
    non_finite = sum(1 for value in item.values() if type(value) is float and not math.isfinite(value))
    if non_finite:
        try:
            streamed = orjson.dumps(jsonable(item))
        except orjson.JSONEncodeError:
            return _dumps(item), None
        if sum(streamed.count(name) for name, _ in _NAMED) == non_finite:  # each name is one of those numbers
            stored = streamed
            for name, token in _NAMED:
                stored = stored.replace(name, token)
            return stored.decode(), streamed.decode()
    return _dumps(item), None


def _item_json(item: Dict[str, Any]) -> str:
    """A stored item's JSON (`item_text`'s)."""
    return item_text(item)[0]


#: a source's row with its newest checkpoint (every source a pass read): an upsert rewrites the row in place, about
#: half the work of REPLACE's delete and insert (SQLite 3.24 and later; older ones replace).
_SAVE_SOURCE = ("INSERT INTO sources VALUES (?, ?, ?) ON CONFLICT(id) DO UPDATE SET path = excluded.path, "
                "checkpoint = excluded.checkpoint" if sqlite3.sqlite_version_info >= (3, 24, 0)
                else "INSERT OR REPLACE INTO sources VALUES (?, ?, ?)")
#: the queued items (`insert`): an upsert, so that a seq written twice (never expected) keeps the newer item as REPLACE
#: did, at less of the commit's cost (a catch-up's 64,216 rows: 1.9-2.9 us a row against REPLACE's 2.5-3.2, load 3.5);
#: older SQLites replace
_SAVE_ITEM = ("INSERT INTO items VALUES (?, ?, ?, ?) ON CONFLICT(seq) DO UPDATE SET source = excluded.source, "
              "kind = excluded.kind, data = excluded.data" if sqlite3.sqlite_version_info >= (3, 24, 0)
              else "INSERT OR REPLACE INTO items VALUES (?, ?, ?, ?)")
# 20 digits in a row: maybe an integer beyond 64 bits, which orjson would read as a float
_LONG_DIGITS = re.compile(r"\d{20}")


def _loads(data: str) -> Dict[str, Any]:
    """A stored item's JSON: by orjson (about 7 times faster), or by json where orjson would fail or differ
    (NaN/Infinity tokens, integers beyond 64 bits)."""
    if _LONG_DIGITS.search(data) is None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)


#: what `Store.load` reads, read ahead by `IntegrityCheck` when the file needs no check: max() loads every value
#: (length() or count() would not read the blobs' overflow pages). From a cold page cache SQLite's page-by-page reads
#: of these 90 MB (a million records) take 0.25 s; done here they overlap the server's imports.
_READ_AHEAD = ("SELECT max(steps), max(times) FROM frames",
               "SELECT max(vals), max(bad), max(steps), max(times) FROM columns",
               "SELECT max(mins), max(maxs) FROM blocks")


class IntegrityCheck:
    """`PRAGMA quick_check` of a state file, run in a thread of its own on a read-only connection of its own.

    What it protects: a file damaged inside (a torn write on a disk that lied about flushing, a bad sector, another
    program's write) that still opens. Such pages would fail later reads and commits, the history would stop being
    written; found at the start, the file is moved aside and the logs read again. The check reads every page (the
    whole file, 375 MB for a million records: 1 s from the page cache, more from a disk, read in order first), so
    it runs while the server starts and serves the history loaded beside it (`serve`), not before; a file its
    owner's mark (`_OwnerMark`) shows unchanged since its last clean close, or since the last commit of a process
    that ended in this boot of the machine, is not checked: only what `Store.load` will read is read ahead
    (`_READ_AHEAD`).

    The check waits for `start` (or `result`): a history loaded beside it (`Store.load`) reads its columns from the
    disk first, not behind the 375 MB read in order (which made that load 0.9 s instead of 0.2 s, cold).

    Args:
        path: the state file, already opened (and in WAL mode) by its owner.
        check: run the check; False = only read ahead, at once (the answer is then None).
        reader: the file opened for reading before SQLite opened it, to read it in order (needed with `check`);
            its owner closes it after SQLite's connections (`StateDB._reader`).
    """

    def __init__(self, path: Path, check: bool = True, reader: Optional[IO[bytes]] = None) -> None:
        self._conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, check_same_thread=False)
        self._reason: Optional[str] = None
        self._reader = reader
        self._cancelled = False
        self._go = threading.Event()
        self.checks = check
        self._thread = threading.Thread(target=self._run, name="mstail-state-check", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            if not self.checks:
                for sql in _READ_AHEAD:  # a damaged page read here fails as the check would
                    self._conn.execute(sql).fetchone()
                return
            self._go.wait()
            self._read_in_order()
            if not self._cancelled and self._conn.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                self._reason = "corrupt (integrity check failed)"
        except sqlite3.OperationalError:
            pass  # interrupted by `cancel`: nobody waits for the answer
        except sqlite3.DatabaseError as exc:
            self._reason = f"corrupt ({exc})"
        finally:
            self._conn.close()

    def _read_in_order(self) -> None:
        """Read the file from start to end once, into the page cache: the check reads it page by page in its
        b-trees' order, which from a disk is random reads (9 s for a million records' 375 MB out of the cache,
        against 1.5 s for this read and 1 s for the check then)."""
        if self._reader is None:
            return
        with contextlib.suppress(OSError):
            chunk = bytearray(1 << 20)
            for at in range(0, os.fstat(self._reader.fileno()).st_size, len(chunk)):  # the size now: it may grow
                if self._cancelled or not os.preadv(self._reader.fileno(), [chunk], at):
                    return

    def start(self) -> None:
        """Let the check begin (it waits for this, or for `result`)."""
        self._go.set()

    def result(self) -> Optional[str]:
        """Wait for the check: why the file must not be used, or None."""
        self._go.set()
        self._thread.join()
        return self._reason

    def cancel(self) -> None:
        """Stop the check (the state is closed before anyone asked for its answer)."""
        self._cancelled = True
        self._go.set()
        with contextlib.suppress(sqlite3.Error):
            self._conn.interrupt()
        self._thread.join()


@functools.lru_cache(maxsize=None)
def boot_id() -> Optional[str]:
    """The id of this boot of the kernel (Linux: a new one at every start of the machine), or None where unreadable."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except (OSError, ValueError):
        return None


class _OwnerMark:
    """The mark the state's owner keeps in its lock file, which says whether the next opening may trust the file
    without `IntegrityCheck`. Its facts: the file's identity and timestamps (device, inode, size, modification and
    status change times in ns), and SQLite's 100-byte header in a clean close's mark.

    - `clean FACTS`, left by a clean close: no -wal or -journal with content beside the file.
    - `open BOOT FACTS`, written once the file is known sound and again after every commit while its owner runs:
      FACTS with its -wal's and -journal's (inode, size, times), BOOT the kernel's boot id. A process that ends
      without closing (`kill -9`, the OOM killer, a crash) leaves it. The machine kept running, so every write the
      process made is in the kernel's page cache, and SQLite's own guarantee (a transaction is wholly in the file or
      its WAL or not at all; the WAL's committed frames, checked by their checksums, replayed at the next opening)
      leaves a consistent file. After a machine crash (another boot id) a disk that lied about flushing may have
      torn pages: that file is checked.

    An opening takes the mark (erased, synced, before anything is written) and trusts the file only when the mark
    still describes it exactly. Any write to the file since (a program's, a copy, a restore, even one that puts the
    modification time back) changes the status change time, which only the kernel sets; a process killed between a
    commit and its mark leaves facts that do not match: both are checked. What no stat shows (a disk that damages a
    page without a write) is what SQLite reports when it reads the page (`StateDB._fail` erases the mark then)."""

    @staticmethod
    def _facts(path: Path, running: bool) -> Optional[str]:
        """The file's facts as a mark holds them, or None where there are none to trust. `running` (an open mark,
        made after every commit): the -wal's and -journal's identity and times too, and no header, as the file is
        never opened while SQLite has it (closing a descriptor drops all of the process's POSIX locks on the file,
        SQLite's too). Else (a clean close) the -wal and -journal must be empty: one with something in it means not
        closed, or still open elsewhere; a read-only reader leaves an empty WAL."""
        try:
            if running:
                facts = []
                for name in (str(path), f"{path}-wal", f"{path}-journal"):
                    try:
                        st = os.stat(name)
                    except FileNotFoundError:
                        facts.append("-")
                        continue
                    facts.append(f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}")
                return " ".join(facts) if facts[0] != "-" else None
            for suffix in ("-wal", "-journal"):
                with contextlib.suppress(FileNotFoundError):
                    if os.stat(f"{path}{suffix}").st_size:
                        return None
            with open(path, "rb") as f:
                st, header = os.fstat(f.fileno()), f.read(100)
        except OSError:
            return None
        return json.dumps({"dev": st.st_dev, "ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                           "ctime_ns": st.st_ctime_ns, "header": header.hex()}, sort_keys=True)

    @classmethod
    def _text(cls, path: Path, running: bool) -> Optional[str]:
        """The mark that describes `path` now, clean or open (None: nothing to mark, or no boot id to mark with)."""
        facts = cls._facts(path, running)
        if facts is None:
            return None
        if not running:
            return f"clean {facts}\n"
        boot = boot_id()
        return f"open {boot} {facts}\n" if boot is not None else None

    @classmethod
    def mark(cls, lock: int, path: Path, running: bool) -> None:
        """Mark `path` as it is now: `running` = an open mark (after a commit), else a clean close's."""
        text = cls._text(path, running)
        if text is None:
            cls.erase(lock)
            return
        with contextlib.suppress(OSError):  # no mark: the next opening checks the file, as after a machine crash
            data = text.encode()
            os.pwrite(lock, data, 0)
            os.ftruncate(lock, len(data))

    @staticmethod
    def erase(lock: int) -> None:
        """No mark: the next opening checks the file."""
        with contextlib.suppress(OSError):
            os.ftruncate(lock, 0)

    @classmethod
    def taken(cls, lock: int, path: Path) -> bool:
        """Whether the lock file held a mark that `path` still matches (an open mark: in this boot of the machine);
        the mark is erased either way (synced: a crash after this opening must not leave it behind for a changed
        file)."""
        try:
            mark = os.pread(lock, 4096, 0).decode("utf-8", "replace")
            if not mark:
                return False
            os.ftruncate(lock, 0)
            os.fsync(lock)
        except OSError:
            return False
        return mark == cls._text(path, running=mark.startswith("open "))


def _outcome(written: bool) -> "Future[bool]":
    """A commit's outcome known at once."""
    future: "Future[bool]" = Future()
    future.set_result(written)
    return future


def _busy(error: str) -> bool:
    """Whether a failed commit's reason is another connection's lock (SQLITE_BUSY or SQLITE_LOCKED), which goes away
    by itself, not a disk that cannot take the write."""
    return "is locked" in error


@dataclass
class _Batch:
    """One commit: everything queued when it was taken (on the loop, at once), written in one transaction."""

    rows: List[Row]
    rewrites: Dict[int, str]  # seq -> JSON of items already on disk
    checkpoints: Dict[str, Tuple[str, str]]  # source -> (path, JSON)
    columns: Optional[Flush]  # its pieces are cut from the live columns as they are written (`Flush`)
    manifest: Optional[str]  # the columns' manifest's JSON, made when the batch was taken
    alerts: Optional[str]  # the alert rules' state's JSON
    #: whether it was written, set on the loop once known (the committer listens to it: `StateDB.commit`)
    outcome: "Future[bool]"
    error: Optional[str] = None  # why it was not written


class StateDB:
    """The SQLite history of one mstail instance, used from the event loop (ARCHITECTURE.md, Threads), and written
    by a thread of its own once `write_behind` says so: commits then never wait for the disk or another program's
    lock on the loop. Readers use one connection, behind a lock (a slow query may be moved to a worker thread
    safely); commits another (for a file: in WAL mode readers never wait for it), and readers see what is queued or
    being written from memory.

    Args:
        path: the database file; None = a private temporary database (no persistence, memory still bounded).
        expected: fingerprint this state must carry; a file with another one (other logs, other formats,
            older schema) is moved aside and a fresh state is started.
        network: the file is on a network filesystem (no WAL there).
    """

    def __init__(self, path: Optional[Path], expected: str = "", network: bool = False) -> None:
        self.path = path
        self.expected = expected
        self._lock = threading.Lock()  # the readers' connection (`conn`); the commits' too without WAL (`_writer`)
        self._write_lock = threading.Lock()  # the commits' own connection (`_wconn`)
        self._mark_lock = threading.Lock()  # the owner's mark: written after a commit (writer), erased by a failure
        self._wconn: Optional[sqlite3.Connection] = None  # the commits' own connection, opened at the first commit
        #: with `write_behind`: the loop told of each commit's end, and the thread that writes them, one at a time
        self._behind: Optional[Tuple[asyncio.AbstractEventLoop, ThreadPoolExecutor]] = None
        self._writing: Optional[_Batch] = None  # the batch being written: its items are still read from memory
        self._written: Optional[Future] = None  # ... and the writer's future for it
        #: the open lock file that keeps a second mstail out, and holds its owner's mark (`_OwnerMark`); a file
        #: object, so that a StateDB dropped unclosed releases the lock
        self._owner: Optional[IO[bytes]] = None
        self._unsaved: List[Row] = []  # items queued for the next commit
        self._unsaved_checkpoints: Dict[str, Tuple[str, str]] = {}  # source -> (path, JSON), written with them
        self._rewrites: Dict[int, str] = {}  # seq -> JSON: amended records already on disk, rewritten with them
        #: why the last commit failed (disk full, read-only, I/O error, ...), or None when everything is written
        self.write_error: Optional[str] = None
        self._backoff = 0.0
        self._retry_at = 0.0
        self._network = network
        self._check: Optional[IntegrityCheck] = None  # checking or reading ahead, from the opening until `verify`
        #: the file opened for the check's read in order before SQLite opened it, closed only after SQLite closed it:
        #: closing any descriptor of a file drops all of the process's POSIX locks on it, SQLite's too, and without its
        #: shared lock another program's connection, closing, takes itself for the last one and deletes the WAL
        #: mstail still writes to
        self._reader: Optional[IO[bytes]] = None
        #: the file's pages are known to hold together: checked at this opening (`verify`), unchanged since its
        #: owner's mark (`_OwnerMark`), or new; only then, and with nothing failed since, is it marked (open or clean)
        self._sound = path is None
        self._failed = False  # a read or write failed since the opening: the next opening checks the file
        #: a file this instance's fingerprint wrote was there to open (a restart): `Store.load` has a history to read
        self.reopened = False
        self._schema = str(SCHEMA_VERSION)  # the file's (`_unusable`); an older one is migrated by the first commit
        self._loose: Optional[int] = None  # rows a chunk may take (`_CHUNKED`), counted by the first commit
        self._has_chunks = False  # the file has the chunks' table (`_chunks_exist`)
        #: the chunk read last and its items (readers only): read again by the next page of a replay
        self._last_chunk: Optional[Tuple[bytes, List[Tuple[int, str, Optional[str], bytes]]]] = None
        self.conn = self._open(network)
        self._mark_running()

    # -- opening ----------------------------------------------------------------------------------------------
    def _open(self, network: bool) -> sqlite3.Connection:
        if self.path is None:
            return self._prepare(sqlite3.connect("", isolation_level=None, check_same_thread=False), network)
        try:
            _private_folder(self.path.parent)
            self._owner = os.fdopen(_private_file(f"{self.path}.lock", os.O_RDWR), "r+b", buffering=0)
        except OSError as exc:
            raise StateError(f"cannot use the state folder {self.path.parent}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(self._owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._owner.close()
            raise StateError(
                f"another mstail keeps its history in {self.path} (the same --log set): stop it first, or give this "
                "one another --state-dir, or --no-state"
            ) from None
        except OSError:
            pass  # a filesystem without locks: go on unguarded
        existed = self.path.exists()  # both before `_connect`: it makes the file, and its chmod changes the ctime
        self._sound = _OwnerMark.taken(self._owner.fileno(), self.path) or not existed
        if not self._sound:
            with contextlib.suppress(OSError):  # none: the check reads it page by page only
                self._reader = open(self.path, "rb", buffering=0)
        try:
            conn = self._prepare(self._connect(), network)
            reason = self._unusable(conn)
        except sqlite3.DatabaseError as exc:
            conn, reason = None, f"corrupt ({exc})"
        if reason is None:
            self._check = IntegrityCheck(self.path, check=not self._sound, reader=self._reader)
            self.reopened = existed
            return conn  # type: ignore[return-value]  # usable: opened
        if conn is not None:
            conn.close()
        return self._set_aside(reason, network)

    def _set_aside(self, reason: str, network: bool) -> sqlite3.Connection:
        """Move the unusable state file (and its -wal, -shm, -journal) aside, said once, and start a fresh one."""
        self._close_reader()  # SQLite's connections to it are closed
        aside = self.path.with_name(f"{self.path.name}.{reason.split()[0]}-{int(time.time())}")  # type: ignore[union-attr]  # a file: a temporary one is never unusable
        log.warning("state %s is %s: moved to %s; reading the logs from the start", self.path, reason, aside)
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(OSError):
                os.replace(f"{self.path}{suffix}", f"{aside}{suffix}")
        self._sound, self._failed = True, False  # a new file: what failed was the old one's
        self._schema, self._loose, self._has_chunks = str(SCHEMA_VERSION), None, False
        try:
            return self._prepare(self._connect(), network)
        except sqlite3.DatabaseError as exc:
            raise StateError(f"cannot create the state file {self.path}: {exc}") from None

    @property
    def checking(self) -> bool:
        """The integrity check of this opening has not been taken by `verify` yet: the file is not known sound, and
        nothing is written to it (`commit` keeps everything queued) until it is."""
        return self._check is not None and self._check.checks

    def start_check(self) -> None:
        """Begin the integrity check, if there is one (it waits for this, or for `verify`: `IntegrityCheck`)."""
        if self._check is not None:
            self._check.start()

    def wait_for_check(self) -> None:
        """Block until the integrity check ends (or `close` cancels it); `verify` then takes its answer at once. For
        a thread other than the event loop's (`serve`): `verify` itself changes the connection."""
        check = self._check
        if check is not None:
            check.result()

    def verify(self) -> Optional[str]:
        """Wait for the integrity check of this opening, if there is one (not for a file unchanged since its owner's
        mark, `_OwnerMark`). It reads the whole file (0.3-1 s for a million records' 375 MB from the
        page cache, more from a disk) in a thread of its own: SQLite leaves the GIL meanwhile. A state that fails it
        is moved aside and a fresh one started, as at opening. Returns why it failed (then nothing read from the
        file before is to be kept), or None. Call it before anything read from the state is trusted and before
        anything is written (`Store.load`, or `serve` for a history loaded beside the check)."""
        check = self._check
        if check is None:
            return None
        reason = check.result()
        self._check = None
        if reason is not None:
            with self._lock:
                self.conn.close()
                self._close_writer()  # (nothing was written: not into a file not known sound)
                self.conn = self._set_aside(reason, self._network)
        self._sound = True
        self._mark_running()
        return reason

    def _mark_running(self) -> None:
        """The open mark for the file as it is now (known sound, nothing failed since): a process that ends without
        closing from here leaves a file the next opening in this boot may trust (`_OwnerMark`)."""
        with self._mark_lock:  # (after a commit, in the writer thread; not after a failure said meanwhile)
            if self._owner is not None and self._sound and not self._failed:
                _OwnerMark.mark(self._owner.fileno(), self.path, running=True)  # type: ignore[arg-type]  # an owner: a file

    def _fail(self) -> None:
        """A read or a commit failed (maybe a damaged page, which SQLite finds when it reads it; a full disk): nothing
        proves the file sound any more, so its mark goes now, and the next opening checks it even after a crash."""
        with self._mark_lock:
            if not self._failed and self._owner is not None and not self._owner.closed:
                _OwnerMark.erase(self._owner.fileno())
            self._failed = True

    def _close_reader(self) -> None:
        """Close the check's reader (`_reader`): only once no SQLite connection to the file is open."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _connect(self) -> sqlite3.Connection:
        """The database file, made 0600 before SQLite opens it: its -wal, -shm and -journal files take the
        database file's mode, so the history is the user's alone whatever the umask."""
        for suffix in ("", "-wal", "-shm", "-journal"):  # an older mstail's files, made with the umask's mode
            with contextlib.suppress(OSError):
                os.chmod(f"{self.path}{suffix}", 0o600)
        try:
            os.close(_private_file(str(self.path), os.O_RDWR))
        except OSError as exc:
            raise StateError(f"cannot open the state file {self.path}: {exc.strerror or exc}") from None
        return sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)

    def _prepare(self, conn: sqlite3.Connection, network: bool) -> sqlite3.Connection:
        new = not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchall()
        if new:  # (only before the first table): pages freed by rewritten pieces go back to the disk at each flush
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        conn.execute("PRAGMA journal_mode=" + ("DELETE" if network or self.path is None else "WAL"))
        conn.execute("PRAGMA synchronous=NORMAL" if not network else "PRAGMA synchronous=FULL")
        conn.executescript(_SCHEMA)
        found = dict(conn.execute("SELECT key, value FROM meta"))
        if not found:
            conn.execute(_CHUNKS_TABLE)
            conn.executemany(
                "INSERT INTO meta VALUES (?, ?)",
                [("schema", str(SCHEMA_VERSION)), ("fingerprint", self.expected), ("created", str(time.time()))],
            )
        # from now on (the opening may wait SQLite's 5 s): a read on the event loop waits for another program's lock
        # no longer than a commit does (in WAL mode reads never wait for one)
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        return conn

    def _unusable(self, conn: sqlite3.Connection) -> Optional[str]:
        """Why this database must not be used, or None; whether its pages hold together is `IntegrityCheck`'s."""
        meta = dict(conn.execute("SELECT key, value FROM meta"))
        if meta.get("schema") not in _SCHEMAS_READ or meta.get("fingerprint") != self.expected:
            return "mismatched (written for other logs, formats or mstail version)"
        self._schema = meta["schema"]
        if self._schema != str(SCHEMA_VERSION):
            log.warning("state %s was written by an earlier mstail (schema %s): migrated in place as it is used (its "
                        "records compressed a part at each commit, its chart columns at their next save)",
                        self.path, self._schema)
        return None

    # -- writing ----------------------------------------------------------------------------------------------
    def insert(self, items: Sequence[Dict[str, Any]]) -> Dict[int, str]:
        """Queue stored items (with their seq) for the next `commit`; readers see them at once. Returns seq -> the
        JSON the stream sends for an item, for those whose stored JSON gave it on the way (`item_text`)."""
        rows = self._unsaved
        streams: Dict[int, str] = {}
        for item in items:
            text, streamed = item_text(item)
            rows.append((item["seq"], item["source"], item.get("kind"), text))
            if streamed is not None:
                streams[item["seq"]] = streamed
        return streams

    def replace(self, item: Dict[str, Any]) -> None:
        """Queue a stored item's new content (an amended record, same seq) for the next `commit`; readers see it
        at once."""
        data = _item_json(item)
        for i in range(len(self._unsaved) - 1, -1, -1):  # an amend is for a recent record: search from the end
            if self._unsaved[i][0] == item["seq"]:
                self._unsaved[i] = self._unsaved[i][:3] + (data,)
                return
            if self._unsaved[i][0] < item["seq"]:
                break
        self._rewrites[item["seq"]] = data

    def queue(self, checkpoints: Dict[str, Tuple[str, SourceCheckpoint]]) -> None:
        """Queue the sources' checkpoints (id -> (path, checkpoint)) for the next `commit` (a newer one of a source
        replaces the one queued before)."""
        for source, (path, checkpoint) in checkpoints.items():
            self._unsaved_checkpoints[source] = (path, checkpoint.dumps())

    def write_behind(self, loop: asyncio.AbstractEventLoop) -> None:
        """From now on `commit` hands what is queued to a writer thread of its own and returns at once; `loop` (the
        event loop that commits, and reads) is told when each batch is written or failed. A later commit meanwhile
        leaves its items queued for the next batch (`ready`). Without it (`mstail parse`, tests) a commit writes
        before it returns."""
        if self._behind is None:
            self._behind = (loop, ThreadPoolExecutor(1, thread_name_prefix="mstail-state-writer"))

    @property
    def ready(self) -> bool:
        """Whether a commit now would write: no batch being written, no integrity check to wait for (nothing is
        written into a file its check may still set aside), no failed write waiting for its retry."""
        return self._writing is None and not self.checking and not (
            self.write_error is not None and time.monotonic() < self._retry_at)

    def commit(self, checkpoints: Dict[str, Tuple[str, SourceCheckpoint]], columns: Optional[Flush] = None,
               alerts: Optional[Dict[str, Any]] = None) -> "Future[bool]":
        """Write the queued items together with these checkpoints (id -> (path, checkpoint)), `columns` (a
        flush of the chart columns) and `alerts` (the alert rules' state after these items, `saved_alerts`), one
        transaction, in the writer thread after `write_behind`, else before returning. Returns their outcome: a
        future of whether they were written, done on the loop once that is known (at once when there was nothing to
        write, or when a batch being written, the check or a retry's wait keeps them queued: False, see `ready`).

        When the disk cannot take them (full, read-only, an I/O error, locked, damaged), nothing is lost: items and
        the newest checkpoints stay queued (readers still see them), `write_error` says why, and later commits try
        again until everything queued is written: after another program's lock every BUSY_RETRY_S, else backing off
        from 1 s to 30 s (with `write_behind` a retry is due then even without a commit)."""
        self.queue(checkpoints)
        if not self._unsaved and not self._unsaved_checkpoints and not self._rewrites and columns is None and alerts is None:
            return _outcome(True)
        if not self.ready:
            return _outcome(False)
        batch = _Batch(self._unsaved, self._rewrites, self._unsaved_checkpoints, columns,
                       None if columns is None else _dumps(columns.manifest),  # (its facts change on the loop)
                       None if alerts is None else _item_json(alerts), Future())
        self._unsaved, self._rewrites, self._unsaved_checkpoints = [], {}, {}
        self._writing = batch  # read from memory until it is written (`_in_memory`)
        if self._behind is None:
            self._write(batch)
            self._settle(batch)
        else:
            self._written = self._behind[1].submit(self._write_and_tell, batch, self._behind[0])
        return batch.outcome

    def _write_and_tell(self, batch: _Batch, loop: asyncio.AbstractEventLoop) -> None:
        """The writer thread's part: write `batch`, then let the loop take its outcome (`_settle`)."""
        self._write(batch)
        with contextlib.suppress(RuntimeError):  # the loop is closed: `close` settles it
            loop.call_soon_threadsafe(self._settle, batch)

    def _write(self, batch: _Batch) -> None:
        """`batch` in one transaction, or its `error`; where it does not wait for another program's lock longer
        than BUSY_TIMEOUT_S. Touches nothing the loop reads but the owner's mark."""
        try:
            conn, lock = self._writer()
        except sqlite3.Error as exc:
            self._fail()
            batch.error = str(exc) or type(exc).__name__
            return
        with lock:
            try:
                conn.execute("BEGIN IMMEDIATE")  # the write lock first: waits (for a while) for it, else fails at once
                if self._schema != str(SCHEMA_VERSION):
                    self._migrate_schema(conn)
                loose = self._save_items(conn, batch.rows)
                for seq, data in batch.rewrites.items():
                    if not conn.execute("UPDATE items SET data = ? WHERE seq = ?", (data, seq)).rowcount:
                        self._rewrite_chunked(conn, seq, data)
                conn.executemany(_SAVE_SOURCE,
                                 [(source, path, data) for source, (path, data) in batch.checkpoints.items()])
                if batch.columns is not None:
                    self._write_columns(conn, batch.columns, batch.manifest)  # type: ignore[arg-type]  # made with the columns
                if batch.alerts is not None:
                    conn.execute("INSERT OR REPLACE INTO meta VALUES ('alerts', ?)", (batch.alerts,))
                compacted = loose >= COMPACT_ROWS
                if compacted:
                    loose = self._compact(conn, loose)
                if compacted or batch.columns is not None:
                    conn.execute("PRAGMA incremental_vacuum")  # (a file made before `auto_vacuum`: nothing done)
                conn.execute("COMMIT")
            except Exception as exc:  # noqa: BLE001 - not only SQLite's: a batch not written must never be lost
                with contextlib.suppress(sqlite3.Error):
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                self._fail()
                batch.error = str(exc) or type(exc).__name__
                return
            self._loose, self._schema = loose, str(SCHEMA_VERSION)
        self._mark_running()  # the files as this commit left them: what a crash from here leaves

    def _migrate_schema(self, conn: sqlite3.Connection) -> None:
        """A schema 1 file made this version's, in the first commit's transaction: the chunks' table. Its records
        stay rows until `_compact` takes them; its columns' raw pieces are read as such and saved again whole
        (`Columns.restore`)."""
        conn.execute(_CHUNKS_TABLE)
        conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))

    def _save_items(self, conn: sqlite3.Connection, rows: List[Row]) -> int:
        """A batch's items, inside the caller's transaction: as chunks where at least CHUNK_MIN of them may be (but
        the newest record of each source: an amend may rewrite it), else as rows. Returns the rows a chunk may take
        in the file now."""
        loose = self._loose
        if loose is None:
            loose = conn.execute(f"SELECT count(*) FROM items WHERE {_CHUNKED}").fetchone()[0]
        newest = {row[1]: row[0] for row in rows if row[2] is None}  # each source's newest record
        keep = set(newest.values())
        chunked = [row for row in rows if (row[2] is None or row[2] == "amend") and row[0] not in keep]
        if len(chunked) < CHUNK_MIN:
            conn.executemany(_SAVE_ITEM, rows)
            return loose + len(chunked) + len(keep)
        self._save_chunks(conn, chunked)
        conn.executemany(_SAVE_ITEM, [row for row in rows if not (row[2] is None or row[2] == "amend")
                                      or row[0] in keep])
        return loose + len(keep)

    @staticmethod
    def _save_chunks(conn: sqlite3.Connection, rows: Sequence[Row]) -> None:
        """Items (in seq order) as chunks of up to CHUNK_ITEMS."""
        conn.executemany("INSERT OR REPLACE INTO chunks VALUES (?, ?, ?)",
                         ((rows[i][0], rows[min(i + CHUNK_ITEMS, len(rows)) - 1][0], _pack_chunk(rows[i:i + CHUNK_ITEMS]))
                          for i in range(0, len(rows), CHUNK_ITEMS)))

    def _compact(self, conn: sqlite3.Connection, loose: int) -> int:
        """Move up to COMPACT_ROWS of the oldest rows a chunk may take into chunks (but each source's newest
        record), inside the caller's transaction; returns how many such rows stay."""
        keep = {seq for (seq,) in conn.execute("SELECT max(seq) FROM items WHERE kind IS NULL GROUP BY source")}
        rows = [row for row in conn.execute(f"SELECT seq, source, kind, data FROM items WHERE {_CHUNKED} "
                                            "ORDER BY seq LIMIT ?", (COMPACT_ROWS + len(keep),))
                if row[0] not in keep]
        self._save_chunks(conn, rows)
        conn.executemany("DELETE FROM items WHERE seq = ?", ((row[0],) for row in rows))
        return loose - len(rows)

    @staticmethod
    def _rewrite_chunked(conn: sqlite3.Connection, seq: int, data: str) -> None:
        """An item kept in a chunk rewritten (an amend of a record compacted since): its chunk made again."""
        spans = conn.execute("SELECT first_seq, data FROM chunks WHERE first_seq <= ? AND last_seq >= ?", (seq, seq))
        for first, packed in spans.fetchall():  # (spans may overlap: a source's newest record is chunked later)
            items = _unpack_chunk(packed)
            if any(item[0] == seq for item in items):
                rows = [(s, source, kind, data if s == seq else _text(text)) for s, source, kind, text in items]
                conn.execute("UPDATE chunks SET data = ? WHERE first_seq = ?", (_pack_chunk(rows), first))
                return
        # not in the file (never expected): as an UPDATE of no row

    def _writer(self) -> Tuple[sqlite3.Connection, threading.Lock]:
        """The commits' connection and its lock: for a file in WAL mode, one of their own (opened at the first
        commit, with the short busy timeout), which readers never wait for; else the readers' (a private temporary
        database is one connection's; in a rollback journal's mode, on a network filesystem, a commit's lock would
        fail the reads of another connection after the busy timeout, where this one's readers wait for the commit)."""
        if self.path is None or self._network:
            return self.conn, self._lock
        if self._wconn is None:
            conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                   check_same_thread=False)
            try:
                conn.execute("PRAGMA synchronous=NORMAL")  # (a connection's own setting)
            except sqlite3.Error:
                conn.close()
                raise
            self._wconn = conn
        return self._wconn, self._write_lock

    def _settle(self, batch: _Batch) -> None:
        """On the loop: take a batch's outcome. Written: the failure said before is over. Not written: its items,
        rewrites and checkpoints go back in front of those queued since (the newer checkpoints and rewrites win),
        and the retry is set."""
        if self._writing is not batch:
            return  # settled already (`close`)
        self._writing = self._written = None
        if batch.error is None:
            self.write_error, self._backoff = None, 0.0
        else:
            self._unsaved[:0] = batch.rows
            self._rewrites = {**batch.rewrites, **self._rewrites}
            self._unsaved_checkpoints = {**batch.checkpoints, **self._unsaved_checkpoints}
            self.write_error = batch.error
            self._backoff = BUSY_RETRY_S if _busy(batch.error) else min(max(self._backoff * 2, 1.0), 30.0)
            self._retry_at = time.monotonic() + self._backoff
            if self._behind is not None:
                with contextlib.suppress(RuntimeError):  # the loop is closed (at `close`): no retry then
                    self._behind[0].call_later(self._backoff, self._retry)
        batch.outcome.set_result(batch.error is None)

    def _retry(self) -> None:
        """A failed batch's retry, due now (with `write_behind`): what is queued, if no commit took it meanwhile."""
        if self._behind is not None and self.write_error is not None and self._writing is None:
            self._retry_at = 0.0
            self.commit({})

    def finish_writes(self) -> None:
        """Wait for the batch being written, if any (blocking: for `close`), and take its outcome; the next commit
        is then tried whatever the backoff (the last one, at close)."""
        batch, written = self._writing, self._written
        if batch is not None and written is not None:
            with contextlib.suppress(Exception):
                written.result()
            self._settle(batch)
        self._retry_at = 0.0

    def _write_columns(self, conn: sqlite3.Connection, flush: Flush, manifest: str) -> None:
        """A flush of the chart columns, inside the caller's transaction."""
        if flush.whole:
            for table in ("frames", "columns", "blocks"):
                conn.execute(f"DELETE FROM {table}")
        frames = [d for d in flush.deletes if d[2] is None]
        conn.executemany("DELETE FROM frames WHERE source = ? AND segment = ? AND start = ?",
                         [(source, segment, start) for source, segment, _, start in frames])
        conn.executemany("DELETE FROM columns WHERE source = ? AND segment = ? AND metric = ? AND start = ?",
                         [d for d in flush.deletes if d[2] is not None])
        conn.executemany("INSERT OR REPLACE INTO frames VALUES (?, ?, ?, ?, ?)",
                         ((p[0], p[1], p[3], p[4], p[5]) for p in flush.pieces(frames=True)))
        conn.executemany("INSERT OR REPLACE INTO columns VALUES (?, ?, ?, ?, ?, ?, ?, ?)", flush.pieces(frames=False))
        conn.executemany("INSERT OR REPLACE INTO blocks VALUES (?, ?, ?, ?, ?)", flush.blocks)
        conn.execute("INSERT OR REPLACE INTO meta VALUES ('columns', ?)", (manifest,))

    @property
    def unsaved(self) -> int:
        """Items stored in memory but not yet written to disk (more than one pass's worth: see `write_error`)."""
        writing = self._writing
        return len(self._unsaved) + (len(writing.rows) if writing is not None else 0)

    def close(self) -> None:
        """Close the file (after the batch being written, if any); a clean close (its pages known sound, everything
        written, nothing failed) is marked so that the next opening needs no integrity check while the file stays
        as this close left it."""
        if self._check is not None:
            self._check.cancel()
        self.finish_writes()
        if self._behind is not None:
            self._behind[1].shutdown()
            self._behind = None
        with self._lock:
            self._close_writer()
            self.conn.close()  # the last connection: SQLite moves the WAL into the file, syncs it and deletes the WAL
            self._close_reader()
            if self._owner is None:
                return
            clean = self._sound and not self._failed and self.write_error is None and not (
                self._unsaved or self._unsaved_checkpoints or self._rewrites)
            if clean:
                _OwnerMark.mark(self._owner.fileno(), self.path, running=False)  # type: ignore[arg-type]  # as above
            else:
                _OwnerMark.erase(self._owner.fileno())  # no open mark left behind either
            self._owner.close()  # releases the lock

    def _close_writer(self) -> None:
        """Close the commits' own connection (nothing is being written)."""
        with self._write_lock:
            if self._wconn is not None:
                self._wconn.close()
                self._wconn = None

    # -- reading ----------------------------------------------------------------------------------------------
    def _rows(self, sql: str, *params: Any) -> List[Tuple[Any, ...]]:
        with self._lock:
            try:
                return self.conn.execute(sql, params).fetchall()
            except sqlite3.DatabaseError:
                self._fail()
                raise

    def sources(self) -> Dict[str, Tuple[str, Optional[SourceCheckpoint]]]:
        """Saved sources: id -> (path, checkpoint or None)."""
        rows = self._rows("SELECT id, path, checkpoint FROM sources")
        return {source: (path, SourceCheckpoint.from_json(json.loads(checkpoint)) if checkpoint else None)
                for source, path, checkpoint in rows}

    def all_items(self, after: int = 0, batch: int = 10_000) -> Iterator[List[Dict[str, Any]]]:
        """Every item with seq > `after` in seq order, in lists of up to `batch` (for the alert engine's replay
        and the records the saved columns do not hold, at start)."""
        while True:
            rows = self._read(after, _SEQ_MAX, batch, "1", (), _any_kind)
            if not rows:
                return
            after = rows[-1][0]
            yield list(self._decoded(rows))

    def last_record(self, source: str) -> Optional[Dict[str, Any]]:
        """The newest record of `source` (what an amend read after a restart is for), or None. Cheap for a recent
        record: the scan runs back from the newest seq."""
        for seq, item_source, kind, data in reversed(self._in_memory()):
            if item_source == source and kind is None:
                return _loads(self._current(seq, data))
        rows = self._rows("SELECT seq, data FROM items WHERE source = ? AND kind IS NULL ORDER BY seq DESC LIMIT 1", source)
        return next(self._decoded(rows), None)

    def last_seq(self) -> int:
        """The highest seq stored (0 for none)."""
        last = self._rows("SELECT COALESCE(MAX(seq), 0) FROM items")[0][0]
        if self._chunks_exist():
            last = max(last, self._rows("SELECT COALESCE(MAX(last_seq), 0) FROM chunks")[0][0])
        return last

    def has_item(self, seq: int) -> bool:
        return bool(self._read(seq - 1, seq + 1, 1, "1", (), _any_kind))

    def columns_manifest(self) -> Optional[Dict[str, Any]]:
        """The saved chart columns' manifest (`mstail.tailer.history.columns`), or None when none were saved."""
        rows = self._rows("SELECT value FROM meta WHERE key = 'columns'")
        return json.loads(rows[0][0]) if rows else None

    def saved_alerts(self) -> Optional[Dict[str, Any]]:
        """The alert rules' state last committed (`AlertEngine.snapshot` with `seq`, the newest item it has seen),
        or None (none saved: a state written before mstail saved it, or by `--no-alerts`); {} when it is no JSON."""
        rows = self._rows("SELECT value FROM meta WHERE key = 'alerts'")
        try:
            return _loads(rows[0][0]) if rows else None
        except ValueError:
            return {}

    def meta_value(self, key: str) -> Optional[str]:
        """A value another part keeps in the state's `meta` table (`remotewrite`'s checkpoint), or None."""
        rows = self._rows("SELECT value FROM meta WHERE key = ?", key)
        return rows[0][0] if rows else None

    def set_meta_value(self, key: str, value: str) -> bool:
        """Write `meta_value(key)` at once, in a transaction of its own (from any thread); False when the disk did
        not take it (the history's own commits say why)."""
        with self._lock:
            try:
                self.conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
            except sqlite3.Error:
                return False
            self._mark_running()  # the file as this write left it (as after a commit)
            return True

    def column_blocks(self) -> List[Tuple[str, int, str, bytes, bytes]]:
        """The saved block summaries: (source, segment, metric, mins, maxs)."""
        return self._rows("SELECT source, segment, metric, mins, maxs FROM blocks")

    def column_pieces(self, batch: int = 16) -> Iterator[Piece]:
        """The saved pieces of every frame, then of every series, each column's in order of their start."""
        queries = ("SELECT source, segment, NULL, start, steps, times, NULL, NULL FROM frames ORDER BY source, segment, start",
                   "SELECT * FROM columns ORDER BY source, segment, metric, start")
        for sql in queries:
            with self._lock:
                cursor = self.conn.execute(sql)
            while True:
                with self._lock:  # a few pieces at a time: never the whole history's bytes at once
                    rows = cursor.fetchmany(batch)
                if not rows:
                    break
                yield from rows

    def items_after(self, seq: int, limit: int) -> List[Dict[str, Any]]:
        """Records, events and amends with seq > `seq` (a stream's replay)."""
        memory = self._in_memory()
        rows = self._read(seq, _first(memory), limit, "1", (), _any_kind)
        return self._with_unsaved(rows, memory, seq, limit, lambda kind: True)

    def records_after(self, seq: int, limit: int) -> List[Dict[str, Any]]:
        memory = self._in_memory()
        rows = self._read(seq, _first(memory), limit, "kind IS NULL", (), _is_record)
        return self._with_unsaved(rows, memory, seq, limit, lambda kind: kind is None)

    def events(self, kind: Optional[str] = None, after: int = 0, limit: int = 1000, newest: bool = False) -> List[Dict[str, Any]]:
        """Events (of one `kind`, or all but amends) in seq order: the first `limit` after seq `after`, or with
        `newest` the last `limit` of them."""
        # Through the kind index, never the seq order: a history of 2 M records and a few events made SQLite walk
        # every row by seq (5 s, on the event loop, at each page load); `!=` as two ranges lets it skip the amends.
        where, params = ("kind = ?", (kind,)) if kind is not None else (
            "kind IS NOT NULL AND (kind < 'amend' OR kind > 'amend')", ())
        wanted: Callable[[Optional[str]], bool] = (
            (lambda k: k == kind) if kind is not None else (lambda k: k is not None and k != "amend"))
        memory = self._in_memory()
        chunked = _is_amend if kind == "amend" else None  # the chunks hold no other event
        if not newest:
            rows = self._read(after, _first(memory), limit, where, params, chunked, indexed="INDEXED BY items_by_kind")
            return self._with_unsaved(rows, memory, after, limit, wanted)
        queued = [(seq, data) for seq, _, k, data in memory if seq > after and wanted(k)][-limit:]
        rows = self._read(after, _first(memory), limit - len(queued), where, params, chunked, newest=True,
                          indexed="INDEXED BY items_by_kind")
        return list(self._decoded(reversed(rows))) + list(self._decoded(queued))

    def _read(self, after: int, bound: int, limit: int, where: str, params: Tuple[Any, ...],
              chunked: Optional[Callable[[Optional[str]], bool]], newest: bool = False,
              indexed: str = "") -> List[Tuple[int, str]]:
        """(seq, JSON) of the file's items with `after` < seq < `bound`: the rows `where` (with `params`) selects and
        the chunks' items whose kind `chunked` takes (None: the chunks hold none of those asked), the first `limit`
        in seq order, or with `newest` the last `limit` from the newest down. One read transaction: a commit that
        moves rows into chunks meanwhile is seen wholly or not at all."""
        if limit <= 0:
            return []
        sql = (f"SELECT seq, data FROM items {indexed} WHERE seq > ? AND seq < ? AND {where} "
               f"ORDER BY seq {'DESC' if newest else 'ASC'} LIMIT ?")
        with self._lock:
            try:
                if chunked is None:
                    return self.conn.execute(sql, (after, bound, *params, limit)).fetchall()
                began = not self.conn.in_transaction  # (in one already: a shared connection's commit failing)
                if began:
                    self.conn.execute("BEGIN")
                try:
                    rows = self.conn.execute(sql, (after, bound, *params, limit)).fetchall()
                    return self._with_chunks(rows, after, bound, limit, chunked, newest)
                finally:
                    if began:
                        self.conn.execute("COMMIT")
            except sqlite3.DatabaseError:
                self._fail()
                raise

    def _with_chunks(self, rows: List[Tuple[int, str]], after: int, bound: int, limit: int,
                     chunked: Callable[[Optional[str]], bool], newest: bool) -> List[Tuple[int, str]]:
        """`_read`'s rows with the chunks' items asked (in its transaction, behind its lock). Chunks are read in the
        order of their first seq (`newest`: of their last seq, down) until the `limit` items found are all before
        the next one (after it); their spans may overlap (a source's newest record is chunked later)."""
        if not self._chunks_exist(self.conn):
            return rows
        spans = self.conn.execute("SELECT first_seq, last_seq FROM chunks WHERE last_seq > ? AND first_seq < ? ORDER BY "
                                  + ("last_seq DESC" if newest else "first_seq"), (after, bound)).fetchall()
        found: Dict[int, Any] = dict(rows)
        for first, last in spans:
            if len(found) >= limit:
                edge = sorted(found, reverse=newest)[limit - 1]
                if (last < edge) if newest else (first > edge):
                    break
            [(packed,)] = self.conn.execute("SELECT data FROM chunks WHERE first_seq = ?", (first,)).fetchall()
            if self._last_chunk is None or self._last_chunk[0] != packed:  # (a replay's next page reads it again)
                self._last_chunk = (packed, _unpack_chunk(packed))
            for seq, _source, kind, text in self._last_chunk[1]:
                if after < seq < bound and chunked(kind):
                    found.setdefault(seq, text)
        return [(seq, text if isinstance(text, str) else _text(text))
                for seq, text in sorted(found.items(), reverse=newest)[:limit]]

    def _chunks_exist(self, conn: Optional[sqlite3.Connection] = None) -> bool:
        """Whether the file has the chunks' table (a schema 1 file gets it with its first commit)."""
        if not self._has_chunks:
            if conn is not None:
                self._has_chunks = bool(conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'chunks'").fetchall())
            else:
                self._has_chunks = bool(self._rows("SELECT 1 FROM sqlite_master WHERE name = 'chunks'"))
        return self._has_chunks

    def _in_memory(self) -> List[Row]:
        """The items not on disk yet, in seq order: the batch being written (`write_behind`), then those queued.
        Every item with a lower seq is in the file; what an answer reads from the file stops below the first of
        these (`_first`), so a batch written meanwhile is read once, from memory."""
        writing = self._writing
        return writing.rows + self._unsaved if writing is not None and writing.rows else self._unsaved

    def _current(self, seq: int, data: str) -> str:
        """An item's JSON as rewritten since (an amended record) where a rewrite is queued or being written."""
        text = self._rewrites.get(seq)
        writing = self._writing
        if text is None and writing is not None:
            text = writing.rewrites.get(seq)
        return data if text is None else text

    def _decoded(self, rows: Iterable[Tuple[int, str]]) -> Iterator[Dict[str, Any]]:
        """Items of (seq, JSON) rows, as rewritten since where a rewrite is still queued or being written."""
        writing = self._writing
        if not self._rewrites and (writing is None or not writing.rewrites):
            return (_loads(data) for _, data in rows)
        return (_loads(self._current(seq, data)) for seq, data in rows)

    def _with_unsaved(self, rows: List[Tuple[Any, ...]], memory: List[Row], after: int, limit: int,
                      wanted: Callable[[Optional[str]], bool]) -> List[Dict[str, Any]]:
        """Rows read from the file, then the items in `memory` after them (their seqs are all higher), up to
        `limit`."""
        out = list(self._decoded(rows))
        if len(out) < limit and memory:
            queued = [(seq, data) for seq, _, kind, data in memory if seq > after and wanted(kind)][:limit - len(out)]
            out += self._decoded(queued)
        return out
