"""`mstail state list` / `mstail state prune`: the states kept in the state folder, and removing old ones.

One state is the SQLite file `db.state_file` names (`<label>-<fingerprint>.sqlite`) with its `-wal`, `-shm`,
`-journal` and `.lock` files; a state set aside as corrupt or mismatched (`*.sqlite.corrupt-<time>`) is one too.
A state a running mstail holds (its `.lock` file locked, `StateDB._open`) is never removed: prune takes that lock
itself while it removes a state, so no mstail can start on it meanwhile. The files are read as they are on disk
(SQLite's `immutable`: no lock taken, nothing written), or, for one in use, by a read-only reader beside its mstail.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, List, Optional, Tuple
from urllib.parse import quote

#: the files besides a state's SQLite file (`<name>.sqlite<suffix>`)
COMPANIONS = ("-wal", "-shm", "-journal")
#: a state set aside by `StateDB._set_aside`: `<name>.sqlite.<reason>-<unix time>`
_ASIDE = re.compile(r"^(?P<base>.+\.sqlite)\.(?P<reason>[a-z]+)-(?P<when>\d+)$")
#: log paths read from one state at most (a folder of runs may have thousands of sources)
MAX_LOGS = 10_000
_AGE = re.compile(r"^(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[smhdw]?)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "": 86400}


class StateDirError(Exception):
    """The state folder cannot be read, or an age given is no age: one line for the user."""


@dataclass
class State:
    """One state in the state folder."""

    path: Path  #: its SQLite file (or set-aside copy)
    files: List[Path]  #: every file of it that exists, the lock file last
    size: int  #: bytes in all its files
    last_use: float  #: the newest modification time among its files (a commit writes the lock file's mark)
    in_use: bool  #: a running mstail holds it
    aside: str = ""  #: "corrupt", "mismatched" ...: set aside by mstail; "" for a state in use or to be resumed
    logs: Optional[List[str]] = field(default=None)  #: the files it holds the history of; None: unreadable

    @property
    def logs_gone(self) -> bool:
        """Every log it is of no longer exists. A log followed by a relative path (as given to that mstail) says
        nothing from here, nor does a state with no log read from it: such a state is not gone."""
        return bool(self.logs) and all(log_gone(log) for log in self.logs)  # type: ignore[union-attr]  # logs: not None


def log_gone(log: str) -> bool:
    """A log path from a state that names no file now; False for a relative one (relative to where mstail ran)."""
    return os.path.isabs(log) and not os.path.exists(log)


def parse_age(text: str) -> float:
    """`30d`, `12h`, `90m`, `2w`, `45s`, or a number of days -> seconds; StateDirError for anything else."""
    match = _AGE.match(text.strip().lower())
    if not match:
        raise StateDirError(f"--older-than {text!r} is no age: give a number and a unit, e.g. 30d, 12h, 90m or 2w")
    return float(match.group("number")) * _UNIT_S[match.group("unit")]


def find_states(folder: Path) -> List[State]:
    """The states in `folder`, least recently used first; [] when it does not exist."""
    try:
        names = sorted(entry.name for entry in os.scandir(folder) if entry.is_file(follow_symlinks=False))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StateDirError(f"cannot read the state folder {folder}: {exc.strerror or exc}") from None
    present = set(names)
    states = []
    for name in names:
        aside = _ASIDE.match(name)
        if not name.endswith(".sqlite") and not aside:
            continue
        members = [name + suffix for suffix in COMPANIONS] + ([] if aside else [name + ".lock"])
        files = [folder / name] + [folder / member for member in members if member in present]
        states.append(_state(folder / name, files, aside.group("reason") if aside else ""))
    return sorted(states, key=lambda state: state.last_use)


def _state(path: Path, files: List[Path], aside: str) -> State:
    size, last_use = 0, 0.0
    for file in files:
        with contextlib.suppress(OSError):
            st = file.stat()
            size, last_use = size + st.st_size, max(last_use, st.st_mtime)
    with _held(path, aside) as free:
        in_use = not free
    return State(path=path, files=files, size=size, last_use=last_use, in_use=in_use, aside=aside,
                 logs=_logs(path, in_use))


@contextlib.contextmanager
def _held(path: Path, aside: str = "") -> Iterator[bool]:
    """Holds the lock a running mstail takes on the state (`StateDB._open`) while the block runs; yields False
    (holding nothing) when a running mstail has it. A set-aside copy, or a state without a lock file, has no owner."""
    if aside:
        yield True
        return
    try:
        fd = os.open(f"{path}.lock", os.O_RDONLY | os.O_CLOEXEC)  # never created here
    except OSError:
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        except OSError:
            pass  # a filesystem without locks: as mstail itself goes on unguarded there
        yield True
    finally:
        os.close(fd)  # releases the lock


def _logs(path: Path, in_use: bool) -> Optional[List[str]]:
    """The log files a state holds the history of (None: unreadable). One in use is read as a reader beside its
    mstail (read-only: it never checkpoints nor removes the WAL mstail writes); another is read as the file is,
    taking no lock and making no -wal or -shm file."""
    mode = "mode=ro" if in_use else "immutable=1"
    try:
        conn = sqlite3.connect(f"file:{quote(str(path))}?{mode}", uri=True)
    except sqlite3.Error:
        return None
    try:
        rows = conn.execute("SELECT DISTINCT path FROM sources ORDER BY path LIMIT ?", (MAX_LOGS,)).fetchall()
        return [str(row[0]) for row in rows]
    except sqlite3.Error:
        return None
    finally:
        conn.close()


def to_prune(states: List[State], older_than: Optional[float], gone: bool, now: Optional[float] = None) -> List[State]:
    """The states `prune` removes: unused for longer than `older_than` seconds, or (`gone`) whose logs all no
    longer exist; never one a running mstail holds."""
    now = time.time() if now is None else now
    return [state for state in states if not state.in_use and (
        (older_than is not None and now - state.last_use > older_than) or (gone and state.logs_gone))]


def remove(state: State) -> Tuple[bool, str]:
    """Remove a state's files, holding its lock meanwhile: (True, "") once removed; (False, why) when a mstail took
    it since it was listed, or a file could not be removed (what was removed stays removed)."""
    with _held(state.path, state.aside) as free:
        if not free:
            return False, "a running mstail holds it now"
        for file in state.files:
            try:
                os.unlink(file)
            except FileNotFoundError:
                continue
            except OSError as exc:
                return False, f"cannot remove {file.name}: {exc.strerror or exc}"
    return True, ""


def human_size(size: float) -> str:
    """1536 -> "1.5 KB" (powers of 1024)."""
    unit = "B"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            break
        size /= 1024
    return f"{size:.0f} B" if unit == "B" else f"{size:.1f} {unit}"
