"""Crafted event files: CPU per MB of each attack of tests/hostile/crafted_events.py (between a version event and 5
good frames), read by `mstail parse FILE` in a process of its own (its CPU: user + system), and, for reference, a
file of good frames only (one scalar a step: the cost of valid frames, which is per frame, not per garbage byte).

Each file is read at --mb and at twice that: the CPU per MB is the difference over the difference in size (the slope:
start-up, numpy's import and the search's tables, paid once, are out of it); the CPU of the larger file is printed
too, whole.

With --live, each attack is instead fed to the event-file splitter 8 KiB at a time, as the sidecar reads a live file
(tests/hostile/test_crafted_event_files.py's `_measured_in_slices`: a process of its own, the search's tables built
before, the CPU of the feeding alone), the attacks of that test's WAITING too; each figure is the least of --repeat
runs (a loaded machine only adds).

Run: python tests/bench/crafted_events.py [--mb 8] [--live [--repeat 3]]
Prints one line per attack: the larger file's size and CPU, the slope in ms of CPU per MB, the records (frames, with
--live) read."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.hostile.crafted_events import CRAFTED, MB, good, version  # noqa: E402


def _cpu_of_parse(path: Path) -> tuple:
    """(CPU seconds of `mstail parse path`, the records it wrote)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "mstail", "parse", str(path)], cwd=ROOT, capture_output=True,
                          check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, len(done.stdout.splitlines())


def _cpu_of_live_feed(path: Path, repeat: int) -> tuple:
    """(CPU seconds of feeding `path` to a splitter in the live reader's slices, the frames it gave): the least of
    `repeat` processes."""
    env = {k: v for k, v in os.environ.items() if k != "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"}
    runs = []
    for _ in range(repeat):
        done = subprocess.run([sys.executable, "-c", "import sys; from tests.hostile.test_crafted_event_files import "
                               "_measured_in_slices; _measured_in_slices(sys.argv[1])", str(path)], cwd=ROOT, env=env,
                              capture_output=True, check=True)
        cpu_ms, frames = json.loads(done.stdout.decode().splitlines()[-1])
        runs.append((cpu_ms / 1000, frames))
    return min(runs)


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--mb", type=float, default=8.0, help="MB of each attack (default 8)")
    options.add_argument("--live", action="store_true", help="fed in 8 KiB slices, as a live file is read")
    options.add_argument("--repeat", type=int, default=3, help="with --live: runs of each file, the least kept")
    args = options.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        cases = {name: make for name, make in CRAFTED.items()}
        if args.live:
            from tests.hostile.test_crafted_event_files import WAITING

            cases.update((name, make) for name, make in WAITING.items() if name not in cases)
        cases["good frames only (reference)"] = lambda size: good(range(1, size // 45))
        for name, make in cases.items():
            figures = []
            for size in (int(args.mb * MB), int(2 * args.mb * MB)):
                path = Path(folder) / f"events.out.tfevents.2.{name.split()[0]}"
                path.write_bytes(version() + make(size) + good(range(1, 6)))
                cpu = _cpu_of_live_feed(path, args.repeat) if args.live else _cpu_of_parse(path)
                figures.append((path.stat().st_size / MB, *cpu))
                os.unlink(path)
            (mb1, cpu1, _), (mb2, cpu2, records) = figures
            slope = (cpu2 - cpu1) * 1000 / (mb2 - mb1) if mb2 > mb1 else float("nan")
            print(f"{name:30s} {mb2:7.2f} MB in {cpu2 * 1000:6.0f} ms of CPU; {slope:7.1f} ms/MB; records {records}")
    print(f"load average: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
