"""Queries and the event loop: do 40 concurrent chart queries on a long history stall the server?

Setup (loopback only): page_load.py's JSONL log of --steps steps x 8 metrics; a real `mstail --jsonl FILE
--state-dir DIR --port 0` reads it all (not measured), then is stopped; each measured run is a restart over that
state (its history back from the saved columns), waiting until `/api/series` serves the whole run.

Measured per run: 40 `/api/series` requests at once, each from a client address of its own (127.0.0.2 and up: the
server bounds the expensive requests of one address, `web/limits.py`), each with a random metric, `smooth=` (a new
weight each, so no cached EMA serves it), `points=` and, one time in two, `aggregate=mean`. Meanwhile `/healthz` is
asked in a loop, each time on a new connection: its latency p50 / p99 / max while the queries run (and its p99 over
the IDLE_S before them: what the machine's load alone does); the queries' wall
time until the last answered; the server's RSS (VmRSS) before them, when they ended and 3 s later. Then 40 more
such queries (other weights) one after another, alone: the server's CPU time across each (its threads'
/proc/PID/task/*/schedstat, in ns; the idle server's CPU over as long is said beside them).

With --before REV the same is measured with the code of git revision REV (`restart.code_of`) over a copy of the
same state, after one start that checks the copy (not counted); --rounds N alternates the two N times.

Run: python tests/bench/stalled_query.py [--steps 1000000] [--before main] [--keep DIR] [--rounds N]
"""

from __future__ import annotations

import argparse
import http.client
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from benchsupport import installed_env, load_test_support
from page_load import rss_mib, write_log
from restart import METRICS, code_of, full_history, start_jsonl_mstail

QUERIES = 40
HEALTH_EVERY_S = 0.02
IDLE_S = 3.0  # /healthz asked this long before the queries
SEED = 20261208


def queries(seed: int) -> List[str]:
    """The 40 random `/api/series` paths (the same for every run)."""
    rng = random.Random(seed)
    out = []
    for k in range(QUERIES):
        smooth = round(0.5 + 0.49 * rng.random(), 3)
        path = (f"/api/series?metric={rng.choice(METRICS)}&points={rng.choice((500, 1000, 2000))}"
                f"&smooth={smooth}")
        out.append(path + ("&aggregate=mean" if k % 2 else ""))
    return out


def ask(port: int, path: str, source: str) -> Tuple[int, float]:
    """One GET from the loopback address `source`: (status, seconds)."""
    began = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600, source_address=(source, 0))
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status, time.perf_counter() - began
    finally:
        conn.close()


def health_samples(port: int, stop: threading.Event, out: List[float]) -> None:
    """`/healthz` latencies (s), one request after another, each on a connection of its own (as a probe asks;
    on one kept open, each answer here came 40 ms late whatever the server did), until `stop`."""
    while not stop.is_set():
        out.append(ask(port, "/healthz", "127.0.0.1")[1])
        time.sleep(HEALTH_EVERY_S)


