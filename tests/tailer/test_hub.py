"""Hub: a subscriber that stops reading is bounded and marked lagging; the others are untouched."""

from __future__ import annotations

import asyncio

from mstail.tailer.live.hub import Hub, ItemsMessage


def test_slow_subscriber_is_bounded_and_flagged() -> None:
    asyncio.run(_slow_subscriber())


async def _slow_subscriber() -> None:  # subscribers live in the server's event loop
    hub = Hub(max_batches=8)
    slow, fast = hub.subscribe(), hub.subscribe()
    for i in range(100):
        hub.publish(ItemsMessage([{"seq": i + 1}]))
        if i % 5 == 0:
            assert all(m.items[0]["seq"] <= i + 1 for m in fast.drain())
    assert len(slow.queue) <= 8 and slow.lagging
    assert not fast.lagging
    hub.unsubscribe(slow)
    assert hub.subscriber_count == 1
