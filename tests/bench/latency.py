"""Write -> client latency of the live stream: a log line written by a training process -> its record received by an
SSE client of a real mstail.

Setup (all on this machine, loopback only): a real `mstail --log 'DIR/output/log/rank_*/info.log' --port 0`
subprocess follows --ranks files (--paths: `--log FILE` for each instead of the glob); one writer process per rank (or --writers processes, each writing every N-th
rank's file in turn) logs MindFormers v1.8 step + progress lines through `logging.handlers.RotatingFileHandler`
(the writer of tests/conftest.py) at --rate steps/s for --duration s, and appends "STEP BEFORE AFTER" per step
to a side file (unix times just before the step line and just after its progress line were written); --clients SSE clients (httpx streaming, spread over
--client-procs processes) read /api/stream and note the arrival time of every record, taken when the blank
line that ends its SSE message is read.

Latency of (client, record) = arrival time - BEFORE of that (source, step) (conservative: it includes the
writer's own time between the two lines). Reported: p50/p90/p99/max over all pairs (and from AFTER), per-client
received/missing/duplicate records and reconnects, the sidecar's CPU% (utime+stime over the writing window from
/proc/PID/stat; 100% = one core) and RSS (VmRSS, VmHWM), and the machine's load average (other work on a
small machine shows up as latency). With --idle S, mstail's CPU is also measured over S seconds before the
writers start, the files existing and quiet, from --settle seconds (default 5) after every file became a source: its
work on the sources it just found (their first passes, what the clients are told of them) is printed apart.

Run: python tests/bench/latency.py [--ranks 8] [--rate 10] [--duration 30] [--clients 10] [--client-procs 2]
                                  [--phase sync|spread] [--writers N] [--idle S [--settle S]] [--paths]
                                  [--keep-work]
Many files: python tests/bench/latency.py --ranks 1024 --rate 1 --writers 16 --clients 2 --phase spread --idle 20

Goal: p99 <= 100 ms with 8 files x 10 steps/s and 10 clients, nothing missing or doubled.
Exit status 0 when the goal is met, 1 otherwise. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from benchsupport import SSEReader, load_test_support, serve_rank_logs, write_times

HERE = Path(__file__).resolve().parent
GOAL_P99_MS = 100.0




# -- client role: one process, several SSE readers in threads ---------------------------------------------------
def run_clients(url: str, first: int, count: int, expect: int, deadline: float, out_dir: Path) -> int:
    import httpx

    def reader(k: int) -> None:
        receipts: List[Tuple[str, int, int, float]] = []  # source, step, seq, arrival
        seen = set()
        reconnects = 0
        sse = SSEReader()
        error = ""
        # A stream held as a browser holds it: only a silence longer than the server's 15 s ping is a drop (a
        # shorter read timeout reconnected idle clients every second, which the idle figure then counted).
        timeout = httpx.Timeout(connect=5.0, read=16.0, write=5.0, pool=5.0)
        with httpx.Client(timeout=timeout, trust_env=False) as client:
            while len(seen) < expect and time.time() < deadline:
                headers = {"Last-Event-ID": sse.last_id} if sse.last_id is not None else {}
                try:
                    with client.stream("GET", url + "/api/stream", headers=headers) as response:
                        response.raise_for_status()
                        sse.start()
                        for line in response.iter_lines():
                            message = sse.feed(line)
                            if line != "":
                                continue
                            arrived = time.time()
                            if message is not None and message[0] == "records":
                                for record in json.loads(message[1]):
                                    seen.add((record["source"], record["step"]))
                                    receipts.append((record["source"], record["step"], record["seq"], arrived))
                            if len(seen) >= expect or time.time() >= deadline:
                                break
                except (httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.ReadError) as exc:
                    # Quiet stream (writers done) or a dropped connection: resume where we were, if time is left.
                    if len(seen) < expect and time.time() < deadline:
                        reconnects += 1
                        error = repr(exc)
                except Exception as exc:  # noqa: BLE001 - reported in the result file, the run goes on
                    error = repr(exc)
                    break
        with open(out_dir / f"client_{k}.json", "w", encoding="utf-8") as f:
            # A ReadTimeout after everything arrived is the normal end, not a reconnect.
            json.dump({"receipts": receipts, "reconnects": reconnects, "error": error}, f)

    threads = [threading.Thread(target=reader, args=(first + i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.time()) + 18)
    return 0


# -- measurement helpers ----------------------------------------------------------------------------------------
def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def proc_mem_kib(pid: int) -> Dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1])
    return out


def loadavg() -> str:
    with open("/proc/loadavg", encoding="ascii") as f:
        return " ".join(f.read().split()[:3])


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def wait_until(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise SystemExit(f"latency: timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def spawn_clients(url: str, clients: int, procs: int, expect: int, deadline: float, out: Path) -> List[subprocess.Popen]:
    """`clients` SSE readers spread over `procs` processes running this script's client role."""
    spawned, first = [], 0
    for index in range(procs):
        count = clients // procs + (1 if index < clients % procs else 0)
        if count:
            spawned.append(subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--role", "clients", "--url", url, "--first", str(first),
                 "--count", str(count), "--expect", str(expect), "--deadline", repr(deadline), "--out", str(out)],
                stdin=subprocess.DEVNULL))
        first += count
    return spawned


