"""Which sources a read pass reads, so that a pass costs what changed, not what is followed.

A *full* pass (polling, where file events say nothing; events unavailable; `Tailer.pass_once()` without
events) reads every source, as a pass always did. With file events, a pass reads the sources whose files the
events named, and those with something due: more to read than the last pass took, a multi-line event (a traceback)
waiting for more lines (the grace period), a state that time changes (following -> idle), never delivered yet. Events
are hints and can be missed, so every `safety_poll_s` a *sweep* also takes the sources one `stat` shows may have
news (`FileFollower.may_have_news`; between the sweeps that stat paths, only the files written lately: QUIET_S).
New files are looked for (a glob per pattern, the costly part with a
thousand files) in every full pass, when an event names a path no source has that a pattern may name (a new
file, or a folder on the way to one), and every REDISCOVER_S in sweeps.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Generic, Iterable, List, Optional, Set, TypeVar

from mstail.tailer.inputs.discovery import ROTATED
from mstail.tailer.inputs.watch import Changes

#: with events on, a sweep looks for new files at least this often even when no event named one (an event missed:
#: a file created and written in a new folder before its watch was added, and never written again).
REDISCOVER_S = 10.0
#: events naming new paths a pattern may name look for new files at most this often (the rest wait for a pass).
DISCOVER_EVENT_S = 0.1
#: one sweep in this many stats the files' paths (a rotation events missed); the others each open file (`fstat`: no
#: path lookup, a third of the cost) that got data in the last QUIET_S.
ROTATION_SWEEP_EVERY = 5
#: a file with no new data for this long is left to the sweeps that stat paths: a write events missed waits for the
#: next of those (at most ROTATION_SWEEP_EVERY sweeps, 5 s) unless it came within QUIET_S of the file's previous data
#: (the last lines of a crash: one sweep, 1 s). A thousand quiet files: fstat was most of an idle mstail's sweeps.
QUIET_S = 5.0

S = TypeVar("S")


class Pacer:
    """The tailer loop's rhythm: whether the next pass is full, a sweep or events only, and how long the loop may
    sleep before it (file events wake it sooner).

    Args:
        poll_s: read every file on this timer and nothing else (`--poll`); None = file events.
        sweep_s: with file events, sweep this often (`Config.safety_poll_s`).
    """

    def __init__(self, poll_s: Optional[float], sweep_s: float) -> None:
        self.poll_s, self.sweep_s = poll_s, sweep_s
        self._next = 0.0  # monotonic time of the next full pass (polling) or sweep
        self._full = True  # the first pass reads every file
        self._sweeps = 0

    def full_pass_next(self) -> None:
        """The watcher was (re)started: what changed while none looked is found by reading every file."""
        self._full = True

    def plan(self, changes: Changes) -> Optional[Plan]:
        """The next pass's plan from what the watchers saw; None = a full pass (polling when its timer is due, the
        first pass, a watcher (re)started, or file events unavailable). A pass that comes early while polling (the
        pass before had more to read, a held record's grace ends) reads only the files with something due: a
        thousand files' history is read in many short passes, each of which would otherwise look at every file."""
        paths = changes.take()
        now = time.monotonic()
        if self.poll_s is not None and not self._full and now < self._next:
            return Plan(paths, sweep=False)
        if self.poll_s is not None or changes.failed or self._full:
            self._full = False
            self._next = now + (self.poll_s if self.poll_s is not None else self.sweep_s)
            return None
        sweep = now >= self._next
        if sweep:
            self._next = now + self.sweep_s
            self._sweeps += 1
        return Plan(paths, sweep, rotations=not sweep or self._sweeps % ROTATION_SWEEP_EVERY == 1)

    def timeout(self) -> float:
        """How long the loop may sleep before the next pass is due."""
        return max(0.0, self._next - time.monotonic())


@dataclass(frozen=True)
class Plan:
    """What the tailer loop asks of one pass: `changed` are the paths file events named since the last pass;
    `sweep` adds every source a stat shows may have news, by a stat of its path (`rotations`: a new file there
    too) or of its open file. No plan (None) is a full pass."""

    changed: Set[str]
    sweep: bool = False
    rotations: bool = True


class Planner(Generic[S]):
    """The tailer's choice of sources per pass (used in the pass thread; `settle` on the event loop between passes,
    never at the same time)."""

    def __init__(self, wanted: Callable[[str], bool]) -> None:
        """`wanted(path)`: whether an event's path no source has may be a file to follow (`PatternFilter`)."""
        self._wanted = wanted
        self._by_path: Dict[str, S] = {}
        #: sources the next pass reads whatever the events say: new ones, and those that had more to read than
        #: the last pass took (their budget or the pass time ran out)
        self.pending: Set[S] = set()
        #: sources whose parser holds a record for its attach line: each pass flushes them when the grace is over
        self.holding: Set[S] = set()
        self._unknown = False  # an event named a wanted path no source has, since the last discovery
        self._discovered_at = float("-inf")

    def add(self, source: S, path: Path) -> None:
        """A new source: the next pass reads it; file events may name `path` absolute, or with links resolved
        as the watched roots are."""
        self.pending.add(source)
        for name in {str(path.absolute()), os.path.realpath(path)}:
            self._by_path[name] = source

    def source_of(self, path: str) -> Optional[S]:
        """The source an event's path belongs to: its file, or a rotated backup of it (`info.log.1`)."""
        source = self._by_path.get(path)
        if source is None:
            backup = ROTATED.match(path)
            if backup is not None:
                source = self._by_path.get(backup.group("base"))
        return source

    def discovery_due(self, plan: Optional[Plan], now: float) -> bool:
        """Whether this pass looks for new files first (`now`: monotonic). Notes the events' unknown paths."""
        if plan is not None and not self._unknown:
            self._unknown = any(self.source_of(path) is None and self._wanted(path) for path in plan.changed)
        wait = DISCOVER_EVENT_S if self._unknown else REDISCOVER_S if plan is not None and plan.sweep else None
        if plan is not None and (wait is None or now - self._discovered_at < wait):
            return False
        self._discovered_at, self._unknown = now, False
        return True

    def choose(self, sources: Iterable[S], plan: Optional[Plan], stale: Callable[[S], bool]) -> List[S]:
        """This pass's sources, in the order given: all of them for a full pass; else those named by events,
        those with something due, and in a sweep those for which `stale(source)` (one stat, a state to refresh)
        says so."""
        if plan is None:
            return list(sources)
        due = self.pending | self.holding
        due.update(filter(None, map(self.source_of, plan.changed)))
        return [source for source in sources if source in due or (plan.sweep and stale(source))]

    def settle(self, read: Iterable[S], more: Iterable[S], holding: Callable[[S], bool]) -> None:
        """After a pass that read `read`: which of them still hold a record, and which have `more` to read."""
        for source in read:
            if holding(source):
                self.holding.add(source)
            else:
                self.holding.discard(source)
        self.pending = set(more)
