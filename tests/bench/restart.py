"""Restart with a long history, and memory: issue 16, goals 3 (history back <= 2 s after a restart with a state of
1 M records) and 5 (<= 200 MB RSS with 1 M records x 8 metrics).

Setup (loopback only): page_load.py's JSONL log of --steps steps x 8 metrics (a NaN, a spike, a checkpoint event
every 10,000 steps); a real `mstail --jsonl FILE --state-dir DIR --port 0` reads it all and is stopped with
Ctrl-C (SIGINT; it saves what is left of its chart columns).

Measured, each restart a new real process over the same state:
- time to history: process start -> the first `/api/series?metric=loss` answer that holds the whole run (its
  last x is the last step) and `/api/series` of all 8 metrics answered (the page's first request); with it the
  CPU time of mstail's main thread by then (what the history costs whatever the machine's load: the wall time on
  a shared machine is mostly waiting for a core) and of the whole process (the state's integrity check runs in a
  thread of its own);
- time to tailing: process start -> the step appended to the log just before the restart served by
  `/api/series` (new lines are read once the alert rules have their state back: taken from the state file, or
  rebuilt from every stored item for a state an mstail before that wrote);
- RSS (VmRSS of /proc/PID/status) once the history is served and the 8 charts' queries answered (smoothing
  0.6, as page_load.py asks), then after the same queries at smoothing 0.99 (each series then caches its full
  EMA's sums, 1.5 bytes a point), and the peak (VmHWM).
With --cold, the page cache is dropped before each restart (`sync; echo 3 > /proc/sys/vm/drop_caches`, root
only): the state file, the log and mstail's own modules are read from the disk, as after a reboot.
mstail runs as an installed one does, with its modules' bytecode compiled first (`benchsupport.installed_env`).
Runs:
- first run: the log read from its start (no state): time, RSS, peak (skipped with --keep DIR when DIR holds
  the state of an earlier run: reading the log takes minutes on a loaded machine);
- restart: this code, over the state the first run left (closed cleanly: opened without SQLite's integrity check);
  that mstail is then killed (SIGKILL);
- restart after a crash: the next one, over the state the killed one left (its last commits in the WAL; the lock
  file's mark as the killed process left it: in this boot of the machine, no integrity check), stopped with Ctrl-C;
- restart after a machine crash: the next one with the lock file's mark erased, as a power cut or a kernel crash
  leaves it (the mark of another boot, or none): `quick_check` reads the whole file, beside the history's load and
  the server's start (before them up to e38a66e), and tailing waits for it;
- baseline, same state, same code: the state's saved columns deleted, which is what a state written by the
  mstail before them holds; the columns are rebuilt from every record's JSON (said once) and saved again;
- with --before REV: the same two restarts by the code of git revision REV (its tree exported into a temp folder and
  put first on PYTHONPATH), over the state as this code left it; the code before the saved columns loaded the
  history and replayed the alert rules before it listened at all.

With --rounds N, the restarts (this code's and REV's in turn) are made N times and their medians are the figures.

Run: python tests/bench/restart.py [--steps 1000000] [--before REV] [--keep DIR] [--cold] [--rounds N]
Goals: history back <= 2 s; RSS <= 200 MB (each run's RSS after the page's queries). Exit status 0 when met.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from benchsupport import installed_env, load_test_support
from latency import proc_cpu_s
from page_load import T0, get, rss_mib, write_log

GOAL_HISTORY_S = 2.0
GOAL_RSS_MB = 200.0
METRICS = ("loss", "lr", "grad_norm", "loss_scale", "overflow", "step_time_ms", "throughput_tflops", "samples_per_s")
ROOT = Path(__file__).resolve().parents[2]


def thread_cpu_s(pid: int, tid: int) -> float:
    """CPU seconds (user + system) of one thread of a process."""
    with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_jsonl_mstail(support: Any, code: Optional[Path], work: Path, log: Path, state: Path,
                       env: Dict[str, str]) -> Any:
    """A real mstail following the JSONL `log` with its state in `state`, run from the tree `code` (default this one)."""
    here, support.ROOT = support.ROOT, code or support.ROOT  # start_mstail runs mstail from ROOT (cwd, PYTHONPATH)
    try:
        return support.start_mstail([], work, args=["--jsonl", str(log), "--state-dir", str(state)], timeout=600,
                                    env=env)
    finally:
        support.ROOT = here


def full_history(server: Any, steps: int) -> bool:
    """Whether /api/series serves the whole run of loss (the last x is the last step), then the 8 charts."""
    try:
        [entry] = server.get_json("/api/series?metric=loss&points=2000&smooth=0.6", timeout=120)["series"]
    except (OSError, ValueError):
        return False  # not listening yet, or no series yet
    if not entry["x"] or entry["x"][-1] < steps:
        return False
    for metric in METRICS:
        get(f"{server.url}/api/series?metric={metric}&points=2000&smooth=0.6")
    return True


def append_step(log: Path) -> int:
    """Append the step after the log's last one (what a run writes while mstail restarts); returns it."""
    with open(log, "rb") as f:
        f.seek(max(0, log.stat().st_size - 4096))
        last = max(json.loads(line).get("step", 0) for line in f.read().splitlines()[1:])
    step = last + 1
    with open(log, "a", encoding="utf-8") as f:
        f.write(json.dumps({"step": step, "time": T0 + step * 0.5, "loss": 2.0, "lr": 1e-4}) + "\n")
    return step


