"""Fan-out under load: 100 SSE clients of one real mstail while 8 files get 10 steps/s each, and one client that
stops reading halfway through.

Setup (loopback only): a real `mstail --log 'DIR/output/log/rank_*/info.log' --port 0 --send-timeout S`; one
writer process per rank (tests/conftest.py's MindFormers writer, which notes the time of every step) at --rate
steps/s for --duration s; --clients SSE readers (tests/bench/latency.py's client role: httpx streaming, one
thread per reader) spread over --client-procs processes, each noting when every record arrives. At half time a
*stalled* client connects (a raw socket with a 4 KiB receive buffer that asks for the whole history and never
reads); it stays until the end (or until mstail drops it after --send-timeout of accepting nothing).

Reported: write -> client latency p50/p99/max over all (client, record) pairs, separately for the records written
before the stalled client came and those written after it (the stalled client must not move the others' p99),
missing/duplicate records, mstail's CPU (% of one core over the writing window) and RSS, and whether the stalled
client was dropped (`mstail_sse_clients_dropped_total` from /metrics).

Run: python tests/bench/fanout.py [--clients 100] [--client-procs 10] [--ranks 8] [--rate 10] [--duration 30]
                                  [--send-timeout 10] [--keep-work]
Goal: p99 <= 150 ms in both halves, nothing missing or doubled. Exit 0 when met, 1 otherwise. Linux only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import List, Optional, Sequence

import latency
from benchsupport import load_test_support, serve_rank_logs, write_times

HERE = Path(__file__).resolve().parent
GOAL_P99_MS = 150.0
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))




def metric(url: str, name: str) -> float:
    with _NO_PROXY.open(url + "/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return math.nan


def stalled_client(url: str) -> socket.socket:
    host, port = url.split("//", 1)[1].split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(f"GET /api/stream?after=0 HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    return sock  # never read


def run(args: argparse.Namespace) -> int:
    support = load_test_support()
    steps = int(round(args.rate * args.duration))
    expect = args.ranks * steps
    server, log_dir, work = serve_rank_logs(support, "mstail-fanout-", args.ranks, ("--send-timeout", repr(args.send_timeout)))
    try:
        pid = server.proc.pid
        print(f"mstail {server.url} pid {pid}: {args.ranks} files x {args.rate:g} steps/s x {args.duration:g} s = {expect} "
              f"records; {args.clients} SSE clients in {args.client_procs} processes; a stalled client from half time; "
              f"--send-timeout {args.send_timeout:g}; work dir {work}")
        clients: List[subprocess.Popen] = []
        writers: List[subprocess.Popen] = []
        stalled: Optional[socket.socket] = None
        try:
            deadline = time.time() + args.duration + 25
            clients += latency.spawn_clients(server.url, args.clients, args.client_procs, expect, deadline, work)
            latency.wait_until(lambda: server.get_json("/healthz")["clients"] >= args.clients, 60, f"{args.clients} clients")
            rss_start = latency.proc_mem_kib(pid)
            load_start = latency.loadavg()
            cpu0, wall0 = latency.proc_cpu_s(pid), time.monotonic()
            start_at = time.time() + 1.0
            for rank in range(args.ranks):
                writers.append(support.spawn_writer(
                    log_dir / f"rank_{rank}" / "info.log", steps, 1.0 / args.rate, times_path=work / f"times_{rank}.txt",
                    seed=rank, steps_per_epoch=max(steps, 1), start_at=start_at))
            stall_at = start_at + args.duration / 2
            rss_peak = 0
            clients_max = 0
            while any(w.poll() is None for w in writers):
                if args.stall and stalled is None and time.time() >= stall_at:
                    stalled = stalled_client(server.url)
                    stall_at = time.time()
                rss_peak = max(rss_peak, latency.proc_mem_kib(pid).get("VmRSS", 0))
                clients_max = max(clients_max, server.get_json("/healthz")["clients"])
                time.sleep(0.1)
                if time.monotonic() - wall0 > args.duration + 30:
                    raise SystemExit("fanout: writers did not finish in time")
            cpu1, wall1 = latency.proc_cpu_s(pid), time.monotonic()
            clients_after = server.get_json("/healthz")["clients"]
            for client in clients:
                client.wait(timeout=max(0.0, deadline - time.time()) + 15)
            dropped = metric(server.url, "mstail_sse_clients_dropped_total")
            mem_end = latency.proc_mem_kib(pid)
            load_end = latency.loadavg()
        finally:
            for proc in writers + clients:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=5)
            if stalled is not None:
                stalled.close()
            began = time.monotonic()
            code = server.stop()
            stop_s = time.monotonic() - began

        written, _ = write_times(work, args.ranks)
        before_ms: List[float] = []
        after_ms: List[float] = []
        missing = dups = 0
        per_client_p99: List[float] = []
        for k in range(args.clients):
            path = work / f"client_{k}.json"
            if not path.exists():
                missing += expect
                continue
            receipts = json.loads(path.read_text())["receipts"]
            counts = Counter((s, step) for s, step, _, _ in receipts)
            missing += sum(1 for key in written if key not in counts)
            dups += sum(n - 1 for n in counts.values() if n > 1)
            mine = []
            for source, step, _seq, arrived in receipts:
                w = written.get((source, step))
                if w is None:
                    continue
                ms = (arrived - w) * 1000
                mine.append(ms)
                if w < stall_at:
                    before_ms.append(ms)
                elif w > stall_at + 0.5:
                    after_ms.append(ms)
            per_client_p99.append(latency.percentile(sorted(mine), 99))
        before_ms.sort()
        after_ms.sort()
        p = latency.percentile
        cpu_pct = 100 * (cpu1 - cpu0) / max(wall1 - wall0, 1e-9)
        print()
        print(f"{'before the stalled client:' if args.stall else 'first half:               '} {len(before_ms)} (client, record) pairs, p50 {p(before_ms, 50):.1f} ms, "
              f"p99 {p(before_ms, 99):.1f} ms, max {before_ms[-1] if before_ms else math.nan:.1f} ms")
        print(f"{'with the stalled client:  ' if args.stall else 'second half (no stall):   '} {len(after_ms)} pairs, p50 {p(after_ms, 50):.1f} ms, "
              f"p99 {p(after_ms, 99):.1f} ms, max {after_ms[-1] if after_ms else math.nan:.1f} ms")
        per_client_p99.sort()
        print(f"per-client p99: best {per_client_p99[0]:.1f} ms, median {p(per_client_p99, 50):.1f} ms, "
              f"worst {per_client_p99[-1]:.1f} ms; {missing} missing, {dups} duplicated of {expect} x {args.clients}")
        print(f"mstail CPU {cpu_pct:.1f}% of one core over {wall1 - wall0:.1f} s; RSS {rss_start.get('VmRSS', 0) / 1024:.1f} MiB "
              f"before, {rss_peak / 1024:.1f} MiB max while writing, peak (VmHWM) {mem_end.get('VmHWM', 0) / 1024:.1f} MiB")
        print(f"SSE clients: at most {clients_max} while writing, {clients_after} once writing was over (readers leave "
              f"when they have every record); stalled client {'connected' if args.stall else 'none (--no-stall)'}, "
              f"mstail_sse_clients_dropped_total {dropped:g}")
        print(f"machine: {os.cpu_count()} CPUs, load {load_start} at the start, {load_end} at the end; "
              f"SIGINT -> exit {code} in {stop_s:.2f} s")
        ok = p(before_ms, 99) <= GOAL_P99_MS and p(after_ms, 99) <= GOAL_P99_MS and missing == 0 and dups == 0
        print(f"goal p99 <= {GOAL_P99_MS:.0f} ms in both halves, nothing missing or doubled: {'MET' if ok else 'NOT MET'}")
        return 0 if ok else 1
    finally:
        if not args.keep_work:  # 1,024 ranks: tens of MB of logs and timings
            shutil.rmtree(work, ignore_errors=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep-work", action="store_true", help="keep the work dir (logs, timings, mstail's state) "
                    "for a look afterwards (default: removed)")
    ap.add_argument("--clients", type=int, default=100, help="SSE clients (default 100)")
    ap.add_argument("--client-procs", type=int, default=10, help="processes the clients are spread over (default 10)")
    ap.add_argument("--ranks", type=int, default=8, help="log files, one writer each (default 8)")
    ap.add_argument("--rate", type=float, default=10.0, help="steps per second per writer (default 10)")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of writing (default 30)")
    ap.add_argument("--send-timeout", type=float, default=10.0, help="mstail's --send-timeout (default 10)")
    ap.add_argument("--no-stall", dest="stall", action="store_false", help="control run: no stalled client (the "
                    "halves are still reported separately, to tell the stalled client's effect from drift)")
    args = ap.parse_args(argv)
    if min(args.clients, args.client_procs, args.ranks) < 1 or args.rate <= 0 or args.duration <= 0:
        ap.error("all numbers must be positive")
    args.client_procs = min(args.client_procs, args.clients)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
