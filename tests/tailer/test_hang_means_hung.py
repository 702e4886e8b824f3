"""Hang means hung: real writer processes end in every way a training ends, and mstail raises exactly the right
alert (or none) for each, for a plain MindSpore log (LossMonitor lines, no timestamps, no end line) and for the
JSONL writer.

- exits cleanly: no alert (the writer closed the file: the run is over);
- killed with SIGKILL: no hang (nobody writes the file any more; with no total and no end logged: "stopped");
- stopped with SIGSTOP (alive, holding the file, silent): one hang alert;
- raises: one error alert with the exception line and the run "died", no hang;
- an old log read at start, its writer still holding it but silent: no hang (history never arms the rule).
And `/api/sources` gives the runs whose writer is gone their fate, never one still holding its file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from tests.conftest import ROOT, wait_until

pytestmark = pytest.mark.slow

HANG_S = 3.0
STEPS = 12
WRITER = r'''
import os, signal, sys, time
sys.path.insert(0, os.environ["MSTAIL_ROOT"])
kind, path, ending, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if kind == "log":
    out = open(path, "a", buffering=1)
    for step in range(1, steps + 1):
        out.write(f"epoch: 1 step: {step}, loss is {3.0 - step / 100:.6f}\n")
        time.sleep(0.1)
else:
    from mstail.callback import JsonlWriter
    writer = JsonlWriter(path)
    for step in range(1, steps + 1):
        writer.log(step, loss=3.0 - step / 100)
        time.sleep(0.1)
if ending == "raise":
    error = "ValueError: For 'loss' of the network, epoch: 1 step: 12, loss is NAN or INF, terminating training."
    if kind == "log":
        out.write("Traceback (most recent call last):\n  File \"train.py\", line 40, in <module>\n" + error + "\n")
    else:
        writer.event("error", steps, "Traceback (most recent call last):\n" + error)
        writer.event("end", steps, "training ended by an exception (ValueError)")
    sys.exit(1)
if ending == "exit" and kind == "jsonl":
    writer.event("end", steps)
if ending in ("kill", "stop", "silent"):
    print("ready", flush=True)
    time.sleep(120)  # alive, holding the file open, writing nothing: killed or stopped by the test
'''


def spawn(kind: str, path: Path, ending: str, steps: int = STEPS) -> "subprocess.Popen[bytes]":
    return subprocess.Popen([sys.executable, "-c", WRITER, kind, str(path), ending, str(steps)],
                            env={**os.environ, "MSTAIL_ROOT": str(ROOT)}, stdout=subprocess.PIPE)


def alerts_by_source(server: Any) -> Dict[str, List[str]]:
    table = server.get_json("/api/alerts")
    out: Dict[str, List[str]] = {}
    for alert in table["active"] + table["resolved"]:
        out.setdefault(alert["source"], []).append(alert["rule"])
    return out


def test_every_way_a_training_ends_gets_the_right_alert_or_none(tmp_path: Path, mstail_server: Any) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    rules = tmp_path / "alerts.toml"
    rules.write_text(f"[hang]\nmin_s = {HANG_S}\nk = 1.0\n", encoding="utf-8")
    # The old log first: written whole before mstail starts, its writer still alive and holding it, silent.
    old = spawn("log", runs / "old.log", "silent", steps=5)
    assert old.stdout is not None and old.stdout.readline() == b"ready\n"
    server = mstail_server(str(runs / "*.log"), args=("--jsonl", str(runs / "*.jsonl"), "--alerts", str(rules)))
    writers = {(kind, ending): spawn(kind, runs / f"{ending}.{kind}", ending)
               for kind in ("log", "jsonl") for ending in ("exit", "kill", "stop", "raise")}
    try:
        # The writers to kill or stop first, each as soon as it is ready: one left alive and silent past HANG_S while
        # the test waited for another (the JSONL writers import MindSpore, seconds apart at a high load) is a hang.
        for (_kind, ending), proc in sorted(writers.items(), key=lambda writer: writer[0][1] not in ("kill", "stop")):
            if ending in ("kill", "stop"):
                assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
                proc.send_signal(signal.SIGKILL if ending == "kill" else signal.SIGSTOP)
            elif ending in ("exit", "raise"):
                proc.wait(timeout=30)
        ended_at = time.monotonic()
        wait_until(lambda: sum(s["records"] for s in server.get_json("/api/sources")) >= 8 * STEPS + 5, 20,
                   message="every step of every writer")
        # Past the bound with room to spare: whatever is going to fire has fired.
        wait_until(lambda: len([r for r in alerts_by_source(server).values() if "hang" in r]) >= 2, 20,
                   message="the two stopped writers' hang alerts")
        time.sleep(max(0.0, HANG_S + 3 - (time.monotonic() - ended_at)))
        got = alerts_by_source(server)
        ids = {Path(s["path"]).name: s["id"] for s in server.get_json("/api/sources")}
        expected = {"exit.log": [], "kill.log": [], "stop.log": ["hang"], "raise.log": ["died", "error"],
                    "exit.jsonl": [], "kill.jsonl": [], "stop.jsonl": ["hang"], "raise.jsonl": ["died", "error"], "old.log": []}
        assert {name: sorted(got.get(ids[name], [])) for name in expected} == expected
        errors = [a for a in server.get_json("/api/alerts")["active"] if a["rule"] == "error"]
        assert [a["count"] for a in errors] == [1, 1]
        assert all(a["message"].startswith("ValueError: For 'loss' of the network") for a in errors), [(a["source"], a["message"]) for a in errors]
        # /api/sources: a run whose writer is gone (exited, raised, killed) has its fate: finished with its end
        # logged, died after an error, else stopped (no total to compare the last step with); a silent writer that
        # still holds its file (stopped, or the old log's) has none: following, then idle, and the hang alert says
        # the rest.
        def states() -> Dict[str, str]:
            return {Path(s["path"]).name: s["state"] for s in server.get_json("/api/sources")}

        fates = {"exit.log": "stopped", "kill.log": "stopped", "raise.log": "died",
                 "exit.jsonl": "finished", "kill.jsonl": "stopped", "raise.jsonl": "died"}
        wait_until(lambda: {n: st for n, st in states().items() if n in fates} == fates, 30, message=f"{fates}")
        assert {states()[n] for n in ("stop.log", "stop.jsonl", "old.log")} <= {"following", "idle"}, states()
    finally:
        for proc in [old, *writers.values()]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait(timeout=10)
