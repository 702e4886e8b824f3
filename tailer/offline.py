"""`mstail parse`: legacy logs -> records as JSONL or CSV, offline.

A rotated chain (`info.log.5` ... `info.log.1`, `info.log`) is read oldest first as one source, whether the
backups were named on the command line or not. Lines are split exactly as when following (bounded length,
invalid UTF-8 replaced), so a finished log parses to the same records a live run showed.
"""

from __future__ import annotations

import csv
import io
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, TextIO, Tuple

from parsers import Format, Item, SourceParser
from parsers.explain import Explainer

from .discovery import SourceNamer, expand, rotated_backups
from .encoding import dumps, finite_or_name, ordered
from .lines import Line, LineSplitter

_ROTATED = re.compile(r"^(?P<base>.+)\.(?P<n>\d+)$")
READ_CHUNK = 1 << 20
PROGRESS_MIN_BYTES = 8 << 20  # smaller inputs parse too fast for a progress bar to help


@dataclass
class Chain:
    """One source: its files oldest first."""

    source: str
    files: List[Path]


@dataclass
class Summary:
    files: int = 0
    records: int = 0
    events: int = 0
    unmatched: int = 0
    formats: Dict[str, str] = field(default_factory=dict)  # source -> detected format


def chains(inputs: Sequence[str]) -> List[Chain]:
    """Group the given paths/globs into rotated chains; missing inputs raise FileNotFoundError."""
    paths: List[Path] = []
    for pattern in inputs:
        found = expand(pattern)
        found = [p for p in found if p.is_file()] if found else []
        if not found:
            raise FileNotFoundError(pattern)
        paths += found
    given = {p.absolute() for p in paths}
    namer = SourceNamer()
    out: List[Chain] = []
    seen: set = set()
    for path in paths:
        rotated = _ROTATED.match(path.name)
        if rotated and (path.parent / rotated.group("base")).absolute() in given:
            continue  # a backup of a live file that was given too: read as part of that chain
        key = path.absolute()
        if key in seen:
            continue
        seen.add(key)
        files = rotated_backups(path) + [path] if not rotated else [path]
        out.append(Chain(source=namer.name(path), files=files))
    return out


def chain_lines(chain: Chain, progress=None) -> Iterator[Tuple[Path, Line]]:  # type: ignore[no-untyped-def]
    """The lines of one chain in order, split exactly as when following; `progress(n_bytes)` as bytes are read."""
    for path in chain.files:
        splitter = LineSplitter()
        with open(path, "rb") as handle:
            while True:
                data = handle.read(READ_CHUNK)
                if not data:
                    break
                if progress is not None:
                    progress(len(data))
                for line in splitter.feed(data):
                    yield path, line
            if splitter.pending_bytes:  # a finished log may end without a newline
                for line in splitter.feed(b"\n"):
                    yield path, line


def parse_chain(chain: Chain, parser: SourceParser, progress=None) -> Iterator[Item]:  # type: ignore[no-untyped-def]
    """Items of one chain in order: the items `chain_lines` fed one by one would give."""
    now = time.time()
    for path in chain.files:
        yield from _file_items(path, parser, now, progress)
    yield from parser.flush(now, force=True)