# -- the benchmark -----------------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    support = load_test_support()
    steps = int(round(args.rate * args.duration))
    expect = args.ranks * steps
    server, log_dir, work = serve_rank_logs(support, "mstail-latency-", args.ranks, one_by_one=args.paths)
    try:
        print(f"mstail: {server.url} pid {server.proc.pid}; {args.ranks} files x {args.rate:g} steps/s x {args.duration:g} s "
              f"= {expect} records, writer phases {args.phase}; {args.clients} clients in {args.client_procs} processes; work dir {work}{' (kept)' if args.keep_work else ''}")
        clients: List[subprocess.Popen] = []
        writers: List[subprocess.Popen] = []
        try:
            rss_start = proc_mem_kib(server.proc.pid)
            load_start = loadavg()
            deadline = time.time() + args.duration + 11 + args.drain_s + args.idle + args.settle
            clients += spawn_clients(server.url, args.clients, args.client_procs, expect, deadline, work)
            wait_until(lambda: server.get_json("/healthz")["clients"] >= args.clients, 20, f"{args.clients} SSE clients")

            wait_until(lambda: server.get_json("/healthz")["sources"] >= args.ranks, 60, f"{args.ranks} sources")
            idle_pct = settle_pct = None
            if args.idle > 0:
                cpu0, wall0 = proc_cpu_s(server.proc.pid), time.monotonic()
                time.sleep(args.settle)
                settle_pct = 100 * (proc_cpu_s(server.proc.pid) - cpu0) / (time.monotonic() - wall0)
                cpu0, wall0 = proc_cpu_s(server.proc.pid), time.monotonic()
                time.sleep(args.idle)
                idle_pct = 100 * (proc_cpu_s(server.proc.pid) - cpu0) / (time.monotonic() - wall0)
            cpu0, wall0 = proc_cpu_s(server.proc.pid), time.monotonic()
            start_at = time.time() + 1.0  # time for the writers to start up, so that the phases are the chosen ones
            gap = 0.0 if args.phase == "sync" else 1.0 / args.ranks / args.rate  # between consecutive ranks' steps
            for first in range(args.writers):  # writer `first` writes ranks first, first + writers, ...
                ranks = range(first, args.ranks, args.writers)
                writers.append(support.spawn_writer(
                    [log_dir / f"rank_{rank}" / "info.log" for rank in ranks], steps, 1.0 / args.rate,
                    times_path=[work / f"times_{rank}.txt" for rank in ranks], seed=first, steps_per_epoch=max(steps, 1),
                    start_at=start_at + first * gap, spread_s=args.writers * gap))
            rss_peak_run = 0
            for writer in writers:
                while writer.poll() is None:
                    rss_peak_run = max(rss_peak_run, proc_mem_kib(server.proc.pid).get("VmRSS", 0))
                    time.sleep(0.25)
                    if time.monotonic() - wall0 > args.duration + 30:
                        raise SystemExit("latency: writers did not finish in time")
            cpu1, wall1 = proc_cpu_s(server.proc.pid), time.monotonic()
            bad = [w.stderr.read().decode() for w in writers if w.returncode != 0]  # type: ignore[union-attr]
            if bad:
                raise SystemExit(f"latency: a writer failed: {bad[0]}")
            for client in clients:
                client.wait(timeout=max(0.0, deadline - time.time()) + 20)  # past the deadline: one more ping
            mem_end = proc_mem_kib(server.proc.pid)
            health = server.get_json("/healthz", timeout=30)  # a starved server answers late, not never
            load_end = loadavg()
        finally:
            for proc in writers + clients:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=5)
            began = time.monotonic()
            code = server.stop()
            stop_s = time.monotonic() - began

        # -- the figures -------------------------------------------------------------------------------------------
        written, completed = write_times(work, args.ranks)
        assert len(written) == expect, (len(written), expect)
        write_ms = sorted((completed[k] - written[k]) * 1000 for k in written)

        all_ms: List[float] = []
        from_done_ms: List[float] = []
        rows = []
        for k in range(args.clients):
            path = work / f"client_{k}.json"
            if not path.exists():
                rows.append((k, 0, expect, 0, 0, "no result file", math.nan))
                continue
            result = json.loads(path.read_text())
            counts = Counter((s, step) for s, step, _, _ in result["receipts"])
            unknown = [key for key in counts if key not in written]
            missing = sum(1 for key in written if key not in counts)
            dups = sum(n - 1 for n in counts.values() if n > 1)
            mine = sorted((t - written[(s, step)]) * 1000 for s, step, _, t in result["receipts"] if (s, step) in written)
            all_ms += mine
            from_done_ms += [(t - completed[(s, step)]) * 1000 for s, step, _, t in result["receipts"] if (s, step) in written]
            note = result["error"] if result["reconnects"] or not mine else ""
            if unknown:
                note += f" {len(unknown)} unknown records"
            rows.append((k, len(result["receipts"]), missing, dups, result["reconnects"], note, percentile(mine, 99)))
        all_ms.sort()
        from_done_ms.sort()
        cpu_pct = 100 * (cpu1 - cpu0) / max(wall1 - wall0, 1e-9)

        print()
        print("client  received  missing  duplicates  reconnects  p99_ms  note")
        for k, received, missing, dups, reconnects, note, p99 in rows:
            print(f"{k:6d}  {received:8d}  {missing:7d}  {dups:10d}  {reconnects:10d}  {p99:6.1f}  {note}")
        print()
        print(f"latency write->client over {len(all_ms)} (client, record) pairs: "
              f"p50 {percentile(all_ms, 50):.1f} ms, p90 {percentile(all_ms, 90):.1f} ms, "
              f"p99 {percentile(all_ms, 99):.1f} ms, max {all_ms[-1] if all_ms else math.nan:.1f} ms, "
              f"min {all_ms[0] if all_ms else math.nan:.1f} ms")
        print(f"  measured from the progress line written instead: p50 {percentile(from_done_ms, 50):.1f} ms, "
              f"p99 {percentile(from_done_ms, 99):.1f} ms, max {from_done_ms[-1] if from_done_ms else math.nan:.1f} ms; "
              f"writers took p50 {percentile(write_ms, 50):.2f} ms, p99 {percentile(write_ms, 99):.2f} ms, "
              f"max {write_ms[-1]:.1f} ms from step line to progress line (a writer descheduled in between adds its stall)")
        print(f"mstail CPU {cpu_pct:.1f}% of one core over the {wall1 - wall0:.1f} s writing window; "
              f"RSS {rss_start.get('VmRSS', 0) / 1024:.1f} MiB before, {rss_peak_run / 1024:.1f} MiB max sampled while writing, "
              f"{mem_end.get('VmRSS', 0) / 1024:.1f} MiB at the end, peak (VmHWM) {mem_end.get('VmHWM', 0) / 1024:.1f} MiB")
        print(f"mstail CPU {1e6 * (cpu1 - cpu0) / max(expect, 1):.0f} us per record written ({cpu1 - cpu0:.2f} s for {expect}: "
              "less sensitive to the machine's load than the latency)")
        if idle_pct is not None:
            print(f"mstail CPU {idle_pct:.2f}% of one core over {args.idle:g} s with the {args.ranks} files quiet (before writing; "
                  f"in the {args.settle:g} s before, as they became sources: {settle_pct:.2f}%)")
        print(f"machine: {os.cpu_count()} CPUs, load average {load_start} at the start, {load_end} at the end "
              f"(other work on the machine shows up as latency)")
        print(f"mstail /healthz at the end: {health}; SIGINT -> exit {code} in {stop_s:.2f} s")
        total_missing = sum(r[2] for r in rows)
        total_dups = sum(r[3] for r in rows)
        p99 = percentile(all_ms, 99)
        ok = p99 <= GOAL_P99_MS and total_missing == 0 and total_dups == 0
        print(f"goal p99 <= {GOAL_P99_MS:.0f} ms, nothing missing or doubled: {'MET' if ok else 'NOT MET'} "
              f"(p99 {p99:.1f} ms, {total_missing} missing, {total_dups} duplicates)")
        return 0 if ok else 1
    finally:
        if not args.keep_work:  # 1,024 ranks: tens of MB of logs and timings
            shutil.rmtree(work, ignore_errors=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=8, help="log files, one writer process each (default 8)")
    ap.add_argument("--rate", type=float, default=10.0, help="steps per second per writer (default 10)")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of writing (default 30)")
    ap.add_argument("--keep-work", action="store_true", help="keep the work dir (logs, timings, mstail's state) "
                    "for a look afterwards (default: removed)")
    ap.add_argument("--paths", action="store_true", help="give mstail the files one by one (a --log each) instead of "
                    "one glob")
    ap.add_argument("--writers", type=int, default=0, help="writer processes, each writing every N-th rank's file "
                    "(default 0: one per rank; fewer keep a thousand ranks from being a thousand processes)")
    ap.add_argument("--clients", type=int, default=10, help="SSE clients (default 10)")
    ap.add_argument("--client-procs", type=int, default=2, help="processes the clients are spread over (default 2)")
    ap.add_argument("--phase", choices=("sync", "spread"), default="sync",
                    help="sync: every writer logs step N at the same moment, as data-parallel ranks do (default); "
                    "spread: writer phases spread evenly over the step interval (a steady trickle of lines)")
    ap.add_argument("--idle", type=float, default=0.0, help="seconds of quiet files before the writers start, "
                    "over which mstail's idle CPU is measured (default 0: none)")
    ap.add_argument("--settle", type=float, default=5.0, help="with --idle: seconds after every file became a source "
                    "before the idle window opens, measured apart (default 5)")
    ap.add_argument("--drain-s", type=float, default=5.0, help="how long clients wait for stragglers (default 5)")
    # internal: the client role
    ap.add_argument("--role", choices=("bench", "clients"), default="bench", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--expect", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role == "clients":
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        return run_clients(args.url, args.first, args.count, args.expect, args.deadline, Path(args.out))
    if args.ranks < 1 or args.rate <= 0 or args.duration <= 0 or args.clients < 1 or args.client_procs < 1:
        ap.error("--ranks, --rate, --duration, --clients and --client-procs must be positive")
    args.client_procs = min(args.client_procs, args.clients)
    args.writers = min(args.writers or args.ranks, args.ranks)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
