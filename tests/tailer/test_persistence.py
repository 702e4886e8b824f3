"""Persistence (`--state-dir`): a restarted mstail resumes with nothing lost and nothing repeated.

Scenario 9 of ../shared/research/tailing-and-sse.md §4 (restart with persisted offsets: `kill -9` and SIGTERM
while a writer appends thousands of lines a second; files rotated, deleted or truncated while mstail is down;
a corrupt or mismatched state) and the server-restart variant of scenario 10 (SSE ids stable across restarts).
Every test runs real `mstail` processes against real writer processes (logging's RotatingFileHandler).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import List, Tuple

import pytest

from mstail.parsers import load_formats
from mstail.tailer.config import Config
from mstail.tailer.live.hub import Hub
from mstail.tailer.live.sidecar import Tailer
from mstail.parsers.derived import load_derived
from mstail.tailer.app.state import open_state
from mstail.tailer.history.db import StateDB
from mstail.tailer.history.store import Store
from tests.conftest import finish_writer, start_mstail, wait_until
from tests.web.sse_client import collect, stream_seqs

WRITER = Path(__file__).with_name("seq_writer.py")
PATTERN = r"^line=(?P<step>\d+) padding=x+$"


def write(path: Path, count: int, *args: str) -> "subprocess.Popen[bytes]":
    cmd = [sys.executable, str(WRITER), str(path), str(count), *args]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


class Sidecar:
    """Starts and restarts a real mstail on one log with one state folder; remembers every process."""

    def __init__(self, log: Path, tmp_path: Path, *extra: str) -> None:
        self.log, self.tmp_path = log, tmp_path
        self.args = ["--pattern", PATTERN, "--format", "pattern", "--state-dir", str(tmp_path / "state"), "--no-alerts", *extra]
        self.servers: list = []

    def start(self):  # type: ignore[no-untyped-def]
        server = start_mstail([self.log], self.tmp_path / f"run{len(self.servers)}", args=self.args)
        self.servers.append(server)
        return server

    def records(self, server, expected: int) -> List[dict]:  # type: ignore[no-untyped-def]
        """Wait (bounded) until `server` holds `expected` records, then return them all in seq order."""
        server.wait_records(expected, timeout=60)
        got: List[dict] = []
        while True:
            page = server.get_json(f"/api/records?after={got[-1]['seq'] if got else 0}&limit=10000")
            if not page:
                return got
            got += page

    def close(self) -> None:
        for server in self.servers:
            code = server.stop()
            assert code is not None and "Traceback" not in server.stderr, server.stderr


@pytest.fixture
def sidecar(tmp_path: Path):  # type: ignore[no-untyped-def]
    made: List[Sidecar] = []

    def make(log: Path, *extra: str) -> Sidecar:
        made.append(Sidecar(log, tmp_path, *extra))
        return made[-1]

    yield make
    for one in made:
        one.close()


def log_read_once(tmp_path: Path, sidecar, count: int, name: str = "info.log"):  # type: ignore[no-untyped-def]
    """A finished log of `count` lines and a first mstail that has read all of it: (log, sidecar, server)."""
    log = tmp_path / "logs" / name
    log.parent.mkdir()
    finish_writer(write(log, count))
    side = sidecar(log)
    first = side.start()
    side.records(first, count)
    return log, side, first


def steps_and_seqs(records: List[dict]) -> Tuple[List[int], List[int]]:
    return [r["step"] for r in records], [r["seq"] for r in records]


def assert_exactly_once(records: List[dict], expected: range) -> None:
    steps, seqs = steps_and_seqs(records)
    duplicated = sorted(step for step, n in Counter(steps).items() if n > 1)
    missing = sorted(set(expected) - set(steps))
    assert (missing[:10], duplicated[:10]) == ([], []), f"{len(missing)} missing, {len(duplicated)} duplicated"
    assert steps == sorted(steps), "records out of order"
    assert seqs == list(range(1, len(seqs) + 1)), "seqs are not gap-free from 1"


@pytest.mark.slow  # mstail and writer processes
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_restart_while_a_fast_writer_rotates_loses_and_repeats_nothing(tmp_path: Path, sidecar, how: int) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "logs" / "info.log"
    log.parent.mkdir()
    total = 12_000
    # ~60 bytes a line, 150 KB files: the file rotates ~5 times, also while mstail is down.
    writer = write(log, total, "--interval", "0.0002", "--max-bytes", "150000", "--backups", "50")
    side = sidecar(log)
    first = side.start()
    first.wait_records(2_000, timeout=30)
    first.proc.send_signal(how)
    first.proc.wait(timeout=10)
    second = side.start()
    finish_writer(writer)
    assert_exactly_once(side.records(second, total), range(1, total + 1))
    assert "Traceback" not in first.stderr


@pytest.mark.slow  # mstail and writer processes
def test_history_survives_the_deletion_of_its_rotated_files(tmp_path: Path, sidecar) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "logs" / "info.log"
    log.parent.mkdir()
    rotation = ("--max-bytes", "3000", "--backups", "10")  # ~50 lines a file, 11 files kept: older ones deleted
    finish_writer(write(log, 300, *rotation))
    side = sidecar(log)
    first = side.start()
    before = side.records(first, 300)
    assert first.stop() == 0
    # While mstail is down the run goes on and the handler deletes every file that held steps 1..300.
    finish_writer(write(log, 700, "--start", "301", *rotation))
    still_on_disk = sorted(
        int(line.split()[0].split("=")[1])
        for path in [log, *log.parent.glob("info.log.*")]
        for line in path.read_text().splitlines()
    )
    assert still_on_disk[0] > 300  # the test means something: the first run's files are gone
    second = side.start()
    after = side.records(second, 300 + len(still_on_disk))
    assert after[:300] == before  # same records, same seqs
    steps = [r["step"] for r in after]
    assert steps == list(range(1, 301)) + still_on_disk  # lines deleted unread while down are the only gap


@pytest.mark.slow  # mstail and writer processes
def test_a_log_truncated_while_down_is_read_again_as_a_new_segment(tmp_path: Path, sidecar) -> None:  # type: ignore[no-untyped-def]
    log, side, first = log_read_once(tmp_path, sidecar, 100, "worker_0.log")
    assert first.stop() == 0
    log.write_bytes(b"")  # msrun relaunch: the worker log starts again
    finish_writer(write(log, 40))
    second = side.start()
    records = side.records(second, 140)
    assert [(r["step"], r["segment"]) for r in records] == [(s, 0) for s in range(1, 101)] + [(s, 1) for s in range(1, 41)]


@pytest.mark.slow  # mstail and writer processes
def test_a_partial_line_pending_at_kill_9_is_read_whole_after_the_restart(tmp_path: Path, sidecar) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "logs" / "info.log"
    log.parent.mkdir()
    log.write_bytes(b"line=00000001 padding=xx\nline=00000002 padd")
    side = sidecar(log)
    first = side.start()
    side.records(first, 1)
    first.proc.kill()
    first.proc.wait(timeout=10)
    with open(log, "ab") as out:
        out.write(b"ing=xx\nline=00000003 padding=xx\n")
    second = side.start()
    assert steps_and_seqs(side.records(second, 3)) == ([1, 2, 3], [1, 2, 3])


def _state_file(tmp_path: Path) -> Path:
    (found,) = (tmp_path / "state").glob("*.sqlite")
    return found


@pytest.mark.slow  # mstail and writer processes
def test_ctrl_c_closes_the_state_after_saving_the_chart_columns(tmp_path: Path, sidecar) -> None:  # type: ignore[no-untyped-def]
    # Before: uvicorn raised the Ctrl-C it caught again once it had stopped, asyncio.run cancelled the shutdown at its
    # first await, and the state was never closed by mstail (its columns not saved; SQLite closed at exit, if at all).
    log, side, first = log_read_once(tmp_path, sidecar, 50)  # the first commit saves the columns (up to seq 50)
    finish_writer(write(log, 30, "--start", "51"))
    side.records(first, 80)  # committed with no columns: those wait for 65,536 records, or the shutdown
    assert first.stop() == 0
    state = _state_file(tmp_path)
    assert not Path(f"{state}-wal").exists()  # the last connection closed cleanly
    db = sqlite3.connect(str(state))
    try:
        (manifest,) = db.execute("SELECT value FROM meta WHERE key = 'columns'").fetchone()
    finally:
        db.close()
    assert json.loads(manifest)["seq"] == 80


@pytest.mark.slow  # mstail and writer processes
@pytest.mark.parametrize("damage", ["corrupt", "mismatched"])
def test_a_damaged_state_is_set_aside_and_the_log_read_from_the_start(tmp_path: Path, sidecar, damage: str) -> None:  # type: ignore[no-untyped-def]
    _, side, first = log_read_once(tmp_path, sidecar, 200)
    assert first.stop() == 0
    state = _state_file(tmp_path)
    if damage == "corrupt":
        with open(state, "r+b") as db:
            db.write(b"\x00garbage" * 64)  # the SQLite header and the first page
    else:
        db = sqlite3.connect(str(state))
        with db:
            db.execute("UPDATE meta SET value = 'other' WHERE key = 'fingerprint'")
        db.close()
    second = side.start()
    assert_exactly_once(side.records(second, 200), range(1, 201))
    assert f"is {damage}" in second.stderr and "reading the logs from the start" in second.stderr
    assert len(list((tmp_path / "state").glob(f"*.sqlite.{damage}-*"))) == 1  # kept for a look, not deleted


@pytest.mark.slow  # mstail and writer processes
def test_a_state_damaged_in_a_machine_crash_is_caught_beside_its_served_history_and_read_again(  # type: ignore[no-untyped-def]
        tmp_path: Path, sidecar) -> None:
    # After a machine crash (no mark its owner left holds) the history is loaded and served beside the state's
    # integrity check. Here the check fails on a page of the items, which that load does not read: said, the file set
    # aside, and the same server (the same port) starts over from a fresh state, reading the log from the start.
    _, side, first = log_read_once(tmp_path, sidecar, 200)
    assert first.stop() == 0
    state = _state_file(tmp_path)
    data = state.read_bytes()
    at = data.index(b'"step":150,')
    with open(state, "r+b") as db:
        db.seek(at - at % 4096)
        db.write(bytes(range(256)) * 16)  # a torn page, as a disk that lied about flushing leaves it
    Path(f"{state}.lock").write_bytes(b"")  # the machine crashed: no mark to trust
    second = side.start()
    wait_until(lambda: second.get_json("/healthz")["passes"] > 0, 60)  # started over: nothing tailed before the check
    assert_exactly_once(side.records(second, 200), range(1, 201))  # the URL it announced still serves
    assert "checking the state" in second.stderr and "is corrupt" in second.stderr
    assert len(list((tmp_path / "state").glob("*.sqlite.corrupt-*"))) == 1  # kept for a look, not deleted
    assert second.get_json("/healthz")["state_check"] is None  # checked (the fresh file: new, sound)
    assert second.stdout_path.read_text().count("serving") == 1  # one server for the user, started over inside


@pytest.mark.slow  # mstail and writer processes
def test_ctrl_c_closes_the_state_cleanly_and_the_next_start_trusts_it(tmp_path: Path, sidecar) -> None:  # type: ignore[no-untyped-def]
    # Before: uvicorn raised SIGINT again after its shutdown, asyncio.run cancelled the cleanup at its first await and
    # `Store.close` never ran (no last commit of the columns and alert state, no clean close).
    _, side, first = log_read_once(tmp_path, sidecar, 200)
    assert first.stop() == 0
    lock = Path(f"{_state_file(tmp_path)}.lock")
    assert lock.read_text().startswith("clean ")  # `_OwnerMark`: the next start needs no integrity check
    second = side.start()
    assert_exactly_once(side.records(second, 200), range(1, 201))
    assert lock.read_text().startswith("open ")  # taken at the opening; in its place the running owner's mark


@pytest.mark.slow  # mstail and writer processes
def test_sse_ids_survive_a_restart_last_event_id_resumes_exactly(tmp_path: Path, sidecar) -> None:  # type: ignore[no-untyped-def]
    log, side, first = log_read_once(tmp_path, sidecar, 50)
    seen = collect(f"{first.url}/api/stream?after=0", until=lambda got: 50 in stream_seqs(got))
    assert stream_seqs(seen)[:50] == list(range(1, 51))
    assert first.stop() == 0
    finish_writer(write(log, 30, "--start", "51"))  # written while the server is down
    second = side.start()
    side.records(second, 80)
    resumed = collect(f"{second.url}/api/stream", headers={"Last-Event-ID": "50"}, until=lambda got: 80 in stream_seqs(got))
    assert stream_seqs(resumed)[:30] == list(range(51, 81))
    records = [r for m in resumed if m.get("event") == "records" for r in m.data]
    assert [r["step"] for r in records if r["seq"] <= 80] == list(range(51, 81))


@pytest.mark.slow  # mstail and writer processes
def test_the_state_folder_may_not_be_inside_a_followed_log_folder(tmp_path: Path) -> None:
    logs = tmp_path / "output" / "log"
    logs.mkdir(parents=True)
    done = subprocess.run(
        [sys.executable, "-m", "mstail", "--log", str(logs / "rank_*" / "info.log"), "--port", "0",
         "--state-dir", str(logs / "state")],
        capture_output=True, text=True, timeout=30,
    )
    assert done.returncode == 2
    assert "inside the followed log folder" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow  # mstail and writer processes
def test_no_state_keeps_nothing(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "info.log"
    log.parent.mkdir()
    finish_writer(write(log, 20))
    server = start_mstail([log], tmp_path / "run", args=["--pattern", PATTERN, "--no-state", "--state-dir", str(tmp_path / "state")])
    try:
        wait_until(lambda: server.get_json("/api/sources")[0]["records"] == 20, 15)
    finally:
        assert server.stop() == 0
    assert not (tmp_path / "state").exists()


def test_another_derived_file_gets_another_state(tmp_path: Path) -> None:
    """Derived values are stored in the records: a history kept with one `--derived` file is not reused with
    another (other constants, other expressions, perplexity off), nor with none."""
    def state_for(toml: str) -> Path:
        derived = None
        if toml:
            path = tmp_path / f"derived-{len(list(tmp_path.glob('derived-*')))}.toml"
            path.write_text(toml, encoding="utf-8")
            derived = load_derived(str(path))
        config = Config(logs=(str(tmp_path / "info.log"),), state_dir=str(tmp_path / "state"), derived=derived)
        db = open_state(config, load_formats(user_dir=Path("/nonexistent")))
        db.close()
        return db.path

    tokens = '[constants]\nseq_len = {n}\n[series]\ntokens_per_s = "samples_per_s * seq_len"\n'
    paths = [state_for(""), state_for(tokens.format(n=4096)), state_for(tokens.format(n=8192)),
             state_for("perplexity = false\n")]
    assert len(set(paths)) == 4
    assert state_for(tokens.format(n=4096)) == paths[1]  # the same file content: the same history


# -- in-process: the resume point itself ---------------------------------------------------------------------
STEP_LINE = ("2025-11-20 03:15:{s:02d},221 - mindformers[mindformers/core/callback/callback.py:821] - INFO - "
             "{{ Epoch:[  1/  2], step:[{i:5d}/   12], loss:[15.507022/15.507022], per_step_time: 512ms, lr: 4e-05, "
             "overflow cond: False, loss_scale: 1.0, global_norm: [1.23]")
PROGRESS_LINE = ("2025-11-20 03:15:{s:02d},222 - mindformers[mindformers/core/callback/callback.py:838] - INFO -    "
                 "4.2% |██          | 0.14181 samples/s/p  0:05:24 }}")


def _tailer(state: Path, *logs: str, **options: object) -> Tailer:
    config = Config(logs=logs, alert_rules=None, **options)  # type: ignore[arg-type]
    formats = load_formats(patterns=config.patterns, user_dir=Path("/nonexistent"))
    store = Store(StateDB(state, expected="test"))
    tailer = Tailer(config, formats, store, Hub())
    tailer.resume(store.load())
    return tailer


def _append(path: Path, *lines: str) -> None:
    with open(path, "a", encoding="utf-8") as out:
        out.write("".join(line + "\n" for line in lines))


def test_a_restart_between_a_step_and_its_progress_line_amends_the_stored_step(tmp_path: Path) -> None:
    log, state = tmp_path / "worker_0.log", tmp_path / "state.sqlite"
    step = lambda i: STEP_LINE.format(s=i, i=i)  # noqa: E731
    progress = lambda i: PROGRESS_LINE.format(s=i)  # noqa: E731
    _append(log, step(1), progress(1))
    first = _tailer(state, str(log))
    asyncio.run(first.pass_once())
    _append(log, step(2), progress(2), step(3))  # step 3 is published at once, without its progress line
    asyncio.run(first.pass_once())
    assert "samples_per_s" not in first.store.records_after(2, 1)[0]
    first.store.close()  # the process dies here: what is committed is all there is
    (checkpoint,) = [c for _, c in StateDB(state, expected="test").sources().values()]
    assert checkpoint.emitted == checkpoint.emitted_at == 5  # 3 records, 2 amends; nothing held: resume after step 3

    second = _tailer(state, str(log))
    _append(log, progress(3))
    asyncio.run(second.pass_once())
    records = second.store.records_after(0, 100)
    assert [(r["seq"], r["step"]) for r in records] == [(1, 1), (2, 2), (3, 3)]
    assert all(r["samples_per_s"] == 0.14181 and r["loss"] == 15.507022 for r in records)  # progress merged
    amends = [i for i in second.store.items_after(3) if i.get("kind") == "amend"]
    assert [(a["seq"], a["step"], a["samples_per_s"]) for a in amends] == [(4, 3, 0.14181)]  # a replay applies it


def test_torchrun_tagged_ranks_resume_after_a_restart_each_in_its_own_source(tmp_path: Path) -> None:
    """Ranks tagged `[rankN]: ` in one file; mstail dies between rank 1's step and its progress line."""
    log, state = tmp_path / "train.log", tmp_path / "state.sqlite"
    step = lambda r, i: f"[rank{r}]: " + STEP_LINE.format(s=i, i=i)  # noqa: E731
    progress = lambda r, i: f"[rank{r}]: " + PROGRESS_LINE.format(s=i)  # noqa: E731
    _append(log, step(0, 1), step(1, 1), progress(0, 1), progress(1, 1))
    first = _tailer(state, str(log))
    asyncio.run(first.pass_once())
    _append(log, step(0, 2), step(1, 2), progress(0, 2))
    asyncio.run(first.pass_once())
    first.store.close()

    second = _tailer(state, str(log))
    _append(log, progress(1, 2))
    asyncio.run(second.pass_once())
    records = second.store.records_after(0, 100)
    (file_id,) = [source for source in second.store.sources if "/" not in source]
    assert sorted(second.store.sources) == [file_id, f"{file_id}/rank0", f"{file_id}/rank1"]
    assert [(r["seq"], r["source"][len(file_id):], r["step"]) for r in records] == [
        (1, "/rank0", 1), (2, "/rank1", 1), (3, "/rank0", 2), (4, "/rank1", 2)]
    assert all(r["samples_per_s"] == 0.14181 for r in records)  # each progress line met its own rank's step
    assert second.store.sources[f"{file_id}/rank1"].path == str(log)


