"""A node mstail as an input: what a central mstail follows (`mstail --peer URL`), through the node's stream.

The node's mstail stays the only reader of its logs; the central one takes the node's stored items from its
`/api/stream` (`durable`: only items written with their checkpoints, so a node killed and restarted numbers what it
reads again after the seqs it sent) and stores them as its own, each node source as `NODE/<its id>` (a part of the
node's source, as a launcher-tagged rank is a part of its file: `live.sidecar`'s `_by_part`).

- `PeerFollower` holds one connection in a thread of its own: it asks the node's `/api/sources` (the sources' states),
  then streams from the last seq received (`Last-Event-ID`), with keep-alives every PING_S and a read timeout a little
  above, so a node that stops answering (killed, paused, a partition) is unreachable within READ_TIMEOUT_S; it
  reconnects with backoff, says each problem once and its end. What it receives waits in a bounded queue for the
  passes (a full queue stops reading: the node's stream waits). Its checkpoint is the last seq a pass took and the
  node's history id (`web.sse.HISTORY_HEADER`), like a file's offset and head: committed with the items.
- A node whose history is not the one the checkpoint names (its state was reset: another history id, or the seq is
  beyond its history) is said, on stderr, the node's card and /healthz, and followed from its present end: the
  central never merges two histories by seq, and what the node reads again (each source's steps up to the newest
  taken here) is left out.
- `PeerParser` turns the node's messages into items (records, amends, events; the node's own alerts are left out:
  the central judges the records with its own rules) and keeps each node source's entry (state and fate, problem,
  counters), shown for `NODE/<id>` on the central.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import orjson

from mstail.parsers import Item
from mstail.parsers.engine import ParserState
from mstail.parsers.record import NON_FINITE, PART_KEY, RESERVED
from mstail.tailer.inputs.checkpoint import FilePosition, FollowerCheckpoint
from mstail.tailer.notices import Notices

if TYPE_CHECKING:  # httpx is imported by the connection's thread: every mstail start (and `mstail parse`)
    import httpx  # would otherwise pay its 50 ms of imports, with or without --peer

log = logging.getLogger("mstail.peer")

#: keep-alives asked of the node's stream, and the read timeout that finds a node silent past them
PING_S = 1.0
READ_TIMEOUT_S = 2.5
CONNECT_TIMEOUT_S = 2.0
#: reconnecting: the first wait, doubling to the last
BACKOFF_S, BACKOFF_MAX_S = 0.25, 5.0
#: a stream line (one message's data) longer than this is no mstail's: the connection is dropped and said
MAX_LINE_BYTES = 32 << 20
#: the node's /api/sources answer at most (1,024 sources: about 1 MiB)
MAX_SOURCES_BYTES = 32 << 20
#: messages received and not yet taken by a pass, in bytes at most (reading waits beyond)
QUEUE_BYTES = 16 << 20
#: the history id asked for with the newest seq possible: the node answers `reset` with its present end
_BEYOND = str((1 << 63) - 1)
#: the node's stream names the history its seqs belong to in this header (`web.sse.HISTORY_HEADER`)
HISTORY_HEADER = "x-mstail-history"
_EMPTY_STATE = ParserState().dumps()
#: what the central sets again (seq, source) of a node's item, and of an amend its kind too
_DROPS, _AMEND_DROPS = ("seq", "source"), ("seq", "source", "kind")
#: the messages whose id is a position in the node's history (the others carry the stream's id at the time)
_POSITIONS = ("records", "amend", "event", "alert", "reset")


class PeerError(Exception):
    """Why a node's answer is not an mstail stream this central can follow (one line)."""


class PeerMessage(NamedTuple):
    """One message from a node, a piece as `inputs.kind.items_of` hands it to the parser: `text` is (event, its
    decoded data), `number` its seq; `history` the node's history id it belongs to; `size` its bytes."""

    text: Tuple[str, Any]
    number: int
    history: str
    size: int


@dataclass
class _Connection:
    """What the follower's thread has received: the history and seq to resume from."""

    history: str = ""
    seq: int = 0
    jump: bool = False  # the next connection asks for the node's present end (its history is another one)


