"""mstail's CPU per record with many files, in one process: the pass loop (read, parse, resume points), delivery
(store, alert rules, SQLite commit, source entries) and the SSE encoding of what two streams would send, without the
HTTP server, watchfiles or the machine's scheduler (which make latency.py's figures swing with the load).

Setup: --ranks MindFormers rank files (`output/log/rank_N/info.log`); each step appends MFLossMonitor's step and
progress lines (made by the writer of tests/conftest.py, run once ahead) to every file, --per-pass files at a time,
each group followed by one event pass naming those files (as file events name them; latency.py's 1,024 files at one
step a second come in about 20 passes a second), with a sweep once per step, and the server's look at the
garbage collector (`serve.HeapFreezer`) after each step. --warm steps run first (new sources,
chart series); the next --steps are measured.

Run: python tests/bench/many_files_cpu.py [--ranks 1024] [--steps 6] [--per-pass 51] [--warm 1] [--keep-work]
Prints: records, passes, mstail CPU per record (process time: both threads) and where the event loop's part went.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from benchsupport import load_test_support

from mstail.parsers import load_formats
from mstail.tailer.config import Config
from mstail.tailer.app.state import open_state
from mstail.tailer.live.hub import Hub, ItemsMessage, SourceMessage, Subscriber
from mstail.tailer.live.planner import Plan
from mstail.tailer.app.serve import HeapFreezer
from mstail.tailer.history.store import Store
from mstail.tailer.live.sidecar import Tailer
from mstail.web.sse import _encoded_batch, _source_frames


def step_lines(support, work: Path, steps: int) -> List[bytes]:  # type: ignore[no-untyped-def]
    """Each step's step line + progress line, as the test writer logs them (written once to a template file)."""
    template = work / "template.log"
    writer = support.spawn_writer([template], steps, 0.0, steps_per_epoch=steps)
    support.finish_writer(writer)
    lines = template.read_bytes().splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if b"step:[" in line]
    assert len(starts) == steps, (len(starts), steps)
    return [lines[i] + lines[i + 1] for i in starts]


def drain(clients: List[Subscriber]) -> None:
    """What each SSE stream would write: the first encodes a batch, the others reuse it (web/sse.py)."""
    for client in clients:
        for message in client.drain():
            if isinstance(message, SourceMessage):
                _source_frames(message, 0)
            elif isinstance(message, ItemsMessage):
                _encoded_batch(message)


async def run(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="mstail-many-cpu-"))
    try:
        await measure(args, work)
    finally:
        if not args.keep_work:  # 1,024 rank files, their state: a few MB per run otherwise left in the temp folder
            shutil.rmtree(work, ignore_errors=True)


async def measure(args: argparse.Namespace, work: Path) -> None:
    support = load_test_support()
    lines = step_lines(support, work, args.warm + args.steps)
    paths = []
    for rank in range(args.ranks):
        path = work / "output" / "log" / f"rank_{rank}" / "info.log"
        path.parent.mkdir(parents=True)
        path.touch()
        paths.append(path)
    config = Config(logs=(str(work / "output" / "log" / "rank_*" / "info.log"),), state_dir=str(work / "state"))
    formats = load_formats(user_dir=work / "no-user-formats")
    store = Store(open_state(config, formats))
    store.load()
    hub = Hub()
    clients = [hub.subscribe(), hub.subscribe()]
    tailer = Tailer(config, formats, store, hub)
    await tailer.pass_once()  # every file found
    freezer = HeapFreezer(lambda: (len(store.sources), store.series_count))  # as the server does once a second
    fds = [os.open(path, os.O_WRONLY | os.O_APPEND) for path in paths]
    names = [str(path.absolute()) for path in paths]
    spent: Dict[str, float] = {}

    def timed(obj: object, name: str) -> None:
        inner = getattr(obj, name)

        def wrapper(*a, **k):  # type: ignore[no-untyped-def]
            began = time.thread_time()  # the event loop's thread only (process time would add the other's)
            try:
                return inner(*a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + time.thread_time() - began

        setattr(obj, name, wrapper)

    async def steps(first: int, count: int) -> None:
        for step in range(first, first + count):
            for start in range(0, args.ranks, args.per_pass):
                group = range(start, min(start + args.per_pass, args.ranks))
                for rank in group:
                    os.write(fds[rank], lines[step])
                await tailer.pass_once(Plan({names[rank] for rank in group}, sweep=start == 0))
                drain(clients)
            freezer.check()

    await steps(0, args.warm)
    for obj, name in ((store, "add"), (store, "commit"), (tailer, "_deliver")):
        timed(obj, name)
    passes, cpu, wall = tailer.passes, time.process_time(), time.monotonic()
    await steps(args.warm, args.steps)
    cpu, wall, passes = time.process_time() - cpu, time.monotonic() - wall, tailer.passes - passes
    for fd in fds:
        os.close(fd)
    store.close()
    records = args.ranks * args.steps
    print(f"{args.ranks} files x {args.steps} steps = {records} records in {passes} passes of {args.per_pass} files "
          f"(after {args.warm} warm-up step{'s' if args.warm != 1 else ''}); work dir {work}{' (kept)' if args.keep_work else ''}")
    print(f"mstail CPU {cpu:.2f} s = {1e6 * cpu / records:.0f} us per record (wall {wall:.1f} s); on the event loop: "
          f"delivery {1e6 * spent.get('_deliver', 0) / records:.0f} us per record, of which Store.add "
          f"{1e6 * spent.get('add', 0) / records:.0f} and the commit {1e6 * spent.get('commit', 0) / records:.0f}")
    with open("/proc/loadavg", encoding="ascii") as f:
        print(f"machine: {os.cpu_count()} CPUs, load average {' '.join(f.read().split()[:3])} at the end")


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=1024, help="rank files (default 1024)")
    ap.add_argument("--steps", type=int, default=6, help="measured steps (default 6)")
    ap.add_argument("--per-pass", type=int, default=51, help="files per event pass (default 51: ~20 passes per step)")
    ap.add_argument("--warm", type=int, default=1, help="steps before measuring (default 1)")
    ap.add_argument("--keep-work", action="store_true", help="keep the work dir (the rank files, mstail's state) "
                    "instead of removing it (default: removed)")
    args = ap.parse_args(argv)
    if min(args.ranks, args.steps, args.per_pass) < 1 or args.warm < 0:
        ap.error("--ranks, --steps and --per-pass must be positive, --warm at least 0")
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
