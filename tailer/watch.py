"""Wake-ups from the file system: "look now", never data. Reading is always to EOF from our own offsets,
so a coalesced or missed event costs latency, not lines (the safety timer reads anyway)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Set, Tuple

import watchfiles

log = logging.getLogger("mstail.watch")


async def watch_directories(roots: Set[Tuple[Path, bool]], wake: asyncio.Event, stop: asyncio.Event, step_ms: int) -> None:
    """Set `wake` whenever something changes under `roots` ((directory, recursive) pairs) until `stop`.

    One `awatch` per recursion mode; parent directories are watched, not files (a file watch dies with
    rotation). If watching fails (no inotify, too many watches) we log once and rely on the timer.
    """
    groups = {}
    for directory, recursive in roots:
        groups.setdefault(recursive, []).append(directory)
    await asyncio.gather(*(_watch(dirs, recursive, wake, stop, step_ms) for recursive, dirs in groups.items()))


async def _watch(dirs: list, recursive: bool, wake: asyncio.Event, stop: asyncio.Event, step_ms: int) -> None:
    try:
        async for _ in watchfiles.awatch(
            *dirs,
            watch_filter=None,
            step=step_ms,
            debounce=50,  # steady trickles from many ranks must not wait for a 1.6 s quiet gap
            stop_event=stop,
            recursive=recursive,
            ignore_permission_denied=True,
        ):
            wake.set()
    except (OSError, RuntimeError) as exc:
        log.warning("file events unavailable for %s (%s); reading on the timer only", ", ".join(map(str, dirs)), exc)
