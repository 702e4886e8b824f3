"""The state file's cost (issue 34, goal 3 "Storage a history deserves" and the storing part of goal 1): bytes a
stored metric value on disk, the storing cost per record, and a restart's time and memory to the first full answer.

Cases (each stored the way a catch-up stores a history: `store.prepare`d items, `Store.add(..., prepared=True)` of
--batch items then `Store.commit`, written at once as `mstail parse` and tests do, no writer thread):
- jsonl: page_load.py's JSONL log of --steps steps x 8 metrics (a NaN, a spike, a checkpoint event every 10,000
  steps), its lines as the JSONL format gives them (one record each, events by their `kind`);
- mindformers: parse_speed.py's single-file MindFormers info.log of --mf-mb MB (10 metrics a step, each step's
  samples/s an amend of its record, MindSpore's warnings between), parsed once in this process by mstail's parser
  (not timed).
Measured, by this code and with --before REV by the code of git revision REV (its tree exported, first on the path,
restart.py's `code_of`), each in a process of its own over the same items:
- bytes a value: the state file after a clean close (WAL checkpointed into it, free pages included) over the metric
  values stored (every number of a record or an amend that is no step, time, seq or segment);
- storing: `Store.add` + `Store.commit` (the items' JSON, indexing, SQLite, the columns' flushes), µs a record, CPU
  of the process meanwhile;
- re-open: a new process (Python's start and mstail's imports included) to the first full answer: the state opened,
  `Store.load`, and `Store.series` of every metric of the case (2,000 points each) answered; its peak RSS (VmHWM).

Run: python tests/bench/storage.py [--case jsonl|mindformers|both] [--steps 1000000] [--mf-mb 100] [--before REV]
Goals: <= 16 bytes a value; re-open <= 1 s, RSS <= 200 MB (jsonl, 1 M steps). Exit status 0 when met.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
GOAL_BYTES = 16.0
GOAL_REOPEN_S = 1.0
GOAL_RSS_MB = 200.0
_RESERVED = {"seq", "source", "step", "time", "segment", "epoch", "kind", "line", "estimated", "message"}


def jsonl_items(work: Path, steps: int) -> List[Tuple[str, Dict[str, Any]]]:
    """(kind, data) of page_load.py's log, as the JSONL format gives them."""
    sys.path.insert(0, str(HERE))
    from page_load import write_log

    log = work / "metrics.jsonl"
    write_log(log, steps)
    items = []
    with open(log, encoding="utf-8") as f:
        for line in f:
            data = json.loads(line)
            kind = data.pop("kind", None)
            items.append(("record" if kind is None else "event", data if kind is None else {"kind": kind, **data}))
    return items


def mindformers_items(work: Path, megabytes: int) -> List[Tuple[str, Dict[str, Any]]]:
    """(kind, data) of a MindFormers info.log parsed by mstail's parser (this tree's)."""
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(ROOT))
    from parse_speed import build_single_log

    from mstail.parsers import SourceParser
    from mstail.parsers.interleave import InterleavedParser
    from mstail.tailer.inputs.lines import LineSplitter
    from tests.parsers.support import FORMATS, READ_TIME

    [log] = build_single_log(work, megabytes * 1_000_000)
    parser = InterleavedParser(lambda: SourceParser(FORMATS))
    splitter = LineSplitter()
    items = []
    with open(log, "rb") as f:
        while True:
            block = f.read(1 << 22)
            lines = splitter.feed(block if block else b"\n")
            for line in lines:
                items += parser.feed(line.text, line.number, READ_TIME)
            if not block:
                break
    items += parser.flush(READ_TIME, force=True)
    log.unlink()
    return [(item.kind, {k: v for k, v in item.data.items() if k != "line"}) for item in items]


def values_in(items: List[Tuple[str, Dict[str, Any]]]) -> int:
    """The metric values of the records and amends: the numbers that are no reserved key."""
    return sum(1 for kind, data in items if kind in ("record", "amend")
               for key, value in data.items() if key not in _RESERVED and isinstance(value, (int, float)))


def store_all(items_path: Path, state: Path, batch: int) -> Dict[str, Any]:
    """(In a worker process, with the code under test first on the path.) Store the items, close; the figures."""
    from mstail.parsers import Item
    from mstail.tailer.history.db import StateDB
    from mstail.tailer.history.store import Store, prepare

    with open(items_path, "rb") as f:
        raw = pickle.load(f)
    items = [prepare(Item(kind, data)) for kind, data in raw]  # a catch-up child's work: not timed
    store = Store(StateDB(state, expected="bench"))
    store.load()
    store.add_source("rank_0", "/logs/rank_0/info.log")
    cpu, began = time.process_time(), time.perf_counter()
    for at in range(0, len(items), batch):
        store.add("rank_0", items[at:at + batch], prepared=True)
        store.commit()
    stored = time.perf_counter() - began
    stored_cpu = time.process_time() - cpu
    store.close()
    size = sum(os.path.getsize(f"{state}{suffix}") for suffix in ("", "-wal", "-shm") if os.path.exists(f"{state}{suffix}"))
    records = sum(1 for kind, _ in raw if kind == "record")
    return {"seconds": stored, "cpu": stored_cpu, "records": records, "bytes": size}


