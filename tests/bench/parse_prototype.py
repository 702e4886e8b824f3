"""Issue 16's prototype design, made to give mstail's records for the single case's log: what goal 1 costs at best here.

Issue 16 judged goal 1 reachable in CPython from a prototype: "a literal-anchored step regex run with `finditer`
over 4 MiB blocks of bytes", each match turned into a record and JSON. This is that design, finished only as far as
the single case's log of parse_speed.py needs (its step and progress lines, under the file-handler prefix) and no
further: the step line's regex and the progress line's, written for this log, run with `finditer` over each block;
the step's time read from its line's prefix (the minute parsed once, as mstail does); line numbers counted between
matches; segments where the step goes back; the progress line's samples/s; perplexity; non-finite values as
mstail writes them; the UTF-8 check of every block. None of mstail's generality: no other format, no events, no
error lines, no other line of any kind, no amends beyond the progress line, no format read from a file.

As `mstail parse` does, it runs as its own process (start-up included: only `re` and orjson to import) and parses
the file in two forked workers, each half cut before a step line; the parent joins their outputs (the second half's
segments shifted by the first's). parse_speed.py runs it beside `mstail parse` (`--case single`) and checks its
records equal mstail's.

Run: python tests/bench/parse_prototype.py LOG -o OUT
"""

from __future__ import annotations

import argparse
import calendar
import math
import os
import re
import sys
import time
from typing import BinaryIO, Dict, Iterator, Tuple

import orjson

BLOCK = 4 << 20
STEP = re.compile(
    rb"\{ Epoch:\[\s*(\d+)/\s*\d+\], step:\[\s*(\d+)/\s*(\d+)\], loss:\[ *([-+\w.]+)/ *([-+\w.]+)\], per_step_time: "
    rb"*(\d+)ms, lr: ([^,]+), overflow cond: (\w+), loss_scale: ([^,]+), global_norm: \[([^\]]*)\], "
    rb"train_throughput_per_npu: *([-+\w.]+)T")
PROGRESS = re.compile(rb"% \|[^|\n]*\| *([-+\w.]+) samples/s/p")
PREFIX_TIME = re.compile(rb"\[INFO\] (\d{4}-\d\d-\d\d \d\d:\d\d):(\d\d),(\d{3}) ")
SEGMENT = re.compile(rb'"segment":(\d+)')
NAMES = {math.inf: "Infinity", -math.inf: "-Infinity"}


def _blocks(handle: BinaryIO, start: int, end: int) -> Iterator[bytes]:
    """The bytes of [start, end) in blocks of whole lines (`end` is a line start or the file's end)."""
    handle.seek(start)
    rest = b""
    left = end - start
    while left > 0:
        data = handle.read(min(BLOCK, left))
        if not data:
            break
        left -= len(data)
        data = rest + data
        cut = data.rfind(b"\n") + 1 if left > 0 else len(data)
        yield data[:cut]
        rest = data[cut:]


def _finite(record: Dict[str, object]) -> Dict[str, object]:
    return {k: v if not isinstance(v, float) or math.isfinite(v) else ("NaN" if v != v else NAMES[v])
            for k, v in record.items()}


