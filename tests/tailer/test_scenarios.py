"""The 17 reliability scenarios of shared/research/tailing-and-sse.md §4, in one place, in both modes.

Every file scenario runs twice: `events` (watchfiles on the parent directories plus the 1 s safety timer) and
`polling` (timer only, no watcher at all: what a network filesystem gets). Writers are real processes
(tests/tailer/scenario_writer.py: `logging`'s RotatingFileHandler, or one O_APPEND fd kept across mv/rm) emitting
`w=<writer> seq=<n>` lines; every check is exact per writer: missing, duplicated and out-of-order lines.

Where a scenario runs:
- in-process `Tailer` (the real pass loop, watcher and store, without HTTP: faster): 1, 2, 3, 5, 6, 8, 11, 12,
  13, 17; `FileFollower` directly for the byte-exact edge cases (inode reuse, lost-byte counts, injected errors).
- a real `mstail` subprocess on 127.0.0.1: 1 (short stress), 4 (late files and directories, discovery time),
  7 (a 50 MB line: the process's peak RSS), 16 (NaN / Inf / 1e400 through the SSE stream).
- covered in tests/web (pointers below): 10, 14, 15. Not here: 9 and the server-restart variant of 10 (they
  need the persisted state; they come with it).
The long stress variant of scenario 1 and the fairness latency of 12 are measured by
tests/bench/rotation_scenarios.py (not CI).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from mstail.parsers import load_formats
from mstail.tailer.inputs.follower import FileFollower
from mstail.tailer.live.sidecar import Tailer

from .scenario_support import (
    MODES,
    Running,
    assert_exact,
    count,
    counters,
    finish,
    finished,
    make_tailer,
    records,
    spawn,
)

MODE_LIST = list(MODES)


@pytest.fixture(params=MODE_LIST)
def mode(request: pytest.FixtureRequest) -> str:
    return request.param


def seqs_in(path: Path) -> List[int]:
    """Sequence numbers of the complete `w=.. seq=..` lines a file holds now."""
    out = []
    for raw in path.read_bytes().split(b"\n")[:-1]:
        if raw.startswith(b"w=") and b" seq=" in raw:
            out.append(int(raw.split(b" seq=")[1].split(b" ")[0]))
    return out


# -- 1. rotation by rename + create -------------------------------------------------------------------------
@pytest.mark.slow  # a writer process
def test_01_rename_and_create_with_late_writes_to_the_renamed_file(tmp_path: Path, mode: str) -> None:
    """`mv a.log a.log.1` while writer 1 keeps its fd and appends ~2 s more to a.log.1; writer 2 creates a.log."""
    log = tmp_path / "a.log"
    tailer = make_tailer(mode, str(log))

    async def scenario() -> None:
        async with Running(tailer) as run:
            old = spawn(log, 150, tag=1, raw=True, rate=50)  # 3 s; keeps its fd across the rename
            await run.until(lambda: count(tailer) >= 40, 10, "40 lines of the first file")
            os.rename(log, tmp_path / "a.log.1")
            new = spawn(log, 300, tag=2, rate=200)  # creates the new a.log
            await finished(old, new)
            assert len(seqs_in(tmp_path / "a.log.1")) == 150 and seqs_in(tmp_path / "a.log.1")[-1] == 150
            await run.until(lambda: count(tailer) >= 450, 10, "all 450 lines")
            await run.settle(0.3)

    asyncio.run(scenario())
    assert_exact(records(tailer), {1: range(1, 151), 2: range(1, 301)})
    assert counters(tailer, "a")["rotations"] == 1


def test_01_rotating_file_handler_stress_short(tmp_path: Path, mode: str, mstail_server) -> None:  # type: ignore[no-untyped-def]
    """4 ranks through RotatingFileHandler, rolling every ~60 lines and every 0.5 s, against a real mstail.
    (The 10 files x 60 s variant: tests/bench/rotation_scenarios.py.)"""
    logs = [tmp_path / f"rank{r}" / "info.log" for r in range(4)]
    args = ["--pattern", _pattern(), "--format", "pattern", "--no-alerts"] + _poll_args(mode)
    server = mstail_server(str(tmp_path / "rank*" / "info.log"), args=args)
    writers = [spawn(log, 2000, tag=r, rate=800, max_bytes=4096, backups=500, rotate_every=0.5)
               for r, log in enumerate(logs)]
    finish(*writers)
    server.wait_records(8000, timeout=20)
    got = _all_records(server)
    assert_exact(got, {r: range(1, 2001) for r in range(4)})
    sources = {s["id"]: s for s in server.get_json("/api/sources")}
    assert all(sources[f"rank{r}"]["counters"]["rotations"] >= 10 for r in range(4)), sources


# -- 2. copytruncate ----------------------------------------------------------------------------------------
def copytruncate(log: Path, keep: int = 9) -> Path:
    """What logrotate's `copytruncate` does: shift the backups, copy the live file to .1, truncate it."""
    for n in range(keep - 1, 0, -1):
        if Path(f"{log}.{n}").exists():
            os.rename(f"{log}.{n}", f"{log}.{n + 1}")
    shutil.copyfile(log, f"{log}.1")
    os.truncate(log, 0)
    return Path(f"{log}.1")


