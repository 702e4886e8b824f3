"""Hostile event files against a real `mstail`, written by a writer process byte by byte: a frame header whose length
(with a valid length checksum) is beyond what any protobuf message may be (2^63, 4 GiB). The frames after it are
read, the bad header is counted and said once; nothing after it is swallowed as the rest of a "big frame"."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mstail.parsers.eventfile import MAX_METRICS
from mstail.tailer.eventfollow import EventFilesFollower
from tests.conftest import ROOT, wait_until


#: The writer: a version event, steps 1-2, a header claiming LENGTH bytes (its checksum valid), steps 3-4; each
#: write flushed on its own, as a writer appends.
WRITER = r'''
import struct, sys, time
from mstail.parsers.eventschema import TensorBoardEvent
from mstail.tailer.frames import _masked_crc, frame

def event(step):
    e = TensorBoardEvent(wall_time=1700000000.0 + step, step=step)
    value = e.summary.value.add(); value.tag = "loss"; value.simple_value = 1.0 / step
    return frame(e.SerializeToString())

header = struct.pack("<Q", int(sys.argv[2]))
parts = [frame(TensorBoardEvent(wall_time=1.0, file_version="brain.Event:2").SerializeToString()), event(1), event(2),
         header + struct.pack("<I", _masked_crc(header)) + b"\x08\x01" * 8, event(3), event(4)]
with open(sys.argv[1], "ab") as out:
    for part in parts:
        out.write(part); out.flush(); time.sleep(0.05)
'''


@pytest.mark.slow
@pytest.mark.parametrize("length", [1 << 63, 1 << 32], ids=["2^63", "4GiB"])
def test_a_frame_length_no_event_can_have_swallows_nothing_after_it(mstail_server: Any, tmp_path: Path,
                                                                   length: int) -> None:
    folder = tmp_path / "tb"
    folder.mkdir()
    path = folder / "events.out.tfevents.1700000000.host"
    path.touch()
    server = mstail_server(path)
    subprocess.run([sys.executable, "-c", WRITER, str(path), str(length)], cwd=ROOT, check=True, timeout=30)
    (source,) = server.wait_records(4, timeout=15)
    assert source["counters"]["bad_frames"] >= 1 and source["counters"]["big_frames"] == 0, source["counters"]
    assert server.stderr.count("failed its checksum") == 1, server.stderr


#: The writer: steps 1-3, each a `loss` and a scalar whose tag is 200,000 characters (a writer's bug or a hostile
#: file), one event each as tensorboardX writes them.
LONG_TAGS = r'''
import sys
from mstail.parsers.eventschema import TensorBoardEvent
from mstail.tailer.frames import frame

with open(sys.argv[1], "ab") as out:
    out.write(frame(TensorBoardEvent(wall_time=1.0, file_version="brain.Event:2").SerializeToString()))
    for step in (1, 2, 3):
        for tag in ("loss", f"{step}" + "x" * 200_000):
            e = TensorBoardEvent(wall_time=1700000000.0 + step, step=step)
            value = e.summary.value.add(); value.tag = tag; value.simple_value = 1.0 / step
            out.write(frame(e.SerializeToString())); out.flush()
'''


@pytest.mark.slow
def test_a_tag_too_long_for_a_metric_name_is_counted_not_kept(mstail_server: Any, tmp_path: Path) -> None:
    path = tmp_path / "events.out.tfevents.1700000000.host"
    path.touch()
    server = mstail_server(path)
    subprocess.run([sys.executable, "-c", LONG_TAGS, str(path)], cwd=ROOT, check=True, timeout=30)
    (source,) = server.wait_records(3, timeout=15)
    assert source["metrics"] == ["loss"] and source["counters"]["dropped_values"] == 3, source["counters"]


#: The writer: steps 1-3, each a `loss` and 600 scalars of tags never seen before (1,800 in all: a writer inventing
#: tags, one per step and parameter), one event each as tensorboardX writes them.
NEW_TAGS = r'''
import sys
from mstail.parsers.eventschema import TensorBoardEvent
from mstail.tailer.frames import frame

with open(sys.argv[1], "ab") as out:
    out.write(frame(TensorBoardEvent(wall_time=1.0, file_version="brain.Event:2").SerializeToString()))
    for step in (1, 2, 3):
        for tag in ["loss", *(f"param_{step}_{i}" for i in range(600))]:
            e = TensorBoardEvent(wall_time=1700000000.0 + step, step=step)
            value = e.summary.value.add(); value.tag = tag; value.simple_value = 1.0 / step
            out.write(frame(e.SerializeToString()))
        out.flush()
'''


@pytest.mark.slow
def test_tags_past_the_metric_bound_are_counted_not_kept(mstail_server: Any, tmp_path: Path) -> None:
    path = tmp_path / "events.out.tfevents.1700000000.host"
    path.touch()
    server = mstail_server(path)
    subprocess.run([sys.executable, "-c", NEW_TAGS, str(path)], cwd=ROOT, check=True, timeout=30)
    (source,) = server.wait_records(3, timeout=15)
    wait_until(lambda: server.get_json("/api/sources")[0]["counters"]["lines"] == 1 + 3 * 601, 10, message="all read")
    (source,) = server.get_json("/api/sources")
    assert len(source["metrics"]) == MAX_METRICS and "loss" in source["metrics"]
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
