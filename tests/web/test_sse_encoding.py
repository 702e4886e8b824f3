"""The stream's encoding of a hub message is the web layer's: made once for every stream, kept beside the message
(never in it) and gone with it."""

from __future__ import annotations

import dataclasses
import gc
from typing import List

import pytest

from mstail.parsers.record import json_bytes
from mstail.tailer.live.hub import Hub, ItemsMessage, SourceMessage
from mstail.web import sse
from mstail.web.sse import _encoded_batch, _source_frames, encode_items


def _batch(first: int) -> List[dict]:
    return [{"seq": first, "source": "a", "step": first, "loss": 1.0},
            {"seq": first + 1, "source": "a", "step": first, "kind": "warning", "message": "m"}]


def test_a_batch_is_encoded_once_for_every_stream_and_its_message_carries_only_data(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert [f.name for f in dataclasses.fields(ItemsMessage)] == ["items", "texts"]
    assert [f.name for f in dataclasses.fields(SourceMessage)] == ["sources"]
    calls: List[int] = []
    monkeypatch.setattr(sse, "encode_items", lambda items, texts=None: calls.append(len(items)) or encode_items(items, texts))
    hub = Hub()
    streams = [hub.subscribe() for _ in range(3)]
    texts = {1: json_bytes(_batch(1)[0]).decode()}  # the stream's JSON of record 1, noted while storing it
    hub.publish(ItemsMessage(_batch(1), texts))
    messages = [message for stream in streams for message in stream.drain()]
    assert [_encoded_batch(message) for message in messages] == [encode_items(_batch(1))] * 3 and calls == [2]
    message = messages[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        message.texts = {}  # type: ignore[misc]
    assert message.texts == texts and message.items == _batch(1)


def test_an_encoding_goes_with_its_message() -> None:
    gc.collect()
    before = len(sse._BATCH_FRAMES), len(sse._SOURCE_JSON)
    hub = Hub(max_batches=4)
    stream = hub.subscribe()
    for first in range(1, 200, 2):
        hub.publish(ItemsMessage(_batch(first)))
        hub.publish(SourceMessage([{"id": "a", "records": first}]))
        for message in stream.drain():
            if isinstance(message, ItemsMessage):
                _encoded_batch(message)
            else:
                _source_frames(message, first)
        del message
    assert (len(sse._BATCH_FRAMES), len(sse._SOURCE_JSON)) == before
