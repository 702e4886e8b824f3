"""The block path's record builder (`parsers.steplines`) gives, block by block, the items, counts and parser state
that feeding every line to the line engine gives: on the generated logs of the parse benchmark (relaunches, NaN
losses, overflow, checkpoints, tracebacks), on the sample and real logs, and with a log cut into two blocks at every
line boundary. The line engine judges; `parsers.blocks.feed_block` takes the usual step and progress lines here."""

from __future__ import annotations

import random
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import pytest

from mstail.parsers import SourceParser
from mstail.parsers.blocks import _made_for
from mstail.parsers.derived import Derived
from mstail.parsers.interleave import InterleavedParser
from mstail.parsers.loader import parse_format
from mstail.parsers.schema import Format
from mstail.tailer.inputs.kind import items_of
from mstail.tailer.inputs.lines import LineSplitter

from tests.bench.parse_speed import build_logs, build_single_log
from tests.parsers.support import FORMATS, READ_TIME
from tests.tailer.test_offline_chains import DERIVED, LOGS, mixed_log, whole_file_lines

Outcome = Tuple[List[str], dict, str]


def new_parser(derived: Optional[Derived], formats: Sequence[Format] = FORMATS) -> InterleavedParser:
    return InterleavedParser(lambda: SourceParser(formats), derived)


def by_lines(data: bytes, derived: Optional[Derived], tmp_path: Path, formats: Sequence[Format] = FORMATS) -> Outcome:
    """The line engine: every line of `data` fed one by one (repr: NaN == NaN), its counts and its state."""
    path = tmp_path / "log"
    path.write_bytes(data)
    parser = new_parser(derived, formats)
    found = [repr(item) for text, number in whole_file_lines(path) for item in parser.feed(text, number, READ_TIME)]
    found += [repr(item) for item in parser.flush(READ_TIME, force=True)]
    return found, parser.counts, parser.snapshot_json()


def by_blocks(data: bytes, derived: Optional[Derived], cuts: List[int], formats: Sequence[Format] = FORMATS) -> Outcome:
    """The block path: `data` handed to the line reader in pieces cut at `cuts`, its blocks through `feed_block`."""
    parser = new_parser(derived, formats)
    splitter = LineSplitter()
    found = []
    for start, end in zip([0] + cuts, cuts + [len(data)]):
        for piece in splitter.feed(data[start:end], blocks=True):
            found += [repr(item) for item in items_of(parser, piece, READ_TIME)]
    found += [repr(item) for item in parser.flush(READ_TIME, force=True)]
    return found, parser.counts, parser.snapshot_json()


def taken_lines(data: bytes, formats: Sequence[Format] = FORMATS) -> int:
    """How many lines of `data` the block path builds itself (not left to the engine): the test must exercise it."""
    parser = SourceParser(formats)
    taken = 0
    for number, text in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        steps = _made_for(parser.format)[2] if parser.format is not None else None
        found = steps.take(parser, text, number, READ_TIME) if steps is not None and not parser.collecting \
            and "\x1b" not in text else None
        if found is None:
            parser.feed(text, number, READ_TIME)
        taken += found is not None
    return taken


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> List[Path]:
    """The parse benchmark's logs, small: its single-file info.log (a NaN loss at step 777, overflows, two relaunches
    opening segments) and its mixed case (an info.log and a worker log with MindSpore's and C++ lines, tracebacks)."""
    folder = tmp_path_factory.mktemp("generated")
    return build_single_log(folder, 1_300_000) + build_logs(folder, 700_000, seed=3)


@pytest.mark.parametrize("derived", list(DERIVED))
@pytest.mark.parametrize("which", range(3))
def test_generated_logs_give_the_line_engines_items(generated: List[Path], which: int, derived: str,
                                                    tmp_path: Path) -> None:
    data = generated[which].read_bytes()
    assert taken_lines(data) > 500
    expected = by_lines(data, DERIVED[derived], tmp_path)
    cuts = sorted(random.Random(which).sample(range(1, len(data)), 40))  # blocks of all sizes, cut mid-line too
    assert by_blocks(data, DERIVED[derived], cuts) == expected
    assert by_blocks(data, DERIVED[derived], []) == expected


@pytest.mark.parametrize("path", LOGS, ids=[p.name for p in LOGS])
def test_sample_and_real_logs_give_the_line_engines_items(path: Path, tmp_path: Path) -> None:
    data = path.read_bytes()
    expected = by_lines(data, DERIVED["perplexity"], tmp_path)
    assert by_blocks(data, DERIVED["perplexity"], []) == expected
    assert by_blocks(data, DERIVED["perplexity"], list(range(4096, len(data), 4096))) == expected


