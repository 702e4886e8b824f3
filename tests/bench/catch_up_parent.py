"""The sidecar's cost per history record during a catch-up, in CPU time: what mstail's own process spends storing a
catch-up child's batches (issue 16, goal 2: the parent's share of the two cores).

Setup: catch_up.py's history, one newest-style MindFormers info.log of --size-mb (default 100; built once, kept with
--keep DIR, the folder catch_up.py --keep uses). Each run is a fresh Python process that follows that one file with
the tailer's real parts in one process (a `Tailer`, a `Store` over a state file in a temporary folder, the default
alert rules, the `Hub` with one subscriber whose batches are encoded as the SSE stream encodes them), its catch-up
parsed by a real forked child, and passes run until the child is done and the file read to its end. With --before
REV the same runs alternate with the code of git revision REV (--rounds of each).

Printed per run: history records stored; the CPU time (the event loop's thread, `time.thread_time`) of the
deliveries per record, and of their parts: `Store.add` (its chart columns and SQLite rows), the alert rules
(`AlertEngine.observe`), `Store.commit`, the stream's encoding; the process's whole CPU (the pass thread's
unpickling too) and the catch-up child's (reaped); the load average. Wall times are not the point (the child's
parse paces the run), CPU per record is.

Run: python tests/bench/catch_up_parent.py [--keep DIR] [--size-mb 100] [--before REV --rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence

from latency import loadavg

#: the parts of a delivery timed, (module, class, method) -> the label printed (a method the code measured lacks is
#: left out: `observe_all`, which the tailer calls instead of `observe` since issue 16, is not in older code)
PARTS = {("store", "Store", "add"): "Store.add", ("alerts", "AlertEngine", "observe"): "alert rules",
         ("alerts", "AlertEngine", "observe_all"): "alert rules",
         ("store", "Store", "commit"): "commit", ("web", None, "encode_items"): "stream encoding"}
LABELS = list(dict.fromkeys(PARTS.values()))


def measure(log: Path) -> None:
    """One run over `log` with the mstail the path imports (this tree or --before's); prints one line."""
    from mstail.parsers.loader import load_formats
    from mstail.tailer.alerts import engine as alerts
    from mstail.tailer.history import store as store_module
    from mstail.tailer.alerts.engine import load_alert_rules
    from mstail.tailer.config import Config
    from mstail.tailer.app.state import open_state
    from mstail.tailer.live.hub import Hub, ItemsMessage
    from mstail.tailer.history.store import Store
    from mstail.tailer.live.sidecar import Tailer
    from mstail.web import sse

    spent: Dict[str, float] = dict.fromkeys([*LABELS, "delivery"], 0.0)
    modules = {"store": store_module, "alerts": alerts, "web": sse}

    def timed(function: Callable[..., Any], label: str) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            began = time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                spent[label] += time.thread_time() - began
        return run

    for (module, owner, name), label in PARTS.items():
        holder = getattr(modules[module], owner) if owner else modules[module]
        if hasattr(holder, name):
            setattr(holder, name, timed(getattr(holder, name), label))

    async def follow() -> int:
        state = tempfile.mkdtemp(prefix="mstail-catchup-parent-")
        try:
            config = Config(logs=(str(log),), state_dir=state, alert_rules=load_alert_rules(None))
            formats = load_formats()
            store, hub = Store(open_state(config, formats)), Hub()
            tailer = Tailer(config, formats, store, hub)
            tailer.resume(store.load())
            store.save_alerts(tailer.alerts.snapshot)  # as `serve` does once the rules have their state
            subscriber = hub.subscribe()
            deliver = tailer._deliver

            def delivered(results: Any) -> None:
                deliver(results)
                for message in subscriber.drain():  # what the first stream does with each batch
                    if isinstance(message, ItemsMessage):
                        sse._encoded_batch(message)

            tailer._deliver = timed(delivered, "delivery")  # type: ignore[method-assign]
            while True:
                more = await tailer.pass_once()
                [source] = tailer._sources.values()
                if source.catch_up is None and source.caught_up and not more:
                    break
            records = store.sources[source.id].records
            store.close()
            return records
        finally:
            shutil.rmtree(state, ignore_errors=True)

    began = time.process_time()
    records = asyncio.run(follow())
    process = time.process_time() - began
    child = os.times().children_user + os.times().children_system
    parts = ", ".join(f"{label} {spent[label] / records * 1e6:.2f}" for label in LABELS)
    print(f"{records:,} records: delivery {spent['delivery'] / records * 1e6:.2f} us a record ({parts}); process CPU "
          f"{process:.2f} s, its catch-up child {child:.2f} s; load {loadavg()}", flush=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", metavar="DIR", help="the history's folder, kept (catch_up.py --keep's works too)")
    parser.add_argument("--size-mb", type=float, default=100.0, help="the history's size (default 100)")
    parser.add_argument("--before", metavar="REV", help="also run the code of this git revision, alternating")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each code (default 1)")
    parser.add_argument("--measure", metavar="LOG", help=argparse.SUPPRESS)  # one run, in the process started for it
    args = parser.parse_args(argv)
    if args.measure:
        measure(Path(args.measure))
        return 0
    import parse_speed  # not in a --measure run: it imports this tree's mstail

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="mstail-catchup-parent-"))
    history = work / "output" / "log" / "rank_0" / "info.log"
    try:
        if not history.exists() or history.stat().st_size < args.size_mb * parse_speed.MB:
            [built] = parse_speed.build_single_log(work / "build", int(args.size_mb * parse_speed.MB))
            history.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(built), history)
        print(f"history: {history.stat().st_size / 1e6:.1f} MB in {history}")
        codes = [("this code", None)]
        if args.before:
            from restart import code_of

            shutil.rmtree(work / "before-code", ignore_errors=True)
            codes.append((f"code of {args.before}", code_of(args.before, work / "before-code")))
        for round_ in range(args.rounds):
            for label, code in codes:
                env = dict(os.environ, MSTAIL_FORMATS_DIR=str(work / "no-user-formats"))
                if code is not None:
                    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(code), env.get("PYTHONPATH", "")]))
                print(f"{label}, round {round_ + 1}: ", end="", flush=True)
                subprocess.run([sys.executable, __file__, "--measure", str(history)], env=env, check=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
