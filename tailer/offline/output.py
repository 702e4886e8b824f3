"""Where `mstail parse` writes: UTF-8 JSONL or CSV on stdout or a file, and a progress bar on a terminal.

A file (`-o OUT`) is never one of the logs being read, and is written whole or not at all: into a temporary file
in its folder, renamed over it at the end, so Ctrl-C, SIGTERM or an error leaves an earlier OUT as it was.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import functools
import io
import math
import os
import re
import stat
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Sequence, TextIO, Tuple

from mstail.parsers.record import NON_FINITE, finite_or_name

from mstail.tailer.offline.reading import READ_CHUNK

if TYPE_CHECKING:
    from tqdm import tqdm

PROGRESS_MIN_BYTES = 8 << 20  # smaller inputs parse too fast for a progress bar to help

#: A spreadsheet reads a cell starting with one of these as a formula (OWASP, CSV injection).
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


#: Control characters (C0, DEL, C1) as JSON writes them (`\n`, `\u001b`; DEL and C1, which JSON leaves, the same
#: way): a terminal showing the CSV runs no escape sequence from a log, and a row stays one line.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f]")
_CONTROL_NAMES = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _escaped(match: "re.Match[str]") -> str:
    char = match.group()
    return _CONTROL_NAMES.get(char) or f"\\u{ord(char):04x}"


def csv_cell(value: Any) -> Any:
    """One CSV cell: "" for no value, a non-finite number by its name, a text's control characters escaped as
    JSON escapes them (`_CONTROLS`), and a text that a spreadsheet would run as a formula (`=HYPERLINK(...)`,
    `-1+cmd|...`) behind a single quote. Numbers are never quoted (-1.5 stays a number), nor "-Infinity" (a
    number's name). The page's export (web/static/util.js `csvCell`) has the same rule."""
    if value is None:
        return ""
    if isinstance(value, str):
        if value.startswith(FORMULA_START) and value not in NON_FINITE:
            value = "'" + value
        return value if value.isprintable() else _CONTROLS.sub(_escaped, value)
    return finite_or_name(value)


def csv_time(seconds: Optional[float]) -> str:
    """A record's time (epoch seconds) as every CSV of mstail writes it: ISO 8601 in this machine's time zone, with
    its offset, to the nearest millisecond (`2026-12-02T14:35:44.367+08:00`); "" for none. The page's export writes
    the same (web/static/util.js `isoTime`); the epoch seconds go in the `time_s` column beside it."""
    if seconds is None:
        return ""
    try:
        minute, ms = divmod(math.floor(seconds * 1000 + 0.5), 60_000)  # JavaScript's Math.round, as the page
        start, zone = _local_minute(minute)
    except (OverflowError, OSError, TypeError, ValueError):  # a time no calendar date has: `time_s` still holds it
        return ""
    return f"{start}{ms // 1000:02d}.{ms % 1000:03d}{zone}"


@functools.lru_cache(maxsize=4096)
def _local_minute(minute: int) -> Tuple[str, str]:
    """A minute since the epoch in the local zone: its date and time to the minute (`2026-12-02T14:35:`), and the
    zone's offset then (`+08:00`). Zones change offset on whole minutes; a row's time costs a lookup, not a
    calendar conversion (about 3 us of a row's 6)."""
    local = datetime.fromtimestamp(minute * 60, timezone.utc).astimezone()
    offset = int(local.utcoffset().total_seconds()) // 60  # type: ignore[union-attr]  # an aware time: it has one
    hours, minutes = divmod(abs(offset), 60)
    return (f"{local.year:04d}-{local.month:02d}-{local.day:02d}T{local.hour:02d}:{local.minute:02d}:",
            f"{'-' if offset < 0 else '+'}{hours:02d}:{minutes:02d}")


def write_csv(rows: List[dict], out: TextIO) -> None:
    """Rows as CSV, a column per key in order of appearance; a `time` column (epoch seconds in records) is written
    as `csv_time`, followed by `time_s` with the seconds (unless a metric has that name)."""
    columns: Dict[str, None] = {}
    for row in rows:
        columns.update((key, None) for key in row)
    names = list(columns)
    at = names.index("time") if "time" in columns and "time_s" not in columns else None
    if at is not None:
        names.insert(at + 1, "time_s")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([csv_cell(name) for name in names])  # metric names come from logs and JSONL files too
    for row in rows:
        cells = [csv_cell(row.get(name)) for name in columns]
        if at is not None:
            cells.insert(at, csv_time(row.get("time")))
        writer.writerow(cells)


def copy_jsonl(path: str, out: TextIO) -> None:
    """A worker's JSONL (UTF-8, "\\n" line ends) onto `out`, as the serial run would have written it (`byte_writer`)."""
    write = byte_writer(out)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(READ_CHUNK) + handle.readline(), b""):  # whole lines: whole characters
            write(chunk)


def byte_writer(out: TextIO) -> Callable[[bytes], object]:
    """Writes UTF-8 bytes onto `out`: as they are onto the buffer of an `output` stream (UTF-8, no newline
    translation), else decoded onto the text stream."""
    if isinstance(out, _Output):
        out.flush()
        return out.buffer.write
    return lambda data: out.write(data.decode("utf-8"))


class _Output(io.TextIOWrapper):
    """The output of `mstail parse`: UTF-8, "\\n" written as it is (so a worker's bytes can be copied onto it)."""


class OutputError(Exception):
    """`-o OUT` cannot be written (a missing or unwritable folder, a folder given, a full disk, one of the logs):
    one line for the user, `cannot write OUT: reason`."""


_REASONS = {
    errno.ENOENT: "its folder does not exist (create it first)",
    errno.ENOTDIR: "a part of its path is a file, not a folder",
    errno.EISDIR: "it is a folder (give a file name, e.g. -o DIR/records.jsonl)",
    errno.EACCES: "permission denied (pick a folder you can write)",
    errno.EPERM: "permission denied (pick a folder you can write)",
    errno.EROFS: "read-only filesystem",
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
}


def _cannot_write(shown: str, exc: OSError) -> OutputError:
    reason = _REASONS.get(exc.errno or 0) or exc.strerror or str(exc)
    return OutputError(f"cannot write {shown}: {reason}")


class _OutputFile(io.FileIO):
    """The file under `-o`: a failed write (a full disk, EIO) is an OutputError, never an OSError a caller could
    take for a log it could not read."""

    shown = ""

    def write(self, data: Any) -> Optional[int]:  # type: ignore[override]  # as FileIO.write, which typing.IO overloads
        try:
            return super().write(data)
        except BrokenPipeError:
            raise  # `mstail parse LOG | head`: the reader left, which is no error (the CLI exits 0)
        except OSError as exc:
            raise _cannot_write(self.shown, exc) from None


def _same_file_as_input(st: os.stat_result, inputs: Sequence[Path]) -> Optional[Path]:
    for path in inputs:
        try:
            if os.path.samestat(st, os.stat(path)):
                return path
        except OSError:
            continue
    return None


def _new_temp(target: str, like: Optional[os.stat_result]) -> Tuple[int, str]:
    """A new file next to `target` (so the final rename stays on one filesystem): the umask's mode for a new
    OUT, an existing OUT's own mode."""
    folder, name = os.path.split(target)
    while True:
        temp = os.path.join(folder, f".{name[:200]}.{os.urandom(4).hex()}.mstail-tmp")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            continue
        if like is not None:
            with contextlib.suppress(OSError):
                os.fchmod(fd, stat.S_IMODE(like.st_mode))
        return fd, temp


@contextlib.contextmanager
def output(path: Optional[str], inputs: Sequence[Path] = ()) -> Iterator[TextIO]:
    """Where `mstail parse` writes: stdout for None or "-"; else the file `path`, refused (OutputError) before
    anything is opened for writing when it is one of `inputs` (the same file: through symlinks, hard links),
    written to a temporary file in its folder and renamed over it only when the block ends without an error.
    A device or FIFO (/dev/null, a process substitution) and a link in /dev or /proc (/dev/stdout) are written
    directly."""
    if path is None or path == "-":
        raw = _stdout()
        if raw is None:  # a stdout without a file descriptor (a caller's redirect_stdout): written as it is
            out = _Output(sys.stdout.buffer, encoding="utf-8", newline="\n", write_through=False)
            try:
                yield out
            finally:
                out.flush()
            return
        yield from _written(raw, "stdout", None, "")
        return
    target = os.path.realpath(path)  # through a symlink: the file it names is replaced, the link stays
    try:
        existing: Optional[os.stat_result] = os.stat(target)
    except (FileNotFoundError, NotADirectoryError):
        existing = None
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    if existing is not None:
        if stat.S_ISDIR(existing.st_mode):
            raise OutputError(f"cannot write {path}: {_REASONS[errno.EISDIR]}")
        same = _same_file_as_input(existing, inputs)
        if same is not None:
            raise OutputError(f"cannot write {path}: it is the input log {same} (writing would destroy it); "
                              "give -o another file")
    shown_path = os.path.abspath(path)
    direct = (existing is not None and not stat.S_ISREG(existing.st_mode)) \
        or (shown_path != target and shown_path.startswith(("/dev/", "/proc/")))  # /dev/stdout, /dev/fd/N
    try:
        if direct:
            temp = None
            raw = _OutputFile(path, "w")
        else:
            fd, temp = _new_temp(target, existing)
            raw = _OutputFile(fd, "w")
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    yield from _written(raw, path, temp, target)


def _stdout() -> Optional[_OutputFile]:
    try:
        sys.stdout.flush()  # what was printed before comes first
        return _OutputFile(os.dup(sys.stdout.fileno()), "w")  # a copy of the descriptor: closing it leaves stdout open
    except (AttributeError, OSError, ValueError):
        return None


def _written(raw: _OutputFile, shown: str, temp: Optional[str], target: str) -> Iterator[TextIO]:
    """`output`'s stream over `raw`, then: flushed and closed, and `temp` renamed to `target` only when the caller's
    block ended well; else `temp` removed. A failed flush, close or rename is an OutputError."""
    raw.shown = shown
    out = _Output(io.BufferedWriter(raw), encoding="utf-8", newline="")
    finishing = False
    try:
        yield out
        finishing = True
        out.close()
        if temp is not None:
            os.replace(temp, target)
    except BaseException as exc:  # an error, Ctrl-C: no partial OUT, an earlier one stays as it was
        with contextlib.suppress(Exception):
            out.close()
        if temp is not None:
            with contextlib.suppress(OSError):
                os.unlink(temp)
        if finishing and isinstance(exc, OSError) and not isinstance(exc, BrokenPipeError):
            raise _cannot_write(shown, exc) from None
        raise


def progress_bar(total: int) -> Optional[tqdm[Any]]:
    if total < PROGRESS_MIN_BYTES:
        return None
    isatty = getattr(sys.stderr, "isatty", None)
    if isatty is not None and not isatty():
        return None  # what tqdm's disable=None does, without importing tqdm (about 70 ms)
    from tqdm import tqdm

    # tqdm turns itself off when stderr is not a terminal (disable=None), so pipes and CI stay clean.
    return tqdm(total=total, unit="B", unit_scale=True, desc="parsing", file=sys.stderr, disable=None)