@pytest.mark.parametrize("derived", ["none", "series"])
def test_a_log_cut_at_every_line_boundary_gives_the_line_engines_items(derived: str, tmp_path: Path) -> None:
    """Two blocks, the first ending at each line end of a log where every state the engine keeps meets a boundary
    (a record waiting for its progress line, an open traceback, a relaunch, pairs to read, a coloured line)."""
    data = ("\n".join(mixed_log()) + "\n").encode("utf-8")
    assert taken_lines(data) > 20
    expected = by_lines(data, DERIVED[derived], tmp_path)
    ends = [at + 1 for at in range(len(data)) if data[at:at + 1] == b"\n"]
    for end in ends:
        assert by_blocks(data, DERIVED[derived], [end]) == expected, f"cut after byte {end}"


#: A format of the shapes the block path builds that no built-in log shows: a prefix whose time may be missing or
#: not parse (the read time, marked), the step printed with the run's length, the step worked out from an epoch's
#: length with the epoch count, an int field, an attach rule.
SHAPES = r"""
[[prefix]]
name = "clock"
regex = '^(?:(?P<time>\d\d:\d\d) )?\| (?P<message>.*)$'
time_format = "%H:%M"
[[rule]]
name = "printed"
kind = "record"
regex = '^step (?P<step>\d+)(?:/(?P<total_steps>\d+))? loss (?P<loss>\S+)(?: ms (?P<ms>\S+))?$'
literal = 'step '
[rule.fields]
ms = "int"
[[rule]]
name = "epochs"
kind = "record"
regex = '^epoch (?P<epoch>\d+) at (?P<step_in_epoch>\d+)/(?P<steps_per_epoch>\d+)(?: of (?P<epochs>\d+))? loss (?P<loss>\S+)$'
literal = 'epoch '
[[rule]]
name = "speed"
kind = "attach"
regex = '^speed (?P<speed>\S+)$'
literal = 'speed '
"""


def shapes_log(rng: random.Random, lines: int, epochs: bool) -> bytes:
    """Random lines of `SHAPES`: steps printed (`epochs` False) or worked out from epochs counted from 1 or from 0,
    mostly going forward, sometimes back; values that convert, NaN, out of range or not at all; times that parse, do
    not, or are not there; progress lines and other lines between them."""
    out = []
    step = 0
    first_epoch = rng.choice([0, 1])  # a log counting epochs from 0 says so in its first record
    for _ in range(lines):
        stamp = rng.choice(["10:0%d " % rng.randrange(10), "", "99:99 "])
        loss = rng.choice(["1.5", "2.25", "nan", "1e999", "inf", "x"]) if rng.random() < 0.3 else f"{rng.random():.4f}"
        step = max(0, step + (1 if rng.random() < 0.95 else -9))
        kind = rng.random()
        if kind < 0.6 and not epochs:
            total = f"/{rng.choice([100, 10**30])}" if rng.random() < 0.3 else ""
            ms = f" ms {rng.choice(['12', '1.5', '99999999999999999999', 'None'])}" if rng.random() < 0.5 else ""
            message = f"step {step}{total} loss {loss}{ms}"
        elif kind < 0.6:
            of = f" of {rng.choice([3, 9])}" if rng.random() < 0.5 else ""
            message = f"epoch {first_epoch + step // 8} at {step % 8 + 1}/8{of} loss {loss}"
        elif kind < 0.9:
            message = f"speed {rng.choice(['3.5', '4', 'nan', 'fast'])}"
        else:
            message = rng.choice(["other words", "step x loss 1", "loss: 2.5 somewhere"])
        out.append(f"{stamp}| {message}")
    return ("\n".join(out) + "\n").encode("utf-8")


@pytest.mark.parametrize("seed", range(8))
def test_each_shape_the_block_path_builds_gives_the_line_engines_items(seed: int, tmp_path: Path) -> None:
    formats = [parse_format(SHAPES, "built-in", "shapes")]
    data = shapes_log(random.Random(seed), 400, epochs=seed % 2 == 1)
    assert taken_lines(data, formats) > 150
    expected = by_lines(data, None, tmp_path, formats)
    cuts = sorted(random.Random(seed).sample(range(1, len(data)), 12))
    assert by_blocks(data, None, cuts, formats) == expected
