"""What the parser tests share: built-in formats only, parsing lines as `mstail parse` does, metric checks."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mstail.parsers import SourceParser, format_table, load_formats
from mstail.parsers.amends import settled
from mstail.tailer.inputs.lines import LineSplitter

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_logs"
FORMATS = load_formats(user_dir=Path(__file__).parent / "no-such-dir")  # built-ins only, whatever ~/.config holds
RESERVED = {"step", "epoch", "time", "segment", "line", "source", "seq", "estimated"}
READ_TIME = 1_000_000.0  # the `now` passed to the parser: what an unprefixed line's time must be
NAN = float("nan")
INF = float("inf")


def parse(lines: Sequence[str], fmt: Optional[str] = None) -> Tuple[List[dict], List[dict], SourceParser]:
    """Feed lines as `mstail parse` does (one read time, a forced flush at the end, amends joined to their records):
    records, events, parser."""
    parser = SourceParser(FORMATS, forced=format_table(FORMATS)[fmt] if fmt else None)
    fed = []
    for number, line in enumerate(lines, 1):
        fed += parser.feed(line, number, READ_TIME)
    fed += parser.flush(READ_TIME, force=True)
    items = list(settled(fed))
    records = [i.data for i in items if i.kind == "record"]
    events = [i.data for i in items if i.kind == "event"]
    assert len(records) + len(events) == len(items)
    return records, events, parser


def parse_file(path: Path) -> Tuple[List[dict], List[dict], SourceParser]:
    """A whole file's lines as `mstail parse` splits them (`LineSplitter`: a `\r` progress bar keeps its last redraw)."""
    assert path.is_file(), f"{path} is missing"
    lines = LineSplitter().feed(path.read_bytes())
    assert [line.number for line in lines] == list(range(1, len(lines) + 1))
    return parse([line.text for line in lines])


def metrics(record: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in record.items() if k not in RESERVED}


def same(actual: Any, expected: Any) -> bool:
    if isinstance(expected, float) and math.isnan(expected):
        return isinstance(actual, float) and math.isnan(actual)
    return type(actual) is type(expected) and actual == expected


def assert_metrics(record: Dict[str, Any], expected: Dict[str, Any]) -> None:
    got = metrics(record)
    assert set(got) == set(expected), f"metric names differ: {sorted(got)} != {sorted(expected)}"
    wrong = {k: (got[k], v) for k, v in expected.items() if not same(got[k], v)}
    assert not wrong, f"(actual, expected): {wrong}"
