"""Hostile folders of runs against a real `mstail`: run folders whose names are not valid UTF-8 or hold terminal
escape sequences and newlines (each run followed whole, under an id the API can serve and a terminal can show; the
sidecar stays healthy, stderr carries no escape sequence and no forged line), a restart of `mstail DIR` over folders
of event files (the same sources, not a second one each), and a file whose name is no UTF-8 appearing in a followed
log's folder (the watcher must not take the sidecar down, and file events come back); links in a followed folder to
files and folders outside it (not opened, their secrets not served, unless --follow-symlinks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from tests.conftest import spawn_writer
from tests.eventfiles.conftest import write_tensorboard

pytestmark = pytest.mark.slow

#: run folder name (bytes, as the file system has it) -> the id the source gets
HOSTILE_NAMES = {
    b"bad\xffutf8": "bad\\xffutf8",
    b"esc\x1b[2J\x1b]0;pwned\x07run": "esc\\x1b[2J\\x1b]0;pwned\\x07run",
    b"new\nmstail: forged": "new\\nmstail: forged",
}
STEPS = 6


def _sources(server: Any) -> Dict[str, dict]:
    return {source["id"]: source for source in server.get_json("/api/sources")}


def test_run_folders_with_hostile_names_are_followed_under_printable_ids(mstail_server: Any, tmp_path: Path,
                                                                          wait_until: Any) -> None:
    root = tmp_path / "runs"
    for name in HOSTILE_NAMES:
        folder = Path(os.fsdecode(os.fsencode(root) + b"/" + name))
        folder.mkdir(parents=True)
        write_tensorboard(folder, 1, STEPS)
    server = mstail_server(args=[str(root)])
    server.wait_records(STEPS * len(HOSTILE_NAMES), timeout=20)
    sources = _sources(server)
    assert sorted(sources) == sorted(HOSTILE_NAMES.values())
    assert all(source["records"] == STEPS for source in sources.values())
    health = server.get_json("/healthz")
    assert health["status"] == "ok" and health["tailing_failures"] == 0, health
    stderr = server.stderr
    assert "\x1b" not in stderr and "\x07" not in stderr
    assert all(line.startswith("mstail: ") for line in stderr.splitlines() if line.strip()), stderr
    wait_until(lambda: server.get_json("/healthz")["unsaved"] == 0, 10, message="the history written")

    assert server.stop() == 0
    again = mstail_server(args=[str(root)])
    wait_until(lambda: sorted(_sources(again)) == sorted(HOSTILE_NAMES.values()), 10, message="the same ids")
    time.sleep(1)  # a pass or two: a file read again from its start would add its records again
    assert {key: source["records"] for key, source in _sources(again).items()} == dict.fromkeys(sources, STEPS)


def test_a_restart_over_folders_of_event_files_keeps_one_source_per_run(mstail_server: Any, tmp_path: Path,
                                                                       wait_until: Any) -> None:
    for run in ("exp1", "exp2"):
        write_tensorboard(tmp_path / "runs" / run / "tensorboard", 1, STEPS)
    server = mstail_server(args=[str(tmp_path / "runs")])
    server.wait_records(2 * STEPS)
    wait_until(lambda: server.get_json("/healthz")["unsaved"] == 0, 10, message="the history written")
    assert server.stop() == 0
    again = mstail_server(args=[str(tmp_path / "runs")])
    again.wait_records(2 * STEPS)
    time.sleep(1)  # a pass or two: a second source would have turned up
    assert {key: source["records"] for key, source in _sources(again).items()} == {"exp1": STEPS, "exp2": STEPS}


def test_a_file_named_in_no_utf8_beside_a_followed_log_stops_nothing(mstail_server: Any, tmp_path: Path,
                                                                      wait_until: Any) -> None:
    log = tmp_path / "train.log"
    log.touch()
    server = mstail_server(log)
    Path(os.fsdecode(os.fsencode(tmp_path) + b"/notes\xff.txt")).write_text("a file event on a name no UTF-8\n")
    writer = spawn_writer(log, steps=5, interval_s=0.05)
    assert writer.wait(timeout=30) == 0
    server.wait_records(5, timeout=15)
    time.sleep(0.5)  # the watcher's next batch, which names the file
    assert server.proc.poll() is None, server.stderr
    assert server.get_json("/healthz")["tailing_failures"] == 0
    assert server.stderr.count("file events unavailable") == 1, server.stderr

    def events_back() -> bool:  # watching is tried again (after 5 s): its first batch says so
        (tmp_path / "other.log").write_text(f"{time.time()}\n")
        return "file events are back" in server.stderr

    wait_until(events_back, 15, interval=0.5, message="file events back")


REAL_INFO_LOG = Path(__file__).resolve().parents[1] / "real_logs" / "mindformers-2.0.0_graph_output_log_rank_0_info.log"
SECRET = "DB_PASSWORD=hunter2-5f3a9c"


def _served(server: Any) -> str:
    """Everything the API tells of the runs: the sources and the events, as text."""
    return json.dumps([server.get_json("/api/sources"), server.get_json("/api/events?limit=1000")])


def test_links_out_of_a_followed_folder_are_not_opened(mstail_server: Any, tmp_path: Path, wait_until: Any) -> None:
    """A shared job folder holding links to files elsewhere on the machine (a rank's log, a run folder, a text log
    found by what it holds, a followed log swapped for one): `mstail DIR` names each once and opens none, unless
    --follow-symlinks."""
    outside, runs = tmp_path / "outside", tmp_path / "runs"
    error = f"[ERROR] 2026-12-02 14:40:00,000 [train.py:12] main: {SECRET} api_key=sk-42\n"
    private = REAL_INFO_LOG.read_text() + error
    (outside / "run/output/log/rank_0").mkdir(parents=True)
    (outside / "private.log").write_text(private)
    (outside / "run/output/log/rank_0/info.log").write_text(private)
    logs = runs / "exp1/output/msrun_log"
    logs.mkdir(parents=True)
    (logs / "worker_5.log").symlink_to(outside / "private.log")
    (runs / "exp2").symlink_to(outside / "run")
    (runs / "exp3").mkdir()
    (runs / "exp3/train.log").symlink_to(outside / "private.log")
    server = mstail_server(args=[str(runs)])
    writer = spawn_writer(logs / "worker_0.log", steps=STEPS, interval_s=0.02)
    assert writer.wait(timeout=30) == 0
    server.wait_records(STEPS)
    assert [source["id"] for source in server.get_json("/api/sources")] == ["exp1/worker_0"]
    served = _served(server)
    assert SECRET not in served and "sk-42" not in served and str(outside) not in served
    for link, target in ((logs / "worker_5.log", outside / "private.log"), (runs / "exp2", outside / "run"),
                         (runs / "exp3/train.log", outside / "private.log")):
        assert server.stderr.count(f"{link} is a link to {target}, outside {runs}: not opened") == 1, server.stderr
    # a followed log swapped for such a link (renamed away as a rotation would, a link put in its place)
    (logs / "worker_0.log").rename(logs / "worker_0.log.1")
    (logs / "worker_0.log").symlink_to(outside / "private.log")
    wait_until(lambda: "a link out of" in (server.get_json("/api/sources")[0]["problem"] or ""), 20,
               message="the swapped-in link refused")
    served = _served(server)
    assert SECRET not in served and "sk-42" not in served and SECRET not in server.stderr
    assert server.stop() == 0
    (logs / "worker_0.log").unlink()
    (logs / "worker_0.log.1").rename(logs / "worker_0.log")

    # the same folder with --follow-symlinks: the links are read (what the test above would see if they were)
    opened = mstail_server(args=[str(runs), "--follow-symlinks", "--no-state"])
    wait_until(lambda: SECRET in _served(opened), 20, message="the linked files read with --follow-symlinks")
    assert len(opened.get_json("/api/sources")) == 4


def _fifo_writer(fifo: Path) -> "subprocess.Popen[bytes]":
    """A process blocked in opening `fifo` for writing until some process opens it for reading."""
    os.mkfifo(fifo)
    return subprocess.Popen([sys.executable, "-c", f"import os; os.write(os.open({str(fifo)!r}, os.O_WRONLY), b'x')"])


def _problems(server: Any) -> Optional[List[str]]:
    """Every source's problem, once each has one."""
    problems = [source["problem"] for source in server.get_json("/api/sources")]
    return problems if all(problems) else None


