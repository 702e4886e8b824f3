"""FileFollower against real files written by real writer processes: every line exactly once, in order."""

from __future__ import annotations

import logging
import logging.handlers
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from mstail.tailer.inputs import follower as follower_module
from mstail.tailer.inputs.follower import FileFollower

WRITER = Path(__file__).with_name("seq_writer.py")
SEQ = re.compile(r"line=(\d+)")


def numbers(lines) -> List[int]:  # type: ignore[no-untyped-def]
    return [int(SEQ.search(line.text).group(1)) for line in lines]


def follow_until(follower: FileFollower, want: int, proc: subprocess.Popen, timeout_s: float = 30.0) -> List[int]:
    """Read like the sidecar does (small budget, frequent passes) until `want` lines or the deadline."""
    seen: List[int] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen += numbers(follower.read(64 * 1024, time.time()))
        if len(seen) >= want and proc.poll() is not None:
            break
        time.sleep(0.002)
    seen += numbers(follower.read(1 << 30, time.time()))
    return seen


def spawn(path: Path, count: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(WRITER), str(path), str(count), *extra], stdout=subprocess.PIPE)


@pytest.mark.slow  # a writer process
def test_reads_history_then_live(tmp_path: Path) -> None:
    path = tmp_path / "info.log"
    spawn(path, 100).wait(timeout=20)
    follower = FileFollower(path)
    proc = spawn(path, 400, "--interval", "0.001", "--start", "101")
    seen = follow_until(follower, 500, proc)
    proc.wait(timeout=20)
    assert seen == list(range(1, 501))


@pytest.mark.slow  # a writer process
def test_rotation_by_rotating_file_handler_loses_and_repeats_nothing(tmp_path: Path) -> None:
    path = tmp_path / "info.log"
    follower = FileFollower(path)
    # ~60-byte lines, 4 KiB files: about 60 rotations while we read.
    proc = spawn(path, 4000, "--interval", "0.0002", "--max-bytes", "4096", "--backups", "100")
    seen = follow_until(follower, 4000, proc)
    proc.wait(timeout=30)
    assert follower.counters["rotations"] > 10
    assert seen == list(range(1, 4001))


@pytest.mark.slow  # a writer process
def test_history_includes_rotated_backups_oldest_first(tmp_path: Path) -> None:
    path = tmp_path / "info.log"
    spawn(path, 1000, "--max-bytes", "8192", "--backups", "50").wait(timeout=20)
    assert (tmp_path / "info.log.3").exists()
    follower = FileFollower(path)
    seen = numbers(follower.read(1 << 30, time.time()))
    for _ in range(3):  # backups are read before the live file, one pass each at most
        seen += numbers(follower.read(1 << 30, time.time()))
    assert seen == list(range(1, 1001))


@pytest.mark.slow  # a writer process
def test_backups_found_at_a_rotation_come_out_in_order_under_a_small_budget(tmp_path: Path) -> None:
    path = tmp_path / "info.log"
    spawn(path, 10).wait(timeout=20)
    follower = FileFollower(path)
    seen = numbers(follower.read(1 << 20, time.time()))
    # Many rollovers between two reads: the files created and rotated away meanwhile are found when the old
    # file ends, and each is bigger than one read's budget.
    spawn(path, 1000, "--start", "11", "--max-bytes", "8192", "--backups", "50").wait(timeout=20)
    for _ in range(1000):
        got = follower.read(1024, time.time())
        seen += numbers(got)
        if not got and len(seen) >= 1010:
            break
    assert follower.counters["rotations"] > 3
    assert seen == list(range(1, 1011))


class Handler:
    """`logging`'s RotatingFileHandler in this process, so a test decides when it rolls over."""

    def __init__(self, path: Path) -> None:
        self.handler = logging.handlers.RotatingFileHandler(path, backupCount=50)
        self.handler.setFormatter(logging.Formatter("%(message)s"))
        self.written = 0

    def lines(self, count: int) -> None:
        for _ in range(count):
            self.written += 1
            self.handler.emit(logging.makeLogRecord({"msg": f"line={self.written:08d}"}))

    def rollover(self) -> None:
        self.handler.doRollover()
        self.lines(10)


