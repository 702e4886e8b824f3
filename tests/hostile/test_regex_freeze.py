"""A real mstail against lines that used to freeze it: a `--pattern` that backtracks without end on a line of 40 `a`s
(before: no "serving" line, HTTP dead, SIGINT and SIGTERM ignored, only kill -9 ended it) and a MindFormers step
line whose loss_scale is followed by 64 Ki spaces and an `x` (before: ~42 s in a built-in regex, holding the GIL, so
/healthz waited ~20 s). Now: it serves, /healthz answers within a second while it chews, the normal step after those
lines is stored, Ctrl-C ends it within seconds, and stderr says once which rule was too slow.

The issue's pattern, `(?P<x>a+)+b$`, takes `re` days on 40 `a`s and the `regex` module that now runs a user's
regexes about a millisecond; `(?P<y>a|aa)+b$` is exponential in both, so it is the one that runs into the time limit.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import List

import pytest

from tests.conftest import _NO_PROXY, ROOT, start_mstail, wait_until

pytestmark = pytest.mark.slow

PREFIX = "[INFO] 2024-08-12 10:18:15,163 [mindformers/core/callback/callback.py:314] print_output_info: "
PATTERNS = ("(?P<x>a+)+b$", "(?P<y>a|aa)+b$")  # no `step` group: the step would count matching lines
A_LINE = "a" * 40 + "\n"


def step_line(step: int, tail: str = "65536.0, global_norm: [1.3445505]") -> str:
    return (f"{PREFIX}{{ Epoch:[  1/  2], step:[{step:>5}/   25], loss: 10.355, per_step_time: 514ms, lr: 4.e-06, "
            f"overflow cond: False, loss_scale: {tail}")


def progress_line() -> str:
    return f"{PREFIX}   4.0% |██          | 15.56 samples/s/p  0:00:12 }}\n"


def append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(text)


def test_a_backtracking_user_regex_and_a_hostile_line_cannot_freeze_mstail(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "train.log"
    log.parent.mkdir()
    log.write_text(A_LINE * 10, encoding="utf-8")  # waiting before mstail starts: its first pass meets them
    server = start_mstail([log], tmp_path / "mstail",
                          args=["--no-state", "--pattern", PATTERNS[0], "--pattern", PATTERNS[1]])
    try:
        chewing = threading.Event()
        slowest: List[float] = []

        def poll() -> None:  # /healthz, over and over while the lines below are parsed
            while not chewing.is_set():
                began = time.monotonic()
                try:
                    with _NO_PROXY.open(server.url + "/healthz", timeout=5) as response:
                        response.read()
                except OSError:  # no answer within 5 s (or none at all) counts as the slowest one
                    slowest.append(float("inf"))
                    return
                slowest.append(time.monotonic() - began)
                time.sleep(0.02)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        append(log, A_LINE * 20 + step_line(1, "1" + " " * 65536 + "x\n") + step_line(2, "65536.0\n")
               + progress_line())
        records = wait_until(lambda: [r for r in server.get_json("/api/records?limit=100") if r["step"] == 2], 30,
                             message="the normal step after the hostile lines")
        chewing.set()
        poller.join(timeout=10)
        print(f"/healthz asked {len(slowest)} times while the lines were parsed, slowest {max(slowest) * 1000:.0f} ms")
        assert len(slowest) >= 5 and max(slowest) < 1.0, f"/healthz: up to {max(slowest):.2f} s ({len(slowest)} asks)"
        assert records[0]["loss"] == 10.355 and records[0]["loss_scale"] == 65536.0
        source = server.get_json("/api/sources")[0]
        assert source["format"] == "mindformers" and source["counters"]["slow_lines"] == 30, source

        began = time.monotonic()
        server.proc.send_signal(signal.SIGINT)
        code = server.proc.wait(timeout=10)
        took = time.monotonic() - began
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait(timeout=5)
    assert code == 0 and took < 5, f"exit {code} after {took:.1f} s of SIGINT"  # `serve` returns 0 on Ctrl-C
    err = server.stderr
    assert "Traceback" not in err, err
    warnings = [line for line in err.splitlines() if "took longer than" in line]
    assert len(warnings) == 1, err
    assert warnings[0].startswith(f"mstail: {source['id']}: format 'pattern2' (--pattern), rule 'pattern2': ") \
        and "0.1 s" in warnings[0], warnings[0]


def test_explain_shows_a_line_skipped_for_time(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(A_LINE + "epoch: 1 step: 1, loss is 2.5\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "mstail", "parse", str(log), "--explain", "--pattern", PATTERNS[1]],
        capture_output=True, text=True, timeout=60, cwd=str(ROOT),
    )
    assert result.returncode == 0, result.stderr
    shown = result.stdout.splitlines()
    assert shown[0] == (f"train.log:1  SKIPPED FOR TIME (pattern rule 'pattern' took over 0.1 s): {'a' * 40}"), shown
    assert shown[1].startswith("train.log:2  mindspore/loss_monitor (record)"), shown
    assert "        1  lines a regex of yours gave up on after 0.1 s (skipped for it)" in result.stdout
    assert result.stderr.count("took longer than") == 1, result.stderr
