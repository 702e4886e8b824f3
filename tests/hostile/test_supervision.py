"""A real mstail against input that used to stop it without a word: numbers that fit nowhere, a state folder
whose disk fills up, files that are not files or cannot be read, logs no format understands, a mistyped
folder. Each case: mstail goes on, says what happened once on stderr, /healthz tells the truth, nothing is lost."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import time
import urllib.error
from pathlib import Path
from typing import Any, Iterator, Tuple

import pytest

from tests.conftest import _NO_PROXY, wait_until

pytestmark = pytest.mark.slow

PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 24, 1, 2  # linux/prctl.h, linux/capability.h
PREFIX = "[INFO] 2024-08-12 10:18:15,163 [mindformers/core/callback/callback.py:314] print_output_info: "


def step_line(step: str, per_step_time: str = "514", total: str = "25") -> str:
    return (f"{PREFIX}{{ Epoch:[  1/  2], step:[{step:>5}/{total:>5}], loss: 10.355, per_step_time: "
            f"{per_step_time}ms, lr: 4.e-06, overflow cond: False, loss_scale: 65536.0, global_norm: [1.3445505]\n")


def healthz(url: str) -> Tuple[int, Any]:
    try:
        with _NO_PROXY.open(url + "/healthz", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(text)


def test_numbers_that_fit_nowhere_are_kept_or_skipped_and_tailing_goes_on(tmp_path: Path, mstail_server: Any) -> None:
    # Before: each of these raised OverflowError in the store; the tailing task died silently, /healthz said "ok",
    # and a restart read the same line and died again.
    metrics = tmp_path / "metrics.jsonl"
    log = tmp_path / "rank_0" / "info.log"
    log.parent.mkdir()
    metrics.write_text('{"step": 99999999999999999999, "loss": 1.0}\n{"step": 1, "loss": 1' + "0" * 400 + "}\n"
                       '{"step": 2, "loss": 0.5, "time": 1' + "0" * 400 + "}\n", encoding="utf-8")
    log.write_text(step_line("99999999999999999999") + step_line("1", per_step_time="9" * 400)
                   + f"{PREFIX}Eval result: {{'PerplexityMetric': {{'loss': 1{'0' * 400}, 'PPL': 3.5}}}}, eval time is 1.5 s.\n",
                   encoding="utf-8")
    server = mstail_server(log, args=("--jsonl", str(metrics)))
    append(metrics, '{"step": 3, "loss": 0.25}\n')
    append(log, step_line("2"))
    wait_until(lambda: {3, 2} <= {r["step"] for r in server.get_json("/api/records?limit=100")}, 15,
               message="the lines after the odd ones")
    status, facts = healthz(server.url)
    assert (status, facts["status"], facts["tailing_failures"]) == (200, "ok", 0), facts
    series = server.get_json("/api/series?metric=loss")["series"]
    assert series and all(len(s["x"]) == len(s["min"]) for s in series)
    assert "Traceback" not in server.stderr

    # A restart reads the same lines again without dying on them.
    assert server.stop() == 0
    again = mstail_server(log, args=("--jsonl", str(metrics)))
    wait_until(lambda: healthz(again.url)[1]["last_seq"] >= facts["last_seq"], 15, message="the history back")
    assert healthz(again.url)[0] == 200


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 512 KB tmpfs for the state: a real full disk (the tests run as root in their own sandbox); 6,000 steps fill
    it even as the state file's compressed chunks."""
    folder = tmp_path / "small-disk"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(folder)], check=True, timeout=10)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], timeout=10)


