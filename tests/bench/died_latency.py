"""Died latency: a training process killed with SIGKILL mid-run -> the source's fate and the `died` alert of a real
mstail; and what watching the writers costs.

Setup (this machine, loopback only): a real `mstail --log DIR/rank_*/info.log --port 0`; per round the MindFormers
writer of tests/conftest.py logs step lines (totals printed: `step:[ N/100000]`) at --rate steps/s to a new
rank_R/info.log, is killed with SIGKILL after --run seconds, and /api/sources and /api/alerts are polled every 20 ms.
State latency = the first poll showing the source over (died, or `ended` before the fates) - the kill; alert latency
= the died alert's `first_seen` (mstail's clock) - the kill. With --tree, the mstail of another checkout is measured
(its tests/conftest.py starts it), e.g. the main branch: `--tree /work/main`.

Cost: one full look through /proc for a file's writers (`writers.holders_of`) and one liveness read of the writer
processes seen (`writers.running`), timed here in this process on the same machine.

Run: python tests/bench/died_latency.py [--rounds 5] [--rate 10] [--run 2] [--tree PATH]

Goal: the died alert within 5 s of the writer's exit. Exit 0 when every round met it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
GOAL_S = 5.0


def load_support(tree: Path) -> Any:
    """`tree`'s tests/conftest.py as a plain module (it starts `tree`'s mstail), state in a temporary folder."""
    os.environ.setdefault("MSTAIL_STATE_DIR", tempfile.mkdtemp(prefix="mstail-bench-state-"))
    spec = importlib.util.spec_from_file_location("mstail_test_support", tree / "tests" / "conftest.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def one_round(support: Any, server: Any, log: Path, rate: float, run_s: float) -> Tuple[Optional[float], Optional[float], str]:
    writer = support.spawn_writer(log, steps=100000, interval_s=1.0 / rate, steps_per_epoch=100000)
    time.sleep(run_s)
    writer.kill()
    killed = time.time()
    writer.wait(5)
    state_s = alert_s = None
    state = ""
    deadline = killed + 30
    while time.time() < deadline and (state_s is None or alert_s is None):
        source = next((s for s in server.get_json("/api/sources") if Path(s["path"]) == log), None)
        if source is not None and state_s is None and source["state"] in ("died", "stopped", "finished", "ended"):
            state_s, state = time.time() - killed, source["state"]
        died = [a for a in server.get_json("/api/alerts")["active"]
                if a["rule"] == "died" and source is not None and a["source"] == source["id"]]
        if died and alert_s is None:
            alert_s = died[0]["first_seen"] - killed
        if state_s is not None and state != "died":
            break  # no died alert will come (an mstail without fates)
        time.sleep(0.02)
    return state_s, alert_s, state


def costs(rounds: int = 20) -> None:
    sys.path.insert(0, str(HERE.parent.parent))
    from mstail.tailer.inputs.writers import holders_of, running
    import subprocess

    work = Path(tempfile.mkdtemp(prefix="mstail-writers-"))
    procs = [subprocess.Popen([sys.executable, "-c", f"import time; f = open({str(work / f'{i}.log')!r}, 'a'); "
                               "time.sleep(60)"]) for i in range(8)]
    try:
        deadline = time.monotonic() + 30
        while not all((work / f"{i}.log").exists() for i in range(8)) and time.monotonic() < deadline:
            time.sleep(0.05)
        identities = set()
        for i in range(8):
            st = os.stat(work / f"{i}.log")
            identities.add((st.st_dev, st.st_ino))
        looks, pulses = [], []
        for _ in range(rounds):
            began = time.perf_counter()
            found, _ = holders_of(identities)
            looks.append(time.perf_counter() - began)
            seen = set().union(*found.values())
            began = time.perf_counter()
            running(seen)
            pulses.append(time.perf_counter() - began)
        fds = sum(len(os.listdir(f"/proc/{p}/fd")) for p in os.listdir("/proc") if p.isdigit()
                  and os.access(f"/proc/{p}/fd", os.R_OK))
        print(f"cost: a full look (8 files, {fds} open fds on the machine) median {statistics.median(looks) * 1000:.1f} ms; "
              f"a pulse ({len(seen)} writer processes) median {statistics.median(pulses) * 1e6:.0f} us")
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rate", type=float, default=10.0, help="steps per second (default 10)")
    ap.add_argument("--run", type=float, default=2.0, help="seconds each writer runs before the kill (default 2)")
    ap.add_argument("--tree", type=Path, default=HERE.parent.parent, help="the checkout whose mstail is measured")
    args = ap.parse_args()
    support = load_support(args.tree.resolve())
    work = Path(tempfile.mkdtemp(prefix="mstail-died-bench-"))
    server = support.start_mstail([str(work / "rank_*" / "info.log")], work / "mstail")
    states: List[float] = []
    alerts: List[float] = []
    ok = True
    try:
        for index in range(args.rounds):
            state_s, alert_s, state = one_round(support, server, work / f"rank_{index}" / "info.log", args.rate, args.run)
            print(f"round {index}: over after {'-' if state_s is None else f'{state_s:.2f} s'} ({state or 'never'}), "
                  f"died alert after {'none' if alert_s is None else f'{alert_s:.2f} s'}")
            if state_s is not None:
                states.append(state_s)
            if alert_s is not None:
                alerts.append(alert_s)
            ok = ok and alert_s is not None and alert_s <= GOAL_S
    finally:
        server.stop()
        shutil.rmtree(work, True)
    if states:
        print(f"kill -> state over: median {statistics.median(states):.2f} s, max {max(states):.2f} s")
    if alerts:
        print(f"kill -> died alert: median {statistics.median(alerts):.2f} s, max {max(alerts):.2f} s (goal <= {GOAL_S:.0f} s)")
    costs()
    print("goal met" if ok else "goal MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