def test_a_followed_log_swapped_for_a_link_out_is_not_opened(mstail_server: Any, tmp_path: Path,
                                                             wait_until: Any) -> None:
    """After `mstail DIR` follows a log, the log is swapped for a link to a FIFO outside DIR, and a rank folder for a
    link to a folder outside holding one: both are refused without being opened (the FIFOs' writers stay blocked;
    an open for reading, even to refuse the file after it, would release them)."""
    outside, runs = tmp_path / "outside", tmp_path / "runs"
    (outside / "logs").mkdir(parents=True)
    logs = {run: runs / run / "msrun_log" for run in ("exp1", "exp2")}
    for folder in logs.values():
        folder.mkdir(parents=True)
    server = mstail_server(args=[str(runs), "--no-state"])
    writer = spawn_writer([folder / "worker_0.log" for folder in logs.values()], steps=STEPS, interval_s=0.02)
    assert writer.wait(timeout=30) == 0
    server.wait_records(2 * STEPS)
    blocked = [_fifo_writer(outside / "secret.fifo"), _fifo_writer(outside / "logs/worker_0.log")]
    try:
        (logs["exp1"] / "worker_0.log").rename(logs["exp1"] / "worker_0.log.1")
        (logs["exp1"] / "worker_0.log").symlink_to(outside / "secret.fifo")
        logs["exp2"].rename(tmp_path / "moved")  # (out of DIR: not a run found)
        logs["exp2"].symlink_to(outside / "logs")
        problems = wait_until(lambda: _problems(server), 20, message="both swapped-in links refused")
        for process in blocked:
            with pytest.raises(subprocess.TimeoutExpired):
                process.wait(timeout=2)  # (opened by a reader: it writes and exits at once)
        assert all(problem.startswith("a link out of") for problem in problems), problems
        assert server.get_json("/healthz")["status"] == "ok"
    finally:
        for process in blocked:
            process.kill()
            process.wait()
