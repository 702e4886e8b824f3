"""The sources' entries a delivery sends on the stream (SSE `source`): one hub message per delivery whatever the
number of sources, counts held back (sent at most every SOURCE_PUSH_S per source) go out with a later pass even
when it did not read that source, and each entry's JSON is encoded once for every stream."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import List

import pytest

from mstail.parsers import load_formats
from mstail.tailer import tailer as tailer_module
from mstail.tailer.config import Config
from mstail.tailer.hub import Hub, ItemsMessage, SourceMessage
from mstail.tailer.planner import Plan
from mstail.tailer.store import Store
from mstail.tailer.tailer import Tailer
from mstail.web.sse import _source_frames, frame

PATTERN = r"^step=(?P<step>\d+) loss=(?P<loss>\S+)$"


def _append(path: Path, *steps: int) -> None:
    with open(path, "a", encoding="utf-8") as out:
        out.write("".join(f"step={step} loss=0.5\n" for step in steps))


def _sources(messages: List[object]) -> List[List[dict]]:
    return [m.sources for m in messages if isinstance(m, SourceMessage)]


def test_held_back_counts_go_out_with_a_later_pass_in_one_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tailer_module, "SOURCE_PUSH_S", 0.2)
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    _append(a, 1)
    _append(b, 1)
    config = Config(logs=(str(a), str(b)), patterns=(PATTERN,), format="pattern", alert_rules=None)
    hub = Hub()
    tailer = Tailer(config, load_formats(patterns=config.patterns, user_dir=Path("/nonexistent")), Store(), hub)
    client = hub.subscribe()

    asyncio.run(tailer.pass_once())  # both new: sent at once, in one message
    (first,) = _sources(client.drain())
    assert sorted(s["records"] for s in first) == [1, 1] and len({s["id"] for s in first}) == 2
    a_id = next(s["id"] for s in first if s["path"] == str(a))

    _append(a, 2)
    asyncio.run(tailer.pass_once(Plan({str(a.absolute())})))  # a's counts changed too soon after: held back
    messages = client.drain()
    assert _sources(messages) == [] and any(isinstance(m, ItemsMessage) for m in messages)

    time.sleep(0.25)
    _append(b, 2)
    asyncio.run(tailer.pass_once(Plan({str(b.absolute())})))  # reads b only; a's held counts go out with it
    (later,) = _sources(client.drain())
    assert sorted((s["id"] == a_id, s["records"]) for s in later) == [(False, 2), (True, 2)]


def test_source_frames_are_frame_by_frame_and_encoded_once() -> None:
    entries = [{"id": "rank_0", "records": 3, "loss": "NaN"}, {"id": "rank_1", "records": 4}]
    message = SourceMessage(entries)
    assert _source_frames(message, 7) == frame(7, "source", entries[0]) + frame(7, "source", entries[1])
    encoded = message.encoded
    assert _source_frames(message, 9) == frame(9, "source", entries[0]) + frame(9, "source", entries[1])
    assert message.encoded is encoded  # a second stream (another id) reuses the JSON
