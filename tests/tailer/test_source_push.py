"""The sources' entries a delivery sends on the stream (SSE `source`): one hub message per delivery whatever the
number of sources, counts held back (sent at most every SOURCE_PUSH_S per source) go out with a later pass even
when it did not read that source, and each entry's JSON is encoded once for every stream."""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path
from typing import List

import pytest

from mstail.parsers import load_formats
from mstail.parsers.record import dumps, json_bytes
from mstail.tailer.live import sidecar as tailer_module
from mstail.tailer.config import Config
from mstail.tailer.live.hub import Hub, ItemsMessage, SourceMessage
from mstail.tailer.live.planner import Plan
from mstail.tailer.history.store import Store
from mstail.tailer.live.sidecar import Tailer
from mstail.web import sse
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


def test_source_frames_are_frame_by_frame_and_encoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    entries = [{"id": "rank_0", "records": 3, "loss": "NaN"}, {"id": "rank_1", "records": 4}]
    message = SourceMessage(entries)
    at_7, at_9 = (frame(seq, "source", entries[0]) + frame(seq, "source", entries[1]) for seq in (7, 9))
    encoded: List[object] = []
    monkeypatch.setattr(sse, "json_bytes", lambda data: encoded.append(data) or json_bytes(data))
    assert _source_frames(message, 7) == at_7
    assert encoded == entries
    assert _source_frames(message, 9) == at_9
    assert encoded == entries  # a second stream (another id) reuses the JSON


def test_counts_held_back_are_at_most_a_second_behind_with_many_sources(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With many sources an entry goes out less often, but never more than SOURCE_PUSH_MAX_S after its counts
    changed (issue 17: the page's counters live), and the loop wakes for it: no further write, no sweep needed."""
    monkeypatch.setattr(tailer_module, "SOURCE_PUSH_SHARE", 2)  # 16 sources: 2 s between entries without the cap
    files = [tmp_path / f"rank_{rank}.log" for rank in range(16)]
    for path in files:
        _append(path, 1)
    config = Config(logs=(str(tmp_path / "rank_*.log"),), patterns=(PATTERN,), format="pattern", alert_rules=None,
                    safety_poll_s=30.0)  # no sweep within the test: only the held entry's own time may wake the loop
    hub = Hub()
    tailer = Tailer(config, load_formats(patterns=config.patterns, user_dir=Path("/nonexistent")), Store(), hub)
    published: List[tuple] = []  # (monotonic time, path, records) of every entry sent
    publish = hub.publish

    def noting(message: object) -> None:
        if isinstance(message, SourceMessage):
            published.extend((time.monotonic(), s["path"], s["records"]) for s in message.sources)
        publish(message)  # type: ignore[arg-type]

    hub.publish = noting  # type: ignore[method-assign]
    first = str(files[0])

    async def scenario() -> float:
        stop = asyncio.Event()
        task = asyncio.create_task(tailer.run(stop))
        try:
            while not any(path == first for _, path, _ in published):
                await asyncio.sleep(0.01)
            sent = next(t for t, path, _ in published if path == first)
            await asyncio.sleep(0.3)  # the file events' watcher is running by now
            _append(files[0], 2)  # read at once; its entry is held back (sent 0.3 s ago)
            while not any(path == first and records == 2 for _, path, records in published):
                assert time.monotonic() - sent < 10, "the held entry never went out"
                await asyncio.sleep(0.01)
            return next(t for t, path, records in published if path == first and records == 2) - sent
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)

    behind = asyncio.run(scenario())
    assert 0.25 < behind <= tailer_module.SOURCE_PUSH_MAX_S + 0.3, behind  # held back, then sent when due


@pytest.mark.parametrize("data", [
    {"id": "rank_0", "problem": None, "run": None, "last_time": 1.5e9, "metrics": ["loss"], "counters": {"lines": 1}},
    {"id": "rank_0", "problem": None, "last_time": math.nan},  # a None and a NaN: both would be `null` by orjson
    {"id": "null/rank_0", "problem": None, "last_time": math.inf},  # "null" in a string does not hide the Infinity
    {"id": "rank_0", "nested": [{"a": None, "b": -math.inf}]},
    [{"seq": 1, "loss": math.nan, "time": None}, {"seq": 2, "loss": 0.5, "step": 1 << 70}],  # an int orjson refuses
])
def test_stream_json_keeps_the_names_of_non_finite_numbers_and_every_value(data: object) -> None:
    """The stream's JSON (orjson where its text holds the same values) reads back as the json module's with the
    non-finite numbers by name (`dumps`), the record contract's encoding."""
    body = frame(3, "source", data).split(b"data: ", 1)[1]
    assert body.endswith(b"\n\n") and json.loads(body) == json.loads(dumps(data))
