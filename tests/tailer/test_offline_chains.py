"""`mstail parse` reads a chain as the sidecar reads a file: however the bytes arrive in chunks, the lines (and so
the items) are those the `LineSplitter` makes of the whole file, on every sample and real log and on a log of
what could go wrong at a chunk boundary; a rotated chain is read oldest file first."""

from __future__ import annotations

from pathlib import Path
from typing import List, Tuple

import pytest

from mstail.parsers.amends import settled
from mstail.parsers.derived import Derived, compile_expression
from mstail.parsers import Item, SourceParser
from mstail.parsers.record import dumps, ordered
from mstail.parsers.interleave import InterleavedParser
from mstail.tailer.inputs.lines import LineSplitter
from mstail.tailer.offline import Chain, chain_lines, chains, parse_chain
from mstail.tailer.offline import reading

from tests.parsers.support import FORMATS, READ_TIME, ROOT, SAMPLES
from tests.parsers.test_mindformers import PREFIXES, progress, v18_line

REAL = ROOT / "tests" / "real_logs"
LOGS = sorted(p for p in SAMPLES.iterdir() if p.suffix in (".log", ".jsonl")) + sorted(REAL.glob("*.log"))
FILE = PREFIXES["file_v10"]
OUT = PREFIXES["stdout_v16"]
TRACEBACK = """Traceback (most recent call last):
  File "/home/ma-user/run_mindformer.py", line 42, in <module>
    main()
RuntimeError: Run task failed"""


def mixed_log() -> List[str]:
    """A log where every state the engine keeps meets a block boundary somewhere."""
    lines = [FILE("config dump: {'seed': 0}"), "  an unprefixed continuation of nothing", "loss: 9.9 before any format"]
    step = 0
    for epoch in (1, 2):
        for _ in range(12):
            step += 1
            in_epoch = (step - 1) % 12 + 1
            line = v18_line(epoch, 2, in_epoch, 12, 3.0 - step / 100, avg=3.0, gn="[nan]" if step == 5 else "[1.5]")
            if step in (3, 8):  # fields the format does not name: a metric (3), a part it cannot read, counted (8)
                line += ", tokens_per_s: 1234.5" if step == 3 else ", data_time: 1.5 ms, other=2"
            lines.append(FILE(line))
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


def whole_file_lines(path: Path) -> List[Tuple[str, int]]:
    splitter = LineSplitter()
    lines = splitter.feed(path.read_bytes())
    if splitter.pending_bytes:
        lines += splitter.feed(b"\n")
    return [(line.text, line.number) for line in lines]


def items(path: Path) -> List[str]:
    return [repr(i) for i in parse_chain(Chain("s", [path]), SourceParser(FORMATS))]  # repr: NaN == NaN


@pytest.fixture
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reading.time, "time", lambda: READ_TIME)


@pytest.mark.parametrize("chunk", [7, 100, 4096])
@pytest.mark.parametrize("path", LOGS, ids=[p.name for p in LOGS])
def test_every_log_parses_the_same_whatever_the_read_size(path: Path, chunk: int, monkeypatch: pytest.MonkeyPatch,
                                                          fixed_clock: None) -> None:
    whole = items(path)
    monkeypatch.setattr(reading, "READ_CHUNK", chunk)
    assert [(line.text, line.number) for _, line in chain_lines(Chain("s", [path]))] == whole_file_lines(path)
    assert items(path) == whole