class PeerFollower:
    """Follows one node mstail's stream (see the module's doc); the `Follower` of the `peer` kind.

    Args:
        name: the node's name (its sources are NAME/<id>).
        url: the node mstail's base URL (http://node-3:6150).
        token: the node's access token, or None.
    """

    def __init__(self, name: str, url: str, token: Optional[str] = None) -> None:
        self.name, self.url = name, url.rstrip("/")
        self.path = Path(name)
        self.confine: Optional[str] = None
        self.state = "waiting"  # waiting (never reached yet) | following | unreachable
        self.problem: Optional[str] = None
        self.counters: Dict[str, int] = {"bytes": 0, "messages": 0, "connects": 0, "disconnects": 0, "resets": 0}
        self.last_data_time: Optional[float] = None
        self.current: Any = None  # no file: the writer and catch-up machinery pass it by
        self.unreachable_since: Optional[float] = None  # wall time it was last heard of while unreachable, else None
        self._heard: Optional[float] = None  # wall time of the last bytes it sent (data or keep-alive)
        self.reset_said: Optional[str] = None  # what its last reset was, said on its card until the central restarts
        #: called (from the follower's thread) when there is news for a pass: a message, a state changed
        self.wake: Callable[[], None] = lambda: None
        self._token = token
        self._taken = _Connection()  # the history and seq of the last message a pass took (the checkpoint)
        self._received = _Connection()  # ... and of the last one received (where a reconnection resumes)
        self._queue: Deque[PeerMessage] = deque()
        self._queued_bytes = 0
        self._lock = threading.Condition()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._notices = Notices(log)
        #: how often its state or problem changed (by the thread), and how often when `take_state_news` last looked
        self._state_changes, self._state_seen = 0, 0

    @property
    def source_path(self) -> Path:
        return self.path

    # -- the pass's side ------------------------------------------------------------------------------------
    def read(self, budget: int, now: float, blocks: bool = False) -> Sequence[PeerMessage]:
        """The messages received, oldest first, until `budget` bytes are reached (the last one may pass it: a pass
        that got its budget reads on); starts the connection at the first call (after `restore`)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"mstail-peer-{self.name}", daemon=True)
            self._thread.start()
        out: List[PeerMessage] = []
        taken = 0
        with self._lock:
            while self._queue and taken < budget:
                message = self._queue.popleft()
                out.append(message)
                taken += message.size
            self._queued_bytes -= taken
            left = bool(self._queue)
            self._lock.notify_all()
        if left:
            self.wake()  # what this pass leaves is read by the next, not by a sweep a second later
        if out:
            self.counters["bytes"] += taken
            self.counters["messages"] += len(out)
            self.last_data_time = now
            for message in out:
                if message.text[0] in _POSITIONS:
                    self._taken = _Connection(message.history, message.number)
                if message.text[0] == "reset":
                    self._say_reset(message)
        return out

    def may_have_news(self, rotation: bool = True, quiet: bool = False) -> bool:
        return bool(self._queue)

    def checkpoint(self) -> FollowerCheckpoint:
        """The node's history id and the seq of the last message taken, as a file's head and offset."""
        taken = self._taken
        return FollowerCheckpoint(files=[FilePosition((0, 0), (0, taken.history), taken.seq, 0)],
                                  counters=dict(self.counters))

    def restore(self, checkpoint: FollowerCheckpoint) -> bool:
        if not checkpoint.files:
            return True
        position = checkpoint.files[0]
        self._taken = _Connection(str(position.head[1]), int(position.offset))
        self._received = _Connection(self._taken.history, self._taken.seq)
        self.counters.update({k: v for k, v in checkpoint.counters.items() if k in self.counters})
        return True

    def close(self) -> None:
        """Stop following: the thread ends at its next read (within READ_TIMEOUT_S); nothing waits for it."""
        self._stop.set()
        with self._lock:
            self._lock.notify_all()

    def take_state_news(self) -> bool:
        """Whether the node's state or problem changed since the last call (then all its sources' entries change)."""
        changes = self._state_changes
        news, self._state_seen = changes != self._state_seen, changes
        return news

    def health(self) -> Dict[str, Any]:
        """The node as /healthz shows it."""
        return {"node": self.name, "url": self.url, "state": self.state, "unreachable_since": self.unreachable_since,
                "problem": self.problem, "seq": self._taken.seq, "reset": self.reset_said}

    def _say_reset(self, message: PeerMessage) -> None:
        self.counters["resets"] += 1
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        self.reset_said = (f"the node's history was reset (found {when}): what it logged before it is kept here as "
                           f"taken; followed from its seq {message.number} on, what it read again is not taken twice")
        log.warning("peer %s (%s): %s", self.name, self.url, self.reset_said)

    # -- the connection's thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        import httpx

        backoff = BACKOFF_S
        while not self._stop.is_set():
            try:
                delivered = self._session()
            except (PeerError, httpx.HTTPError, httpx.StreamError, OSError, ValueError) as exc:
                delivered = self._down(_why(exc))
            except Exception as exc:  # the thread's last line of defence: said, and tried again
                log.debug("peer %s failed", self.name, exc_info=True)
                delivered = self._down(f"unexpected {_why(exc)}")
            if self._stop.is_set():
                return
            backoff = BACKOFF_S if delivered else min(backoff * 2, BACKOFF_MAX_S)
            self._stop.wait(backoff)

    def _session(self) -> bool:
        """One connection: the sources' entries, then the stream until it ends or fails (raises). True when it got
        somewhere (the stream opened)."""
        import httpx

        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        timeout = httpx.Timeout(CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S)
        with httpx.Client(timeout=timeout, headers=headers, trust_env=False) as client:
            sources = self._get_sources(client)
            received = self._received
            last = _BEYOND if received.jump else str(received.seq)
            params = {"durable": "true", "ping": str(PING_S)}
            with client.stream("GET", f"{self.url}/api/stream", params=params,
                               headers={"Last-Event-ID": last, "Accept": "text/event-stream"}) as response:
                history = _check_stream(response)
                if received.history and history != received.history and not received.jump:
                    self._received = _Connection(history, 0, jump=True)  # another history: from its present end
                    return True
                self._up(sources, history)
                self._received = _Connection(history, received.seq, received.jump)
                self._read_stream(response, history)
        self._down("the node closed the stream")
        return True

    def _get_sources(self, client: httpx.Client) -> Any:
        with client.stream("GET", f"{self.url}/api/sources") as response:
            _check_status(response)
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_SOURCES_BYTES:
                    raise PeerError(f"its /api/sources answer is over {MAX_SOURCES_BYTES >> 20} MiB: not an mstail?")
        try:
            sources = orjson.loads(bytes(body))
        except orjson.JSONDecodeError:
            raise PeerError("its /api/sources answer is not JSON: not an mstail?") from None
        if not isinstance(sources, list) or not all(isinstance(entry, dict) and "id" in entry for entry in sources):
            raise PeerError("its /api/sources answer is not a list of sources: not an mstail?")
        return sources

    def _read_stream(self, response: httpx.Response, history: str) -> None:
        """Split the stream into messages (bounded lines) and queue each; returns when the stream ends."""
        buffer = bytearray()
        fields: Dict[str, str] = {}
        data: List[str] = []
        held = 0  # the message's data so far, in characters (many data lines without its end are bounded too)
        for chunk in response.iter_bytes():
            if self._stop.is_set():
                return
            self._heard = time.time()
            buffer += chunk
            start = 0
            while True:
                end = buffer.find(b"\n", start)
                if end < 0:
                    break
                line = bytes(buffer[start:end]).rstrip(b"\r").decode("utf-8", "replace")
                start = end + 1
                if line:
                    name, _, value = line.partition(":")
                    value = value[1:] if value.startswith(" ") else value
                    if name == "data":
                        data.append(value)
                        held += len(value)
                    elif name in ("id", "event"):
                        fields[name] = value
                    continue
                if data:
                    self._dispatch(fields, "\n".join(data), history)
                fields, data, held = {}, [], 0
            del buffer[:start]
            if len(buffer) + held > MAX_LINE_BYTES:
                raise PeerError(f"it sent a line over {MAX_LINE_BYTES >> 20} MiB: not an mstail stream?")

    def _dispatch(self, fields: Dict[str, str], data: str, history: str) -> None:
        event = fields.get("event", "message")
        try:
            seq = int(fields.get("id", ""))
            value = orjson.loads(data)
        except ValueError:
            raise PeerError(f"it sent a {event!r} message that is not an mstail one (no seq or no JSON)") from None
        if event in _POSITIONS:
            self._received = _Connection(history, seq)  # (a reset: the node's present end, the jump done)
        self._put(PeerMessage((event, value), seq, history, len(data)))

    def _put(self, message: PeerMessage) -> None:
        with self._lock:
            while self._queued_bytes > QUEUE_BYTES and not self._stop.is_set():
                self._lock.wait(0.5)
            self._queue.append(message)
            self._queued_bytes += message.size
        self.wake()

    def _up(self, sources: Any, history: str) -> None:
        """Connected: the news said once, the sources' entries queued first."""
        self.counters["connects"] += 1
        if self.unreachable_since is not None:
            log.warning("peer %s (%s) reached again after %.0f s; resuming after its seq %d", self.name, self.url,
                        time.time() - self.unreachable_since, self._received.seq)
        self._notices.forget("down")
        self.state, self.problem, self.unreachable_since = "following", None, None
        self._state_changes += 1
        self._put(PeerMessage(("sources", sources), self._received.seq, history, 0))

    def _down(self, why: str) -> bool:
        """The connection failed or ended: unreachable since now (or since it first failed), said once."""
        if self._stop.is_set():
            return False
        if self.unreachable_since is None:
            self.unreachable_since = self._heard or time.time()  # its silence began when it was last heard
            self.counters["disconnects"] += 1
        since = time.strftime("%H:%M:%S", time.localtime(self.unreachable_since))
        self.state = "unreachable"
        self.problem = f"node unreachable since {since}: {why}"
        self._state_changes += 1
        self._notices.say("down", f"peer {self.name} ({self.url}) unreachable: {why}; retrying, up to every "
                          f"{BACKOFF_MAX_S:g} s")
        self.wake()
        return False


