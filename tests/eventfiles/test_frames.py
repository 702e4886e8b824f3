"""The frame reader on real event files: torn tails wait, a bad checksum costs the damaged bytes only."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mstail.tailer.inputs.frames import (HEADER_BYTES, Frame, FrameSplitter, event_file_kind, event_files_in, frame,
                                  is_event_file)


def test_whole_file_and_byte_by_byte_give_the_same_frames(event_file: Path) -> None:
    data = event_file.read_bytes()
    whole = FrameSplitter().feed(data)
    assert len(whole) == 1 + 12 * 8 and whole[-1].end == len(data)
    assert all(a.end == b.start for a, b in zip(whole, whole[1:]))  # contiguous, nothing left out
    splitter, dribbled = FrameSplitter(), []
    for index in range(len(data)):
        got = splitter.feed(data[index:index + 1])
        dribbled += got
        assert splitter.offset == (dribbled[-1].end if dribbled else 0)  # a torn tail waits, the offset stays put
    assert dribbled == whole and splitter.bad_frames == 0 and splitter.pending_bytes == 0


def test_frame_writes_the_bytes_tensorboardx_writes(event_file: Path) -> None:
    data = event_file.read_bytes()
    assert b"".join(frame(f.payload) for f in FrameSplitter().feed(data)) == data


def test_a_bad_data_checksum_costs_that_frame_only(event_file: Path) -> None:
    data = bytearray(event_file.read_bytes())
    whole = FrameSplitter().feed(bytes(data))
    victim = whole[5]
    data[victim.start + HEADER_BYTES + 3] ^= 0x40  # one bit inside the payload
    splitter = FrameSplitter()
    got = splitter.feed(bytes(data))
    assert [f.payload for f in got] == [f.payload for f in whole if f is not victim]
    assert splitter.bad_frames == 1 and splitter.skipped_bytes == victim.end - victim.start


def test_a_bad_length_is_resynced_at_the_next_valid_frame(event_file: Path) -> None:
    data = bytearray(event_file.read_bytes())
    whole = FrameSplitter().feed(bytes(data))
    victim = whole[7]
    data[victim.start] ^= 0x01  # the length: its own checksum now fails, so it cannot be trusted
    splitter = FrameSplitter()
    got: List[Frame] = []
    for index in range(0, len(data), 7):  # in pieces, so the search for the next frame also waits for bytes
        got += splitter.feed(bytes(data[index:index + 7]))
    assert [f.payload for f in got] == [f.payload for f in whole if f is not victim]
    assert splitter.bad_frames == 1 and splitter.skipped_bytes == victim.end - victim.start


def test_a_torn_frame_then_zeros_then_a_relaunch_s_frames(event_file: Path) -> None:
    data = event_file.read_bytes()
    whole = FrameSplitter().feed(data)
    later = frame(b"\x10\x07")  # an Event{step: 7}
    torn = whole[3]
    damaged = data + data[torn.start:torn.end - 5] + bytes(1 << 20) + later  # a crash's torn frame, zeros, a relaunch
    splitter = FrameSplitter()
    got = splitter.feed(damaged)
    assert [f.payload for f in got] == [f.payload for f in whole] + [b"\x10\x07"]
    assert splitter.offset == len(damaged) and splitter.bad_frames == 1


def test_a_frame_over_the_limit_is_passed_over_unread(event_file: Path) -> None:
    big = frame(b"\x00" * 5000)
    data = event_file.read_bytes()
    splitter, got = FrameSplitter(max_line_bytes=1000), []
    stream = data[:40] + big + data[40:]
    for index in range(0, len(stream), 100):
        got += splitter.feed(stream[index:index + 100])
        assert splitter.pending_bytes <= 1000 + 100
    assert [f.payload for f in got] == [f.payload for f in FrameSplitter().feed(data)]
    assert splitter.big_frames == 1 and splitter.bad_frames == 0


@pytest.mark.slow
def test_a_text_log_is_told_from_an_event_file_without_numpy(tmp_path: Path) -> None:
    """`mstail parse` asks this of every file it is given: a text log's first bytes are no frame header, which is said
    without the splitter's damage scan (it imports numpy: about a third of the command's start-up)."""
    text = tmp_path / "info.log"
    text.write_text("[INFO] 2025-11-24 16:00:01,858 [mindformers/callback.py:821] print_output_info: x\n" * 3)
    probe = ("import sys; from pathlib import Path; from mstail.tailer.inputs.frames import is_event_file; "
             f"print(is_event_file(Path({str(text)!r})), 'numpy' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]


def test_resuming_at_a_frame_offset_reads_the_rest(event_file: Path) -> None:
    data = event_file.read_bytes()
    whole = FrameSplitter().feed(data)
    middle = whole[40]
    rest = FrameSplitter(middle.start, first_number=middle.number).feed(data[middle.start:])
    assert rest == whole[40:]


def test_which_files_are_event_files(event_file: Path, tmp_path: Path) -> None:
    assert is_event_file(event_file) and event_file_kind(event_file.name) == "tensorboard"
    assert event_file_kind("events.out.events.summary.1700000000.0.host_MS") == "mindspore-summary"
    assert event_file_kind("events.out.events.summary.1700000000.0.host_lineage") is None
    renamed = tmp_path / "run.bin"
    renamed.write_bytes(event_file.read_bytes())
    assert is_event_file(renamed) and not is_event_file(renamed, sniff=False)  # known by its first frame
    text = tmp_path / "info.log"
    text.write_text("2024-01-01 00:00:00 - INFO - { Epoch:[  1/  2], step:[    1/  100], loss: 2.0\n" * 3)
    assert not is_event_file(text)
    (tmp_path / "events.out.tfevents.1700000002.host").write_bytes(b"")
    (tmp_path / "events.out.tfevents.1700000001.host.2").write_bytes(b"")
    (tmp_path / "events.out.tfevents.999999999.host").write_bytes(b"")
    assert [p.name for p in event_files_in(tmp_path)] == [
        "events.out.tfevents.999999999.host", "events.out.tfevents.1700000001.host.2", "events.out.tfevents.1700000002.host"]


def test_a_torn_frame_right_before_a_relaunch_s_frames_loses_none_of_them(event_file: Path) -> None:
    data = event_file.read_bytes()
    whole = FrameSplitter().feed(data)
    torn = whole[3]
    # The torn frame's length reaches into the frames after it: skipping it by its length would lose them.
    damaged = data + data[torn.start:torn.end - 5] + data
    splitter = FrameSplitter()
    got = splitter.feed(damaged)
    assert [f.payload for f in got] == [f.payload for f in whole] * 2
    assert splitter.bad_frames == 1 and splitter.skipped_bytes == torn.end - 5 - torn.start


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=30), where=st.integers(min_value=0),
       flip=st.integers(min_value=1, max_value=255))
def test_any_cuts_and_any_damaged_byte_lose_only_the_frame_it_is_in(event_file: Path, cuts: List[int], where: int,
                                                                    flip: int) -> None:
    data = bytearray(event_file.read_bytes())
    whole = FrameSplitter().feed(bytes(data))
    where %= len(data)
    data[where] ^= flip
    splitter, got, last = FrameSplitter(), [], 0
    for cut in sorted({c % len(data) for c in cuts}) + [len(data)]:
        got += splitter.feed(bytes(data[last:cut]))
        last = cut
    assert [f.payload for f in got] == [f.payload for f in whole if not f.start <= where < f.end]
    assert splitter.bad_frames == 1


def test_megabytes_of_random_bytes_between_frames_are_passed_over(event_file: Path) -> None:
    data = event_file.read_bytes()
    whole = FrameSplitter().feed(data)
    garbage = random.Random(7).randbytes(3 << 20)
    stream = data + garbage + bytes(5000) + data[40:] + bytes(3)  # garbage, zeros, frames, a zero tail
    splitter, got = FrameSplitter(), []
    for index in range(0, len(stream), 64 << 10):
        got += splitter.feed(stream[index:index + (64 << 10)])
    assert [f.payload for f in got] == [f.payload for f in whole] + [f.payload for f in whole[1:]]
    assert splitter.bad_frames == 1 and splitter.skipped_bytes == len(garbage) + 5000
    assert splitter.offset == len(stream) - 3 and splitter.pending_bytes == 3  # a tail that may become a frame


def test_a_frame_whose_header_begins_with_zero_bytes_after_a_run_of_zeros() -> None:
    payload = bytes(range(256))  # a length of 256: the header's first byte is 0
    splitter = FrameSplitter()
    got = splitter.feed(bytes(100) + frame(payload))
    assert [f.payload for f in got] == [payload] and got[0].start == 100 and splitter.skipped_bytes == 100
