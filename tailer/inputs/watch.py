"""Wake-ups from the file system: "look now" and where, never data. Reading is always to EOF from our own
offsets, so a coalesced or missed event costs latency, not lines (the safety sweep looks anyway)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Dict, Iterable, List, Set, Tuple

import watchfiles

log = logging.getLogger("mstail.watch")

#: After file events failed, watching is tried again after this many seconds, doubling up to RETRY_MAX_S.
RETRY_S, RETRY_MAX_S = 5.0, 300.0


class Changes:
    """What the watchers saw since the last `take`: the paths named by file events, and whether watching
    failed (then only a timer can tell that something changed). Touched on the event loop only."""

    def __init__(self) -> None:
        self.event = asyncio.Event()  # set when there is something to take
        self.paths: Set[str] = set()
        self.failed = False
        self.failing: Set[bool] = set()  # the watcher groups (by recursion mode) whose watching failed

    def add(self, paths: Iterable[str]) -> None:
        self.paths.update(paths)
        self.event.set()

    def take(self) -> Set[str]:
        """The paths seen since the last call; the event is cleared."""
        paths, self.paths = self.paths, set()
        self.event.clear()
        return paths


async def watch_directories(roots: Set[Tuple[Path, bool]], changes: Changes, stop: asyncio.Event, step_ms: int) -> None:
    """Add to `changes` every path that changes under `roots` ((directory, recursive) pairs) until `stop`.

    One `awatch` per recursion mode; parent directories are watched, not files (a file watch dies with
    rotation). If watching fails (no inotify, too many watches, a file name that is no UTF-8) we log once, mark
    `changes.failed`, rely on the timer and try watching again now and then (`_watch`).
    """
    groups: Dict[bool, List[Path]] = {}
    for directory, recursive in roots:
        groups.setdefault(recursive, []).append(directory)
    await asyncio.gather(*(_watch(dirs, recursive, changes, stop, step_ms) for recursive, dirs in groups.items()))


async def _watch(dirs: list, recursive: bool, changes: Changes, stop: asyncio.Event, step_ms: int) -> None:
    """Watch one group of folders until `stop`. A failure is said once and leaves the timer reading everything
    (`changes.failed`); watching is tried again after RETRY_S, doubling up to RETRY_MAX_S, and its first batch
    after that ends the timer's turn (said once too): a file whose name broke it may never be written again."""
    said, retry = "", RETRY_S  # said: "" (nothing yet), "failed", "back"
    where = ", ".join(map(str, dirs))
    while not stop.is_set():
        try:
            async for batch in watchfiles.awatch(
                *dirs,
                watch_filter=None,
                step=step_ms,
                debounce=50,  # steady trickles from many ranks must not wait for a 1.6 s quiet gap
                stop_event=stop,
                recursive=recursive,
                ignore_permission_denied=True,
            ):
                if recursive in changes.failing:
                    changes.failing.discard(recursive)
                    changes.failed = bool(changes.failing)
                    retry = RETRY_S
                    if said == "failed":
                        said = "back"
                        log.info("file events are back for %s", where)
                changes.add(path for _, path in batch)
            return
        except Exception as exc:  # noqa: BLE001 - OSError, RuntimeError, and either inside anyio's ExceptionGroup
            # (watchfiles raises from its task group: a file name that is no UTF-8 under a watched folder ends it so)
            while len(getattr(exc, "exceptions", ())) == 1:
                exc = exc.exceptions[0]  # type: ignore[attr-defined]  # an ExceptionGroup: it has them
            changes.failing.add(recursive)
            changes.failed = True
            changes.event.set()
            if not said:
                said = "failed"
                log.warning("file events unavailable for %s (%s); reading on the timer, trying again now and then",
                            where, exc)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), retry)
        retry = min(retry * 2, RETRY_MAX_S)