def parse_part(path: str, start: int, end: int, out: BinaryIO) -> Tuple[int, int, int, int]:
    """JSONL records of the steps in [start, end) onto `out`; (first step, last step, last segment, records), the
    segments counted from 0 in this part."""
    minutes: Dict[bytes, int] = {}
    dumps = orjson.dumps
    record = None
    clean = True
    segment = records = 0
    first_step = last_step = -1
    with open(path, "rb") as handle:
        line = sum(block.count(b"\n") for block in _blocks(handle, 0, start))
        for block in _blocks(handle, start, end):
            block.decode()  # a block that is not UTF-8 raises, as mstail refuses it
            progress = PROGRESS.finditer(block)
            found = next(progress, None)
            last, count, rfind = 0, block.count, block.rfind
            for step_line in STEP.finditer(block):
                at = step_line.start()
                while found is not None and found.start() < at:
                    if record is not None and "samples_per_s" not in record:
                        record["samples_per_s"] = float(found[1])
                    found = next(progress, None)
                if record is not None:
                    out.write(dumps(record if clean else _finite(record)) + b"\n")
                    records += 1
                line += count(b"\n", last, at)
                last = at
                stamp = PREFIX_TIME.match(block, rfind(b"\n", 0, at) + 1)
                minute = minutes.get(stamp[1])
                if minute is None:
                    minute = minutes[stamp[1]] = calendar.timegm(time.strptime(stamp[1].decode(), "%Y-%m-%d %H:%M"))
                epoch, in_epoch, per_epoch, loss, loss_avg, ms, lr, overflow, scale, norm, tflops = step_line.groups()
                epoch_no = int(epoch)
                step = (epoch_no - 1) * int(per_epoch) + int(in_epoch)
                if last_step >= 0 and step < last_step:
                    segment += 1
                if first_step < 0:
                    first_step = step
                last_step = step
                loss_value = float(loss)
                record = {
                    "source": "rank_0", "step": step, "epoch": epoch_no,
                    "time": minute + int(stamp[2]) + int(stamp[3]) / 1000, "segment": segment, "line": line + 1,
                    "loss": loss_value, "loss_avg": float(loss_avg), "step_time_ms": int(ms), "lr": float(lr),
                    "overflow": int(overflow == b"True"), "loss_scale": float(scale), "grad_norm": float(norm),
                    "throughput_tflops": float(tflops),
                    "perplexity": math.exp(loss_value) if not loss_value > 709.0 else math.inf,
                }
                clean = b"n" not in step_line[0]  # "nan", "inf": a value orjson would write as null
            while found is not None:
                if record is not None and "samples_per_s" not in record:
                    record["samples_per_s"] = float(found[1])
                found = next(progress, None)
            line += count(b"\n", last)
    if record is not None:
        out.write(dumps(record if clean else _finite(record)) + b"\n")
        records += 1
    return first_step, last_step, segment, records


def _middle(path: str) -> int:
    """A line start near the middle of the file, before a step line (so each step's progress line is in its part)."""
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        handle.seek(size // 2)
        data = handle.read(1 << 20)
    found = data.find(b"{ Epoch:[")
    if found < 0:
        return size
    return size // 2 + data.rfind(b"\n", 0, found) + 1


def parse(path: str, out_path: str) -> int:
    """Both halves parsed by forked workers, joined into `out_path`; the number of records."""
    cut = _middle(path)
    parts = [(0, cut), (cut, os.path.getsize(path))]
    pipes, children = [], []
    for index, (start, end) in enumerate(parts):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            with open(f"{out_path}.{index}", "wb") as out:
                facts = parse_part(path, start, end, out)
            os.write(write_end, " ".join(map(str, facts)).encode())
            os._exit(0)
        os.close(write_end)
        pipes.append(read_end)
        children.append(pid)
    facts = []
    for pid, pipe in zip(children, pipes):
        _, status = os.waitpid(pid, 0)
        if status != 0:
            raise SystemExit(f"a worker failed ({status})")
        facts.append([int(x) for x in os.read(pipe, 200).split()])
        os.close(pipe)
    (_, last_step, segments, first_records), (first_step, _, _, second_records) = facts
    shift = segments + (0 <= first_step < last_step)
    with open(out_path, "wb") as out:
        with open(f"{out_path}.0", "rb") as part:
            out.write(part.read())
        with open(f"{out_path}.1", "rb") as part:
            second = part.read()
        if shift:
            second = SEGMENT.sub(lambda m: b'"segment":%d' % (int(m[1]) + shift), second)
        out.write(second)
    for index in range(2):
        os.unlink(f"{out_path}.{index}")
    return first_records + second_records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="the single case's info.log (parse_speed.py)")
    parser.add_argument("-o", "--output", required=True, help="the JSONL written")
    args = parser.parse_args()
    parse(args.log, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
