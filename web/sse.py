"""`/api/stream`: Server-Sent Events with replay.

Every message has `id: <seq>` (the last seq it carries). A client that reconnects with `Last-Event-ID`
(browsers do this by themselves) or `?after=SEQ` gets exactly what it missed from the store, then the
live batches; sse-starlette does not implement Last-Event-ID (its issue #113), so we do.

At most `StreamLimit.limit` streams are open at once (`limit_streams(app, n)`, `--max-streams`): one more gets
a 503 with a JSON reason and `Retry-After` (the page's EventSource reconnects with backoff); the open ones go on.
"""

from __future__ import annotations

import asyncio
import logging
import re
import weakref
from dataclasses import dataclass
from typing import Any, AsyncIterator, Dict, Iterator, List, Optional

import orjson
from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse
from sse_starlette.sse import SendTimeoutError

from mstail.parsers.record import json_bytes, jsonable
from mstail.tailer.live.hub import Hub, ItemsMessage, SourceMessage
from mstail.tailer.history.store import Store

router = APIRouter()

RETRY_MS = 2000
PING_S = 15
#: a `durable` stream (`?durable=true`, what a central mstail asks: `tailer.inputs.peer`) sends an item only once it
#: is written with its checkpoint: a node killed and restarted numbers what it reads again after the seqs it sent.
#: The written seq is looked at this often while newer items wait for their commit (a pass's, a few ms).
DURABLE_POLL_S = 0.01
#: ... for at most this long per wake (a disk that refuses the history: the items wait, the stream pings on)
DURABLE_WAIT_S = 1.0
#: items still not written after this long are committed by the stream itself (the passes' batching goes first)
DURABLE_NUDGE_S = 0.1
#: the response header naming the history a stream's seqs belong to (its state's creation): a node whose state was
#: reset answers another one, so a follower resuming by seq can tell
HISTORY_HEADER = "X-Mstail-History"
REPLAY_CHUNK = 2000  # items per message while replaying history
LAST_EVENT_ID = re.compile(r"[0-9]{1,19}")  # ASCII digits only: str.isdigit() also takes '²'


@dataclass
class StreamLimit:
    """How many streams may be open (None: no limit), how many are, and how many were refused."""

    limit: Optional[int] = None
    open: int = 0
    refused: int = 0

    def stats(self) -> Dict[str, Any]:
        return {"open": self.open, "limit": self.limit, "refused": self.refused}


def limit_streams(app: FastAPI, limit: int) -> StreamLimit:
    """Cap `app`'s open streams at `limit` (the composition root calls this; without it there is no cap)."""
    app.state.stream_limit = StreamLimit(limit)
    return app.state.stream_limit