def test_a_full_state_disk_is_said_and_nothing_is_lost_when_it_has_room_again(tmp_path: Path, small_disk: Path,
                                                                                 mstail_server: Any) -> None:
    # Before: tailing froze at the first failed write with no message and /healthz "ok", and stayed frozen after
    # the disk had room again.
    log = tmp_path / "rank_0" / "info.log"
    log.parent.mkdir()
    steps = 6000
    log.write_text("".join(step_line(str(i), total="9999") for i in range(1, steps // 2 + 1)), encoding="utf-8")
    server = mstail_server(log, args=("--state-dir", str(small_disk)))
    append(log, "".join(step_line(str(i), total="9999") for i in range(steps // 2 + 1, steps + 1)))
    server.wait_records(steps, timeout=30)  # in memory and on the page, whatever the disk says
    status, facts = wait_until(lambda: (lambda h: h if h[0] == 503 else None)(healthz(server.url)), 15,
                               message="/healthz to say the history cannot be written")
    assert facts["status"] == "failing" and "cannot be written" in facts["problems"][0] and facts["unsaved"] > 0
    wait_until(lambda: "cannot write the history" in server.stderr, 5, message="the stderr line")
    assert server.stderr.count("cannot write the history") == 1
    records = []
    while len(records) < steps:  # the API still serves all of it: the unsaved part from memory
        page = server.get_json(f"/api/records?after={records[-1]['seq'] if records else 0}&limit=10000")
        assert page, "the records the disk did not take are missing from the API"
        records += page
    assert [r["step"] for r in records] == list(range(1, steps + 1))

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True, timeout=10)
    wait_until(lambda: healthz(server.url)[0] == 200, 40, message="/healthz back to 200 once the disk has room")
    assert healthz(server.url)[1]["unsaved"] == 0
    wait_until(lambda: "written again" in server.stderr, 5, message="the recovery line")
    assert server.stop() == 0

    # What was kept in memory is on disk now: a restart has every step, once.
    again = mstail_server(log, args=("--state-dir", str(small_disk)))
    wait_until(lambda: healthz(again.url)[1]["last_seq"] >= steps, 20, message="the history back")
    stored = []
    while True:
        page = again.get_json(f"/api/records?after={stored[-1]['seq'] if stored else 0}&limit=10000")
        if not page:
            break
        stored += page
    assert [r["step"] for r in stored] == list(range(1, steps + 1))


def test_files_that_cannot_be_read_or_parsed_are_said_once_and_shown(tmp_path: Path, mstail_server: Any) -> None:
    # Before: a FIFO hung mstail (and Ctrl-C) for good; /dev/urandom printed thousands of "was truncated" lines;
    # 50 metric-looking lines no format matches left the page waiting and stderr silent.
    logs = tmp_path / "logs"
    logs.mkdir()
    os.mkfifo(logs / "fifo.log")
    os.symlink("/dev/urandom", logs / "urandom.log")
    (logs / "custom.log").write_text("".join(f"it {i} loss=2.{i}\n" for i in range(50)), encoding="utf-8")
    (logs / "good.log").write_text(step_line("1"), encoding="utf-8")
    server = mstail_server(str(logs / "*.log"))
    server.wait_records(1, timeout=15)  # good.log's step (held for its progress line up to the grace period)
    sources = wait_until(lambda: (lambda s: s if len(s) == 4 and all(x["state"] != "waiting" for x in s) else None)(
        server.get_json("/api/sources")), 15, message="four sources, none waiting")
    by_path = {Path(s["path"]).name: s for s in sources}
    assert by_path["fifo.log"]["state"] == "unreadable" and "FIFO" in by_path["fifo.log"]["problem"]
    assert by_path["urandom.log"]["state"] == "unreadable" and "device" in by_path["urandom.log"]["problem"]
    assert "mstail parse" in by_path["custom.log"]["problem"] and "--explain" in by_path["custom.log"]["problem"]
    assert by_path["good.log"]["records"] == 1 and by_path["good.log"]["problem"] is None
    time.sleep(1.5)  # several passes: each problem is still said once
    err = server.stderr
    assert err.count("fifo.log: cannot read it") == 1 and err.count("urandom.log: cannot read it") == 1
    assert err.count("look like metrics but no format matches") == 1
    assert f"{logs / 'good.log'} -> good, format mindformers" in err
    assert healthz(server.url)[0] == 200


def test_a_file_mstail_may_not_read_is_unreadable_not_waiting(tmp_path: Path, mstail_server: Any) -> None:
    # Before (as a non-root user): "following 1 file", state `waiting`, io_errors 0, nothing said. The tests run
    # as root, which reads anything: this mstail runs without the capabilities that let root ignore file modes.
    log = tmp_path / "rank_0" / "info.log"
    log.parent.mkdir()
    log.write_text(step_line("1"), encoding="utf-8")
    log.chmod(0o000)

    def without_root_file_access() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        for capability in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
            if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")

    server = mstail_server(log, preexec_fn=without_root_file_access)
    (source,) = wait_until(lambda: [s for s in server.get_json("/api/sources") if s["state"] == "unreadable"], 10,
                           message="an unreadable source")
    assert source["problem"] == "permission denied"
    wait_until(lambda: "info.log: cannot read it (permission denied)" in server.stderr, 5, message="the warning")
    assert healthz(server.url)[0] == 200
    log.chmod(0o644)  # given access: read at a later pass
    server.wait_records(1, timeout=10)


def test_a_mistyped_folder_is_named_with_its_nearest_existing_parent(tmp_path: Path, mstail_server: Any) -> None:
    # Before: "following 0 files, waiting" forever, the missing folder never named.
    (tmp_path / "output").mkdir()
    server = mstail_server(tmp_path / "output" / "lgo" / "rank_*" / "info.log")
    wait_until(lambda: "does not exist" in server.stderr, 20, message="the missing-folder line")
    line = next(line for line in server.stderr.splitlines() if "does not exist" in line)
    assert f"{tmp_path / 'output' / 'lgo'} does not exist" in line and f"is {tmp_path / 'output'})" in line