def _check_status(response: httpx.Response) -> None:
    if response.status_code in (401, 403):
        raise PeerError(f"it refused the token (HTTP {response.status_code}): give the node's token with "
                        "--peer-token-file or $MSTAIL_PEER_TOKEN")
    if response.status_code != 200:
        raise PeerError(f"it answered HTTP {response.status_code} to {response.request.url.path}: not an mstail?")


def _check_stream(response: httpx.Response) -> str:
    """The history id of a stream that is an mstail's, else `PeerError`."""
    _check_status(response)
    kind = response.headers.get("content-type", "")
    if not kind.startswith("text/event-stream"):
        raise PeerError(f"its /api/stream answered {kind or 'no content type'}, not an event stream: not an mstail?")
    history = response.headers.get(HISTORY_HEADER, "")
    if not history:
        raise PeerError("its stream names no history (X-Mstail-History): an mstail older than this one?")
    return history


def _why(exc: BaseException) -> str:
    """A failure in one line."""
    import httpx

    if isinstance(exc, PeerError):
        return str(exc)
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer within {READ_TIMEOUT_S:g} s ({type(exc).__name__})"
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


class _NodeFormat(NamedTuple):
    name: str


class PeerPart:
    """One node source as the central's source `NODE/<id>`: its entry on the node (state, fate, counters)."""

    holding = False
    overflow_lines = 0

    def __init__(self) -> None:
        self.entry: Dict[str, Any] = {}
        self.emitted = 0
        #: the (segment, step) of its newest record taken (segment None: known from the history by its step alone)
        self.last: Optional[Tuple[Optional[int], int]] = None
        #: after the node's reset, what it reads again up to: its items up to there are not taken twice
        self.floor: Optional[Tuple[Optional[int], int]] = None

    @property
    def format(self) -> Optional[_NodeFormat]:
        name = self.entry.get("format")
        return _NodeFormat(name) if isinstance(name, str) else None

    @property
    def meta(self) -> Dict[str, Any]:
        total = self.entry.get("total_steps")
        return {"total_steps": total} if isinstance(total, int) else {}

    @property
    def counts(self) -> Dict[str, int]:
        counters = self.entry.get("counters")
        out = {k: v for k, v in counters.items() if isinstance(v, int)} if isinstance(counters, dict) else {}
        return {"unmatched_metric_lines": 0, **out}

    @property
    def state(self) -> str:
        state = self.entry.get("state")
        return state if isinstance(state, str) else "waiting"

    def fate(self) -> Optional[Tuple[str, str, bool]]:
        """(fate, why, guessed) as the node judged it, while its run is over."""
        if self.state not in ("finished", "died", "stopped"):
            return None
        return self.state, str(self.entry.get("end_reason") or self.state), bool(self.entry.get("end_guessed"))

    def writing(self) -> Optional[bool]:
        """Whether the node sees a writer of the file (None: it cannot, a network filesystem's)."""
        if self.fate() is not None:
            return False
        if self.entry.get("hang_rule") != "writer":
            return None
        return True if self.state in ("following", "idle") else None

    def describe(self, info: Any, node: str) -> None:
        """What the node said of the source, on its central entry (`SourceInfo`)."""
        entry = self.entry
        info.path = f"{node}:{entry.get('path') or ''}"
        info.hang_rule = entry.get("hang_rule")
        info.run = entry.get("run")
        info.problem = info.problem or entry.get("problem")


