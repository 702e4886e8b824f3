"""Fan-out of new history to live subscribers (SSE clients) through bounded queues.

The tailer publishes one batch per read pass (all sources). Every subscriber has its own bounded queue: a
client that stops reading does not slow the others or grow memory — when its queue is full it is marked
`lagging`, its queue is dropped, and it catches up from the store (which holds everything) when it reads
again. Nothing is lost; the slow client just gets its backlog in one go.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Set, Union


# Messages are data, each one published once: compared and hashed by identity (a consumer may key what it makes of
# one by it: the SSE stream's encoding, `web.sse`), and never changed once published.
@dataclass(frozen=True, eq=False)
class ItemsMessage:
    """The items one pass stored (records, events, alerts), in seq order."""

    items: List[Dict[str, Any]]
    #: seq -> the JSON the stream sends for an item, for those whose stored JSON gave it (`Store.add`'s `Stored.texts`)
    texts: Dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class SourceMessage:
    """The sources whose entries one delivery sends (`SourceInfo.as_json()` each, a state or counts that changed):
    one message, one queue slot, however many sources (a thousand a second at a thousand files)."""

    sources: List[Dict[str, Any]]


Message = Union[ItemsMessage, SourceMessage]


class Subscriber:
    """One live client. `wait()` until there is something, then `drain()`."""

    def __init__(self, max_batches: int) -> None:
        self.queue: Deque[Message] = deque()
        self.max_batches = max_batches
        self.lagging = False  # the queue overflowed: catch up from the store, then go on live
        self._ready = asyncio.Event()

    def put(self, message: Message) -> None:
        if len(self.queue) >= self.max_batches:
            self.queue.clear()
            self.lagging = True
        else:
            self.queue.append(message)
        self._ready.set()

    async def wait(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    def drain(self) -> List[Message]:
        self._ready.clear()
        messages = list(self.queue)
        self.queue.clear()
        return messages


class Hub:
    """Publish/subscribe within one event loop.

    Args:
        max_batches: queue bound per subscriber, in batches (one batch per read pass); default 256.
    """

    def __init__(self, max_batches: int = 256) -> None:
        self.max_batches = max_batches
        self._subscribers: Set[Subscriber] = set()
        self.published = 0
        # Counted by the consumers (the SSE stream) for `/metrics`: messages and items sent to clients,
        # and how often a client's queue overflowed so that it had to catch up from the store.
        self.sent_messages = 0
        self.sent_items = 0
        self.catch_ups = 0
        self.dropped_clients = 0  # streams ended because the client accepted nothing for the send timeout

    def subscribe(self) -> Subscriber:
        subscriber = Subscriber(self.max_batches)
        self._subscribers.add(subscriber)
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.discard(subscriber)

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    def publish(self, message: Message) -> None:
        self.published += 1
        for subscriber in self._subscribers:
            subscriber.put(message)