@pytest.mark.slow  # a writer process
def test_02_copytruncate_while_writing(tmp_path: Path, mode: str) -> None:
    """Three copytruncates while a writer appends: every line that exists in a copy or in the live file is
    delivered once (the copy is not re-ingested, its unread tail is read from the old offset); only lines
    written between the copy and the truncate (in no file at all) are missing."""
    log = tmp_path / "a.log"
    tailer = make_tailer(mode, str(log))
    exist: List[int] = []

    async def scenario() -> None:
        async with Running(tailer) as run:
            writer = spawn(log, 900, tag=1, raw=True, rate=300)  # 3 s
            for _ in range(3):
                await asyncio.sleep(0.7)
                exist.extend(seqs_in(copytruncate(log)))
            await finished(writer)
            exist.extend(seqs_in(log))
            await run.until(lambda: count(tailer) >= len(exist), 10, f"{len(exist)} lines")
            await run.settle(0.5)

    asyncio.run(scenario())
    assert sorted(set(exist)) == sorted(exist), "a line is in two files: the test's copytruncate is wrong"
    assert_exact(records(tailer), {1: sorted(exist)})
    c = counters(tailer, "a")
    assert c["truncations"] == 3 and c["rotations"] == 0, c
    assert c["lost_bytes"] == 0, c  # the copies held everything that was not read yet


@pytest.mark.slow  # a writer process
def test_02_truncated_and_regrown_past_the_offset_within_one_interval(tmp_path: Path, mode: str) -> None:
    """`tail -F` resumes mid-line here (size never looked smaller); the head signature catches it."""
    log = tmp_path / "a.log"
    finish(spawn(log, 50, tag=1))
    tailer = make_tailer(mode, str(log))

    async def scenario() -> None:
        async with Running(tailer) as run:
            await run.until(lambda: count(tailer) >= 50, 10, "the first generation")
            size = log.stat().st_size
            await finished(spawn(log, 120, tag=2, truncate=True, raw=True, batch=120))  # one write, > the old size
            assert log.stat().st_size > size
            await run.until(lambda: count(tailer) >= 170, 10, "the second generation")
            await run.settle(0.3)

    asyncio.run(scenario())
    assert_exact(records(tailer), {1: range(1, 51), 2: range(1, 121)})
    assert counters(tailer, "a")["truncations"] == 1


