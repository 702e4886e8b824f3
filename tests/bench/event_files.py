"""Event files (issue 18): reading a 100 MB TensorBoard event file and a 100 MB MindSpore summary file, mstail against
TensorBoard's own reader on the same file; and the live latency from a real writer's flush to an SSE client.

The files (built once under --run-dir, reused while their size fits --mb):
- TensorBoard: MindFormers' MFLossMonitor scalars (`learning-rate`, `batch-size`, `loss`, `grad-norm`, each with its
  "vs samples" twin: 8 events a step), as tensorboardX's own protobuf classes serialize them, in TFRecord framing
  (`mstail.tailer.inputs.frames.frame`, which writes the bytes tensorboardX writes: tests/eventfiles/test_frames.py); writing
  100 MB through `SummaryWriter.add_scalar` itself takes about 20 minutes here, so the writer's classes are used
  directly.
- MindSpore: one event a step with `loss` and `lr`, as `SummaryRecord.record(step)` writes it (MindSpore 2.10's own
  `summary_pb2.Event`), in the same framing.

Reading, one after the other, each timed as a whole process (start-up included):
- mstail: `mstail parse FILE > /dev/null` (frames -> checked -> decoded -> one JSON record per step);
- TensorBoard: `EventFileLoader(FILE).Load()` from tensorboard's own package (event_processing.event_file_loader),
  every event read and every scalar value touched, in a venv of this bench's own (tensorboard from PyPI, shared with
  peer_tensorboard.py). TensorBoard's Python reader checks CRCs in pure Python when TensorFlow is absent (its
  tensorflow stub), which is how a TensorBoard without TensorFlow reads; it stops after --tb-seconds and its rate is
  taken over what it read. It reads the MindSpore file's framing and events but no scalars (another schema).
Figures per second of CPU (this 2-core machine is shared: wall time says more about the other jobs than about the
reader; both are printed): frames/s, records/s (mstail: steps; TensorBoard: scalar values, the unit it hands out),
and the ratio of frames/s.

Live: a real mstail follows a folder (`--log 'DIR/events.out.tfevents.*'`); a tensorboardX writer process
(tests/eventfiles/tbwrite.py) writes --rate steps/s for --duration s, noting the time right after each step's
flush; an SSE client (/api/stream) notes when each step's record first arrives and when its last scalar arrives
(record or amend). Latency = arrival - flush: p50/p99/max of both.

Run: python tests/bench/event_files.py [--mb 100] [--run-dir DIR] [--tb-seconds 300] [--rate 10] [--duration 20]
Prints the figures and the load average; exit 0 unless something failed. Linux only (/proc/loadavg).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from benchsupport import SSEReader, load_test_support
from peer_tensorboard import bench_venv

ROOT = Path(__file__).resolve().parents[2]
METRICS = ("loss", "lr", "grad_norm", "global_batch_size")

# Runs in the bench's venv: TensorBoard's own reader over one file, for at most argv[2] seconds.
_TB_READER = r'''
import json, sys, time
started = time.perf_counter()
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
events = values = 0
limit = float(sys.argv[2])
for event in EventFileLoader(sys.argv[1]).Load():
    events += 1
    for value in event.summary.value:
        if value.HasField("tensor"):  # EventFileLoader hands simple_value scalars out as tensors (data_compat)
            values += 1
    if events % 4096 == 0 and time.perf_counter() - started > limit:
        break
print(json.dumps({"events": events, "values": values, "seconds": time.perf_counter() - started,
                  "cpu": time.process_time()}))
'''


def load() -> str:
    with open("/proc/loadavg", encoding="ascii") as handle:
        return " ".join(handle.read().split()[:3])


# -- the files -----------------------------------------------------------------------------------------------
def build_tensorboard(path: Path, size: int) -> None:
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.proto.summary_pb2 import Summary

    from mstail.tailer.inputs.frames import frame

    sys.path.insert(0, str(ROOT))
    from tests.eventfiles.tbwrite import GLOBAL_BATCH, values

    wall = 1.7e9
    with open(path, "wb") as out:
        out.write(frame(Event(wall_time=wall, file_version="brain.Event:2").SerializeToString()))
        step, written = 0, 0
        while written < size:
            step += 1
            v = values(step % 100_000 + 1)
            chunk = []
            for tag, name in (("learning-rate", "lr"), ("batch-size", "global_batch_size"), ("loss", "loss"),
                              ("grad-norm", "grad_norm")):
                for shown, at in ((tag, step), (f"{tag}_vs_samples", step * GLOBAL_BATCH)):
                    summary = Summary(value=[Summary.Value(tag=shown, simple_value=v[name])])
                    chunk.append(frame(Event(wall_time=wall + step * 0.1, step=at, summary=summary).SerializeToString()))
            data = b"".join(chunk)
            out.write(data)
            written += len(data)


def build_mindspore(path: Path, size: int) -> None:
    from mindspore.train.summary_pb2 import Event  # MindSpore's own schema: what SummaryRecord serializes

    from mstail.tailer.inputs.frames import frame

    wall = 1.7e9
    with open(path, "wb") as out:
        out.write(frame(Event(wall_time=wall, version="MindSpore.Event:1").SerializeToString()))
        step, written = 0, 0
        while written < size:
            step += 1
            event = Event(wall_time=wall + step * 0.1, step=step)
            for tag, value in (("loss", 10.0 / (step % 1000 + 1)), ("lr", 1e-4 * (step % 7))):
                item = event.summary.value.add()
                item.tag = tag
                item.scalar_value = value
            data = frame(event.SerializeToString())
            out.write(data)
            written += len(data)


def files(run_dir: Path, megabytes: int) -> Tuple[Path, Path]:
    size = megabytes << 20
    tensorboard = run_dir / "tensorboard" / "events.out.tfevents.1700000000.bench"
    mindspore = run_dir / "summary" / "events.out.events.summary.1700000000.0.bench_MS"
    for path, build in ((tensorboard, build_tensorboard), (mindspore, build_mindspore)):
        if not path.exists() or not size <= path.stat().st_size < size + (1 << 20):
            path.parent.mkdir(parents=True, exist_ok=True)
            print(f"writing {path} ({megabytes} MB, once)", flush=True)
            build(path, size)
    return tensorboard, mindspore


# -- reading -------------------------------------------------------------------------------------------------
def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def read_with_mstail(path: Path) -> Dict[str, float]:
    started, cpu = time.perf_counter(), children_cpu()
    done = subprocess.run([sys.executable, "-m", "mstail", "parse", str(path)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, cwd=str(ROOT), check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    seconds, cpu = time.perf_counter() - started, children_cpu() - cpu
    records = int(re.search(r"(\d+) records", done.stderr.decode()).group(1))  # type: ignore[union-attr]
    return {"frames": count_frames(path), "records": records, "seconds": seconds, "cpu": cpu}


def count_frames(path: Path) -> int:
    """The frames of a file, by hopping from length to length (the file is whole and valid: it was built here)."""
    data, pos, count = path.read_bytes(), 0, 0
    while pos < len(data):
        pos += 16 + struct.unpack_from("<Q", data, pos)[0]
        count += 1
    return count


def read_with_tensorboard(venv: Path, path: Path, limit: float) -> Dict[str, float]:
    done = subprocess.run([str(venv / "bin" / "python"), "-c", _TB_READER, str(path), str(limit)],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True)
    result = json.loads(done.stdout)
    return {"frames": result["events"], "records": result["values"], "seconds": result["seconds"], "cpu": result["cpu"]}


def rates(result: Dict[str, float]) -> str:
    return (f"{result['frames'] / result['cpu']:>10,.0f} frames/s  {result['records'] / result['cpu']:>10,.0f} "
            f"records/s of CPU  ({result['frames']:,} frames, {result['records']:,} records in {result['cpu']:.1f} s "
            f"CPU, {result['seconds']:.1f} s wall)")


# -- live ----------------------------------------------------------------------------------------------------
def live_latency(rate: float, duration: float) -> Dict[str, List[float]]:
    support = load_test_support()
    work = Path(tempfile.mkdtemp(prefix="mstail-event-live-"))
    folder = work / "tensorboard" / "rank_0"
    folder.mkdir(parents=True)
    server = support.start_mstail([str(folder / "events.out.tfevents.*")], work / "mstail", args=("--no-alerts",))
    steps = int(rate * duration)
    first: Dict[int, float] = {}
    complete: Dict[int, float] = {}
    got: Dict[int, set] = {}
    stop = threading.Event()

    def client() -> None:
        import httpx

        sse = SSEReader()
        with httpx.Client(timeout=httpx.Timeout(5.0, read=1.0), trust_env=False) as http:
            while not stop.is_set() and len(complete) < steps:
                headers = {"Last-Event-ID": sse.last_id} if sse.last_id is not None else {}
                try:
                    with http.stream("GET", server.url + "/api/stream", headers=headers) as response:
                        sse.start()
                        for line in response.iter_lines():
                            message = sse.feed(line)
                            if message is not None:
                                arrived = time.time()
                                take(message, arrived)
                            if len(complete) >= steps or stop.is_set():
                                return
                except httpx.ReadTimeout:  # a quiet stream (no step yet): ask again from where it was
                    continue

    def take(message: Tuple[str, str], arrived: float) -> None:
        kind, data = message
        items = json.loads(data) if kind == "records" else [json.loads(data)] if kind == "amend" else []
        for item in items:
            step = item["step"]
            first.setdefault(step, arrived)
            got.setdefault(step, set()).update(key for key in item if key in METRICS)
            if len(got[step]) == len(METRICS):
                complete.setdefault(step, arrived)

    reader = threading.Thread(target=client, daemon=True)
    reader.start()
    time.sleep(0.5)  # the stream is open before the first step
    times = work / "flushed.txt"
    writer = subprocess.run([sys.executable, "-m", "tests.eventfiles.tbwrite", str(folder), "1", str(steps), "--pause",
                             str(1 / rate), "--times", str(times)], cwd=str(ROOT), timeout=duration * 5 + 60)
    reader.join(timeout=15)
    stop.set()
    server.stop()
    if writer.returncode != 0:
        raise SystemExit("event_files: the tensorboardX writer failed")
    flushed = {int(step): float(at) for step, at in (line.split() for line in times.read_text().splitlines())}
    return {"first": [first[s] - flushed[s] for s in flushed if s in first],
            "complete": [complete[s] - flushed[s] for s in flushed if s in complete], "steps": [float(steps)]}


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=100, help="size of each file in MB (default 100)")
    parser.add_argument("--run-dir", type=Path, default=Path.home() / ".cache" / "mstail" / "event-files-bench")
    parser.add_argument("--venv", type=Path, default=Path.home() / ".cache" / "mstail" / "peer-tensorboard")
    parser.add_argument("--tb-seconds", type=float, default=300.0, help="TensorBoard's reader stops after this")
    parser.add_argument("--rate", type=float, default=10.0, help="live: steps per second (default 10)")
    parser.add_argument("--duration", type=float, default=20.0, help="live: seconds of writing (default 20)")
    parser.add_argument("--no-live", action="store_true")
    args = parser.parse_args(argv)
    venv = bench_venv(args.venv)
    tensorboard, mindspore = files(args.run_dir, args.mb)
    for name, path in (("TensorBoard event file", tensorboard), ("MindSpore summary file", mindspore)):
        print(f"\n{name}: {path} ({path.stat().st_size / 1e6:.0f} MB)   load {load()}")
        ours = read_with_mstail(path)
        print(f"  mstail parse        {rates(ours)}   load {load()}", flush=True)
        theirs = read_with_tensorboard(venv, path, args.tb_seconds)
        print(f"  TensorBoard loader  {rates(theirs)}   load {load()}")
        print(f"  -> mstail reads {(ours['frames'] / ours['cpu']) / (theirs['frames'] / theirs['cpu']):.1f}x "
              f"TensorBoard's frames per CPU second", flush=True)
    if not args.no_live:
        print(f"\nlive: {args.rate:g} steps/s for {args.duration:g} s, tensorboardX flush -> SSE client   load {load()}")
        result = live_latency(args.rate, args.duration)
        steps = int(result["steps"][0])
        for what in ("first", "complete"):
            ms = [1000 * x for x in result[what]]
            print(f"  {what:<8} {len(ms)}/{steps} steps: p50 {percentile(ms, 0.5):.0f} ms, p99 {percentile(ms, 0.99):.0f} ms, "
                  f"max {max(ms, default=float('nan')):.0f} ms")
        print(f"  load {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
