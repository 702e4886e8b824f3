"""Following event files: one source per folder of them, read frame by frame by the same `FileFollower`.

A TensorBoard writer (tensorboardX, as MindFormers uses it) and MindSpore's `SummaryRecord` start a new file in the
same folder each time one is opened (a relaunch, a second `SummaryRecord`): `events.out.tfevents.<time>.<host>`,
`events.out.events.summary.<time>.<host>_MS`. To the follower that is a rotation: the folder's newest event file is
the path it follows (`path`), the older ones are its backups (`_backups`), read first, oldest first, and a file
that stops growing is read to its end before the newer one. Identity, rotation, truncation and checkpoints are the
follower's own; only the splitter (`frames.FrameSplitter` instead of `lines.LineSplitter`) and the naming differ.
A file that is an event file by its content alone (`frames.is_event_file` sniffed it) is followed by itself.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import List, Optional, Tuple, Union

from mstail.tailer.inputs.follower import FileFollower, _OpenFile
from mstail.tailer.inputs.frames import FrameSplitter, event_files_in
from mstail.tailer.inputs.lines import Block, Line

log = logging.getLogger("mstail.follower")

#: A folder's listing of event files is taken again after this many seconds even when its mtime has not moved.
LISTING_MAX_AGE_S = 10.0
#: The frame reader's counters, added to the follower's for every file it reads.
FRAME_COUNTERS = ("bad_frames", "skipped_bytes", "big_frames")


class EventFilesFollower(FileFollower):
    """A `FileFollower` of event files: those of a folder (`folder=True`: the newest is the path, the others its
    backups), or one file (`folder=False`). Other arguments as `FileFollower`'s."""

    def __init__(self, path: Path, max_line_bytes: int = 1 << 20, folder: bool = True) -> None:
        self.folder = path if folder else None
        #: (the folder's mtime, its event files, when to list again) while trusted
        self._listed: Optional[Tuple[int, List[Path], float]] = None
        super().__init__(path, max_line_bytes, with_backups=folder, splitter=FrameSplitter)
        self.counters.update(dict.fromkeys(FRAME_COUNTERS, 0))

    @property
    def path(self) -> Path:
        """The file followed now: the folder's newest event file (a name in it that does not exist yet while it has
        none: the follower waits), or the one file."""
        if self.folder is None:
            return self._file
        files = self._listing()
        return files[-1] if files else self.folder / "events.out.tfevents"

    @path.setter
    def path(self, value: Path) -> None:
        self._file = value

    @property
    def source_path(self) -> Path:
        """The folder (or the one file) the source stands for, whichever of its files is read now."""
        return self.folder if self.folder is not None else self._file

    def _backups(self) -> List[Path]:
        return self._listing()[:-1] if self.folder is not None else []

    def _listing(self) -> List[Path]:
        """The folder's event files (`event_files_in`), listed again only when the folder changed: every look at
        `path` asks for them, and listing 10,000 files takes 100 ms. A file created, removed or renamed in the folder
        moves its mtime; a listing is kept only when that mtime is 2 s old or more, so a change within the mtime's
        granularity (a second on some network filesystems) cannot hide behind an unchanged one (git's racy-clean
        rule), and for `LISTING_MAX_AGE_S` at most (a FUSE mount of an object store may never move a folder's
        mtime)."""
        try:
            mtime = os.stat(self.folder).st_mtime_ns  # type: ignore[arg-type]  # called with a folder only
        except OSError:
            mtime = None
        now = time.monotonic()
        if mtime is not None and self._listed is not None and self._listed[0] == mtime and now < self._listed[2]:
            return self._listed[1]
        files = event_files_in(self.folder)  # type: ignore[arg-type]  # as above
        trusted = mtime is not None and time.time_ns() - mtime >= 2_000_000_000
        self._listed = (mtime, files, now + LISTING_MAX_AGE_S) if trusted else None  # type: ignore[assignment]  # trusted: an mtime
        return files

    def _read_from(self, handle: _OpenFile, budget: int, now: Optional[float] = None,
                   blocks: bool = False) -> List[Union[Line, Block]]:
        splitter = handle.splitter
        before = [getattr(splitter, name) for name in FRAME_COUNTERS]
        frames = super()._read_from(handle, budget, now, blocks)
        splitter = handle.splitter  # the same one, unless a truncation restarted it
        for name, old in zip(FRAME_COUNTERS, before):
            self.counters[name] += max(0, getattr(splitter, name) - old)
        if splitter.bad_frames > before[0] and not getattr(handle, "said_bad", False):
            handle.said_bad = True  # type: ignore[attr-defined]  # once per file: the counter says how many more
            log.warning("%s: a frame failed its checksum (or its length); skipped, reading on (bad_frames counts them)", handle.path)
        return frames
