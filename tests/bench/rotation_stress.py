"""Rotation stress with mstail killed and restarted: is every line stored exactly once, in order?

Setup (all on this machine): --ranks writer processes (this script's writer role) each log `rank=R seq=N pad=x...`
lines (~60 B) at --rate lines/s for --duration s through `logging.handlers.RotatingFileHandler` (--max-bytes 1 MB,
--backups 3: `info.log` -> `info.log.1` ... `info.log.3`, the oldest deleted) into `DIR/output/log/rank_R/info.log`.
A real `python -m tailer --log 'DIR/output/log/rank_*/info.log' --pattern ... --state-dir DIR/state --port 0`
follows them; it is killed with SIGKILL --kills times (evenly spread over the run) and restarted after --down s.
Each writer also notes every rollover (time, last seq of the file rotated away), so the script knows which lines
lived in which file and when that file was deleted.

At the end every record is read back from `/api/records` (in seq order) and checked per rank:
- lost: lines written but not stored, split into "deleted while down" (their file was deleted by the handler
  between a kill and 1 s after the restarted mstail served: nobody can read those) and "lost while up"
  (anything else: a bug);
- duplicated: lines stored more than once;
- out of order: adjacent stored lines of a rank whose seq goes down.
Plus each mstail process's CPU (user+sys seconds / wall seconds it lived, from /proc/PID/stat) and peak RSS
(VmHWM from /proc/PID/status, sampled every 0.2 s; a killed process's last sample).

With 1 MB files and 3 backups a line stays on disk ~4 x 17 s at 1,000 lines/s, so with quick restarts
nothing should be deleted while mstail is down.

Run: python tests/bench/rotation_stress.py [--ranks 8] [--rate 1000] [--duration 60] [--kills 2] [--down 0.5]

Goal: 0 lost while up / 0 duplicated / 0 out of order. Exit status 0 when met, 1 otherwise. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import logging
import logging.handlers
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from bisect import bisect_left
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from benchsupport import load_test_support

PATTERN = r"^rank=(?P<rank>\d+) seq=(?P<step>\d+) pad=x+$"
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


# -- writer role --------------------------------------------------------------------------------------------------
class NotingHandler(logging.handlers.RotatingFileHandler):
    """RotatingFileHandler that appends "time last_seq" to a side file at every rollover."""

    def __init__(self, path: str, notes: str, max_bytes: int, backups: int) -> None:
        super().__init__(path, maxBytes=max_bytes, backupCount=backups)
        self.notes = open(notes, "a", encoding="ascii")  # closed in close()
        self.last_seq = 0

    def doRollover(self) -> None:
        super().doRollover()
        self.notes.write(f"{time.time():.6f} {self.last_seq}\n")
        self.notes.flush()

    def close(self) -> None:
        super().close()
        self.notes.close()


def run_writer(path: str, notes: str, rank: int, rate: float, duration: float, max_bytes: int, backups: int) -> int:
    handler = NotingHandler(path, notes, max_bytes, backups)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("stress")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    total = int(rate * duration)
    start = time.monotonic()
    written = 0
    while written < total:
        due = min(total, int((time.monotonic() - start) * rate) + 1)
        while written < due:
            written += 1
            handler.last_seq = written - 1  # a rollover happens before this line is written
            logger.info("rank=%d seq=%08d pad=%s", rank, written, "x" * 30)
        time.sleep(0.005)
    handler.close()
    print("done", flush=True)
    return 0


# -- sidecar measurements ----------------------------------------------------------------------------------------
def proc_cpu_s(pid: int) -> Optional[float]:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def proc_hwm_kib(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class Sampler:
    """Samples CPU and peak RSS of one process every 0.2 s until it exits (its last sample is kept)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.started = pid, time.monotonic()
        self.cpu_s, self.hwm_kib, self.ended = 0.0, 0, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(0.2)

    def sample(self) -> None:
        cpu, hwm = proc_cpu_s(self.pid), proc_hwm_kib(self.pid)
        if cpu is not None:
            self.cpu_s = cpu
            self.ended = time.monotonic()
        if hwm is not None:
            self.hwm_kib = max(self.hwm_kib, hwm)

    def stop(self) -> None:
        self.sample()
        self._stop.set()
        self._thread.join(timeout=2)

    @property
    def wall_s(self) -> float:
        return max((self.ended or time.monotonic()) - self.started, 1e-9)