class _Stream(EventSourceResponse):
    """An SSE response that treats a send timeout (the client stopped reading) as a normal way to end: the
    client is dropped and counted (`hub.dropped_clients`); its browser reconnects and catches up by id.
    Beyond `limit` open streams it answers a 503 instead (counted and checked with no await in between, so
    simultaneous clients cannot all slip in)."""

    def __init__(self, hub: Hub, limit: StreamLimit, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._hub = hub
        self._limit = limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        limit = self._limit
        if limit.limit is not None and limit.open >= limit.limit:
            limit.refused += 1
            reason = f"mstail: {limit.open} live streams are open, the most this server takes (--max-streams); retry later"
            await JSONResponse({"detail": reason}, 503, headers={"Retry-After": "5", "Cache-Control": "no-store"})(
                scope, receive, send)
            return
        limit.open += 1
        try:
            await super().__call__(scope, receive, send)
        except Exception as exc:  # only a send timeout is swallowed
            if not _only_send_timeouts(exc):
                raise
            self._hub.dropped_clients += 1
        finally:
            limit.open -= 1


def _only_send_timeouts(exc: BaseException) -> bool:
    inner = getattr(exc, "exceptions", None)  # an ExceptionGroup (no `except*` on Python 3.9)
    if inner is not None:
        return bool(inner) and all(_only_send_timeouts(e) for e in inner)
    return isinstance(exc, SendTimeoutError)


class _QuietDroppedClients(logging.Filter):
    """A dropped client's response cannot be completed (its socket takes nothing), so uvicorn logs it as an
    error and closes the connection; for a stream that is the intended end, not an error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "ASGI callable returned without completing response."


def quiet_dropped_clients() -> None:
    """Install `_QuietDroppedClients` on uvicorn's error log (once; the server's composition root calls it)."""
    uvicorn_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _QuietDroppedClients) for f in uvicorn_log.filters):
        uvicorn_log.addFilter(_QuietDroppedClients())


def frame(seq: int, event: str, data: Any) -> bytes:
    return _frame(seq, event, json_bytes(data))


def _frame(seq: int, event: str, payload: bytes) -> bytes:
    """One SSE message: its id, its event name and its data (JSON bytes, one line)."""
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (seq, event.encode(), payload)


def encode_items(items: List[Dict[str, Any]], texts: Optional[Dict[int, str]] = None) -> bytes:
    """Runs of records become one `records` message; each event its own `event` message (`alert` for alerts,
    `amend` for values a later line added to a record already sent: the page adds them to its charts). `texts`
    (seq -> an item's JSON as `json_bytes` writes it, `ItemsMessage.texts`): the records of a run that have one are
    sent as those texts, not encoded again."""
    out: List[bytes] = []
    run: List[Dict[str, Any]] = []
    for item in items:
        if "kind" in item:
            if run:
                out.append(_records(run, texts))
                run = []
            out.append(frame(item["seq"], item["kind"] if item["kind"] in ("alert", "amend") else "event", item))
        else:
            run.append(item)
    if run:
        out.append(_records(run, texts))
    return b"".join(out)


def _records(run: List[Dict[str, Any]], texts: Optional[Dict[int, str]]) -> bytes:
    """A `records` message of a run of records: `frame`'s bytes. Where orjson writes the run (`json_bytes`), its
    text is its records' joined by commas: those in `texts` as they are, the others encoded here."""
    if texts:
        try:
            data = ",".join([texts.get(record["seq"]) or orjson.dumps(jsonable(record)).decode() for record in run])
        except orjson.JSONEncodeError:  # `json_bytes` writes such a run with the json module: every record
            pass
        else:
            return _frame(run[-1]["seq"], "records", b"[%s]" % data.encode())
    return frame(run[-1]["seq"], "records", run)


#: each hub message's encoding, made by the first stream that sends it and shared by every other one; weakly keyed,
#: so an entry lives as long as its message, which the hub's bounded queues hold (`Subscriber.max_batches` each)
_BATCH_FRAMES: "weakref.WeakKeyDictionary[ItemsMessage, bytes]" = weakref.WeakKeyDictionary()
_SOURCE_JSON: "weakref.WeakKeyDictionary[SourceMessage, List[bytes]]" = weakref.WeakKeyDictionary()


def _encoded_batch(message: ItemsMessage) -> bytes:
    """The frames of a whole batch (`encode_items`), encoded once for all streams."""
    encoded = _BATCH_FRAMES.get(message)
    if encoded is None:
        encoded = _BATCH_FRAMES[message] = encode_items(message.items, message.texts)
    return encoded


def _source_frames(message: SourceMessage, seq: int) -> bytes:
    """A `source` message per source, each with the stream's current id (`frame`'s shape); the JSON is encoded once
    for all streams."""
    encoded = _SOURCE_JSON.get(message)
    if encoded is None:
        encoded = _SOURCE_JSON[message] = [json_bytes(source) for source in message.sources]
    head = f"id: {seq}\nevent: source\ndata: ".encode()
    return b"".join(head + data + b"\n\n" for data in encoded)


@router.get("/api/stream")
async def stream(
    request: Request,
    after: Optional[int] = Query(None, ge=0, le=2**63 - 1, description="replay from seq > after (default: only new items)"),
    durable: bool = Query(False, description="send items only once they are written with their checkpoints"),
    ping: float = Query(PING_S, ge=0.5, le=PING_S, description="seconds between keep-alive comments"),
) -> EventSourceResponse:
    store: Store = request.app.state.store
    hub: Hub = request.app.state.hub
    header = request.headers.get("last-event-id", "").strip()
    if header and not LAST_EVENT_ID.fullmatch(header):
        raise HTTPException(400, "Last-Event-ID must be a seq: 1 to 19 digits")
    requested = int(header) if header else after
    return _Stream(
        hub,
        getattr(request.app.state, "stream_limit", None) or StreamLimit(),
        _events(store, hub, requested, durable, ping),
        ping=ping,
        send_timeout=request.app.state.send_timeout_s,
        headers={"Cache-Control": "no-store", HISTORY_HEADER: history_id(store)},
    )


def history_id(store: Store) -> str:
    """What names this server's history (its state's creation time): another one after a reset, the same after a
    restart over the same state."""
    return store.db.meta_value("created") or ""


def _written_seq(store: Store) -> int:
    """The newest seq written to the state with its checkpoint (every lower one is written too)."""
    return store.last_seq - store.db.unsaved


async def _events(store: Store, hub: Hub, requested: Optional[int], durable: bool = False,
                  ping: float = PING_S) -> AsyncIterator[bytes]:
    # Subscribe and take the snapshot with no await in between: everything up to `snapshot` is in the
    # store, everything after arrives through the queue, so replay + live has no gap and no duplicate.
    subscriber = hub.subscribe()
    snapshot = _written_seq(store) if durable else store.last_seq
    try:
        yield f"retry: {RETRY_MS}\n\n".encode()
        cursor = snapshot if requested is None else requested
        if cursor > snapshot:
            # An id from a history this server does not hold (it restarted): the client must reload.
            yield frame(snapshot, "reset", {"last_seq": snapshot})
            cursor = snapshot
        for chunk in _replay(store, cursor, snapshot):
            hub.sent_messages += 1
            yield chunk
        hub.sent_items += max(0, snapshot - cursor)  # seqs are gap-free: a seq range is an item count
        cursor = snapshot
        if durable:
            async for chunk in _durable(store, hub, subscriber, cursor, ping):
                yield chunk
        while True:
            await subscriber.wait(ping)
            if subscriber.lagging:
                subscriber.lagging = False
                subscriber.drain()
                target = store.last_seq
                hub.catch_ups += 1
                for chunk in _replay(store, cursor, target):
                    hub.sent_messages += 1
                    yield chunk
                hub.sent_items += max(0, target - cursor)
                cursor = target
                continue
            # Coalescing: whatever queued up while this client was busy goes out as one write.
            out: List[bytes] = []
            for message in subscriber.drain():
                if isinstance(message, SourceMessage):
                    out.append(_source_frames(message, cursor))
                    continue
                items = message.items
                if items[-1]["seq"] <= cursor:
                    continue
                hub.sent_items += items[-1]["seq"] - max(cursor, items[0]["seq"] - 1)
                if items[0]["seq"] > cursor:
                    out.append(_encoded_batch(message))
                else:
                    out.append(encode_items([i for i in items if i["seq"] > cursor]))
                cursor = items[-1]["seq"]
            if out:
                hub.sent_messages += 1
                yield out[0] if len(out) == 1 else b"".join(out)
    finally:
        hub.unsubscribe(subscriber)


async def _durable(store: Store, hub: Hub, subscriber: Any, cursor: int, ping: float) -> AsyncIterator[bytes]:
    """A durable stream's live part: each wake, the items written since (read from the store, as a replay) and the
    source entries; the items stored by the wake wait for their commit (`DURABLE_POLL_S`, up to `DURABLE_WAIT_S`;
    later ones go with the next wake or ping). Never returns."""
    while True:
        await subscriber.wait(ping)
        subscriber.lagging = False
        out = [_source_frames(message, cursor) for message in subscriber.drain() if isinstance(message, SourceMessage)]
        waited, stored = 0.0, store.last_seq  # (not the newest then: a busy node stores more meanwhile)
        while _written_seq(store) < stored and waited < DURABLE_WAIT_S:
            if waited >= DURABLE_NUDGE_S and store.db.ready and store.db.write_error is None:
                # a pass's commit that came while the writer was busy waits for the next pass's, which an idle
                # mstail (a run's last step) may not make for a while: commit them now (with their checkpoints, which
                # were queued with them)
                store.commit()
            await asyncio.sleep(DURABLE_POLL_S)
            waited += DURABLE_POLL_S
        target = _written_seq(store)
        out += _replay(store, cursor, target)
        hub.sent_items += max(0, target - cursor)
        cursor = max(cursor, target)
        if out:
            hub.sent_messages += 1
            yield b"".join(out)


def _replay(store: Store, after: int, until: int) -> Iterator[bytes]:
    while after < until:
        items = store.items_after(after, min(REPLAY_CHUNK, until - after))
        if not items:
            return
        yield encode_items(items)
        after = items[-1]["seq"]
