"""Long variants of the reliability scenarios (tests/tailer/test_scenarios.py), not run in CI.

stress    scenario 1: --files writers (tests/tailer/scenario_writer.py, RotatingFileHandler) at --rate lines/s
          each, rolling every --rotate-every s and every ~100 lines, --backups kept, for --duration s; an
          in-process Tailer follows `DIR/rank*/info.log`. Prints lost / duplicated / out-of-order per mode
          (goal 0 / 0 / 0) and the tailer's CPU (this process, all threads) and peak RSS.
fairness  scenario 12: 8 writers at 1,000 lines/s for --duration s, alone (baseline) and beside one at
          50,000 lines/s. Latency of a line = the time its record reaches a hub subscriber - the time its
          writer wrote it. Prints p50/p99/max of the 8 slow files per run (goal: p99 with the flood < 2x the
          baseline) and checks every line of every file arrived once, in order.

Run: python tests/bench/rotation_scenarios.py [stress|fairness|all] [--mode events|polling|both]
         [--duration 60] [--files 10] [--rate 200] [--rotate-every 0.5] [--backups 20]
Exit status 0 when the goals are met. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mstail.tailer.live.hub import ItemsMessage  # noqa: E402
from tests.tailer.scenario_support import (  # noqa: E402
    MODES,
    Running,
    by_writer,
    count,
    finished,
    make_tailer,
    problems,
    records,
    spawn,
)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def stress(mode: str, args: argparse.Namespace) -> bool:
    work = Path(tempfile.mkdtemp(prefix="mstail-stress-"))
    tailer = make_tailer(mode, str(work / "rank*" / "info.log"))
    lines = int(args.rate * args.duration)
    line_bytes = len("w=0 seq=00000000 pad=" + "x" * 30) + 1

    async def run() -> Tuple[float, float]:
        async with Running(tailer) as running:
            cpu0, t0 = _cpu_s(), time.monotonic()
            writers = [spawn(work / f"rank{r}" / "info.log", lines, tag=r, rate=args.rate, max_bytes=100 * line_bytes,
                             backups=args.backups, rotate_every=args.rotate_every) for r in range(args.files)]
            await finished(*writers, timeout=args.duration + 60)
            await running.until(lambda: count(tailer) >= lines * args.files, 60, "every line")
            await running.settle(1.0)
            return _cpu_s() - cpu0, time.monotonic() - t0

    cpu, wall = asyncio.run(run())
    got = by_writer(records(tailer))
    report = {r: problems(got.get(r, []), range(1, lines + 1)) for r in range(args.files)}
    lost = sum(p.get("n_missing", 0) for p in report.values())
    dup = sum(p.get("n_duplicates", 0) for p in report.values())
    disorder = sum(p.get("out_of_order", 0) for p in report.values())
    rotations = sum(info.counters.get("rotations", 0) for info in tailer.store.sources.values())
    print(f"stress[{mode}]: {args.files} files x {lines} lines ({args.rate:g}/s, rolling every {args.rotate_every} s "
          f"and ~100 lines, {args.backups} backups), {rotations} rotations: lost {lost}, duplicated {dup}, "
          f"out of order {disorder}; tailer CPU {100 * cpu / wall:.0f}% of a core over {wall:.1f} s, "
          f"peak RSS {_peak_rss_mib():.0f} MiB", flush=True)
    return lost == dup == disorder == 0


def _latencies(mode: str, args: argparse.Namespace, flood: bool) -> Tuple[List[float], bool]:
    work = Path(tempfile.mkdtemp(prefix="mstail-fair-"))
    tailer = make_tailer(mode, str(work / "rank*.log"))
    slow = int(1000 * args.duration)
    arrived: Dict[Tuple[int, int], float] = {}

    async def consume(subscriber: Any, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await subscriber.wait(0.2)
            now = time.time()
            for message in subscriber.drain():
                if isinstance(message, ItemsMessage):
                    for item in message.items:
                        if "w" in item and int(item["w"]) < 8:
                            arrived[(int(item["w"]), int(item["step"]))] = now

    async def run() -> None:
        subscriber = tailer.hub.subscribe()
        stop = asyncio.Event()
        consumer = asyncio.create_task(consume(subscriber, stop))
        async with Running(tailer) as running:
            writers = [spawn(work / f"rank{r}.log", slow, tag=r, rate=1000, times=work / f"rank{r}.times") for r in range(8)]
            if flood:
                writers.append(spawn(work / "rank8.log", 50_000 * int(args.duration), tag=8, rate=50_000, raw=True,
                                     batch=500))
            await finished(*writers, timeout=args.duration + 60)
            total = 8 * slow + (50_000 * int(args.duration) if flood else 0)
            await running.until(lambda: count(tailer) >= total, 120, "every line")
            await running.settle(0.5)
        stop.set()
        await consumer

    asyncio.run(run())
    latencies = []
    for r in range(8):
        for line in (work / f"rank{r}.times").read_text().splitlines():
            seq, written = line.split()
            latencies.append(arrived.get((r, int(seq)), float("inf")) - float(written))
    got = by_writer(records(tailer))
    exact = all(not problems(got.get(r, []), range(1, slow + 1)) for r in range(8))
    if flood:
        exact = exact and not problems(got.get(8, []), range(1, 50_000 * int(args.duration) + 1))
    return sorted(latencies), exact


def _pct(values: List[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


def fairness(mode: str, args: argparse.Namespace) -> bool:
    base, base_ok = _latencies(mode, args, flood=False)
    loaded, loaded_ok = _latencies(mode, args, flood=True)
    for name, values in (("alone", base), ("beside a 50k lines/s file", loaded)):
        print(f"fairness[{mode}] 8 files x 1000 lines/s {name}: p50 {_pct(values, 0.5):.1f} ms, "
              f"p99 {_pct(values, 0.99):.1f} ms, max {values[-1] * 1000:.1f} ms", flush=True)
    ratio = _pct(loaded, 0.99) / max(_pct(base, 0.99), 1e-9)
    print(f"fairness[{mode}]: p99 ratio {ratio:.2f} (goal < 2); every line once and in order: "
          f"{base_ok and loaded_ok}", flush=True)
    return ratio < 2 and base_ok and loaded_ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="?", choices=("stress", "fairness", "all"), default="all")
    ap.add_argument("--mode", choices=("events", "polling", "both"), default="both")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--rotate-every", type=float, default=0.5)
    ap.add_argument("--backups", type=int, default=20)
    args = ap.parse_args()
    modes = list(MODES) if args.mode == "both" else [args.mode]
    ok = True
    for mode in modes:
        if args.what in ("stress", "all"):
            ok = stress(mode, args) and ok
        if args.what in ("fairness", "all"):
            ok = fairness(mode, args) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