def _taken_once(part: PeerPart, kind: str, data: Dict[str, Any]) -> bool:
    """Whether an item of a node source is new here: after the node's reset, those up to its floor (the newest record
    taken before) are what the node read again (by segment and step; by step where the segment is not known), and
    so are its events up to the first record past it."""
    step, segment = data.get("step"), data.get("segment", 0)
    at = (segment, step) if isinstance(step, int) and isinstance(segment, int) else None
    floor = part.floor
    if floor is not None:
        below = at is None or (at[1] <= floor[1] if floor[0] is None else at <= floor)
        if below:
            return False
        if kind == "record":
            part.floor = None  # past what it read again: everything from here is new
    if kind == "record" and at is not None:
        part.last = at
    return True


class PeerParser:
    """A node's messages -> items (see the module's doc); the node's sources are its `parts`."""

    holding = False
    overflow_lines = 0
    format = None

    def __init__(self) -> None:
        self._parts: Dict[str, PeerPart] = {}
        self._touched: Dict[str, PeerPart] = {}  # the parts with items or a new entry since `take_touched`
        self.main = PeerPart()
        self.emitted = 0

    @property
    def parts(self) -> Mapping[str, PeerPart]:
        return self._parts

    @property
    def counts(self) -> Dict[str, int]:
        return {"unmatched_metric_lines": 0}

    @property
    def meta(self) -> Dict[str, Any]:
        return {}

    def feed(self, text: Any, number: int, now: float) -> List[Item]:
        event, data = text
        if event == "sources":
            for entry in data:
                self._entry(entry)
            return []
        if event == "source":
            if isinstance(data, dict) and "id" in data:
                self._entry(data)
            return []
        if event == "records":
            items = [self._item("record", record) for record in data if isinstance(record, dict)]
        elif event in ("amend", "event") and isinstance(data, dict):
            items = [self._item(event, data)]
        elif event == "reset":  # another history (the follower says it): what it reads again is not taken twice
            for part in self._parts.values():
                part.floor = part.last
            return []
        else:
            return []  # the node's alerts: the central judges for itself
        items = [item for item in items if item is not None]
        self.emitted += len(items)
        return items  # type: ignore[return-value]  # Nones dropped above

    def _entry(self, entry: Dict[str, Any]) -> None:
        self._part(str(entry["id"])).entry = entry

    def _part(self, source: str) -> PeerPart:
        part = self._parts.get(source)
        if part is None:
            part = self._parts[source] = PeerPart()
        self._touched[source] = part
        return part

    def take_touched(self, everything: bool = False) -> Mapping[str, PeerPart]:
        """The parts with items or a new entry since the last call (`everything`: all of them), which a delivery
        updates: a node's 64 sources are not looked at for every message of one of them."""
        touched, self._touched = (self._parts if everything else self._touched), {}
        return touched

    def _item(self, kind: str, data: Dict[str, Any]) -> Optional[Item]:
        source = data.get("source")
        if not isinstance(source, str) or not source:
            return None
        part = self._part(source)
        if not _taken_once(part, kind, data):
            return None
        dropped = _AMEND_DROPS if kind == "amend" else _DROPS  # an amend's kind is the item's, not a value to join
        out = {key: (NON_FINITE.get(value, value) if isinstance(value, str) and key not in RESERVED else value)
               for key, value in data.items() if key not in dropped}
        out[PART_KEY] = source
        return Item(kind, out)

    def remember(self, source: str, step: int) -> None:
        """The newest step of `source` the central holds (after a restart: a reset node's floor, `PeerPart.last`)."""
        self._parts.setdefault(source, PeerPart()).last = (None, step)

    def flush(self, now: float, force: bool = False) -> List[Item]:
        return []

    def snapshot_json(self) -> str:
        return _EMPTY_STATE

    def restore(self, state: ParserState) -> bool:
        return True


class PeerKind:
    """The `peer` input kind: a node mstail's stream (`InputSpec.variant` its URL, `InputSpec.token` its token)."""

    name = "peer"
    bulk = False

    def follower(self, spec: Any) -> PeerFollower:
        return PeerFollower(spec.source, spec.variant, spec.token)

    def parser(self, spec: Any) -> PeerParser:
        return PeerParser()

    def splitter(self, spec: Any) -> Any:
        raise ValueError("a node mstail's stream is followed live only, not parsed offline")


PEER = PeerKind()


def peer_name(url: str) -> str:
    """A node's default name: its host:port."""
    import httpx

    parsed = httpx.URL(url)
    return f"{parsed.host}:{parsed.port or (443 if parsed.scheme == 'https' else 80)}"
