"""`/api/stream`: Server-Sent Events with replay.

Every message has `id: <seq>` (the last seq it carries). A client that reconnects with `Last-Event-ID`
(browsers do this by themselves) or `?after=SEQ` gets exactly what it missed from the store, then the
live batches; sse-starlette does not implement Last-Event-ID (its issue #113), so we do.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Dict, List, Optional

from fastapi import APIRouter, Query, Request
from sse_starlette import EventSourceResponse

from tailer.encoding import dumps
from tailer.hub import Hub
from tailer.store import Store

router = APIRouter()

RETRY_MS = 2000
PING_S = 15
REPLAY_CHUNK = 2000  # items per message while replaying history


def frame(seq: int, event: str, data: Any) -> bytes:
    return f"id: {seq}\nevent: {event}\ndata: {dumps(data)}\n\n".encode("utf-8")


def encode_items(items: List[Dict[str, Any]]) -> bytes:
    """Runs of records become one `records` message; each event its own `event` message."""
    out: List[bytes] = []
    run: List[Dict[str, Any]] = []
    for item in items:
        if "kind" in item:
            if run:
                out.append(frame(run[-1]["seq"], "records", run))
                run = []
            out.append(frame(item["seq"], "event", item))
        else:
            run.append(item)
    if run:
        out.append(frame(run[-1]["seq"], "records", run))
    return b"".join(out)


def _encoded_batch(message: Dict[str, Any]) -> bytes:
    # One encoding per batch, shared by every subscriber.
    if "_encoded" not in message:
        message["_encoded"] = encode_items(message["items"])
    return message["_encoded"]


@router.get("/api/stream")
async def stream(
    request: Request,
    after: Optional[int] = Query(None, ge=0, description="replay from seq > after (default: only new items)"),
) -> EventSourceResponse:
    store: Store = request.app.state.store
    hub: Hub = request.app.state.hub
    header = request.headers.get("last-event-id", "").strip()
    requested = int(header) if header.isdigit() else after
    return EventSourceResponse(
        _events(store, hub, requested), ping=PING_S, send_timeout=30, headers={"Cache-Control": "no-store"}
    )


async def _events(store: Store, hub: Hub, requested: Optional[int]) -> AsyncIterator[bytes]:
    # Subscribe and take the snapshot with no await in between: everything up to `snapshot` is in the
    # store, everything after arrives through the queue, so replay + live has no gap and no duplicate.
    subscriber = hub.subscribe()
    snapshot = store.last_seq
    try:
        yield f"retry: {RETRY_MS}\n\n".encode()
        cursor = snapshot if requested is None else requested
        if cursor > snapshot:
            # An id from a history this server does not hold (it restarted): the client must reload.
            yield frame(snapshot, "reset", {"last_seq": snapshot})
            cursor = snapshot
        for chunk in _replay(store, cursor, snapshot):
            yield chunk
        cursor = snapshot
        while True:
            await subscriber.wait(PING_S)
            if subscriber.lagging:
                subscriber.lagging = False
                subscriber.drain()
                target = store.last_seq
                for chunk in _replay(store, cursor, target):
                    yield chunk
                cursor = target
                continue
            for message in subscriber.drain():
                if message["type"] == "source":
                    yield frame(cursor, "source", message["source"])
                    continue
                items = message["items"]
                if items[-1]["seq"] <= cursor:
                    continue
                if items[0]["seq"] > cursor:
                    yield _encoded_batch(message)
                else:
                    yield encode_items([i for i in items if i["seq"] > cursor])
                cursor = items[-1]["seq"]
    finally:
        hub.unsubscribe(subscriber)


def _replay(store: Store, after: int, until: int):  # type: ignore[no-untyped-def]
    while after < until:
        items = store.items_after(after, min(REPLAY_CHUNK, until - after))
        if not items:
            return
        yield encode_items(items)
        after = items[-1]["seq"]
