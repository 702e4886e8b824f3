"""Crafted event files: CPU per MB of each attack of tests/hostile/crafted_events.py (between a version event and 5
good frames), read by `mstail parse FILE` in a process of its own (its CPU: user + system, start-up included, and the
start-up alone: `mstail parse` of an empty event file), and, for reference, a file of good frames only (one scalar a
step: the cost of valid frames, which is per frame, not per garbage byte).

Run: python tests/bench/crafted_events.py [--mb 8]
Prints one line per file: its size, the CPU of `mstail parse` minus start-up, per MB, and the records read."""

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
        empty = Path(folder) / "events.out.tfevents.1.empty"
        empty.write_bytes(version())
        start_up = min(_cpu_of_parse(empty)[0] for _ in range(3))
        print(f"mstail parse start-up: {start_up * 1000:.0f} ms of CPU")
        cases = {name: make(size) for name, make in CRAFTED.items()}
        cases["good frames only (reference)"] = good(range(1, size // 45))
        for name, body in cases.items():
            path = Path(folder) / f"events.out.tfevents.2.{name.split()[0]}"
            path.write_bytes(version() + body + good(range(1, 6)))
            cpu, records = _cpu_of_parse(path)
            mb = path.stat().st_size / MB
            print(f"{name:30s} {mb:7.2f} MB  {(cpu - start_up) * 1000 / max(mb, 1e-9):8.1f} ms/MB"
                  f" ({(cpu - start_up) * 1000:7.0f} ms)  records {records}")
            os.unlink(path)
    print(f"load average: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