@pytest.mark.parametrize("rollovers", [1, 2])
@pytest.mark.parametrize("after_open", [1, 2, 3, 4])
def test_rollovers_while_the_backups_are_listed_come_out_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after_open: int, rollovers: int
) -> None:
    """Three rollovers between two reads, then `rollovers` more while the read that finds them opens files: right
    after its `after_open`-th open (1: the path's new file; 2, 3, 4: the backups `.3`, `.2`, `.1`, oldest first).
    Each renames every backup to the next number: one listed but not opened yet moves to a number already passed,
    or a file newer than the path's is listed as a backup. Every line still comes out once, in write order."""
    path = tmp_path / "info.log"
    handler = Handler(path)
    handler.lines(10)
    follower = FileFollower(path)
    seen = numbers(follower.read(1 << 20, time.time()))
    for _ in range(3):
        handler.rollover()
    opens = 0

    class RollsOverMeanwhile(follower_module._OpenFile):  # type: ignore[misc,valid-type]
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            nonlocal opens
            super().__init__(*args, **kwargs)
            opens += 1
            if opens == after_open:
                for _ in range(rollovers):
                    handler.rollover()

    monkeypatch.setattr(follower_module, "_OpenFile", RollsOverMeanwhile)
    for _ in range(5):  # the old file ends, the rotation is seen, each newer file read: a pass each at most
        seen += numbers(follower.read(1 << 20, time.time()))
    handler.handler.close()
    assert opens > after_open
    assert seen == list(range(1, handler.written + 1))


def test_partial_line_waits_for_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    path.write_bytes(b"line=00000001\nline=0000")
    follower = FileFollower(path)
    assert numbers(follower.read(1 << 20, time.time())) == [1]
    assert follower.read(1 << 20, time.time()) == []
    with open(path, "ab") as handle:
        handle.write(b"0002 tail\n")
    [line] = follower.read(1 << 20, time.time())
    assert line.text == "line=00000002 tail" and line.start == 14


def test_truncation_restarts_from_the_top(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    path.write_text("".join(f"line={i:08d}\n" for i in range(1, 51)))
    follower = FileFollower(path)
    assert len(follower.read(1 << 20, time.time())) == 50
    with open(path, "w") as handle:  # truncate in place (same inode), like copytruncate or `> file`
        handle.write("line=00000101\n")
    assert numbers(follower.read(1 << 20, time.time())) == [101]
    assert follower.counters["truncations"] == 1


def test_truncated_then_regrown_past_the_old_offset_is_detected(tmp_path: Path) -> None:
    # A size check alone misses this (tail -F, Promtail): the head signature catches it.
    path = tmp_path / "a.log"
    path.write_text("".join(f"line={i:08d} old\n" for i in range(1, 11)))
    follower = FileFollower(path)
    assert len(follower.read(1 << 20, time.time())) == 10
    with open(path, "w") as handle:
        handle.write("".join(f"line={i:08d} new run\n" for i in range(1, 21)))
    assert numbers(follower.read(1 << 20, time.time())) == list(range(1, 21))


def test_delete_and_recreate_reads_the_new_file_from_the_start(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    path.write_text("".join(f"line={i:08d}\n" for i in range(1, 6)))
    follower = FileFollower(path)
    assert len(follower.read(1 << 20, time.time())) == 5
    os.unlink(path)
    follower.read(1 << 20, time.time())
    assert follower.state == "gone"
    path.write_text("".join(f"line={i:08d}\n" for i in range(6, 9)))
    seen = numbers(follower.read(1 << 20, time.time())) + numbers(follower.read(1 << 20, time.time()))
    assert seen == [6, 7, 8]
    assert follower.state == "following"


def test_file_that_appears_later(tmp_path: Path) -> None:
    path = tmp_path / "later" / "a.log"
    follower = FileFollower(path)
    assert follower.read(1 << 20, time.time()) == [] and follower.state == "waiting"
    path.parent.mkdir()
    path.write_text("line=00000001\n")
    assert numbers(follower.read(1 << 20, time.time())) == [1]


def test_over_long_line_is_cut_and_tailing_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    with open(path, "wb") as handle:
        handle.write(b"line=00000001\n" + b"y" * (5 << 20) + b"\nline=00000002\n")
    follower = FileFollower(path, max_line_bytes=1 << 20)
    lines = []
    for _ in range(10):
        lines += follower.read(1 << 20, time.time())
    assert [len(line.text) for line in lines] == [13, 1 << 20, 13]
    assert follower.counters["cut_lines"] == 1
    assert lines[2].start == 14 + (5 << 20) + 1


@pytest.mark.parametrize(
    "raw, text",
    [
        (b"\xef\xbb\xbfline=1\r\n", "line=1"),  # BOM and CRLF
        (b"bad \xff\xfe byte\n", "bad \ufffd\ufffd byte"),
        (b"nul\x00\x00 run\n", "nul run"),
        (b"  3%|#   |\r 50%|##  |\r100%|####|\n", "100%|####|"),
    ],
)
def test_awkward_bytes_never_raise(tmp_path: Path, raw: bytes, text: str) -> None:
    path = tmp_path / "a.log"
    path.write_bytes(raw)
    [line] = FileFollower(path).read(1 << 20, time.time())
    assert line.text == text
