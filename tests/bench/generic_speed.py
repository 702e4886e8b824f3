"""What the generic step-line reader costs: `SourceParser.feed` (all built-in formats, auto-detection) on a MindYOLO
log, which no specific format reads (so the file never locks: every line is tried against every format, then the
generic reader), next to a competent baseline in the same process: two regexes written for exactly these two lines
(MindYOLO's loss line and its step-time line), the global step computed, values converted, the step time joined to
its record. Lines built from mindyolo/utils/trainer_factory.py's format strings. Figures only, no goal.

Run: python tests/bench/generic_speed.py [--lines 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path
from typing import List

from mstail.parsers import SourceParser, load_formats

LOSS = re.compile(r"Epoch (\d+)/\d+, Step (\d+)/(\d+), imgsize \([^)]*\), loss: ([^,]+), lbox: ([^,]+), lcls: ([^,]+), "
                  r"dfl: ([^,]+), cur_lr: (\S+)")
STEP_TIME = re.compile(r"Epoch \d+/\d+, Step \d+/\d+, step time: (\S+) ms")


def mindyolo_lines(count: int) -> List[str]:
    lines = []
    for i in range(count // 2):
        epoch, step = divmod(i, 3995)
        stamp = f"2024-12-25 09:{i // 60 % 60:02d}:{i % 60:02d},787"
        lines.append(f"{stamp} [INFO] Epoch {epoch + 1}/200, Step {step + 1}/3995, imgsize (640, 640), "
                     f"loss: {11.6707 - i * 1e-5:.4f}, lbox: 3.6262, lcls: 5.5689, dfl: 2.4756, cur_lr: 0.0992")
        lines.append(f"{stamp} [INFO] Epoch {epoch + 1}/200, Step {step + 1}/3995, step time: 5736.71 ms")
    return lines


def baseline(lines: List[str]) -> int:
    records: List[dict] = []
    for line in lines:
        found = LOSS.search(line)
        if found is not None:
            epoch, step, per_epoch = int(found[1]), int(found[2]), int(found[3])
            records.append({"step": (epoch - 1) * per_epoch + step, "loss": float(found[4]), "lbox": float(found[5]),
                            "lcls": float(found[6]), "dfl": float(found[7]), "lr": float(found[8])})
            continue
        found = STEP_TIME.search(line)
        if found is not None and records:
            records[-1]["step_time_ms"] = float(found[1])
    return len(records)


def mstail(lines: List[str], formats: list) -> int:
    parser = SourceParser(formats)
    for number, line in enumerate(lines, 1):
        parser.feed(line, number, 0.0)
    return parser.counts["records"]


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--lines", type=int, default=100_000)
    options.add_argument("--rounds", type=int, default=3)
    args = options.parse_args()
    lines = mindyolo_lines(args.lines)
    formats = load_formats(user_dir=Path("/nonexistent"))
    print(f"{len(lines)} lines; load {' '.join(open('/proc/loadavg').read().split()[:3])}; {os.cpu_count()} CPUs")
    ratios = []
    for number in range(1, args.rounds + 1):
        began = time.perf_counter()
        expected = baseline(lines)
        base_s = time.perf_counter() - began
        began = time.perf_counter()
        got = mstail(lines, formats)
        ours_s = time.perf_counter() - began
        assert got == expected, (got, expected)
        ratios.append(ours_s / base_s)
        print(f"round {number}: baseline {len(lines) / base_s:>10,.0f} lines/s   mstail (generic reader) "
              f"{len(lines) / ours_s:>9,.0f} lines/s   mstail / baseline time {ours_s / base_s:5.1f}x")
    print(f"median mstail / baseline time: {sorted(ratios)[len(ratios) // 2]:.1f}x")


if __name__ == "__main__":
    main()