def percentile(values: List[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


def cpu_ns(pid: int) -> int:
    """CPU time of the threads of process `pid` so far (ns; a thread that ended takes its share with it)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # ended meanwhile
            pass
    return total


def alone(port: int, pid: int, paths: List[str]) -> Dict[str, float]:
    """Each of `paths` asked alone, one after another: the server's CPU across each (ms), and the idle server's over
    the same wall time (ms a query)."""
    cpu, wall = [], []
    for path in paths:
        began, began_cpu = time.perf_counter(), cpu_ns(pid)
        status, _ = ask(port, path, "127.0.0.2")
        cpu.append((cpu_ns(pid) - began_cpu) / 1e6)
        wall.append(time.perf_counter() - began)
        assert status == 200, (status, path)
    began = cpu_ns(pid)
    time.sleep(sum(wall))
    return {"cpu_p50_ms": statistics.median(cpu), "cpu_max_ms": max(cpu), "over_50": sum(c > 50 for c in cpu),
            "idle_ms": (cpu_ns(pid) - began) / 1e6 / len(paths)}


def burst(port: int, pid: int, paths: List[str]) -> Dict[str, float]:
    """The 40 queries at once with /healthz sampled meanwhile: the figures."""
    rss_before = rss_mib(pid)
    health: List[float] = []
    stop = threading.Event()
    sampler = threading.Thread(target=health_samples, args=(port, stop, health), daemon=True)
    sampler.start()
    time.sleep(IDLE_S)  # the idle server first: what the machine's load alone does to /healthz
    idle = len(health)
    answers: List[Tuple[int, float]] = []
    began = time.perf_counter()
    clients = [threading.Thread(target=lambda k=k: answers.append(ask(port, paths[k], f"127.0.0.{2 + k}")))
               for k in range(len(paths))]
    for client in clients:
        client.start()
    for client in clients:
        client.join()
    wall = time.perf_counter() - began
    stop.set()
    sampler.join()
    rss_end = rss_mib(pid)
    time.sleep(3)
    during, before = health[idle:], health[:idle]
    return {"idle_p99_ms": 1000 * percentile(before, 0.99), "idle_n": len(before),"wall_s": wall, "ok": sum(1 for status, _ in answers if status == 200), "answered": len(answers),
            "query_p50_s": percentile([s for _, s in answers], 0.5), "health_n": len(during),
            "health_p50_ms": 1000 * percentile(during, 0.5), "health_p99_ms": 1000 * percentile(during, 0.99),
            "health_max_ms": 1000 * max(during, default=float("nan")), "rss_before": rss_before,
            "rss_end": rss_end, "rss_after_3s": rss_mib(pid)}


def run(support: Any, label: str, log: Path, state: Path, work: Path, steps: int, paths: List[str],
        code: Optional[Path] = None) -> Dict[str, float]:
    """One mstail over `log` and `state` (run from `code`, default this tree) once it serves the whole run: the
    burst's figures, printed."""
    env = installed_env([code])
    server = start_jsonl_mstail(support, code, work, log, state, env)
    try:
        support.wait_until(lambda: full_history(server, steps), 1800, interval=0.1)
        port = int(server.url.rsplit(":", 1)[1].split("/")[0])
        figures = burst(port, server.proc.pid, paths)
        figures.update(alone(port, server.proc.pid, queries(SEED + 1)))
    finally:
        server.stop(timeout=600)
    print(f"[{label}] {figures['ok']}/{figures['answered']} queries answered 200 in {figures['wall_s']:.2f} s "
          f"(median {figures['query_p50_s']:.2f} s); /healthz meanwhile ({figures['health_n']} answers): p50 "
          f"{figures['health_p50_ms']:.1f} ms, p99 {figures['health_p99_ms']:.1f} ms, max {figures['health_max_ms']:.0f} "
          f"ms (idle before: {figures['idle_n']} answers, p99 {figures['idle_p99_ms']:.1f} ms); RSS {figures['rss_before']:.0f} MiB before, {figures['rss_end']:.0f} MiB at the end, "
          f"{figures['rss_after_3s']:.0f} MiB 3 s later; load {os.getloadavg()[0]:.2f}; alone, the server's CPU a "
          f"query: median {figures['cpu_p50_ms']:.1f} ms, max {figures['cpu_max_ms']:.1f} ms, "
          f"{figures['over_50']:.0f} over 50 ms (idle: {figures['idle_ms']:.1f} ms over as long)", flush=True)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--before", help="also measure the code of this git revision (e.g. main)")
    parser.add_argument("--keep", type=Path, help="keep the log and the state in this folder and reuse them")
    parser.add_argument("--rounds", type=int, default=1, help="measure this code (and REV's) this many times")
    args = parser.parse_args()
    support = load_test_support()
    work = Path(tempfile.mkdtemp(prefix="mstail-stalled-"))
    try:
        kept = args.keep.absolute() if args.keep else work
        kept.mkdir(parents=True, exist_ok=True)
        log, state = kept / "metrics.jsonl", kept / "state"
        if not any(state.glob("*.sqlite")):
            write_log(log, args.steps)
            began = time.perf_counter()
            server = support.start_mstail([], work / "first", args=["--jsonl", str(log), "--state-dir", str(state)],
                                          timeout=600, env=installed_env())
            try:
                support.wait_until(lambda: full_history(server, args.steps), 3600, interval=0.5)
            finally:
                server.stop(timeout=600)
            print(f"history: {args.steps:,} steps x 8 metrics read in {time.perf_counter() - began:.0f} s", flush=True)
        paths = queries(SEED)
        before = None
        if args.before:
            before = (code_of(args.before, work / "before-code"), work / "state-copy")
            shutil.copytree(state, before[1])
            run(support, f"warm-up by {args.before}, not counted", log, before[1], work / "warm-up", args.steps,
                paths[:2], code=before[0])
        results: Dict[str, List[Dict[str, float]]] = {"this code": []}
        for round_ in range(args.rounds):
            results["this code"].append(run(support, f"this code, round {round_ + 1}", log, state,
                                            work / f"this-{round_}", args.steps, paths))
            if before is not None:
                results.setdefault(args.before, []).append(
                    run(support, f"{args.before}, round {round_ + 1}", log, before[1], work / f"before-{round_}",
                        args.steps, paths, code=before[0]))
        for name, runs in results.items():
            if not runs:
                continue  # --rounds 0: only the log and the state made (with --keep)
            median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
            print(f"{name} (median of {len(runs)}): /healthz p50 {median['health_p50_ms']:.1f} ms, p99 "
                  f"{median['health_p99_ms']:.1f} ms, max {median['health_max_ms']:.0f} ms (idle before: p99 "
                  f"{median['idle_p99_ms']:.1f} ms); 40 queries "
                  f"{median['wall_s']:.2f} s; RSS {median['rss_before']:.0f} -> {median['rss_end']:.0f} -> "
                  f"{median['rss_after_3s']:.0f} MiB; CPU a query alone: median {median['cpu_p50_ms']:.1f} ms, max "
                  f"{median['cpu_max_ms']:.1f} ms")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
