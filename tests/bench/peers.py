"""Write -> central SSE latency of a central mstail following node mstails (`--peer`), and the central's CPU.

Setup (all on this machine, loopback only): --nodes node mstails, node i on 127.0.0.(i+2), each following --ranks
MindFormers rank logs one writer process per node writes at --rate steps/s for --duration s (the ranks' lines spread
over the step interval, as ranks of a real job are); a central `mstail --peer nI=URL ...` follows them all; one SSE
client of the central notes the arrival of every record (when the blank line ending its message is read).

Latency of a record = its arrival at the central's client - the unix time just before the writer wrote its step line
(conservative: the writer's own time between the step line and its progress line is in it). Reported: p50/p99/max,
records missing and doubled, the central's CPU (utime+stime over the writing window, 100 % = one core) and the
machine's load.

Run: python tests/bench/peers.py [--nodes 16] [--ranks 64] [--rate 1] [--duration 30]
Goal (issue 33): 16 x 64 at 1 step/s: p99 <= 250 ms, the central <= 50 % of a core. Exit 0 when met, else 1.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any, Dict, List, Tuple

from benchsupport import load_test_support, record_arrivals

GOAL_P99_MS, GOAL_CPU = 250.0, 50.0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def renice(pid: int, nice: int) -> None:
    """Every thread of process `pid` at `nice` (Linux: a thread's own; threads it makes later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.setpriority(os.PRIO_PROCESS, int(task.name), nice)


def _append(arrivals: Dict[Tuple[str, int], List[float]], key: Tuple[str, int], at: float) -> None:
    arrivals.setdefault(key, []).append(at)  # every arrival: a record sent twice is counted as doubled


def ranks_of(node: int, ranks: int) -> range:
    return range(node * ranks, (node + 1) * ranks)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--rate", type=float, default=1.0)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--nodes-nice", type=int, default=0,
                    help="run the node mstails and their writers at this nice (they stand in for other machines: "
                         "on one 2-core box 16 nodes and 16 writers otherwise take the central's CPU; default 0)")
    args = ap.parse_args()
    support = load_test_support()
    work = Path(tempfile.mkdtemp(prefix="mstail-bench-peers-"))
    servers: List[Any] = []
    writers: List[Any] = []
    try:
        nodes = []
        for node in range(args.nodes):
            # ranks numbered across the job, as msrun and MindFormers do: node 1 holds rank_64 ... rank_127
            logs = [work / f"node{node}" / f"rank_{rank}" / "info.log" for rank in ranks_of(node, args.ranks)]
            for log in logs:
                log.parent.mkdir(parents=True)
                log.touch()
            server = support.start_mstail([work / f"node{node}" / "rank_*" / "info.log"], work / f"mstail{node}",
                                          args=["--host", f"127.0.0.{node + 2}"])
            servers.append(server)
            nodes.append((logs, server))
            if args.nodes_nice:
                renice(server.proc.pid, args.nodes_nice)
        peers = [option for node, (_, server) in enumerate(nodes) for option in ("--peer", f"n{node}={server.url}")]
        central = support.start_mstail([], work / "central", args=peers)
        servers.append(central)
        arrivals: Dict[Tuple[str, int], List[float]] = {}
        at_node: Dict[Tuple[str, int], List[float]] = {}  # node 0's own stream: what the node alone takes
        stop = threading.Event()
        for url, into in ((central.url, arrivals), (nodes[0][1].url, at_node)):
            threading.Thread(target=record_arrivals, args=(url, partial(_append, into), stop), daemon=True).start()
        time.sleep(3.0)  # the nodes' first passes, the central's connections
        steps = max(1, int(args.duration * args.rate))
        start_at = time.time() + 2.0
        for node, (logs, _) in enumerate(nodes):
            times = [work / f"times_{node}_{rank}.txt" for rank in ranks_of(node, args.ranks)]
            writers.append(support.spawn_writer(logs, steps, 1.0 / args.rate, times_path=times, start_at=start_at,
                                                spread_s=1.0 / args.rate / args.ranks, seed=node))
            if args.nodes_nice:
                renice(writers[-1].pid, args.nodes_nice)
        time.sleep(max(0.0, start_at - time.time()))
        cpu_before, began = cpu_seconds(central.proc.pid), time.monotonic()
        for writer in writers:
            support.finish_writer(writer, timeout=args.duration + 120)
        cpu = (cpu_seconds(central.proc.pid) - cpu_before) / (time.monotonic() - began) * 100
        load = os.getloadavg()[0]
        expected = args.nodes * args.ranks * steps
        deadline = time.monotonic() + 30
        while sum(1 for key in arrivals if key[1] >= 1) < expected and time.monotonic() < deadline:
            time.sleep(0.2)
        stop.set()
        latencies, missing, doubled = [], 0, 0
        for node in range(args.nodes):
            for rank in ranks_of(node, args.ranks):
                for line in (work / f"times_{node}_{rank}.txt").read_text().split("\n"):
                    if not line:
                        continue
                    step, before, _ = line.split()
                    got = arrivals.get((f"n{node}/rank_{rank}", int(step)), [])
                    missing += not got
                    doubled += max(0, len(got) - 1)
                    if got:
                        latencies.append((got[0] - float(before)) * 1000)
        latencies.sort()
        node_latencies = sorted((got[0] - float(line.split()[1])) * 1000
                                for rank in ranks_of(0, args.ranks)
                                for line in (work / f"times_0_{rank}.txt").read_text().split("\n") if line
                                for got in [at_node.get((f"rank_{rank}", int(line.split()[0])), [])] if got)

        def pct(q: float, values: List[float]) -> float:
            return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")

        p50, p99 = pct(0.5, latencies), pct(0.99, latencies)
        print(f"{args.nodes} nodes x {args.ranks} ranks at {args.rate:g} step/s for {args.duration:g} s: "
              f"{len(latencies)} of {expected} records, {missing} missing, {doubled} doubled")
        print(f"write -> central SSE: p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {latencies[-1] if latencies else 0:.0f} ms")
        print(f"write -> node 0's own SSE (no central): p50 {pct(0.5, node_latencies):.0f} ms, "
              f"p99 {pct(0.99, node_latencies):.0f} ms")
        print(f"central CPU {cpu:.1f} % of a core; load average {load:.1f} on {os.cpu_count()} CPUs")
        met = p99 <= GOAL_P99_MS and cpu <= GOAL_CPU and not missing and not doubled
        print("goal met" if met else f"goal not met (p99 <= {GOAL_P99_MS:g} ms, CPU <= {GOAL_CPU:g} %, none lost)")
        return 0 if met else 1
    finally:
        for writer in writers:
            if writer.poll() is None:
                writer.kill()
        for server in servers:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
