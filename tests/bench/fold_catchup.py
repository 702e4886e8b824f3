"""The server side of a first visit right after a catch-up of many ranks: the across-source folds its charts ask.

Setup, in one process: --ranks sources x --steps steps x --metrics metrics of chart columns (`Store`'s `Series`)
grow --chunk steps at a time, as a catch-up's batches come; after each chunk, every metric whose running sums lack
an eighth of what they hold has them advanced (`AggregateCache.advance`, the rule of `Store.keep_folds_warm`). Then
the folds a first visit asks, one per metric (`AggregateCache.fold`), against the same folds by a cache with no
running sums (a fold of every point, as every fold was before they were kept).

Run: python tests/bench/fold_catchup.py [--ranks 1024] [--steps 2000] [--metrics 6] [--chunk 50] [--rounds 3]
Prints: per round the first visit's folds (kept sums) and the same from nothing, their ratio, the advances and
their time during the catch-up, the sums' and folds' memory, the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import numpy as np

from mstail.tailer.aggregate import AggregateCache, Turns
from mstail.tailer.series import Series
from mstail.tailer.store import WARM_ADVANCE_SHARE


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--metrics", type=int, default=6, help="charts a first visit shows (default 6)")
    parser.add_argument("--chunk", type=int, default=50, help="steps of every rank per batch (default 50)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(1)

    async def round_() -> None:
        metrics = {m: [(f"rank_{r}", Series()) for r in range(args.ranks)] for m in range(args.metrics)}
        kept = AggregateCache(Turns(lambda: 0))
        advances, advancing = 0, 0.0
        for first in range(1, args.steps + 1, args.chunk):
            steps = np.arange(first, min(first + args.chunk, args.steps + 1), dtype=np.int64)
            for m, series in metrics.items():
                for _, s in series:
                    s.steps.frombytes(steps.tobytes())
                    s.values.frombytes(rng.normal(2 + m, 0.1, len(steps)).tobytes())
                    s.times.frombytes((1.7e9 + steps.astype(float) + rng.random(len(steps))).tobytes())
            for m, series in metrics.items():
                points = sum(len(s) for _, s in series)
                behind = kept.behind(m, series)
                if behind and behind * WARM_ADVANCE_SHARE >= points - behind:
                    advancing += await kept.advance(m, series)
                    advances += 1
        began = time.perf_counter()
        for m, series in metrics.items():
            await kept.fold(m, series)
        with_sums = time.perf_counter() - began
        cold = AggregateCache(Turns(lambda: 0))
        began = time.perf_counter()
        for m, series in metrics.items():
            await cold.fold(m, series)
        from_nothing = time.perf_counter() - began
        memory = sum(kept._bytes(m) for m in metrics) / args.metrics
        print(f"first visit's {args.metrics} folds: {with_sums * 1000:.0f} ms with the sums kept, "
              f"{from_nothing * 1000:.0f} ms from nothing ({from_nothing / with_sums:.1f}x); during the catch-up "
              f"{advances} advances, {advancing:.2f} s; sums + fold {memory / 1e3:.0f} kB a metric; "
              f"load average {os.getloadavg()[0]:.2f}")

    print(f"{args.ranks:,} ranks x {args.steps:,} steps x {args.metrics} metrics, {args.chunk} steps a batch")
    for _ in range(args.rounds):
        asyncio.run(round_())
    return 0


if __name__ == "__main__":
    sys.exit(main())