def _file_items(path: Path, parser: SourceParser, now: float, progress=None) -> Iterator[Item]:  # type: ignore[no-untyped-def]
    """One file's items. Blocks of whole lines go to `SourceParser.feed_block`, decoded by the line reader; what
    the reader must split itself (NUL bytes, a line that may reach its length limit, the unfinished last line)
    goes through a `LineSplitter` and `feed`."""
    reader = LineSplitter()
    window = reader.max_line_bytes // 2  # when every window this long holds a newline, no line reaches the limit
    long_line: Optional[LineSplitter] = None  # the reader, while inside a line that may be over-long
    number, carry, end = 1, b"", 0  # carry: the unfinished line after the last block; end: bytes read
    with open(path, "rb") as handle:
        for data in iter(lambda: handle.read(READ_CHUNK), b""):
            end += len(data)
            if progress is not None:
                progress(len(data))
            cut = data.rfind(b"\n") + 1
            if long_line is not None:
                yield from _fed(parser, long_line.feed(data[:cut] if cut else data), now)
                if cut:
                    number, long_line, carry = long_line.next_number, None, data[cut:]
                continue
            if not cut:
                carry += data
                if len(carry) >= window:
                    long_line = LineSplitter(end - len(carry), reader.max_line_bytes, number)
                    long_line.feed(carry)  # no newline yet: no line
                    carry = b""
                continue
            block, carry = carry + data[:cut], data[cut:]
            base = end - len(carry) - len(block)  # the block's file offset
            if _plain(block, window):
                before = parser.counts["lines"]
                yield from parser.feed_block(block, number, now, lambda raw, at, base=base: reader.decode(raw, base + at))
                number += parser.counts["lines"] - before  # feed_block counts every line of the block
            else:
                lines = LineSplitter(base, reader.max_line_bytes, number).feed(block)
                yield from _fed(parser, lines, now)
                number += len(lines)
    if long_line is None and carry:
        long_line = LineSplitter(end - len(carry), reader.max_line_bytes, number)
        long_line.feed(carry)
    if long_line is not None and long_line.pending_bytes:  # a finished log may end without a newline
        yield from _fed(parser, long_line.feed(b"\n"), now)


def _fed(parser: SourceParser, lines: List[Line], now: float) -> Iterator[Item]:
    for line in lines:
        yield from parser.feed(line.text, line.number, now)


def _plain(block: bytes, window: int) -> bool:
    """Whether the reader would split `block` at its newlines and nothing else: no NUL byte, no long line."""
    if b"\x00" in block:
        return False
    return all(block.find(b"\n", at, at + window) >= 0 for at in range(0, len(block), window))


def run_explain(inputs: Sequence[str], formats: Sequence[Format], forced: Optional[Format], out: TextIO) -> None:
    """`--explain`: how every line matched, per chain, then a count per rule."""
    now = time.time()
    for group in chains(inputs):
        explainer = Explainer(SourceParser(formats, forced=forced))
        for path, line in chain_lines(group):
            shown = explainer.explain(path.name, line.number, line.text, now)
            if shown is not None:
                out.write(shown + "\n")
        detected = explainer.parser.format.name if explainer.parser.format else "none"
        out.write(f"\n{group.source}: format {detected}\n{explainer.summary()}\n\n")


def run_parse(
    inputs: Sequence[str],
    formats: Sequence[Format],
    forced: Optional[Format],
    to: str,
    out: TextIO,
    with_events: bool = False,
) -> Summary:
    """Parse every chain and write records (and events, if asked) to `out` as `to` ("jsonl" or "csv")."""
    groups = chains(inputs)
    summary = Summary(files=sum(len(g.files) for g in groups))
    total_bytes = sum(os.path.getsize(f) for g in groups for f in g.files)
    bar = _progress_bar(total_bytes)
    rows: List[dict] = []
    for group in groups:
        parser = SourceParser(formats, forced=forced)
        for item in parse_chain(group, parser, progress=bar.update if bar else None):
            if item.kind == "event":
                summary.events += 1
                if not with_events:
                    continue
            else:
                summary.records += 1
            row = ordered({"source": group.source, **item.data})
            if to == "jsonl":
                out.write(dumps(row) + "\n")
            else:
                rows.append(row)
        summary.formats[group.source] = parser.format.name if parser.format else "none"
        summary.unmatched += parser.counts["unmatched_metric_lines"]
    if bar:
        bar.close()
    if to == "csv":
        _write_csv(rows, out)
    return summary


def _write_csv(rows: List[dict], out: TextIO) -> None:
    columns: Dict[str, None] = {}
    for row in rows:
        columns.update((key, None) for key in row)
    writer = csv.DictWriter(out, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({key: ("" if value is None else finite_or_name(value)) for key, value in row.items()})


def _progress_bar(total: int):  # type: ignore[no-untyped-def]
    if total < PROGRESS_MIN_BYTES:
        return None
    from tqdm import tqdm

    # tqdm turns itself off when stderr is not a terminal (disable=None), so pipes and CI stay clean.
    return tqdm(total=total, unit="B", unit_scale=True, desc="parsing", file=sys.stderr, disable=None)


def open_output(path: Optional[str]) -> TextIO:
    if path is None or path == "-":
        return io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n", write_through=False)
    return open(path, "w", encoding="utf-8", newline="")
