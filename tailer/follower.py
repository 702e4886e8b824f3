"""Follow one log path: read complete lines from the start, then live, through rotation and truncation.

A `FileFollower` owns the open files behind one path. The file the path names is read with `pread` from
its own offset; when the path starts naming another file (RotatingFileHandler renamed `info.log` to
`info.log.1` and created a new one, or the file was deleted and recreated) the old file is kept open and
read to its end before the new one is read from offset 0 — lines written late to the renamed file are not
lost (GNU `tail -F` loses them). Truncation is detected by size < offset *or* a changed head signature,
which also catches "truncated then regrown past the old offset" that a size check misses.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .discovery import rotated_backups
from .lines import Line, LineSplitter

HEAD_BYTES = 1024  # identity signature: the first KiB, re-taken as the file grows (small files count too)


class _OpenFile:
    """One open file (inode) and how far it has been read."""

    def __init__(self, path: Path, max_line_bytes: int) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        st = os.fstat(self.fd)
        self.identity = (st.st_dev, st.st_ino)
        self.splitter = LineSplitter(0, max_line_bytes)
        self.pos = 0  # bytes handed to the splitter
        self.head = b""
        self.idle_since: Optional[float] = None

    def read(self, budget: int) -> List[Line]:
        lines: List[Line] = []
        remaining = budget
        while remaining > 0:
            data = os.pread(self.fd, min(remaining, 256 * 1024), self.pos)
            if not data:
                break
            self.pos += len(data)
            remaining -= len(data)
            lines += self.splitter.feed(data)
        if len(self.head) < HEAD_BYTES and self.pos > len(self.head):
            self.head = os.pread(self.fd, HEAD_BYTES, 0)
        return lines

    def replaced_in_place(self) -> bool:
        """True when the file is shorter than what was read, or its first bytes changed (copytruncate)."""
        if os.fstat(self.fd).st_size < self.pos:
            return True
        return bool(self.head) and os.pread(self.fd, len(self.head), 0) != self.head

    def restart(self) -> None:
        self.splitter = LineSplitter(0, self.splitter.max_line_bytes)
        self.pos = 0
        self.head = b""

    def close(self) -> None:
        os.close(self.fd)


class FileFollower:
    """Everything behind one followed path.

    Args:
        path: the log file; it may not exist yet (state "waiting").
        max_line_bytes: longer lines are cut (counted in `counters["cut_lines"]`); default 1 MiB.
        with_backups: on first open also read rotated backups `PATH.N ... PATH.1` (oldest first) so the history
            from before mstail started is complete; default True.
        rotate_wait_s: how long a renamed-away file is still read after it stopped growing; default 5 s.
    """

    def __init__(self, path: Path, max_line_bytes: int = 1 << 20, with_backups: bool = True, rotate_wait_s: float = 5.0) -> None:
        self.path = path
        self.max_line_bytes = max_line_bytes
        self.with_backups = with_backups
        self.rotate_wait_s = rotate_wait_s
        self.state = "waiting"
        self.current: Optional[_OpenFile] = None
        self.draining: List[_OpenFile] = []  # older files still being read to their end, oldest first
        self.counters = {"lines": 0, "bytes": 0, "rotations": 0, "truncations": 0, "cut_lines": 0, "bad_utf8_lines": 0}
        self.last_data_time: Optional[float] = None
        # Files already opened, by (dev, inode) -> their first bytes, so a backup is never read twice but a
        # reused inode with other content is still new.
        self._seen: Dict[Tuple[int, int], bytes] = {}

    def read(self, budget: int, now: float) -> List[Line]:
        """Read up to about `budget` bytes of complete lines, oldest first; never raises for IO trouble."""
        lines: List[Line] = []
        if self.current is None and not self._open(now) and not self.draining:
            return lines
        for old in list(self.draining):
            got = self._read_from(old, budget)
            lines += got
            if not got and old.idle_since is not None and now - old.idle_since >= self.rotate_wait_s:
                self._drop(old)
            elif got:
                old.idle_since = None
            elif old.idle_since is None:
                old.idle_since = now
        if self.current is None and not self._open(now):
            return lines
        if self._safe(self.current.replaced_in_place, False):
            self.counters["truncations"] += 1
            self.current.restart()
        got = self._read_from(self.current, budget)
        lines += got
        if got:
            self.last_data_time = now
            self.state = "following"
        else:
            drained = len(self.draining) + 1  # the old file (read to its end above) goes there on rotation
            if self._check_rotation(now):
                # Read the newer files in this same pass: a step line at the end of the old file must meet its
                # progress line at the top of the new one before the parser's grace period runs out.
                newer = self.draining[drained:] + ([self.current] if self.current else [])
                for handle in newer:
                    lines += self._read_from(handle, budget)
        return lines

    def close(self) -> None:
        for handle in self.draining + ([self.current] if self.current else []):
            handle.close()
        self.draining, self.current = [], None

    def _open(self, now: float) -> bool:
        try:
            current = _OpenFile(self.path, self.max_line_bytes)
        except OSError:
            return False
        if self.with_backups or self.state != "waiting":
            # First open: the rotated history. After a rotation: the backups that were created and rotated
            # away between two of our passes (rotation faster than the poll interval).
            self.draining += self._unseen_backups(exclude=current.identity)
        self._remember(current)
        self.current = current
        self.state = "following"
        return True

    def _unseen_backups(self, exclude: Tuple[int, int]) -> List[_OpenFile]:
        opened = []
        for backup in rotated_backups(self.path):
            try:
                handle = _OpenFile(backup, self.max_line_bytes)
            except OSError:
                continue
            if handle.identity == exclude or self._already_read(handle):
                handle.close()
                continue
            self._remember(handle)
            opened.append(handle)
        return opened

    def _already_read(self, handle: _OpenFile) -> bool:
        head = self._seen.get(handle.identity)
        return head is not None and os.pread(handle.fd, len(head), 0) == head

    def _remember(self, handle: _OpenFile) -> None:
        self._seen[handle.identity] = handle.head
        if len(self._seen) > 4096:  # bounded: only recent files can still show up as backups
            self._seen.pop(next(iter(self._seen)))

    def _check_rotation(self, now: float) -> bool:
        """True when the path names a new file (now `current`; the old one is drained first)."""
        assert self.current is not None
        try:
            st = os.stat(self.path)
        except OSError:
            self.state = "gone"  # deleted or renamed away, nothing new yet; the open file is still read
            return False
        if (st.st_dev, st.st_ino) == self.current.identity:
            if self.state == "gone":
                self.state = "following"  # renamed back, or a flaky stat
            return False
        # The path names a new file: read the old one to its end (it may still be written through an old fd).
        self.counters["rotations"] += 1
        self.current.idle_since = now
        self._remember(self.current)
        self.draining.append(self.current)
        self.current = None
        return self._open(now)

    def _read_from(self, handle: _OpenFile, budget: int) -> List[Line]:
        splitter = handle.splitter
        cut, bad, before = splitter.cut_lines, splitter.replaced_lines, handle.pos
        lines = self._safe(lambda: handle.read(budget), [])
        self.counters["lines"] += len(lines)
        self.counters["bytes"] += handle.pos - before
        self.counters["cut_lines"] += splitter.cut_lines - cut
        self.counters["bad_utf8_lines"] += splitter.replaced_lines - bad
        return lines

    def _drop(self, handle: _OpenFile) -> None:
        self.draining.remove(handle)
        handle.close()

    @staticmethod
    def _safe(call, default):  # type: ignore[no-untyped-def]
        # A read error (EIO on a flaky mount, ESTALE) must not kill the sidecar; the next pass retries.
        try:
            return call()
        except OSError:
            return default