def reopen(state: Path, metrics: List[str]) -> Dict[str, Any]:
    """(In a new worker process.) Open the state, load it, answer every metric's series; seconds since the process
    started, its CPU seconds by then (the figure a loaded machine sways least), and the peak RSS."""
    from mstail.tailer.history.db import StateDB
    from mstail.tailer.history.store import Store

    store = Store(StateDB(state, expected="bench"))
    store.load()
    answers = [store.series(metric, points=2000) for metric in metrics]
    assert all(answer and answer[0]["x"] for answer in answers), "a metric without points"
    seconds, cpu = time.time() - float(os.environ["BENCH_STARTED"]), time.process_time()
    with open("/proc/self/status", encoding="ascii") as f:
        peak = next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))
    store.close()
    return {"seconds": seconds, "cpu": cpu, "rss": peak}


def worker(args: argparse.Namespace) -> None:
    if args.worker == "store":
        out = store_all(Path(args.items), Path(args.state), args.batch)
    else:
        out = reopen(Path(args.state), args.metrics.split(","))
    print(json.dumps(out))


def run_worker(code: Optional[Path], *argv: str) -> Dict[str, Any]:
    """This script as a worker in a new process, with `code` (an exported tree's site folder) first on the path."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (code, ROOT) if p is not None)
    env["BENCH_STARTED"] = repr(time.time())
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv], env=env, cwd=str(ROOT),
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"worker {argv[:2]} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(name: str, code: Optional[Path], items_path: Path, metrics: List[str], values: int, work: Path,
            batch: int) -> Dict[str, float]:
    state = work / f"{name.replace(' ', '-')}.sqlite"
    stored = run_worker(code, "--worker", "store", "--items", str(items_path), "--state", str(state),
                        "--batch", str(batch))
    run_worker(code, "--worker", "reopen", "--state", str(state), "--metrics", ",".join(metrics))  # warm: compiled
    opened = run_worker(code, "--worker", "reopen", "--state", str(state), "--metrics", ",".join(metrics))
    figures = {"bytes": stored["bytes"] / values, "us": stored["seconds"] / stored["records"] * 1e6,
               "cpu_us": stored["cpu"] / stored["records"] * 1e6, "reopen": opened["seconds"],
               "reopen_cpu": opened["cpu"], "rss": opened["rss"],
               "size_mb": stored["bytes"] / 1e6}
    print(f"[{name}] {stored['records']:,} records, {values:,} values: {figures['size_mb']:.1f} MB on disk = "
          f"{figures['bytes']:.1f} bytes a value; Store.add + commit {figures['us']:.1f} us a record "
          f"({stored['seconds']:.2f} s; CPU {figures['cpu_us']:.1f} us); re-open to every metric's series "
          f"{figures['reopen']:.2f} s (CPU {figures['reopen_cpu']:.2f} s), peak RSS {figures['rss']:.0f} MiB; load {os.getloadavg()[0]:.2f}", flush=True)
    for suffix in ("", "-wal", "-shm", ".lock"):
        Path(f"{state}{suffix}").unlink(missing_ok=True)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=("jsonl", "mindformers", "both"), default="both")
    parser.add_argument("--steps", type=int, default=1_000_000, help="steps of the jsonl case")
    parser.add_argument("--mf-mb", type=int, default=100, help="megabytes of the mindformers case's info.log")
    parser.add_argument("--batch", type=int, default=4096, help="items a Store.add + commit")
    parser.add_argument("--before", help="also measure the code of this git revision")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--items", help=argparse.SUPPRESS)
    parser.add_argument("--state", help=argparse.SUPPRESS)
    parser.add_argument("--metrics", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    work = Path(tempfile.mkdtemp(prefix="mstail-storage-"))
    met = True
    try:
        before = None
        if args.before:
            sys.path.insert(0, str(HERE))
            from restart import code_of

            before = code_of(args.before, work / "before-code")
        for case in (("jsonl", "mindformers") if args.case == "both" else (args.case,)):
            began = time.perf_counter()
            items = jsonl_items(work, args.steps) if case == "jsonl" else mindformers_items(work, args.mf_mb)
            metrics = sorted({key for kind, data in items if kind == "record" for key, value in data.items()
                              if key not in _RESERVED and isinstance(value, (int, float))})
            items_path = work / f"{case}.pickle"
            with open(items_path, "wb") as f:
                pickle.dump(items, f, protocol=pickle.HIGHEST_PROTOCOL)
            values = values_in(items)
            print(f"{case}: {len(items):,} items made in {time.perf_counter() - began:.1f} s", flush=True)
            del items
            mine = measure(f"{case}, this code", None, items_path, metrics, values, work, args.batch)
            if before is not None:
                theirs = measure(f"{case}, {args.before}", before, items_path, metrics, values, work, args.batch)
                print(f"[{case}] this code against {args.before}: {mine['bytes']:.1f} / {theirs['bytes']:.1f} bytes a "
                      f"value, {mine['us']:.1f} / {theirs['us']:.1f} us a record stored, re-open {mine['reopen']:.2f} / "
                      f"{theirs['reopen']:.2f} s, RSS {mine['rss']:.0f} / {theirs['rss']:.0f} MiB", flush=True)
            met = met and mine["bytes"] <= GOAL_BYTES
            if case == "jsonl" and args.steps >= 1_000_000:
                met = met and mine["reopen"] <= GOAL_REOPEN_S and mine["rss"] * 1.048576 <= GOAL_RSS_MB
        return 0 if met else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
