"""Follow one log path: read complete lines from the start, then live, through rotation and truncation.

A `FileFollower` owns the open files behind one path. The file the path names is read with `pread` from
its own offset; when the path starts naming another file (RotatingFileHandler renamed `info.log` to
`info.log.1` and created a new one, or the file was deleted and recreated) the old file is kept open and
read to its end before the new one is read from offset 0 — lines written late to the renamed file are not
lost (GNU `tail -F` loses them). Truncation is detected by size < offset *or* a changed head signature,
which also catches "truncated then regrown past the old offset" that a size check misses.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

from mstail.tailer.inputs.checkpoint import FilePosition, FollowerCheckpoint, Signature
from mstail.tailer.inputs.discovery import rotated_backups, within
from mstail.tailer.inputs.lines import Block, Line, LineSplitter

log = logging.getLogger("mstail.follower")

HEAD_BYTES = 1024  # identity signature: the first KiB, re-taken as the file grows (small files count too)
SAVED_SEEN = 256  # files remembered in a checkpoint: more than any handler keeps as backups
LISTINGS = 4  # tries at listing the backups with no rollover while their files are opened
_READ = os.O_RDONLY | os.O_NONBLOCK

def _signature(head: bytes) -> Signature:
    return len(head), hashlib.blake2b(head, digest_size=12).hexdigest()


def _identity(path: Path) -> Optional[Tuple[int, int]]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class NotARegularFile(OSError):
    """A FIFO, a device, a folder or a socket where a log file was expected: never read (a FIFO would block,
    /dev/urandom never ends)."""


class OutsideFolder(NotARegularFile):
    """A file found below a folder of runs whose real path, once opened, leaves that folder (a link put there, or
    swapped in after the file was found): never read without --follow-symlinks."""


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket"))


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


class _OpenFile:
    """One open file (inode) and how far it has been read."""

    def __init__(self, path: Path, max_line_bytes: int, splitter: type = LineSplitter,
                 confine: Optional[str] = None) -> None:
        self.path = path
        # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused just below, as is any other
        # non-regular file. On a regular file the flag changes nothing.
        self.fd = open_confined(path, confine)
        st = os.fstat(self.fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(self.fd)
            raise NotARegularFile(errno.EINVAL, f"{kind_of(st.st_mode)}, not a regular file", str(path))
        self.identity = (st.st_dev, st.st_ino)
        self.splitter = splitter(0, max_line_bytes)  # a LineSplitter, or an event file's FrameSplitter (same shape)
        self.pos = 0  # bytes handed to the splitter
        self.head = b""
        self._signed: Tuple[bytes, Signature] = (b"", _signature(b""))  # (head, its signature): one hash per head
        self.idle_since: Optional[float] = None
        self.size_seen = 0  # the largest size fstat showed (bytes beyond `pos` are known to exist)
        self.retry_at = 0.0  # after an IO error (EIO): no read before this time
        self.backoff = 0.0
        self.soft_errors = 0  # IO errors met after some data was read (the data is handed out, the error counted)

    def read(self, budget: int, blocks: bool = False) -> List[Union[Line, Block]]:
        """Up to about `budget` bytes of complete lines (`blocks`: runs of whole lines as `Block`s, see
        `LineSplitter.feed`)."""
        lines: List[Union[Line, Block]] = []
        remaining = budget
        while remaining > 0:
            try:
                data = os.pread(self.fd, min(remaining, 256 * 1024), self.pos)
            except OSError:
                if lines:
                    self.soft_errors += 1
                    break  # hand out what was read; a lasting error comes back on the next read
                raise
            if not data:
                break
            self.pos += len(data)
            remaining -= len(data)
            lines += self.splitter.feed(data, blocks)
        if len(self.head) < HEAD_BYTES and self.pos > len(self.head):
            try:
                self.head = os.pread(self.fd, HEAD_BYTES, 0)
            except OSError:
                self.soft_errors += 1  # taken on a later read
        return lines

    def replaced_in_place(self) -> bool:
        """True when the file is shorter than what was read, or its first bytes changed (copytruncate).
        read() is trusted over stat: a lagging attribute cache (NFS) may show an old, smaller size."""
        size = os.fstat(self.fd).st_size
        if size < self.pos and not os.pread(self.fd, 1, self.pos - 1):
            return True
        if self.head and os.pread(self.fd, len(self.head), 0) != self.head:
            return True
        self.size_seen = max(self.size_seen, size)  # still this file's size: bytes known to exist
        return False

    def restart(self) -> None:
        self.splitter = type(self.splitter)(0, self.splitter.max_line_bytes)
        self.pos = 0
        self.head = b""

    def matches(self, signature: Signature) -> bool:
        """Whether this file starts with the bytes a signature was taken of."""
        length, _ = signature
        return _signature(os.pread(self.fd, length, 0)) == tuple(signature)

    def resume(self, offset: int, number: int) -> None:
        """Continue after a checkpoint: the next line starts at `offset` and is line `number`."""
        self.splitter = type(self.splitter)(offset, self.splitter.max_line_bytes, first_number=number)
        self.pos = offset
        self.head = os.pread(self.fd, HEAD_BYTES, 0)

    def checkpoint(self) -> FilePosition:
        """Where reading resumes: identity, head signature, offset and number of the next complete line."""
        if self._signed[0] is not self.head:  # a checkpoint is taken for every file a pass read: hash a head once
            self._signed = (self.head, _signature(self.head))
        return FilePosition(self.identity, self._signed[1], self.splitter.offset, self.splitter.next_number)

    def close(self) -> None:
        os.close(self.fd)


def open_confined(path: Union[str, Path], confine: Optional[str]) -> int:
    """`path` opened for reading with no wait (opening a FIFO waits for no writer), and, with `confine`, only if
    its real path stays below that folder (`_open_within`; else OutsideFolder, unopened)."""
    return os.open(path, _READ) if confine is None else _open_within(path, confine)


def _open_within(path: Union[str, Path], confine: str) -> int:
    """`path` opened for reading, never opening anything whose real path leaves the folder `confine` (a real path):
    the path's real path is checked first, then opened one part at a time from `confine` without following any link
    (one swapped in after the check is refused, not opened), and the file opened must be the one checked. A
    non-regular file is refused unopened (opening a FIFO for reading releases its writer)."""
    real = os.path.realpath(path)
    if not within(real, confine):
        raise _outside(path, confine)
    checked = os.stat(real)
    if not stat.S_ISREG(checked.st_mode):
        raise NotARegularFile(errno.EINVAL, f"{kind_of(checked.st_mode)}, not a regular file", str(path))
    parts = Path(os.path.relpath(real, confine)).parts
    folder = os.open(confine, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            below = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=folder)
            os.close(folder)
            folder = below
        fd = os.open(parts[-1], _READ | os.O_NOFOLLOW, dir_fd=folder)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a part became a link since the check
            raise _outside(path, confine) from None
        raise
    finally:
        os.close(folder)
    opened = os.fstat(fd)
    if (opened.st_dev, opened.st_ino) != (checked.st_dev, checked.st_ino):
        os.close(fd)
        raise _outside(path, confine)  # another file was put there since the check
    return fd


def _outside(path: Union[str, Path], confine: str) -> OutsideFolder:
    return OutsideFolder(errno.EACCES, f"a link out of {confine}, not opened (--follow-symlinks opens it)", str(path))


class FileFollower:
    """Everything behind one followed path.

    Args:
        path: the log file; it may not exist yet (state "waiting").
        max_line_bytes: longer lines are cut (counted in `counters["cut_lines"]`); default 1 MiB.
        with_backups: on first open also read rotated backups `PATH.N ... PATH.1` (oldest first) so the history
            from before mstail started is complete; default True.
        rotate_wait_s: how long a renamed-away file is still read after it stopped growing; default 5 s.
        splitter: what splits a file's bytes: `LineSplitter` (default), or an event file's `FrameSplitter`.
    """

    def __init__(self, path: Path, max_line_bytes: int = 1 << 20, with_backups: bool = True, rotate_wait_s: float = 5.0,
                 splitter: type = LineSplitter) -> None:
        self.path = path
        self.splitter_class = splitter
        self.max_line_bytes = max_line_bytes
        self.with_backups = with_backups
        self.rotate_wait_s = rotate_wait_s
        #: a real folder path the files read must stay in (a file found below a folder of runs; `OutsideFolder`),
        #: or None: any (a `--log` file, `--follow-symlinks`)
        self.confine: Optional[str] = None
        self.state = "waiting"
        #: why the path cannot be read ("permission denied", "a FIFO, not a regular file"), or None; the state
        #: is then "unreadable" until it can be opened
        self.problem: Optional[str] = None
        self.current: Optional[_OpenFile] = None
        self.draining: List[_OpenFile] = []  # older files still being read to their end, oldest first
        self.counters = {"lines": 0, "bytes": 0, "rotations": 0, "truncations": 0, "cut_lines": 0, "bad_utf8_lines": 0,
                         "nul_bytes": 0, "lost_bytes": 0, "io_errors": 0}
        self.last_data_time: Optional[float] = None
        # Files already opened, by (dev, inode) -> signature of their first bytes, so a backup is never read
        # twice but a reused inode with other content is still new.
        self._seen: Dict[Tuple[int, int], Signature] = {}

    def read(self, budget: int, now: float, blocks: bool = False) -> List[Union[Line, Block]]:
        """Read up to about `budget` bytes of complete lines, oldest first; never raises for IO trouble. With
        `blocks` (default False), runs of whole lines come as `Block`s (`LineSplitter.feed`)."""
        lines: List[Union[Line, Block]] = []
        if self.current is None and not self._open(now) and not self.draining:
            return lines
        if self.current is not None and self._replaced(self.current, now):
            self._truncated(self.current, now)  # first: a copy it leaves is read below, before the new content
        for old in list(self.draining):
            before = old.pos
            got = self._read_from(old, budget, now, blocks)
            lines += got
            if not got and old.idle_since is not None and now - old.idle_since >= self.rotate_wait_s:
                self._drop(old)
            elif got:
                old.idle_since = None
            elif old.idle_since is None:
                old.idle_since = now
            if old.pos - before >= budget:
                return lines  # this older file has more: newer files wait, so every line comes out in order
        if self.current is None and not self._open(now):
            return lines
        got = self._read_from(self.current, budget, now, blocks)  # type: ignore[arg-type]  # opened above
        lines += got
        if got:
            self.last_data_time = now
            self.state = "following"
        else:
            drained = len(self.draining) + 1  # the old file (read to its end above) goes there on rotation
            if self._check_rotation(now):
                # Read the newer files in this same pass: a step line at the end of the old file meets its progress
                # line at the top of the new one, and the two go out as one record (no amend message).
                newer = self.draining[drained:] + ([self.current] if self.current else [])
                for handle in newer:
                    before = handle.pos
                    lines += self._read_from(handle, budget, now, blocks)
                    if handle.pos - before >= budget:
                        break  # it has more: the newer ones wait, so every line comes out in order
        return lines

    @property
    def source_path(self) -> Path:
        """The path the source stands for (its history's, its checkpoint's): the followed path."""
        return self.path

    def may_have_news(self, rotation: bool = True, quiet: bool = False) -> bool:
        """False only when one `stat` shows nothing a read would find: the open file's size is what has been read,
        no older file is being drained, and (`rotation`, default) the path still names the open file. Without
        `rotation` the open file's own `fstat` is taken (no path lookup: about half the cost), blind to a new file
        at the path, and none at all when `quiet` (default False: the caller's word that the file got no data for a
        while, `planner.QUIET_S`). Only where attributes are current (a local filesystem; NFS may show an old size)
        and as a check behind file events: a rewrite in place to the very same size passes it (the event of that
        write does not)."""
        current = self.current
        if current is None or self.draining or self.state != "following":
            return True
        if quiet and not rotation:
            return False
        try:
            st = os.stat(self.path) if rotation else os.fstat(current.fd)
        except OSError:
            return True
        return (rotation and (st.st_dev, st.st_ino) != current.identity) or st.st_size != current.pos

    def close(self) -> None:
        for handle in self.draining + ([self.current] if self.current else []):
            handle.close()
        self.draining, self.current = [], None

    # -- persistence ------------------------------------------------------------------------------------------
    def checkpoint(self) -> FollowerCheckpoint:
        """The open files (oldest first) with their resume offsets, recently seen files, counters. Taken between
        passes, so every offset is the start of a line not yet handed out."""
        opened = self.draining + ([self.current] if self.current else [])
        seen = list(self._seen.items())[-SAVED_SEEN:]
        return FollowerCheckpoint(
            files=[handle.checkpoint() for handle in opened],
            seen=[(dev, ino, length, digest) for (dev, ino), (length, digest) in seen],
            counters=dict(self.counters),
        )

    def restore(self, checkpoint: FollowerCheckpoint) -> bool:
        """Resume from `checkpoint` (before the first read). Files it names are found again by identity and
        head signature wherever rotation moved them (the path or a backup) and resume at their offsets; files
        it saw are not read again; a copy copytruncate left of a file it names that is truncated or gone (`PATH.1`,
        starting with the bytes read) resumes at that file's offset; anything else under the path is new and read from its start.
        Returns False when a file the checkpoint was still reading is gone or no longer matches (rotated away
        and deleted, truncated, replaced while mstail was down): its unread rest cannot be recovered."""
        self.counters.update(checkpoint.counters)
        self._seen = {(dev, ino): (length, digest) for dev, ino, length, digest in checkpoint.seen}
        pending = {entry.id: entry for entry in checkpoint.files}
        candidates = ([*self._backups()] if self.with_backups or pending else []) + [self.path]
        opened: List[Tuple[Path, _OpenFile, bool]] = []  # (path, handle, resumed where the checkpoint says)
        for path in candidates:
            try:
                handle = _OpenFile(path, self.max_line_bytes, self.splitter_class, self.confine)
            except OSError:
                continue
            entry = pending.pop(handle.identity, None)
            resumed = entry is not None and handle.matches(entry.head) and os.fstat(handle.fd).st_size >= entry.offset
            if resumed:
                handle.resume(entry.offset, entry.line)  # type: ignore[union-attr]  # resumed: an entry
            elif entry is not None:
                # Same inode, other content (a reused inode: a copy copytruncate made may get the number of a
                # file deleted meanwhile) or shorter than what was read (truncated): not the file the checkpoint
                # names, so it goes through the checks below like any other.
                self.counters["truncations"] += 1
                pending[handle.identity] = entry  # still unaccounted for
            opened.append((path, handle, resumed))
        for path, handle, resumed in opened:
            if not resumed and self._already_read(handle):
                handle.close()
                continue
            if not resumed and path != self.path:
                # copytruncate while mstail was down: the copy (another inode starting with the bytes that were
                # read) holds the unread rest of a file now truncated or gone: read it from the checkpoint's offset.
                # Of several candidates the longest matching head is the strongest evidence.
                size = os.fstat(handle.fd).st_size
                matching = [(entry.head[0], entry.offset, key) for key, entry in pending.items()
                            if 0 < entry.offset <= size and handle.matches(entry.head)]
                if matching:
                    key = max(matching)[2]
                    handle.resume(pending[key].offset, pending[key].line)
                    del pending[key]
            self._remember(handle)
            if path == self.path:
                self.current = handle
            else:
                self.draining.append(handle)
        if self.current is not None or self.draining:
            self.state = "following"
        return not pending

    def _backups(self) -> List[Path]:
        """The files read before the path's own, oldest first: its rotated backups (`info.log.5` ... `info.log.1`)."""
        return rotated_backups(self.path)

    def _open(self, now: float) -> bool:
        try:
            current = _OpenFile(self.path, self.max_line_bytes, self.splitter_class, self.confine)
        except OSError as exc:
            if isinstance(exc, NotARegularFile) or exc.errno in (errno.EACCES, errno.EPERM):
                self.problem = exc.strerror if isinstance(exc, NotARegularFile) else "permission denied"
                if self.state in ("waiting", "unreadable"):
                    self.state = "unreadable"
                return False
            self.problem = None
            if self.state == "unreadable":
                self.state = "waiting"
            if self.with_backups and self.state == "waiting":
                # No file at the path but rotated backups (it was deleted after a rollover): read the history.
                self.draining += self._unseen_backups(exclude=(-1, -1))
            return False
        if self.with_backups or self.state != "waiting":
            # First open: the rotated history. After a rotation: the backups that were created and rotated
            # away between two of our passes (rotation faster than the poll interval).
            unseen = self._unseen_backups(exclude=current.identity, newer=False)
            if self.state != "waiting":
                self.counters["rotations"] += len(unseen)
            self.draining += unseen
        self._remember(current)
        self.current = current
        self.state = "following"
        self.problem = None
        return True

    def _unseen_backups(self, exclude: Tuple[int, int], newer: bool = True) -> List[_OpenFile]:
        """The backups not read yet but `exclude` (the open file), oldest first. Without `newer`, only the ones
        rotated away before it: one listed after it is newer, read after it when the path's next file is found."""
        handles = self._backup_files()
        identities = [handle.identity for handle in handles]
        if not newer and exclude in identities:
            for handle in handles[identities.index(exclude):]:
                handle.close()
            handles = handles[:identities.index(exclude)]
        opened = []
        for handle in handles:
            if handle.identity == exclude or self._already_read(handle):
                handle.close()
                continue
            self._remember(handle)
            opened.append(handle)
        return opened

    def _backup_files(self) -> List[_OpenFile]:
        """The backups opened, oldest first. The handler may roll over while we list and open (`.1` becomes `.2`):
        a file not opened yet moves to a number already passed (read later, out of order) and one newer than the
        path's may be listed. So the order is taken from a listing whose names named the same files before and
        after the files were opened, and after another listing of the folder: one moment's chain. A rollover
        meanwhile means another try, which opens only the files not open yet; after LISTINGS tries (rollovers
        faster than a listing) the last one is taken, and a file it missed comes with the next."""
        held: Dict[Tuple[int, int], _OpenFile] = {}
        for attempt in range(1, LISTINGS + 1):
            names = self._backups()
            identities = [_identity(name) for name in names]
            for name, identity in zip(names, identities):
                if identity is not None and identity not in held:
                    try:
                        handle = _OpenFile(name, self.max_line_bytes, self.splitter_class, self.confine)
                    except OSError:
                        continue  # gone meanwhile (the check below sees it), or not readable
                    held[handle.identity] = handle
            if attempt == LISTINGS or (self._backups() == names and [_identity(name) for name in names] == identities):
                break
        chain = [held.pop(identity) for identity in identities if identity in held]
        for handle in held.values():
            handle.close()  # deleted (the handler keeps only so many), or renamed to where nothing is listed
        return chain

    def _already_read(self, handle: _OpenFile) -> bool:
        if any(open_.identity == handle.identity for open_ in self.draining):
            return True  # still open here, so its inode cannot have been reused
        signature = self._seen.get(handle.identity)
        if signature is None:
            return False
        if signature[0] == 0:  # it was empty when last seen: a reused inode with content is another file
            return os.fstat(handle.fd).st_size == 0
        return handle.matches(signature)

    def _remember(self, handle: _OpenFile) -> None:
        self._seen[handle.identity] = _signature(handle.head)
        if len(self._seen) > 4096:  # bounded: only recent files can still show up as backups
            self._seen.pop(next(iter(self._seen)))

    def _check_rotation(self, now: float) -> bool:
        """True when the path names a new file (now `current`; the old one is drained first)."""
        assert self.current is not None
        try:
            st = os.stat(self.path)
        except OSError:
            # Files rotated away after the open one (it is at EOF now) are read before the path comes back.
            unseen = self._unseen_backups(exclude=self.current.identity)
            self.counters["rotations"] += len(unseen)
            self.draining += unseen
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

    def _read_from(
        self, handle: _OpenFile, budget: int, now: Optional[float] = None, blocks: bool = False
    ) -> List[Union[Line, Block]]:
        now = time.time() if now is None else now
        if now < handle.retry_at:
            return []
        splitter = handle.splitter
        cut, bad, nul, before = splitter.cut_lines, splitter.replaced_lines, splitter.nul_bytes, handle.pos
        soft, number = handle.soft_errors, splitter.next_number
        try:
            lines = handle.read(budget, blocks)
        except OSError as exc:
            self._io_error(handle, exc, now)
            return []
        if handle.backoff:
            log.warning("%s: reading works again", handle.path)
            handle.backoff = 0.0
        self.counters["lines"] += splitter.next_number - number
        self.counters["bytes"] += handle.pos - before
        self.counters["cut_lines"] += splitter.cut_lines - cut
        self.counters["bad_utf8_lines"] += splitter.replaced_lines - bad
        self.counters["nul_bytes"] += splitter.nul_bytes - nul
        self.counters["io_errors"] += handle.soft_errors - soft
        return lines

    def _replaced(self, handle: _OpenFile, now: float) -> bool:
        if now < handle.retry_at:
            return False
        try:
            return handle.replaced_in_place()
        except OSError as exc:
            self._io_error(handle, exc, now)
            return False

    def _truncated(self, handle: _OpenFile, now: float) -> None:
        """The file was truncated (or rewritten) in place. With copytruncate the copy (`PATH.1`: another inode
        starting with the bytes we read) holds what was not read yet: it is read from our offset. Whatever
        is known to have existed beyond what was read or recovered is counted in `lost_bytes` and logged."""
        self.counters["truncations"] += 1
        start = handle.splitter.offset  # first byte not handed out as a complete line
        known_end = max(handle.size_seen, handle.pos)
        recovered = start
        copy = self._copy_of(handle, start) if handle.head else None
        if copy is not None:
            copy.idle_since = now
            self.draining.append(copy)
            recovered = max(start, copy.size_seen)
        lost = known_end - recovered
        if lost > 0:
            self.counters["lost_bytes"] += lost
            log.warning("%s was truncated; %d bytes not read before that are lost%s", self.path, lost,
                        "" if copy is None else f" (the copy {copy.path.name} was read)")
        handle.restart()
        handle.size_seen = 0

    def _copy_of(self, handle: _OpenFile, start: int) -> Optional[_OpenFile]:
        """The newest backup that is a copy of `handle` (same first bytes, another inode), opened at `start`."""
        for backup in reversed(self._backups()):
            try:
                copy = _OpenFile(backup, self.max_line_bytes, self.splitter_class, self.confine)
                size = os.fstat(copy.fd).st_size
                same = copy.identity != handle.identity and os.pread(copy.fd, len(handle.head), 0) == handle.head
            except OSError:
                continue
            if same and size >= start and not self._already_read(copy):
                copy.resume(start, handle.splitter.next_number)
                copy.size_seen = size
                self._remember(copy)  # a copy of what was read: never read as a backup of its own
                return copy
            copy.close()
        return None

    def _io_error(self, handle: _OpenFile, exc: OSError, now: float) -> None:
        """ESTALE (NFS: the file handle went stale): open the path again. Other errors (EIO on a flaky mount):
        retry with exponential backoff, 0.1 s doubling up to 30 s. Counted in `io_errors`; never raised."""
        self.counters["io_errors"] += 1
        if exc.errno == errno.ESTALE and self._reopen(handle):
            return
        if not handle.backoff:
            log.warning("%s: %s; retrying with backoff", handle.path, exc)
        handle.backoff = min(max(handle.backoff * 2, 0.1), 30.0)
        handle.retry_at = now + handle.backoff

    def _reopen(self, handle: _OpenFile) -> bool:
        """Swap a stale descriptor for a new one when the path still names the same file; a stale file the
        path no longer names cannot be read any more and is given up (a draining one) or rotated away."""
        try:
            fd = os.open(self.path, os.O_RDONLY) if self.confine is None else _open_within(self.path, self.confine)
            st = os.fstat(fd)
        except OSError:
            return False
        if (st.st_dev, st.st_ino) == handle.identity:
            os.close(handle.fd)
            handle.fd = fd
            return True
        os.close(fd)
        if handle in self.draining:
            unread = handle.size_seen - handle.splitter.offset
            if unread > 0:
                self.counters["lost_bytes"] += unread
            log.warning("%s: stale file handle, the renamed-away file cannot be read any more", handle.path)
            self._drop(handle)
            return True
        return False  # the current file: the rotation check moves to the file the path names now

    def _drop(self, handle: _OpenFile) -> None:
        if handle not in self.draining:
            return  # given up already (a stale handle)
        self.draining.remove(handle)
        self._remember(handle)  # with the head it has now: an empty file remembered empty is not "read"
        handle.close()
