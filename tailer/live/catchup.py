"""A big history parsed in a process of its own, handed over to the live follower at a resume point.

What a file holds when mstail reaches it (a run that has been logging for days) would keep the tailer's pass thread
busy for tens of seconds, one 64 KiB round at a time, beside the live files. When a file that is catching up still
has at least BULK_MIN_BYTES to read, the tailer forks: the child continues with copies of that file's follower and
parser, exactly where the parent's stopped (a pass end where the parser held nothing: a resume point), reads up to
the size the file had then in blocks of BULK_BLOCK_BYTES through the same `items_of` (`inputs.kind`) as a pass
and sends, block by block, the items it got and a `SourceCheckpoint` where its parser held nothing after the block
(written to the pipe by a thread of its own, `_Sender`, so that it parses on while the parent takes none).
The parent stores each batch as a pass's items and commits it with that checkpoint (or, inside a multi-line event,
with the resume point before it and the count of items emitted since: a restart skips those), so the history a
restart finds is always one the line-by-line path would have committed. When the child is done (or stopped early:
a launcher-tagged line, whose part the parent has no source for yet; the file rotated; the child died), the
parent's follower and parser restore the newest checkpoint it delivered (the restart path) and go on live from
there, skipping what it already stored after that checkpoint.

A history of SPLIT_MIN_BYTES or more is parsed by two processes, as `mstail parse` parses a big file's pieces
(`tailer.offline.split`): the child forks a worker of its own that parses the second half with a fresh parser, notes
the places early in its half where its parser held nothing (`split.Probe`) and writes its batches to an unlinked spool
file (on disk, not in memory: they wait there until their turn). The child parses the first half, sending its batches
as before, reads on past the middle up to the first of those places where its parser is in the state the worker's was
(the seam: from there both give the same items), and then sends the worker's batches after that place, its run
segments, counts and checkpoints carried on from the child's own (`_Carry`), so the parent stores the file in its order
and every checkpoint is one a single process would have taken. Where no place agrees (or the worker failed before the
seam), the child parses the second half itself.

The child inherits the formats (compiled regexes, closures: not picklable) by fork, as `mstail parse`'s workers do,
and touches nothing but its copies of the follower and parser and its end of the pipe; it leaves with `os._exit`,
so nothing of the parent's (the SQLite connection, uvicorn) is finalised twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import multiprocessing
import os
import pickle
import queue
import signal
import struct
import tempfile
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from mstail.parsers import Item
from mstail.parsers.amends import fold_amends

from mstail.tailer.inputs.checkpoint import FollowerCheckpoint, SourceCheckpoint
from mstail.tailer.inputs.kind import Follower, InputKind, Parser, items_of
from mstail.tailer.history.store import prepare
from mstail.tailer.offline import split
from mstail.tailer.offline.parallel import _usable_cpus, _worker_init  # `mstail parse`'s: a forked helper's set-up

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

#: a file catching up with at least this much left to read is parsed by a child process (smaller ones are read by
#: the passes: a fork and its hand-over cost a few ms)
BULK_MIN_BYTES = 8 << 20
#: bytes the child reads and parses between two batches (about 80 steps of a MindFormers log): each batch is a
#: pickled message the parent decodes and stores in a few ms, and a resume point for a restart
BULK_BLOCK_BYTES = 128 << 10
#: the pipe's capacity asked for (Linux; at most /proc/sys/fs/pipe-max-size, 1 MiB by default): about 80 batches
#: in the pipe, so the parent's passes seldom wait for a half-written one
PIPE_BYTES = 1 << 20
#: batches the child may parse ahead of the parent (pickled, about 12 KB each: 1,024 are 128 MiB of log and ~13 MB of
#: the child's memory). The parent takes none while it imports the web part and starts the server (half a second
#: and more); a child that waited on the full pipe meanwhile lost that time on the way to the history's end.
AHEAD_BATCHES = 1024
#: the child's niceness above the sidecar's (19, the lowest priority, is as far as it goes): a history is bulk work, so
#: when CPUs are short the live files, the page (and the training job beside the sidecar) go first; on an idle CPU it
#: parses at full speed. Against 5, with a page opened during a catch-up on 2 cores (catch_up.py --page, 5 rounds
#: each): its first curves after a median 1.23 s against 1.66 s, live p99 307 against 493 ms, the history no later.
CHILD_NICE = 19
#: a child that sends no batch for this long (a block takes milliseconds) is stuck — a lock held by another of the
#: parent's threads at the fork, a filesystem that stopped answering —: it is stopped and the passes read on
STALL_S = 30.0
#: how long the child waits for its worker's places or its next spooled batch before it goes on without it (under
#: STALL_S: the parent must not take the wait for a stuck child)
WORKER_WAIT_S = STALL_S / 3
#: how long a child whose pipe closed is given to exit by itself (it is exiting) before `stop` kills it
EXIT_WAIT_S = 5.0
#: a history at least this big is parsed by the child and a worker of its own, half each (when the machine has two
#: CPUs or more): smaller ones do not pay for the seam (the child reads on about a checkpoint save's distance, 1-2 MB
#: of a MindFormers log, past the middle)
SPLIT_MIN_BYTES = 64 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Python 3.10+ names it
_FRAME = struct.Struct("<Q")  # a spooled batch's length, before it


@dataclass
class Batch:
    """What the child parsed from one block: its items (those `feed` would give, the flush of the pass included;
    amends joined to their records among them, each as the store keeps it: `store.prepare`), the checkpoint after
    them (None inside a multi-line event), the items emitted in all by then, line failures (line number, the error in
    words), and the follower's counters and the parser's counts after the block (the source's counters meanwhile:
    the parent's follower and parser stand still at the resume point)."""

    items: List[Item]
    checkpoint: Optional[SourceCheckpoint]
    emitted: int
    failures: List[Tuple[int, str]] = field(default_factory=list)
    counts: Dict[str, int] = field(default_factory=dict)
    piece: int = 0  # which half of a split history parsed it (0: the child's; 1: its worker's, carried on)
    #: its items pickled already (a worker's, which the child passes on as spooled), in place of `items`
    pickled: Optional[bytes] = None

    # Pickled with its items as plain (kind, data) tuples: an `Item` (a NamedTuple) pickles through a Python-level
    # `__getnewargs__`, a call per item that was half the child's cost of sending a batch.
    def __getstate__(self) -> Tuple[Any, ...]:
        pairs = self.pickled if self.pickled is not None else _pairs(self.items)
        return pairs, self.checkpoint, self.emitted, self.failures, self.counts, self.piece

    def __setstate__(self, state: Tuple[Any, ...]) -> None:
        pairs, self.checkpoint, self.emitted, self.failures, self.counts, self.piece = state
        self.items = list(map(Item._make, pickle.loads(pairs) if isinstance(pairs, bytes) else pairs))
        self.pickled = None


def _pairs(items: List[Item]) -> List[Tuple[str, Dict[str, Any]]]:
    return [tuple(item) for item in items]  # type: ignore[misc]  # an Item is a (kind, data) pair


def eligible(kind: InputKind, follower: Follower, parser: Parser) -> bool:
    """Whether a source's follower and parser can go to a child: a kind whose history may (`InputKind.bulk`, a plain
    file of lines) with a file open (older files it still drains are read first, as a pass does), no launcher-tagged
    parts (a new part needs a source on the parent's side), holding nothing (its state is a resume point)."""
    return kind.bulk and follower.current is not None and not parser.parts and not parser.holding


def children_allowed() -> int:
    """How many catch-up children may run at once: one per CPU but the one the sidecar itself needs, at least one."""
    return max(1, _usable_cpus() - 1)


def left_to_read(follower: Follower) -> int:
    """Bytes of the current file not read yet (0 when it cannot be told)."""
    current = follower.current
    try:
        return os.fstat(current.fd).st_size - current.pos if current is not None else 0
    except OSError:
        return 0


class CatchUp:
    """One child parsing a file's history (see the module docstring); used in the tailer's pass thread.

    Args:
        follower: the source's follower, at a resume point (its copy goes on in the child).
        parser: the source's parser there (likewise).
        checkpoint: the resume point: the parent's source checkpoint taken just now.
        now: the read time of the history's lines (the time a line without a timestamp is given), as for a pass.
        fresh: a new parser for the source (as a first start makes it), for a worker that parses the second half of
            a big history (None: the child parses all of it).
    """

    def __init__(self, follower: Follower, parser: Parser, checkpoint: SourceCheckpoint,
                 now: float, fresh: Optional[Parser] = None) -> None:
        self.start = checkpoint
        self.emitted = checkpoint.emitted_at  # the items the source has emitted, those delivered from here included
        self.resume: SourceCheckpoint = checkpoint  # the newest checkpoint delivered
        self.counts: Optional[Dict[str, int]] = None  # the newest batch's counters and counts (`Batch.counts`)
        self.done = False  # the child's pipe is closed: nothing more comes
        self.stalled = False  # stopped after STALL_S without a batch
        self._heard = time.monotonic()  # when the child last sent a batch (or started)
        end = follower.current.pos + left_to_read(follower)  # the size seen now
        context = multiprocessing.get_context("fork")
        self._conn, child_end = context.Pipe(duplex=False)
        _widen(child_end)
        self._process: BaseProcess = context.Process(
            target=_child, args=(follower, parser, fresh, end, child_end, now, os.getpid()), daemon=True,
            name="mstail-catch-up")
        self._process.start()
        child_end.close()

    def take(self, limit: int, wait_s: float) -> List[Batch]:
        """Batches the child has sent, until they hold `limit` items or none is there; waits up to `wait_s` for
        the first. Each delivered batch moves `emitted` and, with a checkpoint, `resume`."""
        out: List[Batch] = []
        count = 0
        while not self.done and count < limit and self._conn.poll(wait_s if not out else 0):
            try:
                batch: Batch = self._conn.recv()  # the pipe holds all of it, or the child is writing the rest now
            except (EOFError, OSError):  # the child is done (or died): its exit status says which (`failed`)
                self._process.join(timeout=EXIT_WAIT_S)
                self.stop()
                break
            out.append(batch)
            self._heard = time.monotonic()
            count += len(batch.items)
            self.emitted = batch.emitted
            self.counts = batch.counts
            if batch.checkpoint is not None:
                self.resume = batch.checkpoint
        if not out and not self.done and time.monotonic() - self._heard >= STALL_S:
            self.stalled = True
            self.stop()
        return out

    def stop(self) -> None:
        """End the child (done or not) and reap it; later `take`s give nothing."""
        self.done = True
        self._conn.close()
        if self._process.is_alive():
            self._process.kill()
        self._process.join(timeout=5)

    @property
    def failed(self) -> Optional[str]:
        """Why the child ended before its end (an error, a signal) in words, or None (it finished, or was stopped)."""
        if self.stalled:
            return f"no batch for {STALL_S:g} s"
        code = self._process.exitcode
        if not code or code == -signal.SIGKILL:  # SIGKILL: `stop`'s
            return None
        return f"exit status {code}" if code > 0 else f"signal {-code}"

    def hand_over(self) -> SourceCheckpoint:
        """The checkpoint the source resumes from (the newest delivered), with every item delivered counted as
        emitted, so that the restore skips what was stored after it."""
        resume = self.resume
        return SourceCheckpoint(resume.follower, resume.parser_json, resume.emitted_at, self.emitted)


def _widen(conn: Connection) -> None:
    """Ask for a pipe of PIPE_BYTES (a smaller one works too, with more waits)."""
    with contextlib.suppress(OSError):
        fcntl.fcntl(conn.fileno(), _F_SETPIPE_SZ, PIPE_BYTES)


def _child(follower: Follower, parser: Parser, fresh: Optional[Parser], end: int, conn: Connection, now: float,
           parent: int) -> None:
    """The child's work: parse from the resume point to `end` (the size seen at the fork), a batch per block; a big
    history in two halves, the second by a worker (`_Worker`)."""
    status, sender, worker = 0, None, None  # the exit status: 1 when something failed
    try:
        _as_a_child(parent)
        current = follower.current
        assert current is not None  # `eligible`
        if (fresh is not None and end - current.pos >= SPLIT_MIN_BYTES and _usable_cpus() > 1
                and len(follower.checkpoint().files) == 1):  # no older file to drain first
            with contextlib.suppress(OSError):  # no fork, no spool file: the child parses it all
                worker = _Worker(follower, fresh, end, now)  # forked before the sender's thread starts
        sender = _Sender(conn)
        if worker is None:
            _parse(follower, parser, sender, end, now)
        elif _parse(follower, parser, sender, worker.middle, now) and not _join(follower, parser, sender, worker, now):
            worker.stop()
            _parse(follower, parser, sender, end, now)  # no seam: the second half parsed here
    except BaseException:  # noqa: BLE001 - the parent resumes from the last batch and says so; nothing may outlive it
        status = 1
    finally:
        try:
            if worker is not None and worker.stop() and worker.joined:
                status = 1  # it ended before its end, after the seam: the parent reads on from its last batch
            if sender is not None:
                sender.finish()  # the batches queued before a failure are good: the parent stores them
        except BaseException:  # noqa: BLE001 - as above
            status = 1
        os._exit(status)  # which closes the pipe: the parent's end then reads its end


def _parse(follower: Follower, parser: Parser, sender: "_Sender", until: int, now: float) -> bool:
    """Parse the current file up to offset `until` (a line start, or the end seen), a batch sent per block; False
    when it stopped before (the file changed, a launcher tag, the parent stopped listening)."""
    current = follower.current
    while follower.current is current and current is not None and current.pos < until:
        batch = _block(follower, parser, min(BULK_BLOCK_BYTES, until - current.pos), now)
        if batch is None or not sender.put(batch):
            return False
    return follower.current is current


def _block(follower: Follower, parser: Parser, budget: int, now: float) -> Optional[Batch]:
    """The batch of the next `budget` bytes; None when there is none to send: the file changed under it (truncated,
    replaced: the parent's passes take it from here) or a launcher tag (the parent reads on from the last resume
    point, with sources for the parts)."""
    failures: List[Tuple[int, str]] = []

    def failed(number: int, exc: Exception) -> None:
        failures.append((number, f"{type(exc).__name__}: {exc}"))

    items: List[Item] = []
    before = follower.counters["bytes"]
    pieces = follower.read(budget, now, blocks=True)
    if follower.counters["bytes"] == before:
        return None
    for piece in pieces:
        items += items_of(parser, piece, now, failed)  # a line that fails is skipped, said by the parent
    items += parser.flush(now)
    if parser.parts:
        return None
    checkpoint = None if parser.holding else SourceCheckpoint(follower.checkpoint(), parser.snapshot_json(),
                                                              emitted_at=parser.emitted)
    return Batch(list(map(prepare, fold_amends(items))), checkpoint, parser.emitted, failures,
                 {**follower.counters, **parser.counts})


class _Worker:
    """The second half of a big history, parsed by a process the child forks (see the module docstring): it writes
    each block's batch to the spool (an unlinked temporary file) and the places where the child may take over
    (`split.Probe`, `written`: the batches spooled before it) to a pipe, once, early.

    Args:
        follower: the child's follower (the worker's copy resumes at the middle).
        fresh: a new parser for the source.
        end: where the history ends.
        now: the history's read time.
    """

    def __init__(self, follower: Follower, fresh: Parser, end: int, now: float) -> None:
        current = follower.current
        assert current is not None
        self.middle = _middle(current.fd, current.splitter.offset, end)
        self.spool = tempfile.TemporaryFile(prefix="mstail-catch-up-")
        self._read = 0  # the spool's bytes taken so far
        self._conn, worker_end = multiprocessing.Pipe(duplex=False)
        child = os.getpid()
        self.pid = os.fork()  # not `multiprocessing.Process`: the child is a daemon, which may not start one
        if self.pid == 0:
            status = 0
            try:
                self._conn.close()
                _worker_init(child)
                number = _lines_between(current.fd, current.splitter.offset, self.middle)  # here: the child parses on
                current.resume(self.middle, current.splitter.next_number + number)
                _spool(follower, fresh, end, now, self.spool.fileno(), worker_end)
            except BaseException:  # noqa: BLE001 - the child sees it end early (its exit status)
                status = 1
            finally:
                os._exit(status)
        worker_end.close()
        self.status: Optional[int] = None  # its exit status once reaped (0 too when stopped here)
        self.stalled = False  # stopped after WORKER_WAIT_S without a batch
        self.joined = False  # the child took over its batches at a seam

    def probes(self) -> List[split.Probe]:
        """The worker's places where the child may take over (none if it ended without telling them, or said nothing
        for WORKER_WAIT_S)."""
        with contextlib.suppress(EOFError, OSError):
            if self._conn.poll(WORKER_WAIT_S):
                return [split.Probe(**probe) for probe in self._conn.recv()]
        return []

    def batches(self, skip: int) -> Any:
        """The spooled batches after the first `skip`, each as spooled (a tuple, `_spool`), as the worker writes
        them, until it ended (the last one whole) or wrote none for WORKER_WAIT_S (then it is stopped)."""
        index, heard = 0, time.monotonic()
        while True:
            frame = self._frame()
            if frame is None:
                if self._ended():
                    frame = self._frame()  # written just before it ended
                    if frame is None:
                        return
                elif time.monotonic() - heard < WORKER_WAIT_S:
                    continue
                else:
                    self.stop()
                    self.stalled = True
                    return
            heard = time.monotonic()
            if index >= skip:
                yield pickle.loads(frame)
            index += 1

    def _frame(self) -> Optional[bytes]:
        """The next whole batch in the spool, or None (not all written yet)."""
        fd = self.spool.fileno()
        head = os.pread(fd, _FRAME.size, self._read)
        if len(head) < _FRAME.size:
            return None
        (length,) = _FRAME.unpack(head)
        data = os.pread(fd, length, self._read + _FRAME.size)
        if len(data) < length:
            return None
        self._read += _FRAME.size + length
        return data

    def _ended(self) -> bool:
        """Whether the worker's pipe closed (it ended); waits up to 0.05 s for that."""
        with contextlib.suppress(EOFError, OSError):
            if self._conn.poll(0.05):
                self._conn.recv()  # nothing more is sent after the probes
            return False
        return True

    def stop(self) -> bool:
        """End the worker (done or not) and reap it; whether it had failed (ended by itself with an exit status other
        than 0, or stalled)."""
        if self.status is None:
            self.status = 0
            with contextlib.suppress(OSError):
                pid, code = os.waitpid(self.pid, os.WNOHANG)
                if pid == 0:  # still running: not needed any more
                    os.kill(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)
                else:
                    self.status = os.waitstatus_to_exitcode(code)
            self.spool.close()
            self._conn.close()
        return self.status != 0 or self.stalled


def _middle(fd: int, offset: int, end: int) -> int:
    """The start of the line nearest after the middle of [offset, end) (`end` when none is within 1 MiB)."""
    middle = offset + (end - offset) // 2
    newline = os.pread(fd, 1 << 20, middle).find(b"\n")
    return end if newline < 0 else min(end, middle + newline + 1)


def _lines_between(fd: int, start: int, end: int) -> int:
    """Newlines in the bytes [start, end) of a file."""
    count, at = 0, start
    while at < end:
        data = os.pread(fd, min(4 << 20, end - at), at)
        if not data:
            break
        count += split._newlines(data)
        at += len(data)
    return count


def _spool(follower: Follower, parser: Parser, end: int, now: float, spool: int, conn: Connection) -> None:
    """The worker's work: parse from the middle to `end`, a batch per block written to the spool (with the worker's
    follower counters, parser counts, emitted count and run segment after it, which the child carries on from its
    own, `_Carry`, and the bytes of a line begun), and the places where the child may take over sent once the probe
    window is past (noted as `mstail parse`'s workers note them, `split.parse_piece`)."""
    current = follower.current
    assert current is not None
    window = current.pos + split.PROBE_BYTES
    probes: List[split.Probe] = []
    following: split.Following = []
    written, published = 0, False
    while follower.current is current and current.pos < end:
        batch = _block(follower, parser, min(BULK_BLOCK_BYTES, end - current.pos), now)
        if batch is None:
            break
        if following:
            following = split._follow(following, batch.items, split.takers(parser.main.format))
        cut = batch.checkpoint
        segment = parser.main.state.segment
        frame = pickle.dumps((pickle.dumps(_pairs(batch.items), pickle.HIGHEST_PROTOCOL),
                              (cut.follower, cut.parser_json) if cut is not None else None, batch.emitted,
                              batch.failures, dict(follower.counters), dict(parser.main.counts), segment,
                              current.pos - current.splitter.offset), pickle.HIGHEST_PROTOCOL)
        os.write(spool, _FRAME.pack(len(frame)) + frame)
        written += 1
        if current.pos <= window and cut is not None:
            state = split.comparable(parser)
            if state is not None:
                known = parser.main.state.event_steps
                missing = sorted(set(split.takers(parser.main.format).values()) - set(known))
                probe = split.Probe(current.splitter.offset, state, segment, written, 0, 0, 0, missing)
                probes.append(probe)
                following += [(probe, set(missing))] if missing else []
        if not published and current.pos > window and (not following or current.pos > window + split.PROBE_BYTES):
            published, following = _publish(conn, probes, following), []  # (a place not settled in twice the window:
            # the child does not wait for it)
    if not published:
        _publish(conn, probes, following)


def _publish(conn: Connection, probes: List[split.Probe], following: split.Following) -> bool:
    """Send the places to the child, those still missing an event's step marked invalid (never learnt)."""
    for probe, _ in following:
        probe.valid = False
    conn.send([probe.__dict__ for probe in probes])
    return True


def _join(follower: Follower, parser: Parser, sender: "_Sender", worker: _Worker, now: float) -> bool:
    """Past the middle, read on to the first of the worker's places where this parser is in the state the worker's
    was, and send the worker's batches after it, carried on (`_Carry`). False when no place agreed (the second half is
    the child's to parse); True when done (or stopped: the file changed, the parent stopped listening)."""
    current = follower.current
    for probe in worker.probes():
        if not _parse(follower, parser, sender, probe.offset, now):
            return True
        if current is None or current.splitter.offset != probe.offset:
            return True  # the file ended before (it changed under it): the passes take it from here
        if probe.valid and not parser.holding and split.comparable(parser, probe.missing) == probe.state:
            worker.joined = True
            batches = worker.batches(probe.written - 1)
            carry = _Carry(follower, parser, next(batches, None))
            for spooled in batches:
                if not sender.put(carry.batch(spooled)):
                    break
            return True
    return False


class _Carry:
    """The worker's batches after the seam carried on from the child's state there: run segments shifted by the
    difference of the two parsers' segments, counters and counts added to the child's, its checkpoints holding the
    sums (what one process reading the whole file would have had).

    Args:
        follower, parser: the child's, at the seam.
        at_seam: the worker's spooled batch that ended at the seam.
    """

    def __init__(self, follower: Follower, parser: Parser, at_seam: Any) -> None:
        assert at_seam is not None  # a place is a batch's end: that batch is spooled
        _, _, emitted, _, counters, counts, segment, begun = at_seam
        self.shift = parser.main.state.segment - segment
        counters = {**counters, "bytes": counters["bytes"] - begun}  # the child has read up to the seam, not beyond
        self.counters = (dict(follower.counters), counters)  # (the child's, the worker's) at the seam
        self.counts = (dict(parser.main.counts), counts)
        self.emitted = parser.emitted - emitted

    def batch(self, spooled: Any) -> Batch:
        pickled, cut, emitted, failures, counters, counts = spooled[:6]
        items: List[Item] = []
        if self.shift:  # a run segment to renumber (else the items go on as the worker pickled them)
            items, pickled = list(map(Item._make, pickle.loads(pickled))), None
            for _, data in items:
                if "segment" in data:
                    data["segment"] += self.shift
        counters, counts = _added(self.counters, counters), _added(self.counts, counts)
        checkpoint = None
        if cut is not None:
            follower, parser_json = cut
            state = json.loads(parser_json)
            state["segment"] += self.shift
            if state.get("last") and "segment" in state["last"]:
                state["last"]["segment"] += self.shift
            state["counts"] = counts
            checkpoint = SourceCheckpoint(FollowerCheckpoint(follower.files, follower.seen, counters),
                                          json.dumps(state), emitted_at=emitted + self.emitted)
        return Batch(items, checkpoint, emitted + self.emitted, failures, {**counters, **counts}, piece=1,
                     pickled=pickled)


def _added(at_seam: Tuple[Dict[str, int], Dict[str, int]], now: Dict[str, int]) -> Dict[str, int]:
    """Counts that add up: the child's at the seam plus what the worker counted since."""
    child, worker = at_seam
    return {**child, **{key: child.get(key, 0) + value - worker.get(key, 0) for key, value in now.items()}}


class _Sender:
    """The child's batches written to the pipe by a thread of their own, so that parsing goes on while the parent
    takes none (at most AHEAD_BATCHES ahead). The batches are pickled in the parsing thread, as `Connection.send`
    would, and written in order.

    Args:
        conn: the child's end of the pipe.
    """

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._queue: queue.Queue = queue.Queue(maxsize=AHEAD_BATCHES)
        self._stopped = threading.Event()  # the writer is done: all written, or the pipe broke (the parent stopped it)
        self._thread = threading.Thread(target=self._write, name="mstail-catch-up-sender", daemon=True)
        self._thread.start()

    def put(self, batch: Batch) -> bool:
        """Queue a batch (waiting while AHEAD_BATCHES are queued); False once the writer stopped (a broken pipe)."""
        data = ForkingPickler.dumps(batch)
        while not self._stopped.is_set():
            with contextlib.suppress(queue.Full):
                self._queue.put(data, timeout=1.0)  # bounded: a look at `_stopped` every second
                return True
        return False

    def finish(self) -> None:
        """Wait until every queued batch is written (or the pipe broke)."""
        while not self._stopped.is_set():
            with contextlib.suppress(queue.Full):
                self._queue.put(None, timeout=1.0)
                break
        self._thread.join()

    def _write(self) -> None:
        try:
            while True:
                data = self._queue.get()
                if data is None:
                    return
                self._conn.send_bytes(data)
        except OSError:  # BrokenPipeError: the parent stopped it; `put` then says so
            pass
        finally:
            self._stopped.set()


def _as_a_child(parent: int) -> None:
    """Signals as a forked helper of the sidecar wants them (`mstail parse`'s workers' set-up: Ctrl-C is the
    parent's, SIGTERM ends it, it dies with the parent), and the parent loop's wake-up pipe no longer told of them."""
    _worker_init(parent)
    with contextlib.suppress(OSError):  # a platform or sandbox that refuses: the child parses at the sidecar's priority
        os.nice(CHILD_NICE)
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:  # forked from a thread other than the main one: nothing was set in this one
        pass
