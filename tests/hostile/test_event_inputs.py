"""Hostile event files against a real `mstail`, appended by a writer process frame by frame: a frame header whose
length (with a valid length checksum) is beyond what any protobuf message may be (2^63, 4 GiB); a tag of 200,000
characters; a writer inventing a new tag for every value. And a folder of many event files, which must not be listed
whole at every look. Each: nothing after the bad input is lost, the bad input is counted (and said once), and memory
and time stay bounded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, List, Union

import pytest

from mstail.parsers.eventfile import MAX_METRICS
from mstail.tailer.inputs import eventfollow
from mstail.tailer.inputs.eventfollow import LISTING_MAX_AGE_S, EventFilesFollower
from tests.conftest import ROOT, wait_until

#: The writer: `python -c WRITER FILE < PARTS` appends a version event, then each of PARTS (JSON): `[step, tag]` an
#: event of one scalar (1/step), a number a frame header claiming that many bytes (its checksum valid); each part is
#: flushed on its own, as a writer appends.
WRITER = r'''
import json, struct, sys
from mstail.parsers.eventschema import TensorBoardEvent
from mstail.tailer.inputs.frames import _masked_crc, frame

def event(step, tag):
    e = TensorBoardEvent(wall_time=1700000000.0 + step, step=step)
    value = e.summary.value.add(); value.tag = tag; value.simple_value = 1.0 / step
    return frame(e.SerializeToString())

def header(length):
    packed = struct.pack("<Q", length)
    return packed + struct.pack("<I", _masked_crc(packed)) + b"\x08\x01" * 8

with open(sys.argv[1], "ab") as out:
    out.write(frame(TensorBoardEvent(wall_time=1.0, file_version="brain.Event:2").SerializeToString()))
    for part in json.load(sys.stdin):
        out.write(header(part) if isinstance(part, int) else event(*part)); out.flush()
'''


def _follow_written(mstail_server: Any, tmp_path: Path, parts: List[Union[int, list]], records: int) -> dict:
    """A real mstail following an event file the writer then appends `parts` to; its source once it holds
    `records` records and has read every frame."""
    path = tmp_path / "events.out.tfevents.1700000000.host"
    path.touch()
    server = mstail_server(path)
    subprocess.run([sys.executable, "-c", WRITER, str(path)], input=json.dumps(parts).encode(), cwd=ROOT, check=True,
                   timeout=30)
    server.wait_records(records, timeout=15)
    frames = 1 + sum(isinstance(part, list) for part in parts)
    wait_until(lambda: server.get_json("/api/sources")[0]["counters"]["lines"] == frames, 10, message="all read")
    source = server.get_json("/api/sources")[0]
    source["stderr"] = server.stderr
    return source


@pytest.mark.slow
@pytest.mark.parametrize("length", [1 << 63, 1 << 32], ids=["2^63", "4GiB"])
def test_a_frame_length_no_event_can_have_swallows_nothing_after_it(mstail_server: Any, tmp_path: Path,
                                                                   length: int) -> None:
    source = _follow_written(mstail_server, tmp_path, [[1, "loss"], [2, "loss"], length, [3, "loss"], [4, "loss"]], 4)
    assert source["counters"]["bad_frames"] >= 1 and source["counters"]["big_frames"] == 0, source["counters"]
    assert source["stderr"].count("failed its checksum") == 1, source["stderr"]


@pytest.mark.slow
def test_a_tag_too_long_for_a_metric_name_is_counted_not_kept(mstail_server: Any, tmp_path: Path) -> None:
    parts = [[step, tag] for step in (1, 2, 3) for tag in ("loss", f"{step}" + "x" * 200_000)]
    source = _follow_written(mstail_server, tmp_path, parts, 3)
    assert source["metrics"] == ["loss", "perplexity"] and source["counters"]["dropped_values"] == 3, source["counters"]


@pytest.mark.slow
def test_tags_past_the_metric_bound_are_counted_not_kept(mstail_server: Any, tmp_path: Path) -> None:
    """1,800 tags never seen before (a writer inventing tags, one per step and parameter)."""
    parts = [[step, tag] for step in (1, 2, 3) for tag in ["loss", *(f"param_{step}_{i}" for i in range(600))]]
    source = _follow_written(mstail_server, tmp_path, parts, 3)
    assert len(source["metrics"]) == MAX_METRICS + 1 and {"loss", "perplexity"} <= set(source["metrics"])  # + derived
    assert source["counters"]["dropped_values"] == 3 * 600 - (MAX_METRICS - 1), source["counters"]


def test_a_folder_of_many_event_files_is_listed_again_only_when_it_changes(tmp_path: Path, monkeypatch: Any) -> None:
    """10,000 event files in one folder: each look at the followed path listed them all (100 ms each), so an idle
    sidecar spent 14% of a core listing them; a listing is now reused until the folder changes."""
    folder = tmp_path / "tb"
    folder.mkdir()
    for i in range(50):
        (folder / f"events.out.tfevents.{1700000000 + i}.host").write_bytes(b"")
    old = time.time() - 10  # the folder changed long enough ago for its mtime to be trusted
    os.utime(folder, (old, old))
    listings = []
    real_scandir = os.scandir
    monkeypatch.setattr(os, "scandir", lambda path: listings.append(path) or real_scandir(path))
    follower = EventFilesFollower(folder)
    assert [follower.path for _ in range(100)][-1].name == "events.out.tfevents.1700000049.host"
    follower._backups()
    assert len(listings) == 1
    (folder / "events.out.tfevents.1700000100.host").write_bytes(b"")  # a relaunch's new file: the folder changed
    assert follower.path.name == "events.out.tfevents.1700000100.host"
    assert len(follower._backups()) == 50
    os.utime(folder, (old, old))
    follower.path  # noqa: B018 - looked at for its listing: kept, the folder's mtime is old again
    (folder / "events.out.tfevents.1700000200.host").write_bytes(b"")
    os.utime(folder, (old, old))  # a filesystem that keeps a folder's mtime: the listing is taken again in time
    assert follower.path.name == "events.out.tfevents.1700000100.host"
    later = time.monotonic() + LISTING_MAX_AGE_S
    monkeypatch.setattr(eventfollow.time, "monotonic", lambda: later)
    assert follower.path.name == "events.out.tfevents.1700000200.host"