@pytest.mark.parametrize("chunk", [5, 64, 1000, 1 << 20])
def test_awkward_bytes_split_as_the_whole_file_does(tmp_path: Path, chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """BOM, CRLF, `\\r` redraws, invalid UTF-8, NUL bytes, an over-long line, no final newline."""
    monkeypatch.setattr(reading, "READ_CHUNK", chunk)
    lines = [line.encode("utf-8") for line in mixed_log()]
    lines[0] = b"\xef\xbb\xbf" + lines[0]
    lines[3] += b"\r"
    lines[5] = b"junk\r" + lines[5]
    lines[8] = lines[8].replace(b"Epoch", b"Ep\x00och")
    lines[9] = b"\xff\xfe " + lines[9]
    lines.insert(20, b"x" * ((1 << 20) + 10) + b" loss: 1.0")  # cut by the reader
    path = tmp_path / "awkward.log"
    path.write_bytes(b"\n".join(lines))  # no final newline
    got = [(line.text, line.number) for _, line in chain_lines(Chain("s", [path]))]
    assert got == whole_file_lines(path)
    assert got[0][0].startswith("[INFO]") and got[20][0] == "x" * (1 << 20)


def test_a_rotated_chain_is_read_oldest_first_as_one_source(tmp_path: Path, fixed_clock: None) -> None:
    lines = mixed_log()
    (tmp_path / "info.log.1").write_text("\n".join(lines[:40]) + "\n", encoding="utf-8")
    (tmp_path / "info.log").write_text("\n".join(lines[40:]) + "\n", encoding="utf-8")
    (chain,) = chains([str(tmp_path / "info.log")])
    assert chain.files == [tmp_path / "info.log.1", tmp_path / "info.log"]
    single = tmp_path / "single.log"
    single.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def steps(found: list) -> List[Tuple[str, object]]:  # line numbers restart in each file: compare the rest
        return [(kind, data.get("step")) for kind, data in found]

    assert steps(list(parse_chain(chain, SourceParser(FORMATS)))) == steps(list(parse_chain(Chain("s", [single]), SourceParser(FORMATS))))


def line_by_line(path: Path, parser) -> Tuple[List[str], dict]:  # type: ignore[no-untyped-def]
    """The items and counts of feeding every line of a file to a parser, one by one, amends joined to their records
    as `mstail parse` joins them (`settled`)."""
    found = [item for text, number in whole_file_lines(path) for item in parser.feed(text, number, READ_TIME)]
    return [repr(item) for item in settled(found + parser.flush(READ_TIME, force=True))], parser.counts


#: Derived series the fast path must add as `InterleavedParser.feed` does: none; the built-in perplexity; and a
#: user's series reading a value only an amend brings (the progress line's samples/s), one reading another.
DERIVED = {
    "none": None,
    "perplexity": Derived(),
    "series": Derived(series=(compile_expression("tokens_per_s", "samples_per_s * 4096", {}),
                              compile_expression("tokens_per_loss", "tokens_per_s / loss", {}))),
}


@pytest.mark.parametrize("derived", list(DERIVED))
@pytest.mark.parametrize("chunk", [7, 100, 4096, 65536, 1 << 20])
@pytest.mark.parametrize("name", [p.name for p in LOGS] + ["mixed.log", "tagged.log"])
def test_the_block_fast_path_gives_what_feeding_every_line_gives(name: str, chunk: int, derived: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch, fixed_clock: None) -> None:
    """`mstail parse` (and the sidecar's catch-up) feed blocks of whole lines through `parsers.blocks.feed_block`,
    which feeds only the lines that may matter and matches step and progress lines itself (`parsers.hotlines`): the
    items, every count and the parser's state are those of feeding each line, whatever
    the block boundaries (a record waiting for its progress line, an open traceback, a skipped run at a boundary,
    a launcher-tagged rank's lines amid the file's own), with derived series or none (the fast path adds them to
    the main parser's items a block at a time)."""
    path = next((p for p in LOGS if p.name == name), tmp_path / name)
    if name == "mixed.log":
        path.write_text("\n".join(mixed_log()) + "\n", encoding="utf-8")
    elif name == "tagged.log":
        lines = [f"[rank1]: {line}" if n % 3 == 1 else line for n, line in enumerate(mixed_log())]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    one_by_one = InterleavedParser(lambda: SourceParser(FORMATS), DERIVED[derived])
    expected, counts = line_by_line(path, one_by_one)
    monkeypatch.setattr(reading, "READ_CHUNK", chunk)
    parser = InterleavedParser(lambda: SourceParser(FORMATS), DERIVED[derived])
    assert [repr(item) for item in parse_chain(Chain("s", [path]), parser)] == expected
    assert parser.counts == counts
    assert parser.snapshot_json() == one_by_one.snapshot_json()  # global steps, segment, last record, event steps


@pytest.mark.parametrize("events", [False, True])
@pytest.mark.parametrize("count", [0, 1, reading.WRITE_ROWS - 1, reading.WRITE_ROWS, reading.WRITE_ROWS + 1,
                                   2 * reading.WRITE_ROWS + 3])
def test_rows_written_in_batches_are_one_line_each(count: int, events: bool) -> None:
    """JSONL rows go out WRITE_ROWS to a `write`: every row is still one line, `dumps` of the ordered row, in order,
    however many rows (an event left out or kept, a launcher-tagged rank named as its own source), nothing held back."""
    items: List[Item] = []
    for n in range(count):
        data = {"step": n, "segment": 0, "line": n + 1, "loss": 1.0 / (n + 1), "lr": 1.5e-07, "note": None}
        if n % 5 == 1:
            data["_part"] = "rank3"
        items.append(Item("event", {"step": n, "kind": "checkpoint"}) if n % 7 == 3 else Item("record", data))
    expected = []
    for kind, data in items:
        if kind == "record" or events:
            source = "s/rank3" if "_part" in data else "s"
            expected.append(dumps(ordered({k: v for k, v in data.items() if k != "_part"}, source)) + "\n")
    written: List[str] = []
    part = reading._Part()
    reading.write_items([Item(kind, dict(data)) for kind, data in items], "s", part, "jsonl", written.append, [], events)
    assert "".join(written) == "".join(expected)
    assert part.written == len(expected)
    assert len(written) == -(-len(expected) // reading.WRITE_ROWS)  # whole batches: the last one not held back
