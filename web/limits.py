"""A bound on the expensive requests one client has in flight: one pure-ASGI middleware.

A series, a heatmap or a big page of records or events can take a while to compute and to send; a client (its
remote address) that asks for more of them at once than `PER_CLIENT` gets `429` with `Retry-After` and a JSON
reason at once, so no client can queue work without bound (in the Store's query thread, where series, folds and
heatmaps are computed one after another, or in the store's reads). A request counted yields to the event loop once
before its work starts, so that the requests that arrived with it are counted too. A browser keeps at most 6
connections to one server (one holds the page's stream), so the page never meets the bound.
"""

from __future__ import annotations

import asyncio
import json
from typing import Dict

from .security import ASGIApp, Receive, Scope, Send

#: The routes whose answers cost the most (web/api.py): their work grows with the history and the query.
EXPENSIVE_PATHS = frozenset({"/api/series", "/api/heatmap", "/api/records", "/api/events"})
PER_CLIENT = 8
RETRY_AFTER_S = 1


class ClientBound:
    """Wraps the app: at most `per_client` requests to `EXPENSIVE_PATHS` in flight per remote address."""

    def __init__(self, app: ASGIApp, per_client: int = PER_CLIENT) -> None:
        self.app = app
        self.per_client = per_client
        self.in_flight: Dict[str, int] = {}  # remote address -> its expensive requests under way (none: absent)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in EXPENSIVE_PATHS:
            await self.app(scope, receive, send)
            return
        client = (scope.get("client") or ("",))[0]
        held = self.in_flight.get(client, 0)
        if held >= self.per_client:
            await _too_many(send, client, self.per_client)
            return
        self.in_flight[client] = held + 1
        try:
            await asyncio.sleep(0)  # the requests that came with this one are counted before any work starts
            await self.app(scope, receive, send)
        finally:
            left = self.in_flight[client] - 1
            if left:
                self.in_flight[client] = left
            else:
                del self.in_flight[client]


async def _too_many(send: Send, client: str, per_client: int) -> None:
    reason = (f"mstail: {client or 'this client'} has {per_client} expensive requests (series, heatmap, records, "
              f"events) under way already: retry after {RETRY_AFTER_S} s")
    body = json.dumps({"detail": reason}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"retry-after", str(RETRY_AFTER_S).encode()), (b"cache-control", b"no-store")]
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": body})
