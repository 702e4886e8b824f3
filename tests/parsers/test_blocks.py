"""`SourceParser.feed_block` and the offline reader built on it give exactly what feeding lines one by one gives:
the same items (records, events, line numbers, segments) and the same counts, on every sample and real log and
on a generated log full of what could go wrong at a block boundary. Also the literal extraction behind it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Sequence, Tuple

import pytest

from parsers import SourceParser
from parsers.engine import _METRIC_LOOKING
from parsers.prefilter import Literal, line_finder, literals
from tailer import offline
from tailer.lines import LineSplitter
from tailer.offline import Chain, chain_lines, parse_chain

from .support import FORMATS, READ_TIME, ROOT, SAMPLES
from .test_mindformers import PREFIXES, progress, v18_line

REAL = ROOT / "tests" / "real_logs"
LOGS = sorted(p for p in SAMPLES.iterdir() if p.suffix in (".log", ".jsonl")) + sorted(REAL.glob("*.log"))
FILE = PREFIXES["file_v10"]
OUT = PREFIXES["stdout_v16"]
TRACEBACK = """Traceback (most recent call last):
  File "/home/ma-user/run_mindformer.py", line 42, in <module>
    main()
RuntimeError: Run task failed"""


# -- literals ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "regex,expected",
    [
        (r"^\{ Epoch:\[\s*(?P<e>\d+)/", [("{ Epoch:[", False), ("/", False)]),
        (r"ab(?:cd)(?P<x>ef)g", [("abcdefg", False)]),  # groups are plain concatenation
        (r"ab(?:c|d)ef", [("ab", False), ("ef", False)]),  # an alternative ends a run
        (r"a(?:bc)+d(?:xy)?z", [("a", False), ("bc", False), ("d", False), ("z", False)]),  # optional: nothing certain
        (r"(?=.* \}$)Saving", [("Saving", False)]),  # a lookahead is not a literal of the match
        (r"(?i)Loss is", [("loss is", True)]),
        (r"ab(?i:CD)ef", [("ab", False), ("cd", True), ("ef", False)]),
        (r"(?i)a(?-i:BC)", [("a", True), ("BC", False)]),
        (r"(?i)█x", []),  # non-ASCII in any case: not searchable in bytes
        (r"\d+|x", []),
    ],
)
def test_literals(regex: str, expected: List[Tuple[str, bool]]) -> None:
    assert literals(re.compile(regex)) == [Literal(*pair) for pair in expected]


def test_every_line_a_rule_can_match_is_found() -> None:
    fmt = next(f for f in FORMATS if f.name == "mindformers")
    finder = line_finder(fmt, (_METRIC_LOOKING,))
    assert finder is not None
    lines = [
        FILE("default_lr: 1.0e-04"),  # ignore rule only: not needed
        FILE("......Saving ckpt......"),
        "LOSS = 3.5",  # the metric-looking check is in any case ...
        "loſs: 2.0",  # ... including the characters re.IGNORECASE folds to ASCII
        FILE("anything", lv="ERROR"),
        FILE("a \x1b[0mcoloured\x1b[0m line"),
        FILE("plain"),
        "Traceback (most recent call last):",
        progress(25.0, 3.8, 60),
    ]
    block = "".join(line + "\n" for line in lines).encode("utf-8")
    offsets, at = [], 0
    for line in lines:
        offsets.append(at)
        at += len(line.encode("utf-8")) + 1
    found = finder.starts(block)
    assert found == [offsets[i] for i in (1, 2, 3, 4, 5, 7, 8)]
    assert finder.starts(block, offsets[5]) == [offsets[i] for i in (5, 7, 8)]


def test_formats_without_literals_have_no_finder() -> None:
    jsonl = next(f for f in FORMATS if f.jsonl)
    assert line_finder(jsonl, (_METRIC_LOOKING,)) is None
    from parsers import pattern_format

    assert line_finder(pattern_format(r"(?P<step>\d+)\s(?P<loss>\S+)"), (_METRIC_LOOKING,)) is None
    assert line_finder(pattern_format(r"it (?P<step>\d+) loss=(?P<loss>\S+)"), (_METRIC_LOOKING,)) is not None


# -- feed_block == feed, line by line ----------------------------------------------------------------------------------
def mixed_log() -> List[str]:
    """A log where every state the engine keeps meets a block boundary somewhere."""
    lines = [FILE("config dump: {'seed': 0}"), "  an unprefixed continuation of nothing", "loss: 9.9 before any format"]
    step = 0
    for epoch in (1, 2):
        for _ in range(12):
            step += 1
            in_epoch = (step - 1) % 12 + 1
            lines.append(FILE(v18_line(epoch, 2, in_epoch, 12, 3.0 - step / 100, avg=3.0, gn="[nan]" if step == 5 else "[1.5]")))
            if step % 4:
                lines.append(FILE("    Epoch:[  1/  2], step:[    3/   12] local_norm/w: 0.1234"))  # ignore, in between
            if step != 7:  # step 7 waits for a progress line that never comes
                lines.append(FILE(progress(step * 4.0, 3.84, 600)))
            lines.append(FILE("default_lr: 1.000000e-04, group_0_lr: 1.0e-04"))
            if step % 6 == 0:
                lines += [FILE("......Saving ckpt......"), FILE(f"Finish saving ckpt of epoch {epoch} step 1 using 1.5 seconds")]
            if step == 9:
                lines += TRACEBACK.splitlines() + ["", "Traceback (most recent call last):", "  chained", "ValueError: x"]
            if step == 10:
                lines.append(FILE("Eval result: {'PerplexityMetric': {'loss': 2.93, 'PPL': 18.7}}, eval time is 12.5 s."))
                lines += [OUT("Worker crashed:", lv="ERROR"), "  detail one", "  detail two"]
            if step == 11:
                lines += ["LOSS is 3.5 here", "total loss = nan", "loſs: 2.0", "\x1b[32m" + FILE("a coloured line") + "\x1b[0m",
                          "Exception in thread Thread-1 (run):", "  File x", "OSError: y", FILE("initial step: 5")]
    lines.append(FILE(v18_line(1, 2, 3, 12, 2.5)))  # a relaunch: a step going back opens a segment
    lines.append(FILE(progress(25.0, 3.8, 60)))
    lines.append(FILE(".........Training Over!............."))
    return lines


def by_lines(lines: Sequence[str], grace_s: float = 0.5, now_step: float = 0.0) -> Tuple[List[str], dict]:
    parser = SourceParser(FORMATS, grace_s=grace_s)
    items = []
    for number, line in enumerate(lines, 1):
        items += parser.feed(line, number, READ_TIME + (number - 1) // 5 * now_step)
    items += parser.flush(READ_TIME, force=True)
    return [repr(i) for i in items], dict(parser.counts)  # repr: NaN == NaN


def by_blocks(lines: Sequence[str], size: int, grace_s: float = 0.5, now_step: float = 0.0) -> Tuple[List[str], dict]:
    """Blocks of `size` lines; with now_step, the read time grows every 5 lines (blocks of 5 are then exact)."""
    parser = SourceParser(FORMATS, grace_s=grace_s)
    splitter = LineSplitter()
    items = []
    for first in range(0, len(lines), size):
        block = "".join(line + "\n" for line in lines[first:first + size]).encode("utf-8")
        items += parser.feed_block(block, first + 1, READ_TIME + first // 5 * now_step, lambda raw, at: splitter.decode(raw, 1))
    items += parser.flush(READ_TIME, force=True)
    return [repr(i) for i in items], dict(parser.counts)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 64, 100_000])
def test_feed_block_gives_what_feed_gives(size: int) -> None:
    lines = mixed_log()
    expected = by_lines(lines)
    assert by_blocks(lines, size) == expected
    items, counts = expected
    assert counts["unmatched_metric_lines"] == 4 and counts["lines"] == len(lines)  # the test log covers them
    assert sum("'kind': 'error'" in item for item in items) == 3 and sum("'segment': 1" in item for item in items) == 1


def test_feed_block_ages_held_records_as_feed_does() -> None:
    """A record held past its grace is emitted by the next line whatever it is, also across blocks."""
    lines = mixed_log()
    assert by_blocks(lines, 5, grace_s=1.0, now_step=2.0) == by_lines(lines, grace_s=1.0, now_step=2.0)


def test_parser_state_after_a_block_is_the_same() -> None:
    lines = mixed_log()
    one, many = SourceParser(FORMATS), SourceParser(FORMATS)
    for number, line in enumerate(lines, 1):
        one.feed(line, number, READ_TIME)
    many.feed_block("".join(line + "\n" for line in lines).encode("utf-8"), 1, READ_TIME, lambda raw, at: raw.decode())
    assert repr(one.snapshot()) == repr(many.snapshot())


# -- the offline reader ----------------------------------------------------------------------------------------------------
def expected_items(path: Path) -> Tuple[List[str], dict]:
    parser = SourceParser(FORMATS)
    chain = Chain("s", [path])
    items = [i for _, line in chain_lines(chain) for i in parser.feed(line.text, line.number, READ_TIME)]
    items += parser.flush(READ_TIME, force=True)
    return [repr(i) for i in items], dict(parser.counts)


def offline_items(path: Path) -> Tuple[List[str], dict]:
    parser = SourceParser(FORMATS)
    return [repr(i) for i in parse_chain(Chain("s", [path]), parser)], dict(parser.counts)


@pytest.fixture
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(offline.time, "time", lambda: READ_TIME)


@pytest.mark.parametrize("chunk", [7, 100, 4096, 1 << 20])
@pytest.mark.parametrize("path", LOGS, ids=[p.name for p in LOGS])
def test_offline_parse_of_every_log_equals_line_by_line(path: Path, chunk: int, monkeypatch: pytest.MonkeyPatch,
                                                        fixed_clock: None) -> None:
    monkeypatch.setattr(offline, "READ_CHUNK", chunk)
    assert offline_items(path) == expected_items(path)


@pytest.mark.parametrize("chunk", [5, 64, 1000, 1 << 20])
def test_offline_parse_of_awkward_bytes_equals_line_by_line(tmp_path: Path, chunk: int, monkeypatch: pytest.MonkeyPatch,
                                                            fixed_clock: None) -> None:
    """BOM, CRLF, `\\r` redraws, invalid UTF-8, NUL bytes, an over-long line, no final newline."""
    monkeypatch.setattr(offline, "READ_CHUNK", chunk)
    lines = [line.encode("utf-8") for line in mixed_log()]
    lines[0] = b"\xef\xbb\xbf" + lines[0]
    lines[3] += b"\r"
    lines[5] = b"junk\r" + lines[5]
    lines[8] = lines[8].replace(b"Epoch", b"Ep\x00och")  # joined by the reader: it must still be seen
    lines[9] = b"\xff\xfe " + lines[9]
    lines.insert(20, b"x" * ((1 << 20) + 10) + b" loss: 1.0")  # cut by the reader
    path = tmp_path / "awkward.log"
    path.write_bytes(b"\n".join(lines))  # no final newline
    assert offline_items(path) == expected_items(path)


def test_parse_output_equals_line_by_line_for_a_rotated_chain(tmp_path: Path, fixed_clock: None) -> None:
    lines = mixed_log()
    (tmp_path / "info.log.1").write_text("\n".join(lines[:40]) + "\n", encoding="utf-8")
    (tmp_path / "info.log").write_text("\n".join(lines[40:]) + "\n", encoding="utf-8")
    chain = offline.chains([str(tmp_path / "info.log")])[0]
    parser = SourceParser(FORMATS)
    expected = [repr(i) for _, line in chain_lines(chain) for i in parser.feed(line.text, line.number, READ_TIME)]
    expected += [repr(i) for i in parser.flush(READ_TIME, force=True)]
    assert [repr(i) for i in parse_chain(chain, SourceParser(FORMATS))] == expected
