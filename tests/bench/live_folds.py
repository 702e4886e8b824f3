"""The fold warmer over a long live run: what keeping the mean + band of 1,024 ranks current costs per step.

Setup (in process, no server): --ranks series (one metric, one per rank) of --steps steps already logged, folded once
(the cold fold a first visit or the warmer made); then --live steps, each one more point on every rank followed by
what `Store.keep_folds_warm` does when a live run pauses between steps (>= 0.25 s): the metric's fold made current
(`AggregateCache.fold(..., fresh=True)`), and the page's answer from it (`aggregate`, 660 buckets, smoothed).

Printed: the first fold's CPU time (in a new process: page faults make it vary); per live step, the fold's CPU time
(median, max) and the answer's (median); the memory one more live step's fold allocates at its peak (tracemalloc,
which numpy reports its arrays to) and the process's peak RSS growth over the live steps (beyond the first fold's
peak); the load average. The history is --ranks x --steps x 24 bytes. With --before REV the same run alternates,
each in a process of its own, with the code of that git revision (e.g. 3bec343, where every fold copied and folded
every point).

Run: python tests/bench/live_folds.py [--ranks 1024] [--steps 10000] [--live 20] [--before REV --rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import List, Optional, Sequence


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def measure(ranks: int, steps: int, live: int) -> None:
    """One run with the mstail the path imports (this tree or --before's); prints one line."""
    import numpy as np

    from mstail.tailer.history.aggregate import AggregateCache, Turns, aggregate
    from mstail.tailer.history.series import Series

    series = []
    for rank in range(ranks):
        s = Series()
        logged = np.arange(1, steps + 1, dtype=np.int64)
        s.steps.frombytes(logged.tobytes())
        s.values.frombytes((2.0 + 5.0 * np.exp(-logged / 3000.0) + 0.01 * (rank % 7)).tobytes())
        s.times.frombytes((1.7e9 + logged * 0.5).tobytes())
        series.append((f"rank_{rank}", s))
    seq = [0]
    cache = AggregateCache(Turns(lambda: seq[0]))
    key = ("loss", tuple(range(ranks)))

    async def run() -> None:
        began = time.process_time()
        await cache.fold(key, series, fresh=True)
        cold = time.process_time() - began
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        folds: List[float] = []
        answers: List[float] = []
        for step in range(steps + 1, steps + live + 1):
            for rank, (_, s) in enumerate(series):
                s.append(step, 2.0 + 0.01 * (rank % 7), 1.7e9 + step * 0.5)
            seq[0] += 1
            began = time.process_time()
            fold = await cache.fold(key, series, fresh=True)
            folds.append(time.process_time() - began)
            began = time.process_time()
            aggregate(fold, None, None, 660, 0.6)
            answers.append(time.process_time() - began)
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024
        tracemalloc.start()  # one more step, traced: the memory a live step's fold takes at its peak
        for _rank, (_, s) in enumerate(series):
            s.append(steps + live + 1, 2.0, 1.7e9)
        seq[0] += 1
        await cache.fold(key, series, fresh=True)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        print(f"{ranks} ranks x {steps:,} steps: the first (full) fold {cold * 1000:.0f} ms CPU; a live step's fold "
              f"median {statistics.median(folds) * 1000:.1f} ms, max {max(folds) * 1000:.1f} ms CPU, its answer "
              f"median {statistics.median(answers) * 1000:.1f} ms; a live step's fold allocates {peak:.1f} MiB at "
              f"its peak; RSS peak +{grown:.0f} MiB over {live} steps (history {ranks * steps * 24 / 2**20:.0f} "
              f"MiB); load {loadavg()}", flush=True)

    asyncio.run(run())


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10_000, help="steps logged before the live ones (default 10,000)")
    parser.add_argument("--live", type=int, default=20, help="live steps, each folded (default 20)")
    parser.add_argument("--before", metavar="REV", help="also run the code of this git revision, alternating")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each code (default 1)")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # one run, in its own process
    args = parser.parse_args(argv)
    if min(args.ranks, args.steps, args.live, args.rounds) < 1:
        parser.error("--ranks, --steps, --live and --rounds need 1 or more")
    if args.measure:
        measure(args.ranks, args.steps, args.live)
        return 0
    from restart import code_of

    work = Path(tempfile.mkdtemp(prefix="mstail-live-folds-"))
    try:
        codes = [("this code", None)]
        if args.before:
            codes.append((f"code of {args.before}", code_of(args.before, work / "before-code")))
        for round_ in range(args.rounds):
            for label, code in codes:
                env = dict(os.environ)
                if code is not None:
                    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(code), env.get("PYTHONPATH", "")]))
                print(f"{label}, round {round_ + 1}: ", end="", flush=True)
                command = [sys.executable, __file__, "--measure", "--ranks", str(args.ranks), "--steps",
                           str(args.steps), "--live", str(args.live)]
                subprocess.run(command, env=env, check=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
