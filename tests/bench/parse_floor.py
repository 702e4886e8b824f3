"""How far `mstail parse`'s CPU per step is from the floor of its own design, in one process (issue 16, goal 1).

The floor: the work in C that mstail's path cannot do without, in the tightest Python loop around it, with no parser
state, no amends, no derived series: the file read in 1 MiB chunks and each chunk's whole lines checked as UTF-8 and
counted (as the line reader does), the lines that may matter found by the format's literals (`parsers.prefilter`,
the same search), each such line decoded, its prefix regex and then its record or attach rule's regex run (the first
rule, in order, whose literal the message holds), every field converted (its fast converter, else its own), a
record's time read by the prefix's clock, and each record a dict written by orjson. mstail: `run_parse` with one
job (all of `mstail parse --jobs 1` but its start-up) into /dev/null.

Both run alternately over the single case's log of tests/bench/parse_speed.py (a 100 MB MindFormers info.log),
best CPU time of --rounds. mstail / floor is the most any change to the Python around those calls can gain; the
goal's 4x against the competent loop needs about a third of mstail's CPU per step.

Run: python tests/bench/parse_floor.py [--size-mb 100] [--rounds 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict

import orjson

from parse_speed import MB, build_single_log  # the single case's log (this script's folder is on sys.path)

from mstail.parsers.blocks import finder_for
from mstail.parsers.derived import load_derived
from mstail.parsers.loader import load_formats
from mstail.tailer.offline import run_parse

CHUNK = 1 << 20


def floor(path: Path, fmt_name: str = "mindformers") -> int:
    """The floor's pass over `path` (see the module docstring) with the built-in format `fmt_name` (default
    mindformers); the number of records."""
    fmt = next(f for f in load_formats() if f.name == fmt_name)
    finder = finder_for(fmt)
    assert finder is not None
    prefixes = [(prefix.regex.match, prefix.parse_time if "time" in prefix.regex.groupindex else None)
                for prefix in fmt.prefixes]
    rules = [(rule.literal, rule.regex.search, rule.kind == "record",
              [(spec.group, spec.name, spec.fast or spec.value, spec.value) for spec in rule.fields])
             for rule in fmt.rules if rule.kind in ("record", "attach")]
    records = lines = 0
    rest = b""
    with open(path, "rb") as handle:
        while True:
            data = rest + handle.read(CHUNK)
            if not data:
                return records
            cut = data.rfind(b"\n") + 1
            block, rest = data[:cut], data[cut:]
            block.decode()
            lines += block.count(b"\n")
            find = block.find
            for start in finder.starts(block):
                text = block[start:find(b"\n", start)].decode()
                for match, clock in prefixes:  # noqa: B007 - read after the break
                    envelope = match(text)
                    if envelope is not None:
                        break
                else:
                    continue
                message = envelope["message"]
                for literals, search, is_record, fields in rules:
                    for literal in literals:
                        if literal in message:
                            break
                    else:
                        if literals:
                            continue
                    found = search(message)
                    if found is None:
                        continue
                    values: Dict[str, object] = {}
                    for group, name, first, convert in fields:
                        field_text = found[group]
                        if field_text is not None:
                            try:
                                values[name] = first(field_text)
                            except (ValueError, KeyError):  # "[1.5]", "None": the field's own converter
                                with contextlib.suppress(ValueError):
                                    values[name] = convert(field_text)
                    if is_record:
                        values["time"] = clock(envelope["time"]) if clock is not None else 0.0
                        values["line"] = lines
                        orjson.dumps(values)
                        records += 1
                    break


def mstail(path: Path) -> int:
    """`mstail parse --jobs 1` of `path` into /dev/null, in this process; the number of records."""
    with open(os.devnull, "w", encoding="utf-8") as out, contextlib.redirect_stderr(io.StringIO()):
        return run_parse([str(path)], load_formats(), None, "jsonl", out, jobs=1, derived=load_derived(None)).records


def load() -> str:
    """The load average, as printed beside the figures."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def alternate(path: Path, rounds: int) -> Dict[str, float]:
    """Each program's best CPU time over `path`, run alternately `rounds` times (each run's time printed)."""
    programs = {"floor": floor, "mstail parse --jobs 1": mstail}
    best = dict.fromkeys(programs, math.inf)
    for _ in range(rounds):
        for name, program in programs.items():
            started = time.process_time()
            found = program(path)
            spent = time.process_time() - started
            best[name] = min(best[name], spent)
            print(f"{name:<22} cpu {spent:6.3f} s  ({found} records)", flush=True)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=100.0, help="size of the log (default 100)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each program, alternating; the best counts")
    parser.add_argument("--keep", metavar="DIR", help="write the log here and keep it")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        folder = Path(args.keep or stack.enter_context(tempfile.TemporaryDirectory(prefix="mstail-bench-")))
        formats_dir = folder / "no-user-formats"  # the built-ins only, whatever the user has configured
        formats_dir.mkdir(parents=True, exist_ok=True)
        os.environ["MSTAIL_FORMATS_DIR"] = str(formats_dir)
        path = build_single_log(folder, int(args.size_mb * MB))[0]
        print(f"== {path} (load average {load()})")
        best = alternate(path, args.rounds)
    floor_s, mstail_s = best.values()
    print(f"best: floor {floor_s:.3f} s, mstail {mstail_s:.3f} s -> mstail is {mstail_s / floor_s:.2f}x the floor "
          f"(load average after: {load()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