@pytest.mark.slow  # a writer process
def test_02_plain_truncation_counts_and_logs_the_bytes_it_lost(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # `> a.log` (no copy) while 40 lines were not read yet (small budget): those bytes are gone; counted, logged.
    log = tmp_path / "a.log"
    finish(spawn(log, 60, tag=1))
    line_bytes = len(log.read_bytes()) // 60
    follower = FileFollower(log)
    assert len(follower.read(20 * line_bytes, time.time())) == 20
    with open(log, "w") as handle:
        handle.write("w=2 seq=00000001 pad=x\n")
    with caplog.at_level(logging.WARNING, logger="mstail.follower"):
        got = follower.read(1 << 20, time.time())
    assert [line.text for line in got] == ["w=2 seq=00000001 pad=x"]
    assert follower.counters["truncations"] == 1
    assert follower.counters["lost_bytes"] == 40 * line_bytes
    assert f"{40 * line_bytes} bytes" in caplog.text


@pytest.mark.slow  # a writer process
def test_02_copy_of_what_was_read_is_not_read_again_after_a_later_rotation(tmp_path: Path) -> None:
    # copytruncate leaves a.log.1 (a copy: another inode, the same head as what was read). When the path later
    # rotates for real (rename), the backups are scanned again: the copy must not be read a second time.
    log = tmp_path / "a.log"
    finish(spawn(log, 30, tag=1))
    follower = FileFollower(log)
    seen = [line.text for line in follower.read(1 << 20, time.time())]
    copytruncate(log)
    finish(spawn(log, 10, tag=2))
    for _ in range(3):
        seen += [line.text for line in follower.read(1 << 20, time.time())]
    os.rename(log, f"{log}.x")  # not a numbered backup: only the copy a.log.1 is one
    finish(spawn(log, 5, tag=3))
    for _ in range(3):
        seen += [line.text for line in follower.read(1 << 20, time.time())]
    tags = [(int(t.split()[0][2:]), int(t.split()[1][4:])) for t in seen]
    assert tags == [(1, i) for i in range(1, 31)] + [(2, i) for i in range(1, 11)] + [(3, i) for i in range(1, 6)]


# -- 3. delete + recreate -----------------------------------------------------------------------------------
@pytest.mark.slow  # a writer process
def test_03_delete_while_written_then_recreate(tmp_path: Path, mode: str) -> None:
    """`rm a.log` while writer 1 still writes through its fd (~2 s more); 0.3 s later writer 2 creates a.log."""
    log = tmp_path / "a.log"
    tailer = make_tailer(mode, str(log))

    async def scenario() -> None:
        async with Running(tailer) as run:
            old = spawn(log, 150, tag=1, raw=True, rate=50)
            await run.until(lambda: count(tailer) >= 40, 10, "40 lines of the first file")
            os.unlink(log)
            await asyncio.sleep(0.3)
            new = spawn(log, 200, tag=2, rate=200)
            await finished(old, new)
            await run.until(lambda: count(tailer) >= 350, 10, "all 350 lines")
            await run.settle(0.3)

    asyncio.run(scenario())
    assert_exact(records(tailer), {1: range(1, 151), 2: range(1, 201)})


@pytest.mark.slow  # a writer process
def test_03_reused_inode_is_a_new_file(tmp_path: Path) -> None:
    """A generation created and rotated away between two passes may get the inode of a file read (and closed)
    earlier (ext4 hands a freed inode out again at once): it is new content and must be read from 0."""
    log = tmp_path / "a.log"
    backup1, backup2 = Path(f"{log}.1"), Path(f"{log}.2")
    finish(spawn(backup1, 3, tag=0))
    finish(spawn(log, 3, tag=1))
    follower = FileFollower(log, rotate_wait_s=0.0)
    texts: List[str] = []
    for _ in range(4):  # reads .1 and a.log; then .1 idles out and is closed
        texts += [line.text for line in follower.read(1 << 20, time.time())]
    assert not follower.draining
    old_inode = backup1.stat().st_ino
    os.unlink(backup1)
    fresh = tmp_path / "fresh.log"
    finish(spawn(fresh, 3, tag=2))  # likely gets the freed inode
    reused = fresh.stat().st_ino == old_inode
    os.rename(log, backup2)  # the handler's rollover, twice between two of our passes
    os.rename(fresh, backup1)
    finish(spawn(log, 3, tag=3))
    for _ in range(4):
        texts += [line.text for line in follower.read(1 << 20, time.time())]
    tags = [(int(t.split()[0][2:]), int(t.split()[1][4:])) for t in texts]
    expected = [(0, i) for i in (1, 2, 3)] + [(1, i) for i in (1, 2, 3)] + [(2, i) for i in (1, 2, 3)] + [(3, i) for i in (1, 2, 3)]
    assert tags == expected, f"inode reused: {reused}"


# -- 4. files and directories that appear later -------------------------------------------------------------
def test_04_files_and_run_directory_appear_later(tmp_path: Path, mode: str, mstail_server) -> None:  # type: ignore[no-untyped-def]
    """mstail starts on an empty directory and on a run directory that does not exist yet; 6 rank files and
    2 rank directories appear 0.3-2 s later. Discovery (first line written -> its record served) within 1 s
    with events, within the poll interval + 1 s when polling; every line of every file."""
    logs, run = tmp_path / "logs", tmp_path / "run"
    logs.mkdir()
    patterns = [str(logs / "rank*.log"), str(run / "output" / "log" / "rank_*" / "info.log")]
    server = mstail_server(*patterns, args=["--pattern", _pattern(), "--format", "pattern", "--no-alerts"] + _poll_args(mode))
    targets = {f"rank{r}": logs / f"rank{r}.log" for r in range(6)}
    targets.update({f"rank_{r}": run / "output" / "log" / f"rank_{r}" / "info.log" for r in (6, 7)})
    writers, first_write, discovered = {}, {}, {}
    began = time.monotonic()
    schedule = sorted((0.3 + 0.25 * i, source) for i, source in enumerate(targets))
    while len(discovered) < len(targets) and time.monotonic() - began < 20:
        for at, source in schedule:
            if source not in writers and time.monotonic() - began >= at:
                times = tmp_path / f"{source}.times"
                writers[source] = spawn(targets[source], 100, tag=int(source.strip("rank_")), rate=100, times=times)
        for source, info in ((s["id"], s) for s in server.get_json("/api/sources")):
            if info["records"] and source not in discovered:
                discovered[source] = time.time()
        time.sleep(0.02)
    finish(*writers.values())
    for source in targets:
        first_write[source] = float((tmp_path / f"{source}.times").read_text().split()[1])
    bound = 1.0 if MODES[mode] is None else MODES[mode] + 1.0
    delays = {source: round(discovered[source] - first_write[source], 3) for source in targets}
    assert all(delay <= bound for delay in delays.values()), delays
    server.wait_records(800, timeout=15)
    got = _all_records(server)
    assert_exact(got, {int(source.strip("rank_")): range(1, 101) for source in targets})
    assert {r["source"] for r in got} == set(targets)


# -- 5. partial line ----------------------------------------------------------------------------------------
@pytest.mark.slow  # a writer process
def test_05_partial_line_waits_for_its_newline(tmp_path: Path, mode: str) -> None:
    """Line 10 is written in two parts 2 s apart, cut inside its number (`seq=0000` ... `0010`): it must not
    come out early (as step 0 or 1), and comes out once, whole, when its newline arrives."""
    log = tmp_path / "a.log"
    tailer = make_tailer(mode, str(log))

    async def scenario() -> None:
        async with Running(tailer) as run:
            writer = spawn(log, 12, tag=1, split_line=10, split_at=12, split_pause=2.0)
            await run.until(lambda: count(tailer) >= 9, 10, "the 9 complete lines")
            await asyncio.sleep(1.0)  # the tail `w=1 seq=0000` has been read (and held) for a while now
            assert [r["step"] for r in records(tailer)] == list(range(1, 10))
            await finished(writer)
            await run.until(lambda: count(tailer) >= 12, 10, "all 12 lines")
            await run.settle(0.3)

    asyncio.run(scenario())
    assert_exact(records(tailer), {1: range(1, 13)})


@pytest.mark.slow  # a writer process
def test_05_partial_last_line_of_a_writer_that_died_is_not_emitted(tmp_path: Path, mode: str) -> None:
    log = tmp_path / "a.log"
    tailer = make_tailer(mode, str(log))

    async def scenario() -> None:
        async with Running(tailer) as run:
            writer = spawn(log, 3, tag=1, split_line=3, split_at=14, split_pause=30)
            await run.until(lambda: count(tailer) >= 2, 10, "the 2 complete lines")
            writer.kill()  # dies mid-line
            writer.communicate(timeout=5)
            await asyncio.sleep(0.6)

    asyncio.run(scenario())
    assert log.read_bytes().endswith(b"w=1 seq=000000")
    assert_exact(records(tailer), {1: [1, 2]})


# -- 6. split UTF-8, CRLF, BOM ------------------------------------------------------------------------------
TEXT = "loss é 中文 😀 ✓"


@pytest.mark.slow  # a writer process
def test_06_multibyte_text_split_across_writes_and_reads(tmp_path: Path, mode: str) -> None:
    """JSONL events carrying multi-byte text, with a BOM and CRLF line ends, written one byte per write and read
    with a 1-byte budget per pass: the decoded text is identical to what was written, nothing replaced."""
    log = tmp_path / "notes.jsonl"
    tailer = make_tailer(mode, patterns=(), format=None, read_budget_bytes=1, jsonl=(str(log),))

    async def scenario() -> None:
        async with Running(tailer) as run:
            await finished(spawn(log, 25, tag=1, jsonl_text=TEXT, crlf=True, bom=True, bytewise=True))
            await run.until(lambda: len(tailer.store.events()) >= 25, 20, "25 events")
            await run.settle(0.3)

    asyncio.run(scenario())
    events = tailer.store.events()
    assert [e["message"] for e in events] == [f"{TEXT} {i}" for i in range(1, 26)]
    assert [e["step"] for e in events] == list(range(1, 26))
    assert counters(tailer, "notes")["bad_utf8_lines"] == 0


def test_06_every_line_identical_whatever_the_read_size(tmp_path: Path) -> None:
    # Byte-exact at the follower: a 1-byte budget splits every character; invalid bytes become U+FFFD, counted.
    log = tmp_path / "a.log"
    lines = [f"{TEXT} {i}" for i in range(40)]
    log.write_bytes(b"\xef\xbb\xbf" + "".join(t + "\r\n" for t in lines).encode() + b"bad \xff\xfe\n")
    follower = FileFollower(log)
    got = []
    for _ in range(log.stat().st_size + 5):
        got += [line.text for line in follower.read(1, time.time())]
    assert got == lines + ["bad \ufffd\ufffd"]
    assert follower.counters["bad_utf8_lines"] == 1


# -- 7. a giant line and `\r` progress bars -----------------------------------------------------------------
def _vm_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {key} in /proc/{pid}/status")


def test_07_fifty_megabyte_line_and_progress_redraws(tmp_path: Path, mode: str, mstail_server) -> None:  # type: ignore[no-untyped-def]
    """50 MB without a newline, then `\r` progress redraws for 1 s, then normal lines: mstail's peak RSS grows
    by less than the 1 MiB line limit plus a small constant, the line is cut once, tailing goes on."""
    log = tmp_path / "rank_0" / "info.log"
    finish(spawn(log, 5, tag=1))
    server = mstail_server(log, args=["--pattern", _pattern(), "--format", "pattern", "--no-alerts"] + _poll_args(mode))
    server.wait_records(5)
    pid = server.proc.pid
    peak_before = _vm_kib(pid, "VmHWM")
    finish(spawn(log, 20, tag=1, start=6, raw=True, giant_after=10, tqdm_after=15, tqdm_seconds=1.0))
    server.wait_records(25, timeout=30)
    growth_kib = _vm_kib(pid, "VmHWM") - peak_before
    assert growth_kib < 1024 + 16 * 1024, f"peak RSS grew by {growth_kib} KiB"
    assert_exact(_all_records(server), {1: range(1, 26)})
    [source] = server.get_json("/api/sources")
    assert source["counters"]["cut_lines"] == 1, source["counters"]


# -- 8. binary garbage --------------------------------------------------------------------------------------
@pytest.mark.slow  # a writer process
def test_08_random_bytes_nul_run_sparse_hole_and_ansi_colours(tmp_path: Path, mode: str) -> None:
    """Random bytes (invalid UTF-8), a 1.5 MiB NUL run glued to the next line, a 2 MiB sparse hole, ANSI
    colour codes around lines: the tailer lives on, every numbered line is parsed, the garbage is counted."""
    log = tmp_path / "a.log"
    tailer = make_tailer(mode, str(log))

    async def scenario() -> None:
        async with Running(tailer) as run:
            await finished(spawn(log, 30, tag=1, garbage_after=10, rate=200))
            await run.until(lambda: count(tailer) >= 35, 15, "35 lines")
            await run.settle(0.3)

    asyncio.run(scenario())
    assert_exact(records(tailer), {1: range(1, 36)})
    c = counters(tailer, "a")
    assert c["bad_utf8_lines"] > 0 and c["nul_bytes"] >= (1536 << 10) + (2 << 20) and c["cut_lines"] == 0, c
    assert c["lines"] == log.read_bytes().count(b"\n"), c  # the ANSI-coloured and garbage lines count too


# -- 9. restart with persisted offsets: comes with the persisted state (another change) ----------------------
# -- 10. SSE reconnect with Last-Event-ID: tests/web/test_sse.py
#    test_reconnect_with_last_event_id_gets_exactly_what_was_missed (resumes right after the id, 0 gaps, 0 dups,
#    `retry: 2000` sent) and test_an_id_beyond_this_history_asks_the_client_to_reload (`reset`); the
#    server-restart variant comes with the persisted state.


# -- 11. NFS / polling: same-mtime writes, injected ESTALE / EIO, attribute-cache lag -------------------------
@pytest.mark.slow  # a writer process
def test_11_writes_that_keep_the_mtime(tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every write is followed by os.utime back to the first mtime (a stat-based poller sees nothing change).
    Polling mode starts no watcher at all (0 events) and still gets every line within the interval + 1 s."""
    import mstail.tailer.live.sidecar as sidecar

    watchers: List[Any] = []
    real_watch = sidecar.watch_directories

    async def counting_watch(*args: Any, **kwargs: Any) -> None:
        watchers.append(args[0])
        await real_watch(*args, **kwargs)

    monkeypatch.setattr(sidecar, "watch_directories", counting_watch)
    log = tmp_path / "a.log"
    times = tmp_path / "times"
    tailer = make_tailer(mode, str(log))

    async def scenario() -> None:
        async with Running(tailer) as run:
            await finished(spawn(log, 150, tag=1, rate=100, keep_mtime=True, times=times))
            await run.until(lambda: count(tailer) >= 150, 10, "150 lines")

    asyncio.run(scenario())
    got = records(tailer)
    assert_exact(got, {1: range(1, 151)})
    written = {int(a): float(b) for a, b in (line.split() for line in times.read_text().splitlines())}
    assert os.stat(log).st_mtime <= min(written.values()) + 0.001  # the mtime of the first write, still
    if MODES[mode] is not None:
        assert watchers == []  # polling: no file events at all
        worst = max(r["time"] - written[r["step"]] for r in got)
        assert worst <= MODES[mode] + 1.0, worst
    else:
        assert watchers


@pytest.mark.slow  # a writer process
def test_11_injected_eio_and_estale_are_survived(tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """No NFS server can run here, so the errors a flaky mount gives are injected into os.pread (the only
    mock in this file): 4 EIOs in a row (backoff 0.1, 0.2, 0.4, 0.8 s), then an ESTALE (the path is opened
    again). Nothing is lost or repeated, the errors are counted, the tailer never stops."""
    log = tmp_path / "a.log"
    real_pread = os.pread
    calls = {"n": 0}

    def flaky_pread(fd: int, size: int, offset: int) -> bytes:
        if os.readlink(f"/proc/self/fd/{fd}") == str(log):
            calls["n"] += 1
            if calls["n"] in (6, 7, 8, 9):
                raise OSError(errno.EIO, "Input/output error")
            if calls["n"] == 14:
                raise OSError(errno.ESTALE, "Stale file handle")
        return real_pread(fd, size, offset)

    tailer = make_tailer(mode, str(log))

    async def scenario() -> None:
        async with Running(tailer) as run:
            monkeypatch.setattr(os, "pread", flaky_pread)
            await finished(spawn(log, 200, tag=1, rate=100))
            await run.until(lambda: count(tailer) >= 200, 15, "200 lines")
            await run.settle(0.3)

    asyncio.run(scenario())
    assert calls["n"] > 14
    assert_exact(records(tailer), {1: range(1, 201)})
    c = counters(tailer, "a")
    assert c["io_errors"] == 5 and c["truncations"] == 0 and c["lost_bytes"] == 0, c


@pytest.mark.slow  # a writer process
def test_11_stat_lagging_behind_the_data_is_not_a_truncation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # NFS attribute cache: fstat keeps reporting an old (smaller) size while read() returns the new data.
    # Injected (no NFS here): fstat of the log always says 0 bytes. read() is trusted: no false truncation.
    log = tmp_path / "a.log"
    real_fstat = os.fstat

    def stale_fstat(fd: int) -> os.stat_result:
        st = real_fstat(fd)
        if os.readlink(f"/proc/self/fd/{fd}") == str(log):
            values = list(st)
            values[6] = 0  # st_size
            return os.stat_result(values)
        return st

    finish(spawn(log, 50, tag=1))
    follower = FileFollower(log)
    monkeypatch.setattr(os, "fstat", stale_fstat)
    texts = [line.text for line in follower.read(1 << 20, time.time())]
    finish(spawn(log, 50, tag=1, start=51))
    for _ in range(3):
        texts += [line.text for line in follower.read(1 << 20, time.time())]
    assert [int(t.split()[1][4:]) for t in texts] == list(range(1, 101))
    assert follower.counters["truncations"] == 0


# -- 12. many ranks, one flooding -------------------------------------------------------------------------
@pytest.mark.slow  # a writer process
def test_12_eight_ranks_beside_a_flooding_one(tmp_path: Path, mode: str) -> None:
    """8 ranks at 1k lines/s and one at 50k lines/s for 2 s: every line of every rank, in order. (The latency
    of the slow ranks with and without the flood: tests/bench/rotation_scenarios.py fairness.)"""
    tailer = make_tailer(mode, str(tmp_path / "rank*.log"))
    total = 8 * 2000 + 100_000

    async def scenario() -> None:
        async with Running(tailer) as run:
            writers = [spawn(tmp_path / f"rank{r}.log", 2000, tag=r, rate=1000) for r in range(8)]
            writers.append(spawn(tmp_path / "rank8.log", 100_000, tag=8, rate=50_000, raw=True, batch=500))
            await finished(*writers)
            await run.until(lambda: count(tailer) >= total, 30, f"{total} lines")
            await run.settle(0.2)

    asyncio.run(scenario())
    expected: Dict[int, Any] = {r: range(1, 2001) for r in range(8)}
    expected[8] = range(1, 100_001)
    assert_exact(records(tailer), expected)
    assert sorted(tailer.store.sources) == [f"rank{r}" for r in range(9)]


# -- 13. multiline tracebacks -------------------------------------------------------------------------------
TRACEBACK_FORMAT = r"""
description = "scenario lines and raw Python tracebacks"
[[rule]]
name = "step"
kind = "record"
regex = '^w=(?P<w>\d+) seq=(?P<step>\d+) pad=(?P<_pad>x*)$'
[[rule]]
name = "traceback"
kind = "event"
event = "error"
multiline = true
regex = '^Traceback \(most recent call last\):'
"""


def traceback_tailer(tmp_path: Path, mode: str, log: Path) -> Tailer:
    fmt = tmp_path / "scenario_tb.toml"
    fmt.write_text(TRACEBACK_FORMAT)
    tailer = make_tailer(mode, str(log), patterns=(), format="scenario_tb", format_files=(str(fmt),))
    formats = load_formats(files=(str(fmt),), user_dir=Path("/nonexistent"))
    return Tailer(tailer.config, formats, tailer.store, tailer.hub)


@pytest.mark.slow  # a writer process
def test_13_tracebacks_between_metric_lines(tmp_path: Path, mode: str) -> None:
    """Three raw tracebacks, each split over two writes 0.2 s apart, between numbered lines: one error event
    per traceback holding all of it, and no metric line swallowed."""
    log = tmp_path / "a.log"
    tailer = traceback_tailer(tmp_path, mode, log)

    async def scenario() -> None:
        async with Running(tailer) as run:
            await finished(spawn(log, 40, tag=1, rate=100, traceback_after="10,20,30"))
            await run.until(lambda: count(tailer) >= 40 and len(tailer.store.events("error")) >= 3, 10, "40 lines")
            await run.settle(1.5)

    asyncio.run(scenario())
    assert_exact(records(tailer), {1: range(1, 41)})
    errors = tailer.store.events("error")
    assert len(errors) == 3, errors
    for event in errors:
        lines = event["message"].splitlines()
        assert lines[0] == "Traceback (most recent call last):" and lines[-1] == "ValueError: w=1 seq=1 pad=x", lines
        assert len(lines) == 6


@pytest.mark.slow  # a writer process
def test_13_torchrun_tagged_ranks_interleaved_in_one_file(tmp_path: Path, mode: str) -> None:
    """torchrun's `[rankN]: ` tags: 3 ranks write one file; rank 2 crashes after its line 10 and its traceback's
    lines come one between each of the others' lines. Each rank becomes a source of its own (`a/rank0` ...),
    the traceback is one error event of `a/rank2` holding all of it, and no metric line is swallowed."""
    log = tmp_path / "a.log"
    tailer = traceback_tailer(tmp_path, mode, log)

    async def scenario() -> None:
        async with Running(tailer) as run:
            await finished(spawn(log, 40, rate=100, torchrun=3, traceback_after="10"))
            await run.until(lambda: count(tailer) >= 90 and tailer.store.events("error"), 10, "90 lines, 1 error")
            await run.settle(1.0)

    asyncio.run(scenario())
    assert_exact(records(tailer), {0: range(1, 41), 1: range(1, 41), 2: range(1, 11)})
    assert {r["source"]: r["w"] for r in records(tailer)} == {"a/rank0": 0, "a/rank1": 1, "a/rank2": 2}
    assert sorted(tailer.store.sources) == ["a", "a/rank0", "a/rank1", "a/rank2"]
    assert tailer.store.sources["a/rank2"].format == "scenario_tb"
    errors = tailer.store.events("error")
    assert [e["source"] for e in errors] == ["a/rank2"]
    lines = errors[0]["message"].splitlines()
    assert lines[0] == "Traceback (most recent call last):" and lines[-1] == "ValueError: w=1 seq=1 pad=x", lines
    assert len(lines) == 6


# -- 14. slow / stalled SSE client: tests/web/test_slow_client.py
#    test_a_client_that_stopped_reading_is_dropped_and_others_go_on (the stalled client is dropped after
#    --send-timeout; a reading client gets every live step; p99 under 100 clients: tests/bench/fanout.py).
# -- 15. shutdown with open streams: tests/web/test_shutdown.py (50 streams, exit within 2 s, clean EOF,
#    reconnect with Last-Event-ID to the restarted server: none lost, none twice).


# -- 16. NaN / Inf / huge values through the stream ---------------------------------------------------------
def test_16_nan_inf_and_overflowing_numbers_reach_the_stream(tmp_path: Path, mode: str, mstail_server) -> None:  # type: ignore[no-untyped-def]
    from tests.web.sse_client import collect

    log = tmp_path / "a.log"
    values = ["1.5", "nan", "inf", "-inf", "1e400", "-1e400", "1.7e308", "NaN", "2.5"]
    script = "import sys,time\nf=open(sys.argv[1],'a')\nfor i,v in enumerate(sys.argv[2:],1):\n" \
             "    f.write('step=%d loss=%s\\n' % (i, v)); f.flush(); time.sleep(0.05)\n"
    pattern = r"^step=(?P<step>\d+) loss=(?P<loss>\S+)$"
    log.write_text("")
    server = mstail_server(log, args=["--pattern", pattern, "--format", "pattern", "--no-alerts"] + _poll_args(mode))
    import subprocess
    import sys

    writer = subprocess.Popen([sys.executable, "-c", script, str(log), *values])
    got = collect(f"{server.url}/api/stream?after=0",
                  until=lambda g: sum(len(m.data) for m in g if m.get("event") == "records") >= len(values))
    writer.wait(timeout=10)
    for message in got:
        if "data" in message:
            json.loads(message["data"], parse_constant=lambda token: pytest.fail(f"bare {token} in the stream"))
    losses = [r.get("loss") for m in got if m.get("event") == "records" for r in m.data]
    # 1e400 is beyond the float range: a field error, left out (an Infinity only when the log writes one)
    assert losses == [1.5, "NaN", "Infinity", "-Infinity", None, None, 1.7e308, "NaN", 2.5]
    assert server.get_json("/healthz")["status"] == "ok"


# -- 17. small files and rank files with identical first KiB ------------------------------------------------
@pytest.mark.slow  # a writer process
def test_17_identical_heads_and_a_tiny_file(tmp_path: Path, mode: str) -> None:
    """8 rank files whose first 1.5 KiB are byte-identical (a config dump) and a 200-byte file: all 9 tailed."""
    tailer = make_tailer(mode, str(tmp_path / "rank*.log"), str(tmp_path / "tiny.log"))

    async def scenario() -> None:
        async with Running(tailer) as run:
            writers = [spawn(tmp_path / f"rank{r}.log", 100, tag=r, rate=200, header_bytes=1536) for r in range(8)]
            writers.append(spawn(tmp_path / "tiny.log", 4, tag=9, pad=10))
            await finished(*writers)
            await run.until(lambda: count(tailer) >= 804, 10, "804 lines")
            await run.settle(0.3)

    asyncio.run(scenario())
    heads = {(tmp_path / f"rank{r}.log").read_bytes()[:1024] for r in range(8)}
    assert len(heads) == 1 and (tmp_path / "tiny.log").stat().st_size < 200
    expected: Dict[int, Any] = {r: range(1, 101) for r in range(8)}
    expected[9] = range(1, 5)
    assert_exact(records(tailer), expected)
    assert len(tailer.store.sources) == 9


# -- helpers for the mstail subprocess ----------------------------------------------------------------------
def _pattern() -> str:
    from .scenario_support import PATTERN

    return PATTERN


def _poll_args(mode: str) -> List[str]:
    return ["--poll", str(MODES[mode])] if MODES[mode] is not None else []


def _all_records(server: Any) -> List[Dict[str, Any]]:
    out: List[Dict[str, Any]] = []
    after = 0
    while True:
        page = server.get_json(f"/api/records?after={after}&limit=10000")
        if not page:
            return out
        out += page
        after = page[-1]["seq"]




@pytest.mark.slow  # a writer process
def test_01_history_larger_than_the_budget_comes_out_in_order(tmp_path: Path) -> None:
    # mstail started late: 5 backups of ~40 KiB each and the live file, read with a 4 KiB budget per pass.
    log = tmp_path / "info.log"
    finish(spawn(log, 4000, tag=1, max_bytes=40000, backups=5))
    follower = FileFollower(log)
    texts: List[str] = []
    for _ in range(200):
        texts += [line.text for line in follower.read(4096, time.time())]
    got = [int(t.split()[1][4:]) for t in texts]
    assert got == list(range(got[0], 4001)) and len(got) > 3000
