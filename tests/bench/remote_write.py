"""Remote write catch-up: how fast a history is sent to a real Prometheus, and what it costs mstail's process.

Setup (this machine, loopback only): a Store over a temporary state holding --sources x --steps records of 10
metrics each (a MindFormers step's: loss, lr, grad_norm, ...; times one per second, ending now), committed; Debian's
`prometheus` with its remote write receiver on (out-of-order window 1 day) on a free loopback port; `RemoteWrite`
sends the whole history from seq 0 in this process's event loop. Measured: wall time until Prometheus took the last
batch, samples per second, this process's CPU seconds per 100k samples (reading the history, building the samples,
the protobuf and snappy encoding, HTTP), and the biggest event-loop stall (the longest gap between 10 ms ticks).
Prometheus' own count_over_time is checked to hold every sample.

Run: python tests/bench/remote_write.py [--sources 64] [--steps 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from benchsupport import ROOT

sys.path.insert(0, str(ROOT))  # the tests' package (its Prometheus starter)

from mstail.parsers import Item
from mstail.tailer.history.db import StateDB
from mstail.tailer.outbound.remotewrite import RemoteWrite
from mstail.tailer.history.store import Store
from tests.tailer.prom_support import prometheus

METRICS = ("loss", "loss_avg", "lr", "grad_norm", "step_time_ms", "overflow", "loss_scale", "throughput_tflops",
           "perplexity", "samples_per_s")


def history(sources: int, steps: int) -> Store:
    store = Store(StateDB(None))
    start = time.time() - steps
    for s in range(sources):
        source = f"rank_{s}"
        store.add_source(source, f"/logs/{source}/info.log")
        store.add(source, [Item("record", {"step": i, "time": start + i, **{m: 1.0 + i * 1e-3 + s for m in METRICS}})
                           for i in range(1, steps + 1)])
    store.commit({})
    return store


async def send(store: Store, url: str) -> tuple:
    sender = RemoteWrite(url, store, flush_s=0.05)
    stall, last, done = 0.0, time.monotonic(), False

    async def ticks() -> None:
        nonlocal stall, last
        while not done:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            stall, last = max(stall, now - last - 0.01), now

    began, cpu = time.monotonic(), time.process_time()
    sender.start()  # (its imports, httpx and protobuf, once: not counted as a stall)
    last = time.monotonic()
    ticking = asyncio.create_task(ticks())
    while sender.sent_seq < store.last_seq:
        await asyncio.sleep(0.05)
    wall, cpu = time.monotonic() - began, time.process_time() - cpu
    done = True
    await ticking
    await sender.stop()
    return wall, cpu, stall, sender.stats()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sources", type=int, default=64)
    ap.add_argument("--steps", type=int, default=1000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mstail-bench-rw-") as folder:
        receiver = prometheus(Path(folder) / "prometheus")
        try:
            store = history(args.sources, args.steps)
            wall, cpu, stall, stats = asyncio.run(send(store, f"{receiver.url}/api/v1/write"))
            held = receiver.query('sum(count_over_time({__name__=~"mstail_.+"}[2d]))')
        finally:
            receiver.stop()
    samples = stats["samples_sent"]
    print(f"{args.sources} sources x {args.steps} steps = {store.last_seq} records, {samples} samples "
          f"(dropped {stats['samples_dropped']}); Prometheus holds {held[0]['value'][1] if held else 0}")
    print(f"sent in {wall:.2f} s: {samples / wall:,.0f} samples/s; mstail CPU {cpu:.2f} s "
          f"({cpu / samples * 1e5:.2f} s per 100k samples); longest event-loop stall {stall * 1000:.0f} ms")
    return 0 if held and int(held[0]["value"][1]) == samples else 1


if __name__ == "__main__":
    sys.exit(main())