def test_a_file_rotated_while_down_is_finished_from_its_offset_then_the_new_one_read(tmp_path: Path) -> None:
    log, state = tmp_path / "info.log", tmp_path / "state.sqlite"
    line = lambda i: f"line={i:08d} padding=xx"  # noqa: E731
    options = {"patterns": (PATTERN,), "format": "pattern"}
    _append(log, *map(line, range(1, 11)))
    first = _tailer(state, str(log), **options)
    asyncio.run(first.pass_once())
    first.store.close()
    os.rename(log, f"{log}.1")
    _append(Path(f"{log}.1"), *map(line, range(11, 13)))  # late writes through the old descriptor
    _append(log, *map(line, range(13, 16)))
    second = _tailer(state, str(log), **options)
    asyncio.run(second.pass_once())
    assert [r["step"] for r in second.store.records_after(0, 100)] == list(range(1, 16))


@pytest.mark.slow  # mstail and writer processes
def test_a_second_mstail_on_the_same_logs_and_state_is_refused_clearly(tmp_path: Path, sidecar) -> None:  # type: ignore[no-untyped-def]
    log, side, _ = log_read_once(tmp_path, sidecar, 5)
    done = subprocess.run(
        [sys.executable, "-m", "mstail", "--log", str(log), "--port", "0", *side.args],
        capture_output=True, text=True, timeout=30,
    )
    assert done.returncode == 2 and "another mstail keeps its history in" in done.stderr, done.stderr
