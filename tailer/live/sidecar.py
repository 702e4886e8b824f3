"""The tailing loop: discover files, read them, parse lines, store records, publish batches.

How it runs: one asyncio task. Each *pass* runs in a worker thread (file IO and regex work must not
block the web server): it reads the files it is due to (`planner`: every file when polling; with file events
the files the events named, plus a stat sweep every `safety_poll_s`; the `--log` patterns are expanded again
only when an event may name a new file) in rounds of small slices (so one flooding file cannot starve the
others: a pass ends after `pass_time_s`), feeds the lines to that source's parser and returns the parsed items.
Back on the event loop the items enter the store (which numbers them) and go out to the hub as one batch. Then
the loop sleeps until a watchfiles event, the safety timer, or — when a traceback may have more lines — the
parser's grace period; if a file had more to read it goes again at once.
A step's record is published at its line; a line that belongs to it but comes later amends it
(mstail.parsers.amends): joined to it when both are read in one pass, else applied by the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import math
import os
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from mstail.parsers import Format, Item, format_table
from mstail.parsers.amends import fold_amends
from mstail.parsers.interleave import MAX_PARTS
from mstail.parsers.record import PART_KEY

from mstail.tailer.alerts.engine import DEFAULT_RULES, AlertEngine
from mstail.tailer.live.catchup import BULK_MIN_BYTES, CatchUp, children_allowed, eligible, left_to_read
from mstail.tailer.inputs.checkpoint import SourceCheckpoint
from mstail.tailer.config import Config
from mstail.tailer.inputs.discovery import (PatternFilter, SourceNamer, WatchRoots, expand, glob_free_prefix, has_glob, nearest_file,
                        nearest_path, visible)
from mstail.tailer.inputs.frames import event_source
from mstail.tailer.inputs.kind import KINDS, Follower, InputKind, InputSpec, Parser, items_of
from mstail.tailer.inputs.peer import PEER, PeerFollower, PeerParser, PeerPart
from mstail.tailer.live.hub import Hub, ItemsMessage, SourceMessage
from mstail.tailer.inputs.netfs import MOUNTINFO, existing_ancestor, network_fs, parse_mountinfo
from mstail.tailer.notices import Notices, no_format_hint
from mstail.tailer.live.planner import QUIET_S, Pacer, Plan, Planner
from mstail.tailer.inputs.runs import HEADS_TIME_S, NOTHING_YET, RunFinder
from mstail.tailer.history.store import Store
from mstail.tailer.inputs.watch import Changes, watch_directories
from mstail.tailer.alerts.fate import FATES, RunEvidence, judge
from mstail.tailer.inputs.writers import ProcId, holders_of, running

log = logging.getLogger("mstail.sidecar")

#: bytes one file gives per round of a pass: small enough that a round over a flooding file is a few ms of parsing.
READ_SLICE = 8 << 10
#: bytes per round of a file still catching up (what it held when mstail reached it), read in blocks of whole lines
#: through the parsers' fast path (`parsers.blocks`): a round's parsing costs a few ms, and its records (about 40)
#: cost as much again to store, so live files still wait about one short pass.
CATCH_UP_SLICE = 64 << 10
#: how long a pass goes on reading the history of files still catching up, a slice each (those read longest ago
#: first): many files' history comes in passes about this long, so live files wait about one such pass and a pass
#: holds this much parsed history (not every file's at once). 1,024 files of 2,000 records: 114 s and 358 MiB at most;
#: at 0.05 s 124 s (the passes' own cost), 337 MiB; unbounded 89-93 s, 1.2-1.3 GB, passes of 12-29 s (/healthz: stalled).
HISTORY_PASS_S = 0.2
#: how long a pass with nothing else to read waits for a catch-up child's next batch (it ends at once when one comes)
BULK_WAIT_S = 0.005
#: while catch-up children run, deliveries commit at most this often (those between queue their items and checkpoints
#: for the next): a pass then delivers about one child's batch (~85 records), and a commit of each cost 5.7-6.2 µs a
#: record, one every 0.1 s 4.3-4.7 (tests/bench/catch_up_parent.py, load 8)
HISTORY_COMMIT_S = 0.1
#: a read pass running longer than this is a stall: /healthz says so (a pass normally takes milliseconds).
STALL_S = 10.0
#: a `--log` pattern naming nothing for this long, in a folder that does not exist, is said on stderr.
MISSING_AFTER_S = 10.0
#: how often /proc is looked through again for the writers of a file none was seen holding (it costs a stat per open
#: fd on the machine, for all such files at once); a file whose writers were seen is looked at again when they exit.
WRITER_CHECK_S = 5.0
#: how often the processes seen writing the followed files are asked whether they still run (a small read each): a
#: writer's exit is seen within about this long (plus a pass), and the run's fate with it.
WRITER_PULSE_S = 1.0
#: a source silent this long, whose file nobody was ever seen holding open for writing (a writer that opens it for
#: each line, or left before mstail looked), is over (its run's fate is judged)
ENDED_AFTER_S = 10.0
#: how many of the newest stored events of each kind that tells how a run ends a restart reads back (`_recall_endings`)
RECALL_EVENTS = 10_000
#: a source's counters go out on the stream (SSE `source`) at most this often; with many sources less often, so that
#: all of them cost at most 512 entries a second: SOURCE_PUSH_S x max(1, sources / SOURCE_PUSH_SHARE), but at least
#: every SOURCE_PUSH_MAX_S - SOURCE_PUSH_S; the loop wakes for held ones at most every SOURCE_PUSH_S, so the page's
#: counters are at most SOURCE_PUSH_MAX_S behind (issue 17; 1,024 sources at a step a second: an entry per step, about
#: 10 us with its JSON). A changed state goes out at once.
SOURCE_PUSH_S = 0.25
SOURCE_PUSH_SHARE = 128
SOURCE_PUSH_MAX_S = 1.0
#: after an unexpected error, a source is left alone this long, the whole loop this long at first (doubling to 30 s).
FAILURE_BACKOFF_S = 1.0
#: the alert engine's time-based rules (hang, gone, stragglers: one look at every source) run at most this often;
#: beyond ALERT_TICK_SHARE sources less often, at most every ALERT_TICK_MAX_S (a tick at 1,024 live sources costs
#: ~2-3 ms, most of it the straggler rule's medians; the hang rule's bound is a minute by default).
ALERT_TICK_S = 0.5
ALERT_TICK_SHARE = 512
ALERT_TICK_MAX_S = 1.0
#: node mstails' news (`--peer`) wakes the loop at most this often: the messages of many nodes, a message per rank's
#: step each, are read by one pass, not a pass each (a pass's own cost, times a thousand ranks a second)
PEER_WAKE_S = 0.03


@dataclass(eq=False)  # identity, not field equality: the planner keeps sources in sets
class _Source:
    id: str
    kind: InputKind  # text, jsonl or events (`mstail.tailer.inputs.kind.KINDS`)
    spec: InputSpec  # what its follower and parser are made from (again after a catch-up child: `_hand_over`)
    follower: Follower
    parser: Parser  # a text source's: one SourceParser per launcher tag (`[rank3]:`), mostly just one
    #: the newest resume point, taken when the parser held nothing; None until the first. Persisted with the
    #: items of the same pass.
    snapshot: Optional[SourceCheckpoint] = None
    #: items the parser will emit again after a restart that were stored before it (dropped, not stored twice).
    skip: int = 0
    committed: Optional[SourceCheckpoint] = None  # the checkpoint last handed to the store
    said_format: Optional[str] = None  # the format last announced on stderr ("" = none yet); None = not announced
    failures: int = 0  # unexpected errors while reading or parsing it (each skipped a line or a round)
    failed_until: float = 0.0  # after an unexpected error: not read before this (monotonic) time
    #: the file has been read to its end once: later items are live. Until then they are the history (the
    #: catch-up at start or after a restart), which never arms the hang rule.
    caught_up: bool = False
    in_history: bool = True  # this pass's items are history (`caught_up` when the pass began)
    #: the number of the first line after the catch-up in the file being read then: a record held over the
    #: catch-up (waiting for its TimeMonitor line) and emitted later is history all the same
    live_from_line: Optional[int] = None
    writer_seen: Optional[Tuple[float, Optional[bool]]] = None  # (monotonic time, held for writing: None if unseen) last asked
    writer_file: Optional[Tuple[int, int]] = None  # the file (identity) `writer_seen` and `holders` are of
    holders: FrozenSet[ProcId] = frozenset()  # the processes the last look saw holding it open for writing
    #: its writers were seen to leave (all exited, none took over): the wall time of that, or of the newest data read
    #: since (then looked at again: a new writer clears it); None while they are there or were never seen
    left_at: Optional[float] = None
    witnessed: bool = False  # a writer was seen or live lines read: how its run ends happens while mstail watches
    shown_state: Optional[str] = None  # the state its last delivery showed (None: never delivered)
    remote: Optional[bool] = None  # its file is on a network filesystem (asked once: writers there are not seen)
    run: Optional[str] = None  # the run it belongs to, for a file found below a folder (`mstail DIR`)
    catch_up: Optional[CatchUp] = None  # the child process parsing its history, while one does (`tailer.catchup`)
    prepared: bool = False  # this pass's items come from a catch-up child, as the store keeps them (`store.prepare`)
    no_child: bool = False  # a catch-up child of this source ended early: the passes read the rest (no fork loop)
    history_turn: int = 0  # the pass that last read its history: the longest ago go first (`_read_pass`)
    missing: Optional[str] = None  # a `--log` file still absent MISSING_AFTER_S after the start: said on its card


class Tailer:
    """Follows the files of a `Config` into a `Store` and a `Hub`.

    Args:
        config: the settings (patterns, polling, budgets).
        formats: formats in detection order (from `parsers.load_formats`).
        store: where parsed history goes.
        hub: where each pass's new items are published.
        alerts: the alert engine fed every stored item (default: one with `config.alert_rules`; none when
            those are None).
    """

    def __init__(
        self, config: Config, formats: Sequence[Format], store: Store, hub: Hub, alerts: Optional[AlertEngine] = None
    ) -> None:
        self.config = config
        if alerts is None and config.alert_rules is not None:
            alerts = AlertEngine(config.alert_rules)
        self.alerts = alerts
        #: called with every alert change that should notify people (webhooks); must not block.
        self.alert_listeners: List[Callable[[Dict[str, Any]], None]] = []
        self.formats = list(formats)
        self.store = store
        self.hub = hub
        table = format_table(self.formats)
        self._forced = table.get(config.format) if config.format else None
        self._jsonl = table.get("jsonl")
        self._patterns: List[Tuple[str, Optional[Format]]] = [(p, self._forced) for p in config.logs]
        self._patterns += [(p, self._jsonl) for p in config.jsonl]
        self._sources: Dict[Path, _Source] = {}
        self._by_id: Dict[str, _Source] = {}  # the same sources by their id
        self._namer = SourceNamer()
        self._event_kinds: Dict[Path, str] = {}  # event-file sources: key -> the kind their names say ("": by content)
        self._event_files: Set[Path] = set()  # event files whose file events wake their folder's source
        self._saved: Dict[Path, SourceCheckpoint] = {}  # checkpoints from the state, by path, until rediscovered
        self._saved_ids: Dict[str, SourceCheckpoint] = {}  # ... and by source id (a node mstail's: `_add_peers`)
        self._peers: List[_Source] = []  # the node mstails followed (`--peer`), once `_add_peers` made them
        self._peer_steps: Dict[str, Dict[str, int]] = {}  # node -> its sources' newest steps held (`resume`)
        #: hands paths to the loop's `Changes` from any thread (set by `run`): a node's news wakes the loop
        self._wake: Optional[Callable[[List[str]], None]] = None
        self._followed: Set[str] = set()  # the paths (as `expand` names them) of the files followed, but event files
        self._runs = RunFinder(config.logdirs, self.formats, self._forced, config.follow_symlinks,  # below `mstail DIR`
                               heads_time_s=HEADS_TIME_S)
        self._said_empty: Set[Path] = set()  # folders said to have no run below them yet
        self._confine: Dict[Path, str] = {}  # key -> the real folder a new run file's reads must stay in, until made
        wanted = PatternFilter(p for p, _ in self._patterns)
        self._watch_roots = WatchRoots(p for p, _ in self._patterns)
        self._planner: Planner[_Source] = Planner(lambda path: wanted(path) or self._runs.may_name(path))
        self._plan: Optional[Plan] = None  # what the pass in progress reads (None: every source)
        self._ticked = float("-inf")  # monotonic time of the alert engine's last tick
        self._pulsed = -math.inf  # monotonic time the writers seen were last asked whether they still run
        self._began = time.time()  # a file written since then was written while mstail watched (`_fate_changed`)
        self._evidence: Dict[str, RunEvidence] = {}  # source id -> what its events said of its run's end
        self._pushed: Dict[str, Tuple[float, Any]] = {}  # source id -> (monotonic time, counts) last sent (SSE)
        self._unpushed: Set[str] = set()  # sources whose changed counts were held back (sent by a later delivery)
        self._push_due: List[Tuple[float, str]] = []  # a heap of (monotonic time it may go, source id) of those
        self._pushing: List[Dict[str, Any]] = []  # the sources' entries this delivery sends (one SourceMessage)
        self._delivered = -math.inf  # monotonic time of the last delivery (`_sleep` wakes for held entries after it)
        self._committed = -math.inf  # monotonic time of the last commit (HISTORY_COMMIT_S)
        self.passes = 0
        self._deliver_s_per_item = 20e-6  # storing + publishing one item on the event loop (measured, see _deliver)
        self.notices = Notices(log)
        self.started = time.monotonic()
        self.running = False  # `run` is looping (set False when it ends, normally or not)
        self.failures = 0  # unexpected errors that ended a loop iteration (each reported, the loop went on)
        self.last_failure: Optional[str] = None
        self._pass_started: Optional[float] = None  # monotonic start of the pass in progress
        self._write_error: Optional[str] = None  # the history write failure last reported
        self._missing_checked = False
        self._unmatched: Dict[str, str] = {}  # glob -> what `_report_unmatched` said of it (until it matches a file)
        self._children = 0  # catch-up children running (`_start_catch_up`)
        self._ahead: Optional[Tuple[List[Tuple[_Source, List[Item]]], bool]] = None  # `read_ahead`'s, undelivered

    def resume(self, checkpoints: Dict[str, Optional[SourceCheckpoint]]) -> None:
        """Continue from the state's checkpoints (source id -> checkpoint; `Store.load`) before the first pass:
        source ids are kept, and each file resumes where the committed history ends."""
        for source_id, checkpoint in checkpoints.items():
            path = Path(self.store.sources[source_id].path)
            self._namer.adopt(path, source_id)
            if checkpoint is not None:
                self._saved[path.absolute()] = checkpoint
                self._saved_ids[source_id] = checkpoint
        for info in self.store.sources.values():  # a node's sources' newest steps: taken once after its reset
            node, _, source_id = info.id.partition("/")
            if source_id and info.last_step is not None and any(node == name for name, _ in self.config.peers):
                self._peer_steps.setdefault(node, {})[source_id] = info.last_step
        self._recall_endings()

    def _recall_endings(self) -> None:
        """What the stored events said of each source's run's end (its parser resumes after them): the newest
        RECALL_EVENTS of each kind that tells it, in their order."""
        events = [event for kind in ("start", "resume", "end", "error")
                  for event in self.store.events(kind, limit=RECALL_EVENTS, newest=True)]
        for event in sorted(events, key=lambda event: event["seq"]):
            self._evidence.setdefault(event["source"], RunEvidence()).see(event)

    def discover(self) -> List[_Source]:
        """Register files the patterns name now, and run files below the folders; returns the new ones (runs in
        the pass thread)."""
        new = self._add_peers()
        every = []
        for pattern, forced in self._patterns:
            paths = expand(pattern, self._followed)
            if paths and self._unmatched:
                self._unmatched.pop(pattern, None)
            every += [(path, forced) for path in paths]
        # A file followed already is passed over by its name (a thousand rank files: no stat, no path work each);
        # event files are not (each one's events wake its folder's source, new ones too).
        found, event_files = self._event_sources([(path, forced) for path, forced in every
                                                  if str(path) not in self._followed])
        fresh: Dict[Path, Tuple[Path, Optional[Format]]] = {}
        for path, forced in found:
            key = path.absolute()
            if key not in self._sources:
                fresh.setdefault(key, (path, forced))  # a file two patterns name: the first one's
        named: List[Tuple[Path, Path, Optional[Format], str, Optional[str]]] = []
        if fresh:
            followed = [path for path, _ in found] + [path for path, _ in every if str(path) in self._followed]
            named = [(key, path, forced, source_id, None) for (key, (path, forced)), source_id
                     in zip(fresh.items(), self._namer.names([path for path, _ in fresh.values()], followed))]
        named += self._new_run_files(set(fresh), event_files)
        for key, path, forced, source_id, run in named:
            variant = self._event_kinds.get(key)
            kind = KINDS["events" if variant is not None else "jsonl" if forced is not None and forced is self._jsonl
                         else "text"]
            spec = InputSpec(path, source=source_id, formats=self.formats, forced=forced, derived=self.config.derived,
                             max_line_bytes=self.config.max_line_bytes, grace_s=self.config.grace_s,
                             variant=variant or "")
            source = _Source(id=source_id, kind=kind, spec=spec, follower=kind.follower(spec), parser=kind.parser(spec))
            source.said_format = forced.name if forced is not None else None
            source.run = run
            source.follower.confine = self._confine.pop(key, None)
            saved = self._saved.pop(Path(visible(str(key))), None)  # kept by its visible path
            if saved is not None:
                self._restore(source, saved)
            self._sources[key] = self._by_id[source_id] = source
            self._planner.add(source, path)
            if kind is None:
                self._followed.add(str(path))
            new.append(source)
        for file, key in event_files:  # file events name a folder's event files, new ones too: they wake its source
            if file not in self._event_files and key in self._sources:
                self._event_files.add(file)
                self._planner.add(self._sources[key], file)
        return new

    def _add_peers(self) -> List[_Source]:
        """The node mstails of `--peer`, made at the first discovery (each resumes at its checkpoint): a source per
        node (its id the node's name), its sources its parts (`NAME/<id>`, `inputs.peer`)."""
        if self._peers or not self.config.peers:
            return []
        for name, url in self.config.peers:
            spec = InputSpec(Path(name), source=name, variant=url, token=self.config.peer_token)
            source = _Source(id=name, kind=PEER, spec=spec, follower=PEER.follower(spec), parser=PEER.parser(spec))
            source.remote = False  # no file: nothing to look up in the mount table
            saved = self._saved_ids.pop(name, None)
            if saved is not None:
                self._restore(source, saved)
            for source_id, step in self._peer_steps.pop(name, {}).items():
                source.parser.remember(source_id, step)  # type: ignore[attr-defined]  # a PeerParser
            key = Path("/", f"peer:{name}")  # what its follower's news names (`_peer_news`)
            source.follower.wake = partial(self._peer_news, str(key))  # type: ignore[attr-defined]  # a PeerFollower
            self._sources[key] = self._by_id[name] = source
            self._planner.add(source, key)
            self._peers.append(source)
        return list(self._peers)

    def _peer_news(self, key: str) -> None:
        """A node's follower has news (from its thread): the loop reads it with the next pass."""
        wake = self._wake
        if wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: shutting down
                wake([key])

    def _new_run_files(self, taken: Set[Path], event_files: List[Tuple[Path, Path]],
                       ) -> List[Tuple[Path, Path, Optional[Format], str, Optional[str]]]:
        """(key, path, forced format, id, run) of the files below the folders (`mstail DIR`) not followed yet and not
        in `taken` (named by a `--log` pattern too: the pattern's); a folder of event files is one source (its
        folder, as `_event_sources` makes it, with its (file, folder) pair added to `event_files`); a folder with
        nothing below it yet is said once."""
        if not self.config.logdirs:
            return []
        new: List[Tuple[Path, Path, Optional[Format], str, Optional[str]]] = []
        for run_file in self._runs.find():
            path = run_file.path
            if run_file.kind == "events":
                path, kind = event_source(path)
                self._event_kinds.setdefault(path.absolute(), kind or "")
                event_files.append((run_file.path.absolute(), path.absolute()))
            key = path.absolute()
            if key in self._sources or key in taken:
                continue
            taken.add(key)
            if run_file.confine is not None:
                self._confine[key] = run_file.confine
            forced = self._jsonl if run_file.kind == "jsonl" else self._forced if run_file.kind == "text" else None
            # claimed by `path` (a folder of event files: the folder, as the history keeps it), so a restart adopts it
            new.append((key, path, forced, self._namer.claim(path, run_file.names), run_file.run))
        for root in set(self._runs.empty) - self._said_empty:
            self._said_empty.add(root)
            log.warning("no run found below %s yet (%s); waiting for one to appear", root, NOTHING_YET)
        return new

    def _event_sources(self, found: List[Tuple[Path, Optional[Format]]],
                       ) -> Tuple[List[Tuple[Path, Optional[Format]]], List[Tuple[Path, Path]]]:
        """`found` with each event file named as such replaced by its folder (one source per folder of event files,
        `eventfollow`), and the (event file, folder key) pairs; the kinds learnt go to `_event_kinds` (key -> kind
        its names say, "" for a file known by its content)."""
        out, files = [], []
        for path, forced in found:
            key = path.absolute()
            if key not in self._sources or key in self._event_kinds:
                stands_for, kind = event_source(path)
                if kind is not None:
                    self._event_kinds.setdefault(stands_for.absolute(), kind)
                    files.append((key, stands_for.absolute()))
                    path = stands_for
            out.append((path, forced))
        return out, files

    def _restore(self, source: _Source, saved: SourceCheckpoint) -> None:
        """Resume a source at its checkpoint. Items emitted after the checkpoint were stored already: the parser
        emits them again from the same lines, and they are skipped. When a file the checkpoint was reading is
        gone, those lines cannot be read again, so nothing is skipped."""
        if not source.parser.restore(saved.parser):
            log.warning("%s: saved state names an unknown format; reading it from the start", source.id)
            return
        intact = source.follower.restore(saved.follower)
        source.skip = saved.emitted - saved.emitted_at if intact else 0
        source.snapshot = saved

    async def run(self, stop: asyncio.Event) -> None:
        """Tail until `stop` is set. An unexpected error ends one iteration, never the loop: it is said on
        stderr (once per kind and interval), counted for /healthz, and the loop goes on after a backoff."""
        watcher: Optional[asyncio.Task] = None
        roots: Set[Tuple[Path, bool]] = set()
        watcher_stop = asyncio.Event()
        changes = Changes()  # made here: on Python 3.9 an Event binds to the loop current at creation
        pacer = Pacer(self.config.poll_s, self.config.safety_poll_s)
        backoff = FAILURE_BACKOFF_S
        roots_seen = -math.inf  # monotonic time the watch roots were last worked out (a stat or so per pattern)
        self._wake = _Coalesced(asyncio.get_running_loop(), changes)
        self.running = True
        try:
            while not stop.is_set():
                try:
                    if self.config.poll_s is None and time.monotonic() - roots_seen >= self.config.safety_poll_s:
                        roots_seen = time.monotonic()  # not every pass: a sweep's period is soon enough
                        current_roots = self._watch_roots() | self._runs.watch_roots()
                        if current_roots != roots:  # a directory appeared: watch closer to the files
                            if watcher is not None:
                                watcher_stop.set()
                                await watcher
                            watcher_stop = asyncio.Event()
                            roots = current_roots
                            watcher = asyncio.create_task(
                                watch_directories(roots, changes, watcher_stop, self.config.watch_step_ms)
                            )
                            pacer.full_pass_next()  # what changed while no watcher looked
                    more = await self.pass_once(pacer.plan(changes))
                    backoff = FAILURE_BACKOFF_S
                    if more:
                        continue
                    await self._sleep(stop, changes.event, pacer.timeout())
                except Exception as exc:  # noqa: BLE001 - the last line of defence: report, back off, go on
                    self._loop_failed(exc, f"going on in {backoff:g} s")
                    await self._wait(stop, backoff)
                    backoff = min(backoff * 2, 30.0)
        finally:
            self.running = False
            self.stop_catch_ups()
            watcher_stop.set()
            if watcher is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            for source in self._sources.values():
                source.follower.close()

    def _loop_failed(self, exc: Exception, then: str) -> None:
        """A pass that failed unexpectedly: said on stderr (once per kind and interval) and counted for /healthz."""
        self.failures += 1
        self.last_failure = f"{type(exc).__name__}: {exc}"
        self._pass_started = None
        self.notices.say(("loop", type(exc)), f"tailing failed ({self.last_failure}); {then}", logging.ERROR)
        log.debug("tailing failure", exc_info=True)

    def read_ahead(self) -> None:
        """Read the first pass now, before the server is set up (`serve`: the web's imports take most of a second),
        so that a big history's catch-up child (started at the end of a file's first pass) parses meanwhile. Its
        items wait for the first `pass_once`, which delivers them instead of reading (after the alert rules'
        state is back: the rules see the old records first). Before `run` only, from the thread that runs it."""
        try:
            self._ahead = self._read_pass(time.time())
        except Exception as exc:  # noqa: BLE001 - as a pass's failure in `run`: said, counted; its passes read on
            self._loop_failed(exc, "going on")

    async def pass_once(self, plan: Optional[Plan] = None) -> bool:
        """One read pass; True when some file had more to read than the pass took. `plan` (file events on)
        narrows it to the files that changed or have something due (`mstail.tailer.live.planner`); None (default)
        reads every file. The first delivers `read_ahead`'s pass, if there was one."""
        self._pass_started = time.monotonic()
        self._plan = plan
        if self._ahead is not None:
            (results, more), self._ahead = self._ahead, None
        else:
            results, more = await asyncio.to_thread(self._read_pass, time.time())
        self._deliver(results)
        now = time.time()
        for source, _ in results:
            source.shown_state = self._state(source, source.id, now)
        self._pass_started = None
        self.passes += 1
        self._report(source for source, _ in results)
        return more

    @staticmethod
    async def _wait(stop: asyncio.Event, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)

    def health(self) -> Dict[str, Any]:
        """Facts for /healthz; `problems` lists what a person must know (tailing stopped or stalled, history
        not written), and makes /healthz answer 503."""
        problems = []
        if not self.running:
            problems.append("tailing has stopped")
        if self._pass_started is not None and time.monotonic() - self._pass_started > STALL_S:
            problems.append(f"a read pass has been running for {time.monotonic() - self._pass_started:.0f} s")
        db = self.store.db
        if db.write_error is not None:
            problems.append(f"the history cannot be written ({db.write_error}); {db.unsaved} items kept in memory")
        out = {"passes": self.passes, "tailing_failures": self.failures, "last_tailing_failure": self.last_failure,
               "unsaved": db.unsaved, "problems": problems, "waiting_for_runs": [str(f) for f in self._runs.empty],
               "unmatched_patterns": list(self._unmatched.values())}
        if self.config.peers:
            out["peers"] = [source.follower.health() for source in self._peers]  # type: ignore[attr-defined]
        return out

    async def _sleep(self, stop: asyncio.Event, wake: asyncio.Event, timeout: float) -> None:
        if self._planner.holding:
            timeout = min(timeout, self.config.grace_s)
        if self._push_due and self.config.poll_s is None:  # counts held back go out when due, not with the next
            # sweep; a pass for all that are due then, at most every SOURCE_PUSH_S (due times spread over the second:
            # a pass per entry would spin). Polling (`--poll`) sends them with its passes (an early one reads all).
            due = max(self._push_due[0][0], self._delivered + SOURCE_PUSH_S)
            timeout = min(timeout, max(0.0, due - time.monotonic()))
        waiters = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stop.wait())]
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    def _read_pass(self, now: float) -> Tuple[List[Tuple[_Source, List[Item]]], bool]:
        """Read every source in rounds of at most `READ_SLICE` bytes each until all are drained, each reached
        `read_budget_bytes`, or the pass (reading, plus storing what it read at the measured cost per item)
        would run over `pass_time_s`: a quiet file's new lines are read in the first round of every pass, so
        they wait for about one short pass however much a flooding file has queued. Files still reading their
        history come after the live ones, those read longest ago first, each only while the pass has time: a
        first pass over 1,024 files once parsed 64 KiB of every one before it looked at the clock (seconds, with
        the records of all of them in memory at once: 0.9 GB)."""
        start = time.monotonic()
        budget = self.config.read_budget_bytes
        sources = [s for s in self._choose(start, now) if s.failed_until <= start]
        # Only the sources this pass reads are touched (`_begin`, on their first round): a thousand files waiting
        # for their history's turn are passed over by every short pass and cost it nothing but their place in the
        # turns (their parsers asked whether they hold a record, a list for their items each: 2-7 ms a pass).
        items: Dict[_Source, List[Item]] = {}  # the sources read so far in this pass (and a catch-up child's)
        taken: Dict[_Source, int] = {}
        more = False  # some file has more than its budget allowed: the next pass starts at once
        bulk = [s for s in sources if s.catch_up is not None]  # their history comes from a child (`_take_batches`)
        for source in bulk:
            _begin(source, items, taken)
        unfinished = sorted((s for s in sources if s.catch_up is None),
                            key=_turn)  # stable: the live ones keep their order
        parsed = 0  # the items this pass has parsed so far
        history_read = False  # one file's history is read in every pass, so a flooding live file cannot stall them
        out_of_time = False

        def over_time(limit: float) -> bool:
            return time.monotonic() - start + parsed * self._deliver_s_per_item >= limit

        while unfinished and not out_of_time:
            behind = []
            for index, source in enumerate(unfinished):
                catching_up = not source.caught_up
                if catching_up:
                    if history_read and over_time(max(HISTORY_PASS_S, self.config.pass_time_s)):
                        behind += unfinished[index:]  # not read this round: first in the next pass
                        out_of_time = True
                        break
                    source.history_turn, history_read = self.passes, True
                if source not in items:
                    _begin(source, items, taken)
                allowance = min(CATCH_UP_SLICE if catching_up else READ_SLICE, budget - taken[source])
                its = items[source]
                before, had = source.follower.counters["bytes"], len(its)
                try:
                    pieces = source.follower.read(allowance, now, blocks=catching_up)
                except Exception as exc:  # noqa: BLE001 - one file's trouble must not stop the others
                    self._source_failed(source, exc)
                    continue
                failed = partial(self._line_failed, source)
                for piece in pieces:
                    its += items_of(source.parser, piece, now, failed)
                parsed += len(its) - had
                got = source.follower.counters["bytes"] - before
                if got < allowance and not source.caught_up:
                    source.caught_up = True  # at the end of what there is: what comes next is live
                    current = source.follower.current
                    source.live_from_line = current.splitter.next_number if current is not None else None
                taken[source] += got
                if got >= allowance:  # it may have more
                    if taken[source] < budget:
                        behind.append(source)
                    else:
                        more = True
            unfinished = behind
            out_of_time = out_of_time or over_time(self.config.pass_time_s)
        results = []
        read = [s for s in sources if s in items]  # in the order chosen; the others wait for their turn, untouched
        for source in read:
            try:
                finished = items[source] if source in bulk else self._finish_pass(source, items[source], now)
                results.append((source, finished))
            except Exception as exc:  # noqa: BLE001 - as for a line: this source's pass is lost, not the others'
                self._source_failed(source, exc)
        waiting = not any(items.values())
        for source in bulk:
            try:
                results.append((source, self._take_batches(source, BULK_WAIT_S if waiting else 0.0)))
            except Exception as exc:  # noqa: BLE001 - as for a pass's end: this source's trouble, not the others'
                self._source_failed(source, exc)
        self._planner.settle(read, unfinished + bulk + [s for s, got in taken.items() if got >= budget], _holds)
        return results, more or bool(unfinished) or bool(bulk)

    def _take_batches(self, source: _Source, wait_s: float) -> List[Item]:
        """The items of the batches a source's catch-up child has sent (as many as `pass_time_s` of storing takes,
        as a pass reads: live files wait for them at most once), waiting up to `wait_s` for the first; the newest
        resume point delivered is the source's snapshot. When the child is done, the source's own follower and
        parser take over from there (`_hand_over`)."""
        catch_up = source.catch_up
        assert catch_up is not None
        limit = max(1, int(self.config.pass_time_s / self._deliver_s_per_item))
        items: List[Item] = []
        for batch in catch_up.take(limit, wait_s):
            items += batch.items  # amends joined to their records in the child, batch by batch
            for number, error in batch.failures:
                self._line_failed(source, number, RuntimeError(error))
        source.prepared = True
        source.snapshot = catch_up.resume
        if catch_up.done:
            self._hand_over(source)
        return items

    def _hand_over(self, source: _Source) -> None:
        """A finished (or stopped) catch-up child: the source resumes at the newest checkpoint it delivered, as after
        a restart (with a new follower; what was stored after that checkpoint is skipped when read again)."""
        catch_up = source.catch_up
        assert catch_up is not None
        catch_up.stop()
        source.catch_up = None
        self._children -= 1
        if catch_up.failed is not None:
            source.no_child = True
            self.notices.say((source.id, "catch-up"), f"{source.follower.path}: the process reading its history ended "
                             f"early ({catch_up.failed}); reading on from where it got to", logging.WARNING)
        follower = source.follower
        source.follower = source.kind.follower(source.spec)
        follower.close()
        self._restore(source, catch_up.hand_over())

    def _start_catch_up(self, source: _Source, now: float) -> None:
        """Hand a source's history to a child process (`tailer.catchup`) when it still has BULK_MIN_BYTES to read
        and fewer children than spare CPUs run; called at the end of its pass, at a resume point."""
        if (source.caught_up or source.catch_up is not None or source.no_child or source.skip or source.snapshot is None
                or not eligible(source.kind, source.follower, source.parser) or left_to_read(source.follower) < BULK_MIN_BYTES):
            return
        if self._children >= children_allowed():
            return
        try:
            source.catch_up = CatchUp(source.follower, source.parser, source.snapshot, now,
                                      source.kind.parser(source.spec))
            self._children += 1
        except (OSError, ValueError) as exc:  # no fork (EAGAIN, ENOMEM; no fork start method): the passes read it
            self.notices.say(("catch-up", type(exc)), f"cannot start a process for a file's history ({exc}); reading "
                             "it in the passes", logging.WARNING)

    def stop_catch_ups(self) -> None:
        """End the catch-up children (at shutdown): the committed history resumes where their last batch ended."""
        for source in self._sources.values():
            if source.catch_up is not None:
                source.catch_up.stop()
                source.catch_up = None
                self._children -= 1

    def _choose(self, start: float, now: float) -> List[_Source]:
        """Look for new files when that is due, and pick the sources this pass reads (`mstail.tailer.live.planner`);
        `start` is monotonic, `now` wall time."""
        if self._planner.discovery_due(self._plan, start):
            self.discover()
        self._refresh_writers(start)
        rotations = self._plan is None or self._plan.rotations
        return self._planner.choose(self._sources.values(), self._plan,
                                    lambda source: self._stale(source, now, rotations))

    def _stale(self, source: _Source, now: float, rotations: bool) -> bool:
        """Whether a sweep reads a source events did not name: a stat shows news (`rotations`: of its path, else of
        its open file if it got data in the last QUIET_S), or its state changed with time."""
        last = source.follower.last_data_time
        quiet = last is None or now - last >= QUIET_S
        return (source.follower.may_have_news(rotations, quiet)
                or self._state(source, source.id, now) != source.shown_state)

    def _source_failed(self, source: _Source, exc: Exception) -> None:
        source.failures += 1
        source.failed_until = time.monotonic() + FAILURE_BACKOFF_S
        self.notices.say((source.id, "read", type(exc)), f"{source.follower.path}: reading failed "
                         f"({type(exc).__name__}: {exc}); trying again", logging.ERROR)

    def _line_failed(self, source: _Source, number: int, exc: Exception) -> None:
        source.failures += 1
        self.notices.say((source.id, "parse", type(exc)), f"{source.follower.path}:{number}: line skipped, the "
                         f"parser failed on it ({type(exc).__name__}: {exc})", logging.ERROR)

    def _finish_pass(self, source: _Source, items: List[Item], now: float) -> List[Item]:
        """Flush what waited too long, drop items stored before a restart, note a resume point, join the amends
        whose record is in this pass to it (a step line and its progress line, read together, go out as one)."""
        parser = source.parser
        items += parser.flush(now)
        if source.skip:
            dropped = min(source.skip, len(items))
            source.skip -= dropped
            items = items[dropped:]
        if not parser.holding:
            source.snapshot = SourceCheckpoint(source.follower.checkpoint(), parser.snapshot_json(),
                                               emitted_at=parser.emitted)
            self._start_catch_up(source, now)
        return fold_amends(items)

    def _deliver(self, results: List[Tuple[_Source, List[Item]]]) -> None:
        started = self._delivered = time.monotonic()
        self._deliver_items(results)
        count = sum(len(items) for _, items in results)
        if count >= 100:  # a moving average of the cost per item, which the next passes plan with
            cost = (time.monotonic() - started) / count
            self._deliver_s_per_item = 0.8 * self._deliver_s_per_item + 0.2 * cost

    def _deliver_items(self, results: List[Tuple[_Source, List[Item]]]) -> None:
        now = time.time()
        push_now, push_every = time.monotonic(), self._push_every()
        batch = []
        sent: Dict[int, str] = {}  # seq -> the JSON the stream sends for an item stored (`ItemsMessage.texts`)
        self._learn_remote(source for source, _ in results)
        for source, items in results:
            for source_id, parser, part_items in _by_part(source, items):
                info = self.store.add_source(source_id, visible(str(source.follower.source_path)))
                old_state = info.state
                info.format = parser.format.name if parser.format else None
                evidence = self._see(source, source_id, part_items)
                info.total_steps = parser.meta.get("total_steps") or evidence.total or info.total_steps
                # while a child reads the history, its counts: the source's follower and parser wait at the resume point
                counts = source.catch_up.counts if source.catch_up is not None and source_id == source.id else None
                if isinstance(parser, PeerPart) and source_id != source.id:
                    counts = parser.counts  # a node's source: the node's counters
                counts = counts or {**source.follower.counters, **parser.counts}
                info.counters = {**counts, "failures": source.failures}
                info.problem = source.follower.problem or (
                    source.missing if source.follower.state == "waiting" else None) or (
                    _hint(source.follower.path, parser.counts)
                    if parser.format is None and parser.counts["unmatched_metric_lines"] else None) or (
                    GUESSED_STEPS if parser.meta.get("steps_per_epoch") == "guessed" else None) or (
                    EPOCH_STEPS if parser.meta.get("x_axis") == "epoch" else None)
                info.hang_rule = "time bound" if source.remote else "writer"
                info.run = source.run
                if isinstance(parser, PeerPart):
                    _describe_peer(source, source_id, parser, info)
                if self.alerts is not None:
                    self.alerts.peers(source_id, info.run, info.format)
                if part_items:
                    # a catch-up child's items come prepared (it never hands over launcher-tagged parts)
                    stored, texts = self.store.add(source_id, part_items, source.prepared and source_id == source.id)
                    batch += stored
                    sent.update(texts)
                    if self.alerts is not None:  # the rules judge whole records and events; amends are not theirs
                        observed = [item for item in part_items if item.kind != "amend"]
                        history = ([True] * len(observed) if source.in_history  # the pass reads history: all of it
                                   else [self._history(source, item) for item in observed])
                        changes = self.alerts.observe_all(
                            source_id, [data for data in stored if data.get("kind") != "amend"], now, history)
                        batch += self._store_alerts(source_id, changes)
                info.state = self._state(source, source_id, now)
                if info.state != old_state:
                    batch += self._store_alerts(source_id, self._fate_changed(source, source_id, info, now))
                self._push_source(info, info.state != old_state, push_now, push_every)
        self._push_held(push_now, push_every)
        if self.alerts is not None and self._tick_due():
            states, infos = {}, self.store.sources
            for source in self._sources.values():
                for source_id in _ids(source):
                    known = infos.get(source_id)
                    if known is not None:
                        states[source_id] = known.state
            for change in self.alerts.tick(now, states, self._writing):
                batch += self._store_alerts(change["source"], [change])
        checkpoints = self._checkpoints(results)
        if self._children and time.monotonic() - self._committed < HISTORY_COMMIT_S:
            self.store.queue(checkpoints)  # committed with the next delivery's (a child's batches come pass by pass)
        else:
            self.store.commit(checkpoints)
            self._committed = time.monotonic()
        if self._pushing:
            self.hub.publish(SourceMessage(self._pushing))
            self._pushing = []
        if batch:
            self.hub.publish(ItemsMessage(batch, sent))

    def _see(self, source: _Source, source_id: str, items: List[Item]) -> RunEvidence:
        """Take what a pass's items say of how a source's run ends (its events; lines written live: its end is
        watched)."""
        evidence = self._evidence.get(source_id)
        if evidence is None:
            evidence = self._evidence[source_id] = RunEvidence()
        for item in items:
            if item.kind == "event":
                evidence.see(item.data)
        if not source.witnessed and any(not self._history(source, item) for item in items):
            source.witnessed = True  # (lines the parser held back at the end of the history, flushed later, are not)
        return evidence

    def _fate_changed(self, source: _Source, source_id: str, info: Any, now: float) -> List[Dict[str, Any]]:
        """A source's state changed: into a fate (its reason on the source; the alert engine told: a death seen
        while mstail watched raises the `died` alert), or out of one (the run goes on: a new run in the same file)."""
        ending = self._fate(source, source_id, now) if info.state in FATES else None
        info.end_reason, info.end_guessed = (ending[1], ending[2]) if ending is not None else (None, False)
        if self.alerts is None or (ending is None and info.state not in ("following", "idle")):
            return []
        if ending is None:
            return self.alerts.fate(source_id, None, "", None, now)
        return self.alerts.fate(source_id, ending[0], ending[1], info.last_step, now, ending[2],
                                source.witnessed or self._written_since_start(source))

    def _written_since_start(self, source: _Source) -> bool:
        """Whether the file was written after mstail started (a run that began and ended between two looks for its
        writer, or a file found late, still ended while mstail watched); a log untouched since is old news."""
        try:
            return os.stat(source.follower.path).st_mtime >= self._began
        except OSError:
            return False

    def _tick_due(self) -> bool:
        """The time-based alert rules look at every source: not more often than ALERT_TICK_S, and with many sources
        less often (ALERT_TICK_S x sources / ALERT_TICK_SHARE, at most ALERT_TICK_MAX_S)."""
        every = min(ALERT_TICK_MAX_S, ALERT_TICK_S * max(1.0, len(self.store.sources) / ALERT_TICK_SHARE))
        if time.monotonic() - self._ticked < every:
            return False
        self._ticked = time.monotonic()
        return True

    def _push_every(self) -> float:
        """How long a source's changed counts wait after its last entry (`_push_source`)."""
        scaled = SOURCE_PUSH_S * max(1.0, len(self.store.sources) / SOURCE_PUSH_SHARE)
        return min(SOURCE_PUSH_MAX_S - SOURCE_PUSH_S, scaled)

    def _push_held(self, now: float, every: float) -> None:
        """Send the counts held back before whose time has come (of sources this pass may not have read): a
        look at the few that are due, not at every source held back (a thousand at a thousand sources)."""
        due = self._push_due
        while due and due[0][0] <= now:
            _, source_id = heapq.heappop(due)
            if source_id in self._unpushed:  # else sent since, with a pass that read it
                self._unpushed.discard(source_id)
                if source_id in self.store.sources:
                    self._push_source(self.store.sources[source_id], False, now, every)  # held again: wait grew

    def _push_source(self, info: Any, changed_state: bool, now: float, every: float) -> None:
        """Send a source's entry to the stream's clients (in this delivery's one `SourceMessage`): at once when its
        state changed, else when its counts changed and it was last sent SOURCE_PUSH_S (scaled by the number of
        sources, at most SOURCE_PUSH_MAX_S - SOURCE_PUSH_S) ago; a change held back goes out with a later pass, which
        the loop runs when it is due (`_sleep`, within SOURCE_PUSH_S), so the counters are at most SOURCE_PUSH_MAX_S
        behind. `now` (monotonic) and `every` (`_push_every`) are the delivery's, worked out once for all sources."""
        counts = (info.records, info.counters.get("lines"), info.counters.get("bytes"), info.problem, len(info.metrics),
                  info.last_step, info.format)
        sent_at, sent = self._pushed.get(info.id, (-math.inf, None))
        if changed_state or (counts != sent and now - sent_at >= every):
            self._pushed[info.id] = (now, counts)
            self._unpushed.discard(info.id)
            self._pushing.append(info.as_json())
        elif counts != sent and info.id not in self._unpushed:
            self._unpushed.add(info.id)
            heapq.heappush(self._push_due, (sent_at + every, info.id))

    def _checkpoints(self, results: List[Tuple[_Source, List[Item]]]) -> Dict[str, Tuple[str, SourceCheckpoint]]:
        """What to commit with this pass's items: each source's newest snapshot and how many items it emitted."""
        out = {}
        for source, _items in results:
            if source.snapshot is not None:
                snapshot = source.snapshot
                checkpoint = SourceCheckpoint(snapshot.follower, snapshot.parser_json, snapshot.emitted_at,
                                              _emitted(source))
                if checkpoint != source.committed:  # an idle source costs no write
                    out[source.id] = (visible(str(source.follower.source_path)), checkpoint)
                    source.committed = checkpoint
        return out

    def _store_alerts(self, source_id: str, changes: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """Alert changes become events with a seq (SSE replay covers them); listeners hear the notable ones."""
        if not changes:
            return []
        stored = self.store.add(source_id, [Item("event", change) for change in changes]).items
        for data in stored:
            if data.get("notify"):
                for listener in self.alert_listeners:
                    try:
                        listener(data)
                    except Exception:  # a listener must never stop tailing (said by log.exception)
                        log.exception("alert listener failed")
        return stored

    def _report(self, sources: Iterable[_Source]) -> None:
        """Say on stderr what a person watching needs to know, once each, of the `sources` a pass read: a file
        found (and its format), a file that cannot be read, lines that look like metrics but match no format;
        and a `--log` folder that does not exist, the history failing to be written (and written again)."""
        for source in sources:
            path, parser = source.follower.path, source.parser
            if source.kind is PEER:
                continue  # its follower says what befalls the node (`inputs.peer`)
            if source.follower.problem is not None:
                self.notices.say((source.id, "unreadable"), f"{path}: cannot read it ({source.follower.problem}); "
                                 "it is skipped until it can be")
                continue
            self.notices.forget((source.id, "unreadable"))
            if source.follower.state == "waiting":
                continue
            fmt = parser.format.name if parser.format is not None else ""
            if source.said_format is None:
                log.info("%s -> %s, %s", path, source.id, f"format {fmt}" if fmt else "no format yet")
            elif fmt and fmt != source.said_format:
                log.info("%s: format %s", source.id, fmt)
            source.said_format = fmt
            if parser.overflow_lines:  # type: ignore[attr-defined]  # a text kind's parser
                self.notices.say((source.id, "tags"), f"{path}: more than {MAX_PARTS} launcher tags ([rankN]:); the "
                                 "lines of the others are parsed as the file's own source")
            if not fmt and parser.counts["unmatched_metric_lines"]:
                self.notices.say((source.id, "no format"), f"{source.id}: {_hint(path, parser.counts)}", logging.INFO)
        self._report_missing()
        error = self.store.db.write_error
        if error != self._write_error:
            if error is not None:
                log.error("cannot write the history (%s): %d items kept in memory, retrying until it can be written",
                          error, self.store.db.unsaved)
            else:
                log.warning("the history is written again; nothing was lost")
            self._write_error = error

    def _report_missing(self) -> None:
        """Once per pattern, MISSING_AFTER_S after the start: a pattern that names no file is most often a typo. Its
        folder does not exist: name the nearest folder that does. A file named alone is absent from a folder that
        exists: name the nearest file there, on stderr and on its source's card (`_Source.missing`)."""
        if self._missing_checked or time.monotonic() - self.started < MISSING_AFTER_S:
            return
        self._missing_checked = True
        for pattern, _ in self._patterns:
            path = Path(pattern).expanduser()
            folder = glob_free_prefix(path.parent)
            if not folder.is_dir():
                log.warning("nothing at %s yet: %s does not exist (the nearest existing folder is %s); waiting",
                            pattern, folder, existing_ancestor(pattern))
                continue
            if has_glob(str(path)):
                self._report_unmatched(pattern)
                continue
            source = self._sources.get(path.absolute())
            if source is None or source.follower.state != "waiting" or path.exists():
                continue
            nearest = nearest_file(path)
            source.missing = f"no file {path.name} in {folder} after {MISSING_AFTER_S:g} s" + (
                f"; the nearest there is {nearest}" if nearest else f"; {folder} holds no file")
            log.warning("nothing at %s yet: %s; waiting", visible(pattern), visible(source.missing))
            self._planner.pending.add(source)  # its card says so with the next pass

    def _report_unmatched(self, pattern: str) -> None:
        """A glob that matches nothing MISSING_AFTER_S after the start (`rnak_*`): said once on stderr, with the
        nearest existing path, and listed on /healthz (`unmatched_patterns`) until a file it names appears."""
        if expand(pattern, self._followed):
            return
        nearest = nearest_path(pattern)
        self._unmatched[pattern] = f"nothing matches {visible(pattern)} after {MISSING_AFTER_S:g} s" + (
            f"; the nearest existing path is {visible(str(nearest))}" if nearest else "")
        log.warning("%s; waiting", self._unmatched[pattern])

    @staticmethod
    def _history(source: _Source, item: Item) -> bool:
        """Whether an item comes from what the file held before mstail caught up with it."""
        if source.in_history:
            return True
        line = item.data.get("line")
        return isinstance(line, int) and source.live_from_line is not None and line < source.live_from_line

    def _writing(self, source_id: str) -> Optional[bool]:
        """Whether a process still holds the source's file open for writing (as `_refresh_writers` last saw it);
        None when that cannot be seen (a network filesystem written from other nodes, another user's processes)."""
        source = self._by_id.get(source_id) or self._by_id.get(source_id.rpartition("/")[0])  # a tagged part's file
        if source is None:
            source = self._by_id.get(source_id.partition("/")[0])  # a node's source (`NODE/<id>`)
        if source is not None and source.kind is PEER:
            part = source.parser.parts.get(source_id[len(source.id) + 1:])
            return part.writing() if part is not None else None  # as the node sees its writers
        return None if source is None else self._source_writing(source)

    @staticmethod
    def _source_writing(source: _Source) -> Optional[bool]:
        """`_writing` of a source in hand."""
        if source.follower.current is None or source.writer_seen is None:
            return None
        return source.writer_seen[1]

    @staticmethod
    def _learn_remote(sources: Iterable[_Source]) -> None:
        """Whether each source's file is on a network filesystem, where writers on other nodes are not seen: asked
        once per file, with one read of the mount table for all the files still unknown."""
        unknown = [s for s in sources if s.remote is None]
        if not unknown:
            return
        try:
            with open(MOUNTINFO, encoding="utf-8", errors="replace") as handle:
                mounts = parse_mountinfo(handle.read())
        except OSError:
            mounts = []
        for s in unknown:
            s.remote = network_fs(s.follower.path, mounts) is not None

    def _refresh_writers(self, now: float) -> None:
        """Keep what /proc says of each local file's writers current (`now`: monotonic), at a bounded cost, at most
        every WRITER_PULSE_S (not a walk over every source at every pass): the processes seen writing are asked
        whether they still run (a read each); a full look
        (a stat per open fd on the machine, for every due file at once) is taken for a file not looked at yet or
        replaced (rotation), whose writers all exited, and every WRITER_CHECK_S for one with no writer seen or silent
        for ENDED_AFTER_S, until its run's fate is judged."""
        if now - self._pulsed < WRITER_PULSE_S:
            return
        self._pulsed = now
        files = [s for s in self._sources.values() if s.follower.current is not None]
        self._learn_remote(files)
        local = [s for s in files if not s.remote]
        alive = running(set().union(*(s.holders for s in local)))
        wall = time.time()
        due = []
        for s in local:
            last = s.follower.last_data_time
            if s.left_at is not None and last is not None and last > s.left_at:
                s.left_at = last  # written since its writers left: is another writing it now? (once per new data)
                due.append(s)
            elif s.writer_seen is None or s.writer_file != s.follower.current.identity:
                due.append(s)
            elif s.holders and not s.holders <= alive:
                if s.holders & alive:
                    s.holders = frozenset(s.holders & alive)
                else:
                    due.append(s)  # every writer seen has exited: has another taken over?
            elif (s.left_at is None and now - s.writer_seen[0] >= WRITER_CHECK_S and s.shown_state not in FATES
                  and (not s.holders or last is None or wall - last >= ENDED_AFTER_S)):
                due.append(s)
        if due:
            self._look_for_writers(due, now, wall)

    @staticmethod
    def _look_for_writers(due: List[_Source], now: float, wall: float) -> None:
        """One look at /proc for the writers of every `due` file: who holds it open for writing, and whether those
        seen before have exited (then its writers left, at `wall`) or only closed it."""
        found, blind = holders_of({s.follower.current.identity for s in due})
        for s in due:
            identity = s.follower.current.identity
            holders = found[identity]
            if holders:
                s.holders, s.left_at, s.witnessed = holders, None, True
            else:
                if s.writer_file == identity and s.holders and not running(s.holders):
                    s.left_at = wall
                s.holders = frozenset()
            status = True if holders else False if not blind or s.left_at is not None else None
            s.writer_seen, s.writer_file = (now, status), identity

    def _fate(self, source: _Source, source_id: str, now: float) -> Optional[Tuple[str, str, bool]]:
        """(fate, why, guessed) of a source's run once it is over (`tailer.fate`), else None: it logged its end, or
        its writer left (seen leaving; or silent ENDED_AFTER_S with nobody seen writing it; or, where writers cannot
        be seen, silent past the hang bound: a guess). Not before its lines are all read and parsed."""
        info = self.store.sources.get(source_id)
        if info is None or not source.caught_up or source.parser.holding:
            return None
        if source.kind is PEER:  # as the node judged it
            part = source.parser.parts.get(source_id[len(source.id) + 1:])
            return part.fate() if part is not None else None
        last = source.follower.last_data_time
        silent = now - last if last is not None else 0.0
        seen = self._source_writing(source)
        guess = seen is None and source.left_at is None and silent >= self._silence_bound(source_id)
        left = source.left_at is not None or (seen is False and silent >= ENDED_AFTER_S) or guess
        evidence = self._evidence.get(source_id) or _NO_EVIDENCE
        verdict = judge(evidence, info.last_step, info.total_steps, info.format == "jsonl", left)
        if verdict is None:
            return None
        return verdict[0], verdict[1], guess and not evidence.standing_end(info.last_step)  # an end logged is no guess

    def _silence_bound(self, source_id: str) -> float:
        """How long a source whose writers cannot be seen must be silent before its run is guessed over: the hang
        bound (the hang rule fires then too, for a run that did not finish)."""
        return self.alerts.hang_bound(source_id) if self.alerts is not None else float(DEFAULT_RULES["hang"]["min_s"])

    def _state(self, source: _Source, source_id: str, now: float) -> str:
        """following | idle | its run's fate (finished, died, stopped: `_fate`) | the follower's own state (waiting,
        gone, unreadable)."""
        follower = source.follower
        if source.kind is PEER and source_id != source.id:
            part = source.parser.parts.get(source_id[len(source.id) + 1:])
            return part.state if part is not None else "waiting"  # the node's word (its last, while unreachable)
        if follower.state != "following":
            return follower.state
        ending = self._fate(source, source_id, now)
        if ending is not None:
            return ending[0]
        last = follower.last_data_time
        silent = now - last if last is not None else 0.0
        if silent >= self.config.idle_after_s:
            return "idle"
        return "following"


_NO_EVIDENCE = RunEvidence()


class _Coalesced:
    """Wake-ups from other threads (node mstails' news, `Tailer._peer_news`) handed to the loop's `Changes` at most
    every PEER_WAKE_S."""

    def __init__(self, loop: asyncio.AbstractEventLoop, changes: Changes) -> None:
        self._loop, self._changes = loop, changes
        self._paths: Set[str] = set()

    def __call__(self, paths: List[str]) -> None:
        """From any thread."""
        self._loop.call_soon_threadsafe(self._gather, paths)

    def _gather(self, paths: List[str]) -> None:
        if not self._paths:
            self._loop.call_later(PEER_WAKE_S, self._hand_over)
        self._paths.update(paths)

    def _hand_over(self) -> None:
        paths, self._paths = self._paths, set()
        self._changes.add(paths)


#: What a source whose global steps rest on a guessed epoch length says (`SourceParser._loss_monitor_step`).
GUESSED_STEPS = ("global steps are estimates: the log prints the step within the epoch but not how many steps an "
                 "epoch has (LossMonitor printing less than once an epoch, no TimeMonitor)")


def _holds(source: _Source) -> bool:
    return source.parser.holding


def _turn(source: _Source) -> Tuple[bool, int]:
    """A pass's order: the live files first, then those reading their history, the one read longest ago first."""
    return not source.caught_up, source.history_turn


def _begin(source: _Source, items: Dict[_Source, List[Item]], taken: Dict[_Source, int]) -> None:
    """A source's first read in a pass (`Tailer._read_pass`): its items and bytes taken start empty, and whether they
    are history is fixed for the pass."""
    source.in_history = not source.caught_up
    source.prepared = False  # set again by `_take_batches` for the batches of this pass
    items[source], taken[source] = [], 0


def _emitted(source: _Source) -> int:
    """The items a source has stored: its catch-up child's, or its parser's and those it will skip when it reads
    them again (after a restart or a hand-over), so that a checkpoint taken meanwhile skips them too."""
    return source.catch_up.emitted if source.catch_up is not None else source.parser.emitted + source.skip


#: What a source says whose records are epoch summaries read by the generic reader (`SourceParser._global_step`).
EPOCH_STEPS = "the x axis counts epochs: the log prints one summary line per epoch, no step counter"


def _hint(path: Path, counts: Dict[str, int]) -> str:
    return no_format_hint(path, counts["unmatched_metric_lines"])


def _ids(source: _Source) -> List[str]:
    """The source ids of a file: its own, and one per launcher-tagged part seen in it (`ID/rank3`)."""
    parts = source.parser.parts
    return [source.id, *(_part_id(source, name) for name in parts)] if parts else [source.id]


def _describe_peer(source: _Source, source_id: str, part: PeerPart, info: Any) -> None:
    """A node's source (`NODE/<id>`) as the node describes it; the node's own entry: its URL and what befalls it."""
    follower = source.follower
    assert isinstance(follower, PeerFollower)
    if source_id != source.id:
        part.describe(info, source.id)
        return
    info.hang_rule = None
    info.problem = follower.problem or follower.reset_said


def _part_id(source: _Source, name: str) -> str:
    return f"{source.id}/{name}"


def _by_part(source: _Source, items: List[Item]) -> List[Tuple[str, Any, List[Item]]]:
    """(source id, parser, items) for a file's own source and for each launcher-tagged part seen in it
    (`ID/rank3`), with or without new items, so every part's state and counters stay current; of a node mstail's
    sources those with items or news (`PeerParser.take_touched`)."""
    if source.kind is PEER:
        follower, peer = source.follower, source.parser
        assert isinstance(follower, PeerFollower) and isinstance(peer, PeerParser)
        parts: Mapping[str, Any] = peer.take_touched(everything=follower.take_state_news())
    else:
        parts = source.parser.parts
    out: Dict[Optional[str], Tuple[str, Any, List[Item]]] = {None: (source.id, source.parser.main, [])}
    out.update({name: (_part_id(source, name), parser, []) for name, parser in parts.items()})
    for item in items:
        out[item.data.pop(PART_KEY, None)][2].append(item)
    return list(out.values())