# -- the run ------------------------------------------------------------------------------------------------------
def all_records(server: Any) -> List[Dict[str, Any]]:
    got: List[Dict[str, Any]] = []
    while True:
        page = server.get_json(f"/api/records?after={got[-1]['seq'] if got else 0}&limit=10000", timeout=30)
        if not page:
            return got
        got += page


def held(server: Any) -> int:
    return sum(s["records"] for s in server.get_json("/api/sources"))


def rollovers(notes: Path) -> List[Tuple[float, int]]:
    if not notes.exists():
        return []
    return [(float(t), int(seq)) for t, seq in (line.split() for line in notes.read_text().splitlines() if line)]


def deleted_while_down(notes: List[Tuple[float, int]], backups: int, downs: List[Tuple[float, float]]) -> List[range]:
    """Seq ranges of files the handler deleted inside a down window. File k (0-based, in rollover order) holds
    seqs (last_{k-1}, last_k] and is deleted by rollover k + backups (when `.backups` is replaced)."""
    out = []
    for k, (_, last) in enumerate(notes):
        first = notes[k - 1][1] + 1 if k else 1
        deleting = k + backups
        if deleting < len(notes):
            when = notes[deleting][0]
            if any(a <= when <= b for a, b in downs):
                out.append(range(first, last + 1))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=8, help="log files, one writer process each (default 8)")
    ap.add_argument("--rate", type=float, default=1000.0, help="lines per second per rank (default 1000)")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of writing (default 60)")
    ap.add_argument("--max-bytes", type=int, default=1_000_000, help="RotatingFileHandler maxBytes (default 1 MB)")
    ap.add_argument("--backups", type=int, default=3, help="RotatingFileHandler backupCount (default 3)")
    ap.add_argument("--kills", type=int, default=2, help="SIGKILL + restart this many times (default 2)")
    ap.add_argument("--down", type=float, default=0.5, help="seconds mstail stays down per kill (default 0.5)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--writer", nargs=7, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.writer:
        path, notes, rank, rate, duration, max_bytes, backups = args.writer
        return run_writer(path, notes, int(rank), float(rate), float(duration), int(max_bytes), int(backups))
    if args.ranks < 1 or args.rate <= 0 or args.duration <= 0 or args.kills < 0 or args.down < 0:
        ap.error("--ranks, --rate and --duration must be positive; --kills and --down not negative")

    support = load_test_support()
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="mstail-rotation-stress-"))
    log_dir = work / "output" / "log"
    for rank in range(args.ranks):
        (log_dir / f"rank_{rank}").mkdir(parents=True)
    glob = str(log_dir / "rank_*" / "info.log")
    mstail_args = ["--pattern", PATTERN, "--format", "pattern", "--state-dir", str(work / "state"), "--no-alerts"]
    per_rank = int(args.rate * args.duration)
    print(f"{args.ranks} ranks x {args.rate:g} lines/s x {args.duration:g} s = {per_rank * args.ranks:,} lines; "
          f"RotatingFileHandler {args.max_bytes:,} B x {args.backups} backups; {args.kills} SIGKILL+restart "
          f"(down {args.down:g} s each); work dir {work}", flush=True)

    samplers: List[Sampler] = []
    downs: List[Tuple[float, float]] = []
    writers: List[subprocess.Popen] = []
    server = None
    try:
        server = support.start_mstail([glob], work / "mstail0", args=mstail_args)
        samplers.append(Sampler(server.proc.pid))
        began = time.time()
        for rank in range(args.ranks):
            cmd = [sys.executable, __file__, "--writer", str(log_dir / f"rank_{rank}" / "info.log"),
                   str(work / f"rollovers_{rank}.txt"), str(rank), str(args.rate), str(args.duration),
                   str(args.max_bytes), str(args.backups)]
            writers.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        for k in range(1, args.kills + 1):
            time.sleep(max(0.0, began + args.duration * k / (args.kills + 1) - time.time()))
            samplers[-1].sample()
            held_before = held(server)
            killed = time.time()
            server.proc.send_signal(signal.SIGKILL)
            server.proc.wait(timeout=10)
            samplers[-1].stop()
            time.sleep(args.down)
            server = support.start_mstail([glob], work / f"mstail{k}", args=mstail_args)
            samplers.append(Sampler(server.proc.pid))
            serving = time.time()
            downs.append((killed, serving + 1.0))
            print(f"  kill {k} at {killed - began:5.1f} s ({held_before:,} records held): down {serving - killed:.2f} s "
                  f"until the new mstail served; it holds {held(server):,} records after restoring", flush=True)
        for proc in writers:
            out, err = proc.communicate(timeout=args.duration + 120)
            if proc.returncode != 0 or out.strip() != b"done":
                print(f"writer failed ({proc.returncode}): {err.decode(errors='replace')}")
                return 1
        wrote = time.time()
        expected_total = per_rank * args.ranks
        last, stable_since, deadline = -1, time.monotonic(), time.monotonic() + 120
        while time.monotonic() < deadline:  # until everything is in, or nothing more came for 5 s
            now_held = held(server)
            if now_held >= expected_total:
                break
            if now_held != last:
                last, stable_since = now_held, time.monotonic()
            elif time.monotonic() - stable_since > 5:
                break
            time.sleep(0.2)
        caught_up = time.time() - wrote
        records = all_records(server)
        samplers[-1].stop()
    finally:
        for proc in writers:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=5)
        if server is not None:
            code = server.stop()
            if code not in (0, None) or "Traceback" in server.stderr:
                print(f"last mstail exited with {code}:\n{server.stderr[-2000:]}")

    # -- report --------------------------------------------------------------------------------------------------
    by_rank: Dict[int, List[int]] = {}
    for record in records:
        by_rank.setdefault(int(record["source"].rsplit("_", 1)[1]), []).append(int(record["step"]))
    totals = Counter()
    print(f"\ncaught up {caught_up:.1f} s after the writers finished; {len(records):,} records read back")
    print(f"{'rank':>4} {'written':>8} {'stored':>8} {'lost up':>8} {'lost down':>9} {'dup':>5} {'order':>6} {'rollovers':>9}")
    for rank in range(args.ranks):
        got = by_rank.get(rank, [])
        counts = Counter(got)
        notes = rollovers(work / f"rollovers_{rank}.txt")
        gone = deleted_while_down(notes, args.backups, downs)
        gone_starts = [r.start for r in gone]
        missing = [s for s in range(1, per_rank + 1) if s not in counts]

        def deleted(seq: int, gone: List[range] = gone, starts: List[int] = gone_starts) -> bool:
            i = bisect_left(starts, seq + 1) - 1
            return i >= 0 and seq in gone[i]

        lost_down = sum(1 for s in missing if deleted(s))
        row = {
            "written": per_rank, "stored": len(got), "lost_up": len(missing) - lost_down, "lost_down": lost_down,
            "dup": sum(n - 1 for n in counts.values() if n > 1), "order": sum(1 for a, b in zip(got, got[1:]) if b < a),
            "unexpected": sum(1 for s in counts if not 1 <= s <= per_rank), "rollovers": len(notes),
        }
        totals.update(row)
        print(f"{rank:>4} {row['written']:>8,} {row['stored']:>8,} {row['lost_up']:>8} {row['lost_down']:>9} "
              f"{row['dup']:>5} {row['order']:>6} {row['rollovers']:>9}")
    print(f"{'all':>4} {totals['written']:>8,} {totals['stored']:>8,} {totals['lost_up']:>8} {totals['lost_down']:>9} "
          f"{totals['dup']:>5} {totals['order']:>6} {totals['rollovers']:>9}")
    print(f"\nlost while up / duplicated / out of order: {totals['lost_up']} / {totals['dup']} / {totals['order']} "
          f"(goal 0 / 0 / 0); lost because the handler deleted their file while mstail was down: {totals['lost_down']}")
    for i, s in enumerate(samplers):
        how = "killed (SIGKILL)" if i < len(samplers) - 1 else "stopped at the end"
        print(f"mstail #{i}: CPU {s.cpu_s:.1f} s over {s.wall_s:.1f} s = {100 * s.cpu_s / s.wall_s:.1f} % of a core; "
              f"peak RSS {s.hwm_kib / 1024:.1f} MiB; {how}")
    cpu, wall = sum(s.cpu_s for s in samplers), sum(s.wall_s for s in samplers)
    print(f"all mstail processes: {100 * cpu / wall:.1f} % of a core; machine: {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(json.dumps({"lost_while_up": totals["lost_up"], "deleted_while_down": totals["lost_down"],
                      "duplicated": totals["dup"], "out_of_order": totals["order"], "unexpected": totals["unexpected"],
                      "cpu_pct": round(100 * cpu / wall, 1), "peak_rss_mib": [round(s.hwm_kib / 1024, 1) for s in samplers]}))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    ok = totals["lost_up"] == totals["dup"] == totals["order"] == totals["unexpected"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
