"""`mstail parse` of one big file in pieces (`tailer.offline.split`): the output (JSONL and CSV, with and without
events) and the summary are those of one process, wherever the cuts fall, across relaunches (run segments),
checkpoints, tracebacks, records waiting for their progress line; a file whose seams never agree is parsed whole."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import pytest

from mstail.parsers import Format, load_formats
from mstail.parsers.amends import settled
from mstail.parsers.derived import Derived
from mstail.tailer.offline import Summary, output, parallel, reading, run_parse, split

from tests.parsers.support import FORMATS, READ_TIME, ROOT
from tests.tailer.test_offline_chains import LOGS, mixed_log, whole_file_lines

sys.path.insert(0, str(ROOT / "tests" / "bench"))
import parse_speed  # the bench's generator of realistic MindFormers logs


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 3 MB log cut as a 100 MB one is; lines without a timestamp get one read time in every process."""
    monkeypatch.setattr(reading.time, "time", lambda: READ_TIME)
    monkeypatch.setattr(split, "SPLIT_MIN_BYTES", 0)
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(split, "PROBE_BYTES", 256 << 10)
    monkeypatch.setattr(split, "PROBE_STEP", 2 << 10)


@pytest.fixture(scope="module")
def big_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chunk-boundary log (checkpoints and their saves, tracebacks, errors, an eval, a step whose progress line
    never comes, a relaunch: a run segment each time) 150 times, after a real start-up."""
    path = tmp_path_factory.mktemp("split") / "info.log"
    preamble = parse_speed._preamble("mindformers-2.0.0_graph_output_log_rank_0_info.log")
    path.write_text("\n".join(preamble + mixed_log() * 150) + "\n", encoding="utf-8")
    return path


def parse(path: Path, to: str, jobs: int, events: bool, formats: Sequence[Format] = FORMATS,
          derived: Optional[Derived] = None) -> Tuple[str, Summary]:
    out = io.StringIO()
    summary = run_parse([str(path)], formats, None, to, out, with_events=events, jobs=jobs, derived=derived)
    return out.getvalue(), summary


def seams(monkeypatch: pytest.MonkeyPatch) -> List[object]:
    """What `stitch` was asked to join (each parse's seams), recorded."""
    found: List[object] = []
    real = split.stitch

    def recorded(results):  # type: ignore[no-untyped-def]
        joins = real(results)
        found.append(joins)
        return joins

    monkeypatch.setattr(parallel, "stitch", recorded)
    return found


@pytest.mark.slow  # worker processes
@pytest.mark.parametrize("to,events", [("jsonl", True), ("jsonl", False), ("csv", True)])
@pytest.mark.parametrize("jobs", [2, 3, 5])
def test_pieces_write_what_one_process_writes(big_log: Path, to: str, events: bool, jobs: int,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    serial, serial_summary = parse(big_log, to, 1, events)
    joined = seams(monkeypatch)
    pieces, summary = parse(big_log, to, jobs, events)
    assert serial_summary.records > 3000 and '"segment":149' in parse(big_log, "jsonl", 1, False)[0]
    assert joined and all(joins is not None for joins in joined)  # every seam found: no parse again in one process
    assert all(join["segment"] for join in joined[0][1:])  # a piece after relaunches: its segments renumbered
    assert pieces == serial
    assert summary == serial_summary


@pytest.mark.slow  # worker processes
def test_pieces_joined_into_an_output_file_are_the_bytes_one_process_writes(big_log: Path, tmp_path: Path) -> None:
    """`-o OUT`: the pieces' JSONL goes onto the output file as bytes (segments renumbered), the same bytes as one
    process writes."""
    files = {}
    for jobs in (1, 2, 3):
        files[jobs] = tmp_path / f"out-{jobs}.jsonl"
        with output(str(files[jobs]), [big_log]) as out:
            run_parse([str(big_log)], FORMATS, None, "jsonl", out, with_events=True, jobs=jobs)
    serial = files[1].read_bytes()
    assert b'"segment":149' in serial
    assert files[2].read_bytes() == serial and files[3].read_bytes() == serial


@pytest.mark.slow  # worker processes
def test_every_cut_gives_the_same_output(big_log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cuts moved line by line over a step line, its progress line, a checkpoint block and a traceback."""
    serial, serial_summary = parse(big_log, "jsonl", 1, True)
    joined = seams(monkeypatch)
    text = big_log.read_bytes()
    middle = len(text) // 2
    places = [text.find(word, middle) for word in (b"Saving ckpt", b"Traceback", b"Eval result", b"Worker crashed")]
    for place in places:
        start = text.rfind(b"\n", 0, place - 500) + 1
        for cut in [start + i for i in range(1000) if text[start + i - 1:start + i] == b"\n"]:
            monkeypatch.setattr(split, "pieces", lambda chain, size, count, cut=cut: [
                split.Piece(chain, 0, 2, 0, cut), split.Piece(chain, 1, 2, cut, None)])
            pieces, summary = parse(big_log, "jsonl", 2, True)
            assert pieces == serial, cut
            assert summary == serial_summary
    assert len(joined) > 10 and all(joins is not None for joins in joined)


@pytest.mark.slow  # worker processes
@pytest.mark.parametrize("derived", [None, Derived()])
def test_a_file_whose_seams_never_agree_is_parsed_whole(derived: Optional[Derived], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A --pattern without a step group counts its lines as steps: a piece's parser cannot know the count. Parsed
    again whole, the file gets the derived series the pieces had (perplexity here)."""
    path = tmp_path / "plain.log"
    path.write_text("".join(f"loss={i % 10}\n" for i in range(60_000)), encoding="utf-8")
    formats = load_formats(patterns=[r"loss=(?P<loss>\d+)"], user_dir=tmp_path / "none")
    serial, serial_summary = parse(path, "jsonl", 1, True, formats, derived)
    joined = seams(monkeypatch)
    again, summary = parse(path, "jsonl", 2, True, formats, derived)
    assert joined == [None]
    assert ('"perplexity":' in serial) == (derived is not None)
    assert again.count('"perplexity":') == serial.count('"perplexity":')  # a short message, not a diff of 60,000 rows
    assert again == serial and summary == serial_summary and serial_summary.records == 60_000


def one_by_one(path: Path, events: bool) -> str:
    """The JSONL of feeding every line of a file to one parser, one by one (no block fast path, no pieces), amends
    joined to their records, written as `mstail parse` writes rows."""
    (chain,) = reading.chains([str(path)])
    parser = reading.new_parser(chain, FORMATS, None)
    fed = [item for text, number in whole_file_lines(path) for item in parser.feed(text, number, READ_TIME)]
    rows: List[str] = []
    reading.write_items(settled(fed + parser.flush(READ_TIME, force=True)), chain.source, reading._Part(), "jsonl",
                        rows.append, [], events)
    return "".join(rows)


@pytest.mark.slow  # worker processes
@pytest.mark.parametrize("name", ["big.log"] + [p.name for p in LOGS])
def test_pieces_write_what_feeding_every_line_writes(name: str, big_log: Path) -> None:
    """Every sample and real log, and the big chunk-boundary log, cut into pieces parsed through the block fast path
    (`parsers.blocks`, `parsers.hotlines`): the bytes of feeding each line in one process."""
    path = big_log if name == "big.log" else next(p for p in LOGS if p.name == name)
    for jobs in (2, 3):
        assert parse(path, "jsonl", jobs, True)[0] == one_by_one(path, True), jobs


@pytest.mark.parametrize("data", [b"", b"no newline", b"\n", b"\n" * 100_000, b"short\n" * 50_000, b"x" * 300 + b"\n",
                                  (b"a long log line " * 20 + b"\n") * 5_000 + b"tail",
                                  (b"a long log line " * 20 + b"\n") * 300 + b"\n" * 100_000])
def test_newlines_before_a_piece_are_counted_whatever_the_lines(data: bytes) -> None:
    """A piece's first line number counts the newlines before it, by memchr on long lines, by `count` on short ones:
    the same number either way, and on a mix of both."""
    assert split._newlines(data) == data.count(b"\n")
