"""Crafted event files: CPU per MB of each attack of tests/hostile/crafted_events.py (between a version event and 5
good frames), read by `mstail parse FILE` in a process of its own (its CPU: user + system), and, for reference, a
file of good frames only (one scalar a step: the cost of valid frames, which is per frame, not per garbage byte).

Each file is read at --mb and at twice that: the CPU per MB is the difference over the difference in size (the slope:
start-up, numpy's import and the search's tables, paid once, are out of it); the CPU of the larger file is printed
too, whole.

Run: python tests/bench/crafted_events.py [--mb 8]
Prints one line per attack: the larger file's size and CPU, the slope in ms of CPU per MB, the records read."""

from __future__ import annotations

import argparse
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


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--mb", type=float, default=8.0, help="MB of each attack (default 8)")
    args = options.parse_args()
    size = int(args.mb * MB)
    with tempfile.TemporaryDirectory() as folder:
        cases = {name: make for name, make in CRAFTED.items()}
        cases["good frames only (reference)"] = lambda size: good(range(1, size // 45))
        for name, make in cases.items():
            figures = []
            for size in (int(args.mb * MB), int(2 * args.mb * MB)):
                path = Path(folder) / f"events.out.tfevents.2.{name.split()[0]}"
                path.write_bytes(version() + make(size) + good(range(1, 6)))
                figures.append((path.stat().st_size / MB, *_cpu_of_parse(path)))
                os.unlink(path)
            (mb1, cpu1, _), (mb2, cpu2, records) = figures
            slope = (cpu2 - cpu1) * 1000 / (mb2 - mb1) if mb2 > mb1 else float("nan")
            print(f"{name:30s} {mb2:7.2f} MB in {cpu2 * 1000:6.0f} ms of CPU; {slope:7.1f} ms/MB; records {records}")
    print(f"load average: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
