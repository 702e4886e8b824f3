"""TensorBoard beside mstail on the same run: time to history, memory, a one-step spike, live latency (issue 16).

The run, written once in both forms: a MindFormers `info.log` (tests/conftest.py's writer: MFLossMonitor v1.8
step + progress lines through logging's file handler, --steps steps as fast as it can, a loss of 50.0 at one
step in the middle) and a tensorboardX event file with the very values of that log (read back from it with one
regex per line kind), 8 scalars per step as MindFormers' `tensorboard_dir` writes them: loss, lr, grad_norm,
loss_scale, step_time_ms, throughput_tflops, samples_per_s, overflow.

Then, one after the other on this machine (loopback only):
- TensorBoard (`tensorboard --logdir DIR --reload_interval 1`, its default reservoir sampling) and a real
  mstail (`mstail --log info.log --no-state`, a first start);
- time to history: from the process start until its HTTP API serves the loss series up to the last step
  (TensorBoard: /data/plugin/scalars/scalars?run=run&tag=loss; mstail: /api/sources says every step is
  stored, /api/series serves from there), and how many loss points that answer holds;
- the spike: whether the loss served (TensorBoard's points; mstail's default /api/series, min/max buckets)
  holds the 50.0 of that one step;
- RSS of the process and its children (TensorBoard's data server) once the history is served;
- live latency: one more step written to each -> the API serves it (polled every 10 ms, 5 ms for mstail):
  TensorBoard from the moment a new event file holding it is closed, mstail from the moment the writer
  began its line pair.
`--tb-full` also runs TensorBoard with `--samples_per_plugin scalars=0` (every point), bounded by --timeout.

TensorBoard and tensorboardX are installed by this script into a venv of its own (--venv, default
~/.cache/mstail/peer-tensorboard; PyPI), never into mstail's environment: they are not test dependencies.

Run: python tests/bench/peer_tensorboard.py [--steps 200000] [--run-dir DIR] [--tb-full] [--timeout 600]
Goal (issue 34, goal 1): mstail's full-fidelity history <= 1.5x the time of TensorBoard's lossy sample, in one run.
Prints the figures; exit 0 unless something failed. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import latency
from benchsupport import load_test_support

SPIKE = 50.0
GOAL_RATIO = 1.5  # mstail's time to its full history over TensorBoard's to its sample (issue 34, goal 1)
METRICS = ("loss", "lr", "grad_norm", "loss_scale", "step_time_ms", "throughput_tflops", "samples_per_s", "overflow")
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_STEP_LINE = re.compile(
    r"step:\[\s*(?P<step>\d+)/\s*\d+\], loss:\[(?P<loss>[^/\]]+)/[^\]]*\], per_step_time: (?P<step_time_ms>\d+)ms, "
    r"lr: (?P<lr>[^,]+), overflow cond: (?P<overflow>\w+), loss_scale: (?P<loss_scale>[^,]+), "
    r"global_norm: \[(?P<grad_norm>[^\]]+)\], train_throughput_per_npu: (?P<throughput_tflops>[\d.]+)T")
_PROGRESS_LINE = re.compile(r"\|\s+(?P<samples_per_s>[\d.]+) samples/s/p")

# Runs in the bench's venv: reads "step wall v1 .. v8" lines on stdin, writes one event file in `logdir`.
_TB_WRITER = r'''
import sys
from tensorboardX import SummaryWriter
names = sys.argv[2].split(",")
writer = SummaryWriter(sys.argv[1], flush_secs=3600, max_queue=100000)
for line in sys.stdin:
    step, wall, *values = line.split()
    for name, value in zip(names, values):
        writer.add_scalar(name, float(value), int(step), walltime=float(wall))
writer.close()
print(repr(__import__("time").time()))  # when the event file was closed (flushed)
'''


# -- the two tools' environment and the run ------------------------------------------------------------------
def bench_venv(path: Path) -> Path:
    """The venv holding tensorboard and tensorboardX (made and filled from PyPI the first time)."""
    python = path / "bin" / "python"
    if not (path / "bin" / "tensorboard").exists():
        print(f"installing tensorboard and tensorboardX into {path} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "tensorboard", "tensorboardX"], check=True)
    return path


def values_of(log: Path) -> List[Tuple[int, List[float]]]:
    """(step, the 8 metrics) of every step of the log: what TensorBoard gets, read with one regex per line kind."""
    out: List[Tuple[int, List[float]]] = []
    step_values: Optional[Dict[str, str]] = None
    with open(log, encoding="utf-8") as f:
        for line in f:
            found = _STEP_LINE.search(line)
            if found:
                step_values = found.groupdict()
                continue
            progress = _PROGRESS_LINE.search(line)
            if progress and step_values is not None:
                step_values["samples_per_s"] = progress.group("samples_per_s")
                step_values["overflow"] = "1" if step_values["overflow"] == "True" else "0"
                out.append((int(step_values["step"]), [float(step_values[name]) for name in METRICS]))
                step_values = None
    return out


def write_event_file(venv: Path, logdir: Path, rows: Sequence[Tuple[int, List[float]]], wall0: float,
                     background: bool = False) -> "subprocess.Popen[bytes]":
    """tensorboardX writes `rows` (step, values) to a new event file in `logdir`; the process prints the time it
    closed the file. Waited for unless `background`."""
    text = "".join(f"{step} {wall0 + step * 0.1!r} {' '.join(map(repr, values))}\n" for step, values in rows)
    proc = subprocess.Popen([str(venv / "bin" / "python"), "-c", _TB_WRITER, str(logdir), ",".join(METRICS)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    proc.stdin.write(text.encode())  # type: ignore[union-attr]
    proc.stdin.close()  # type: ignore[union-attr]
    if not background and proc.wait() != 0:
        raise SystemExit("peer_tensorboard: the tensorboardX writer failed")
    return proc


def build_run(support: Any, venv: Path, work: Path, steps: int, spike_step: int) -> Tuple[Path, Path]:
    """The run in both forms under `work` (built once: a folder that holds it for these steps is reused)."""
    log = work / "output" / "log" / "rank_0" / "info.log"
    logdir = work / "tensorboard"
    built = work / "built.json"
    if built.exists() and json.loads(built.read_text())["run"] == [steps, spike_step]:
        made = json.loads(built.read_text())  # the live steps a measurement added go
        os.truncate(log, made["log_bytes"])
        for extra in set((logdir / "run").glob("*")) - {logdir / "run" / name for name in made["event_files"]}:
            extra.unlink()
        print(f"the run: {steps} steps x {len(METRICS)} metrics, reused from {work}")
        return log, logdir
    for stale in (log, *(logdir / "run").glob("*")):
        stale.unlink(missing_ok=True)
    began = time.monotonic()
    writer = support.spawn_writer(log, steps, 0.0, steps_per_epoch=steps, spike_at=(spike_step,))
    if writer.wait() != 0:
        raise SystemExit(f"peer_tensorboard: the log writer failed: {writer.stderr.read().decode()}")
    rows = values_of(log)
    assert len(rows) == steps and rows[spike_step - 1][1][0] == SPIKE, (len(rows), rows[spike_step - 1])
    write_event_file(venv, logdir / "run", rows, wall0=time.time() - steps * 0.1)
    events = sum(f.stat().st_size for f in (logdir / "run").iterdir())
    print(f"the run: {steps} steps x {len(METRICS)} metrics, loss {SPIKE} at step {spike_step}; info.log "
          f"{log.stat().st_size / 1e6:.1f} MB, event file {events / 1e6:.1f} MB (built in {time.monotonic() - began:.0f} s)")
    built.write_text(json.dumps({"run": [steps, spike_step], "log_bytes": log.stat().st_size,
                                 "event_files": [f.name for f in (logdir / "run").iterdir()]}))
    return log, logdir


# -- measuring ---------------------------------------------------------------------------------------------------
def get_json(url: str, timeout: float = 30.0) -> Any:
    with _NO_PROXY.open(url, timeout=timeout) as response:
        return json.loads(response.read())


def tree_rss_mib(pid: int) -> float:
    """VmRSS of a process and its children (TensorBoard's data server is one), MiB."""
    total, pids = 0, [pid]
    while pids:
        current = pids.pop()
        total += latency.proc_mem_kib(current).get("VmRSS", 0)
        try:
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            children = []
        pids += [int(child) for child in children]
    return total / 1024


def poll(check: Callable[[], Any], timeout: float, every: float = 0.01) -> Tuple[Optional[float], Any]:
    """(seconds until `check()` returned something true, what it returned); (None, None) on timeout."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        try:
            got = check()
        except (OSError, ValueError):  # not serving yet
            got = None
        if got:
            return time.monotonic() - began, got
        time.sleep(every)
    return None, None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure_tensorboard(venv: Path, logdir: Path, steps: int, spike_step: int, timeout: float,
                        extra: Sequence[str] = ()) -> Dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/data/plugin/scalars/scalars?run=run&tag="
    proc = subprocess.Popen([str(venv / "bin" / "tensorboard"), "--logdir", str(logdir), "--host", "127.0.0.1",
                             "--port", str(port), "--reload_interval", "1", *extra],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    began = time.monotonic()
    try:
        def loss_up_to(last: int) -> Optional[list]:
            points = get_json(url + "loss")
            return points if points and points[-1][1] >= last else None

        waited, points = poll(lambda: loss_up_to(steps), timeout, every=0.05)
        out: Dict[str, Any] = {"history_s": None if waited is None else time.monotonic() - began}
        if points is None:
            out["rss_mib"] = tree_rss_mib(proc.pid)
            return out
        out["points"] = len(points)
        out["spike"] = any(step == spike_step and value == SPIKE for _, step, value in points)
        out["rss_mib"] = tree_rss_mib(proc.pid)
        rows = [(steps + 1, [2.0] + [1.0] * (len(METRICS) - 1))]
        writer = write_event_file(venv, logdir / "run", rows, wall0=time.time() - (steps + 1) * 0.1, background=True)
        waited, _ = poll(lambda: loss_up_to(steps + 1), 30)
        served = time.time()
        closed = float(writer.stdout.read().decode())  # type: ignore[union-attr]
        writer.wait(timeout=30)
        out["live_s"] = None if waited is None else served - closed
        return out
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def measure_mstail(support: Any, log: Path, work: Path, steps: int, spike_step: int, timeout: float) -> Dict[str, Any]:
    began = time.monotonic()
    server = support.start_mstail([str(log)], work / "mstail", args=("--no-state",), timeout=60)
    try:
        def stored(count: int) -> bool:
            return any(s["records"] >= count for s in server.get_json("/api/sources"))

        waited, _ = poll(lambda: stored(steps), timeout, every=0.05)
        out: Dict[str, Any] = {"history_s": None if waited is None else time.monotonic() - began}
        out["rss_mib"] = tree_rss_mib(server.proc.pid)
        if waited is None:
            return out
        served = server.get_json("/api/series?metric=loss")["series"]
        out["points"] = sum(len(entry["x"]) for entry in served)
        out["spike"] = any(high == SPIKE for entry in served for high in entry["max"])
        times = work / "live.times"  # "STEP BEFORE AFTER": when the writer began the step's lines
        times.unlink(missing_ok=True)
        writer = support.spawn_writer(log, 1, 0.0, start_step=steps + 1, steps_per_epoch=steps + 1, times_path=times)
        waited, _ = poll(lambda: stored(steps + 1), 30, every=0.005)
        served = time.time()
        writer.wait(timeout=30)
        out["live_s"] = None if waited is None else served - float(times.read_text().split()[1])
        return out
    finally:
        server.stop()


def row(name: str, result: Dict[str, Any]) -> str:
    def seconds(value: Optional[float]) -> str:
        return "not within the timeout" if value is None else f"{value:.2f} s"
    points = result.get("points")
    spike = result.get("spike")
    return (f"{name:<44} {seconds(result.get('history_s')):>22}  {points if points is not None else '-':>8}  "
            f"{'-' if spike is None else 'yes' if spike else 'no':>5}  {result['rss_mib']:7.0f} MiB  "
            f"{seconds(result.get('live_s')) if 'live_s' in result else '-':>10}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200_000, help="steps of the run (default 200000, the issue's)")
    ap.add_argument("--venv", default=str(Path.home() / ".cache" / "mstail" / "peer-tensorboard"),
                    help="the venv for tensorboard + tensorboardX (made on first use)")
    ap.add_argument("--run-dir", help="where the run is built, and reused from when it holds one of --steps "
                    "(building 200,000 steps takes minutes: tensorboardX writes 1.6 M scalars); default a new temp dir")
    ap.add_argument("--timeout", type=float, default=600.0, help="most seconds each tool may take to serve (600)")
    ap.add_argument("--tb-full", action="store_true", help="also TensorBoard with --samples_per_plugin scalars=0")
    args = ap.parse_args(argv)
    if args.steps < 10:
        ap.error("--steps must be at least 10")
    support = load_test_support()
    venv = bench_venv(Path(args.venv))
    work = Path(args.run_dir) if args.run_dir else Path(tempfile.mkdtemp(prefix="mstail-peer-tb-"))
    spike_step = args.steps // 2 + 7
    log, logdir = build_run(support, venv, work, args.steps, spike_step)
    load_start = latency.loadavg()
    results = [("TensorBoard, default (reservoir sampling)",
                measure_tensorboard(venv, logdir, args.steps, spike_step, args.timeout))]
    if args.tb_full:
        results.append(("TensorBoard, --samples_per_plugin scalars=0",
                        measure_tensorboard(venv, logdir, args.steps, spike_step, args.timeout,
                                            ("--samples_per_plugin", "scalars=0"))))
    results.append(("mstail (first start, --no-state)", measure_mstail(support, log, work, args.steps, spike_step,
                                                                       args.timeout)))
    print()
    print(f"{'':<44} {'history served by the API':>22}  {'points':>8}  {'spike':>5}  {'RSS':>11}  {'a new step':>10}")
    for name, result in results:
        print(row(name, result))
    tb, ms = results[0][1], results[-1][1]
    if tb.get("history_s") and ms.get("history_s"):
        print(f"mstail / TensorBoard time to history: {ms['history_s'] / tb['history_s']:.2f}x   goal <= "
              f"{GOAL_RATIO:g}x")
    print(f"machine: {os.cpu_count()} CPUs, load average {load_start} at the start, {latency.loadavg()} at the end; "
          f"work dir {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