def served(server: Any, step: int) -> bool:
    """Whether /api/series serves `step` of loss."""
    try:
        [entry] = server.get_json(f"/api/series?metric=loss&start={step}&end={step}", timeout=120)["series"]
    except (OSError, ValueError):
        return False
    return entry["x"] == [step]


def drop_page_cache() -> None:
    """Empty the page cache (root only): what a restart after a reboot reads comes from the disk."""
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def run(support: Any, label: str, log: Path, state: Path, work: Path, steps: int,
        code: Optional[Path] = None, cold: bool = False, kill: bool = False) -> Tuple[float, float]:
    """One mstail over `log` with `state` (run from `code`, default this tree): prints and returns (seconds to the
    whole history, RSS MiB then). A restart (`state` holds a state) gets a new step appended to the log first:
    tailing has resumed when that step is served; with `cold`, the page cache is dropped just before it. The mstail
    is stopped with Ctrl-C, or with `kill` killed (SIGKILL: a crash)."""
    env = installed_env([code])  # before the page cache is dropped: it reads the modules
    new_step = append_step(log) if any(state.glob("*.sqlite")) else None
    if cold and new_step is not None:
        drop_page_cache()
        label += ", cold page cache"
    began = time.perf_counter()
    server = start_jsonl_mstail(support, code, work, log, state, env)
    listening = time.perf_counter() - began
    try:
        support.wait_until(lambda: full_history(server, steps), 1800, interval=0.02)
        history = time.perf_counter() - began
        pid = server.proc.pid
        main_cpu, all_cpu = thread_cpu_s(pid, pid), proc_cpu_s(pid)
        rss = rss_mib(pid)
        support.wait_until(lambda: new_step is None or served(server, new_step), 1800, interval=0.02)
        tailing = time.perf_counter() - began
        for metric in METRICS:  # the heaviest smoothing the page offers: a cached full EMA per series
            get(f"{server.url}/api/series?metric={metric}&points=2000&smooth=0.99")
        smoothed_rss = rss_mib(server.proc.pid)
        print(f"[{label}] listening {listening:.2f} s, whole history served {history:.2f} s (CPU by then: main "
              f"thread {main_cpu:.2f} s, process {all_cpu:.2f} s), tailing "
              f"{tailing:.2f} s after the start; RSS {rss:.0f} MiB with the 8 charts' queries answered, "
              f"{smoothed_rss:.0f} MiB after them again at smoothing 0.99, peak "
              f"{rss_mib(server.proc.pid, 'VmHWM'):.0f} MiB; load {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        stopped = time.perf_counter()
        if kill:
            server.proc.kill()
            server.proc.wait(timeout=60)
        else:
            server.stop(timeout=600)
        print(f"[{label}] {'killed' if kill else 'stopped'} in {time.perf_counter() - stopped:.2f} s", flush=True)
    said = [line for line in server.stderr_path.read_text("utf-8", "replace").splitlines() if "state" in line]
    for line in said:
        print(f"[{label}] stderr: {line}")
    return history, max(rss, smoothed_rss)


def restarts(support: Any, tag: str, log: Path, state: Path, work: Path, args: argparse.Namespace,
             code: Optional[Path] = None) -> Tuple[Dict[str, float], float]:
    """A restart over a cleanly closed state (then killed), one after that crash (then stopped with Ctrl-C), and one
    as after a machine crash (the lock file's mark erased, as a power cut or another boot leaves it), by the code in
    `code` (default this tree); returns the seconds to the whole history of each, and the highest RSS (MiB)."""
    by = f" by {args.before}" if code is not None else ""
    times, rss = {}, []
    for name, label, kill in ((f"restart{by}", f"restart{by}{tag}, then killed", True),
                              (f"after a crash{by}", f"restart after a crash (kill -9){by}{tag}", False),
                              (f"after a machine crash{by}",
                               f"restart after a machine crash (no mark: the integrity check){by}{tag}", False)):
        if name.startswith("after a machine crash"):
            for lock in state.glob("*.sqlite.lock"):
                lock.write_bytes(b"")
        times[name], its_rss = run(support, label, log, state, work / name.replace(" ", "-"), args.steps,
                                   code=code, cold=args.cold, kill=kill)
        rss.append(its_rss)
    return times, max(rss)


def forget_columns(state: Path) -> None:
    """Make the state what an mstail before the saved columns left: items and checkpoints only."""
    [path] = state.glob("*.sqlite")
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM frames")
        conn.execute("DELETE FROM columns")
        conn.execute("DELETE FROM blocks")
        conn.execute("DELETE FROM meta WHERE key = 'columns'")
    with sqlite3.connect(path) as conn:
        conn.execute("VACUUM")


def code_of(rev: str, into: Path) -> Path:
    """The tree of git revision `rev` as an importable `mstail` (what pyproject's package-dir installs) in a
    folder of its own, which put first on the path is imported before the installed one."""
    tree = into / "tree"
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    package = into / "site" / "mstail"
    shutil.copytree(tree / "mstail", package)
    for part in ("parsers", "tailer", "web"):
        (package / part).symlink_to(tree / part)
    return into / "site"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--before", help="also restart with the code of this git revision (e.g. the merge base)")
    parser.add_argument("--keep", type=Path, help="keep the log and the state in this folder and reuse them when "
                        "there (the first run, reading the log, takes minutes on a loaded machine: skipped then)")
    parser.add_argument("--cold", action="store_true", help="drop the page cache before each restart (root only)")
    parser.add_argument("--rounds", type=int, default=1, help="restarts (a clean one and one after a crash, each by "
                        "this code and by --before REV in turn) this many times; the medians are the figures")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds needs 1 or more")
    support = load_test_support()
    work = Path(tempfile.mkdtemp(prefix="mstail-restart-"))
    try:
        kept = args.keep.absolute() if args.keep else work
        kept.mkdir(parents=True, exist_ok=True)
        log, state = kept / "metrics.jsonl", kept / "state"
        first_rss = math.nan
        if not any(state.glob("*.sqlite")):
            began = time.perf_counter()
            write_log(log, args.steps)
            print(f"log: {args.steps:,} steps x 8 metrics, {log.stat().st_size / 1e6:.0f} MB JSONL, written in "
                  f"{time.perf_counter() - began:.1f} s; load {os.getloadavg()[0]:.2f}", flush=True)
            _, first_rss = run(support, "first run, the log read from its start", log, state, work / "first",
                               args.steps)
        before = None
        if args.before:
            before = (code_of(args.before, work / "before-code"), work / "state-copy")
            shutil.copytree(state, before[1])
            # a copy is a new file to its lock's mark (checked at its opening): one start by REV, not counted, closes it
            run(support, f"warm-up by {args.before}: the copy checked and closed cleanly, not counted", log, before[1],
                work / "before-warm-up", args.steps, code=before[0], cold=args.cold)
        figures: Dict[str, List[float]] = {}
        rss = math.nan
        for round_ in range(1, args.rounds + 1):  # this code and REV's in turn: the machine's load swings
            tag = f" (round {round_} of {args.rounds})" if args.rounds > 1 else ""
            times, rss = restarts(support, tag, log, state, work, args)
            made = [times]
            if before is not None:
                made.append(restarts(support, tag, log, before[1], work / "before", args, code=before[0])[0])
            for times in made:
                for name, seconds in times.items():
                    figures.setdefault(name, []).append(seconds)
        history, crashed = statistics.median(figures["restart"]), statistics.median(figures["after a crash"])
        rebooted = statistics.median(figures["after a machine crash"])
        if args.rounds > 1:
            print("medians: " + ", ".join(f"{name} {statistics.median(times):.2f} s" for name, times in figures.items()))
        without = work / "state-without-columns"
        shutil.copytree(state, without)
        forget_columns(without)
        baseline, _ = run(support, "baseline: restart over a state without saved columns", log, without,
                          work / "baseline", args.steps, cold=args.cold)
        print(f"time to history: {history:.2f} s vs {baseline:.2f} s rebuilding the columns from JSON "
              f"({baseline / history:.1f}x), {crashed:.2f} s after a crash (kill -9), {rebooted:.2f} s after a "
              f"machine crash; goal <= {GOAL_HISTORY_S} s")
        print(f"RSS: {first_rss:.0f} MiB after reading the log, {rss:.0f} MiB after the restart; goal <= {GOAL_RSS_MB} MB")
        worst_rss = max(rss, first_rss) if first_rss == first_rss else rss  # NaN: the first run was skipped (--keep)
        return 0 if max(history, crashed) <= GOAL_HISTORY_S and worst_rss * 1.048576 <= GOAL_RSS_MB else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
