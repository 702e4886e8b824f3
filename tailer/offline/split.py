"""One big file parsed by several processes, with the output one process writes.

The file is cut into pieces at line starts; each worker parses one piece with a fresh parser. A fresh parser does not
know what the lines before its piece left behind (the run segment, the last record, the format, an open traceback),
so each seam is checked: the worker of the next piece notes, early in its piece, where its parser held nothing and
what its state was then (`Probe`); the worker of the piece before reads on past its end until its own parser, holding
nothing either, is in that same state at one of those places (up to the run segment's number and the counts, which
only add up). From there both parsers give the same items, so the output is the first worker's up to that place and
the second's after it, its segments renumbered. One part of the state a fresh parser learns only late: the step of
the last event of a kind a rule takes its step from (`same_step_as`: a checkpoint's save, logged 1,000s of steps
apart). A place where the next piece's parser lacks it still counts if that parser met such an event before any
line that takes its step (then it knows what the other knows), which it tells when it has (`Probe.missing`).
Where no place agrees (a log whose state never converges: a `--pattern` that counts steps, launcher-tagged ranks),
the file is parsed again in one process: slower, never other.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from mstail.parsers import Format, Item
from mstail.parsers.amends import Settler
from mstail.parsers.derived import Derived

from mstail.tailer.inputs.lines import LineSplitter
from mstail.tailer.offline.output import byte_writer
from mstail.tailer.inputs.kind import Parser, items_of
from mstail.tailer.offline.reading import READ_CHUNK, Chain, _Part, new_parser, write_items

#: A file smaller than this is parsed by one process: a piece must be big enough to pay for its seam.
SPLIT_MIN_BYTES = 16 << 20
#: How far into its piece a worker notes places where the worker before may hand over (a seam needs the two parsers
#: to agree, which for a MindFormers log takes until the next checkpoint save: about 1,000 steps, 1-2 MB).
PROBE_BYTES = 8 << 20
#: Bytes read between two such places: the worker before reads at most this far past the place where the two parsers
#: came to agree. Not less: at 32 KiB (256 places) the window's small reads and states cost the later piece, the
#: critical path, about 4 % more CPU than at 256 KiB (32 places).
PROBE_STEP = 256 << 10
#: How long a worker waits for the next piece's places before it gives its seam up (the file is then parsed whole).
SEAM_WAIT_S = 600.0
_SEGMENT = re.compile(rb'"segment":(-?\d+)')


@dataclass
class Piece:
    """Bytes [start, end) of a one-file chain (end None: to the end of the file), the `index`-th of `count`."""

    chain: Chain
    index: int
    count: int
    start: int
    end: Optional[int]


@dataclass
class Probe:
    """A place in a piece where its parser held nothing: the offset of the next line, the parser's state there as it
    is compared (`comparable`), its run segment, and what had been counted and written by then."""

    offset: int
    state: str
    segment: int
    written: int
    records: int
    events: int
    unmatched: int
    #: event kinds whose last step the parser did not know here (left out of `state`); the place counts only if it
    #: met an event of each before any event that takes its step (`valid`)
    missing: List[str] = field(default_factory=list)
    valid: bool = True


@dataclass
class PieceResult:
    part: _Part
    probes: List[Probe] = field(default_factory=list)
    #: where this piece's parser agreed with the next piece's: (index of the next piece's probe, this piece's segment)
    seam: Optional[List[int]] = None


def pieces(chain: Chain, size: int, count: int) -> List[Piece]:
    """`chain` (one file of `size` bytes) cut into at most `count` pieces of about equal size, each starting a line."""
    path = chain.files[0]
    starts = [0]
    with open(path, "rb") as handle:
        for i in range(1, count):
            handle.seek(size * i // count)
            handle.readline()  # to the next line start
            at = handle.tell()
            if starts[-1] < at < size:
                starts.append(at)
    ends: List[Optional[int]] = [*starts[1:], None]
    return [Piece(chain, i, len(starts), start, end) for i, (start, end) in enumerate(zip(starts, ends))]


def comparable(parser: Parser, drop: Sequence[str] = ()) -> Optional[str]:
    """The parser's state as two parsers must share it for the same lines to give them the same items, or None when
    that cannot be told (launcher-tagged parts). Left out: the counts and the run segment (they add up), the
    segment of the last record, the steps of event kinds no rule of the format takes (`same_step_as`) and of those
    in `drop`."""
    if parser.parts or parser.main.format is None:
        return None
    state = parser.main.snapshot().to_json()
    del state["counts"], state["segment"]
    if state.get("last"):
        state["last"] = {key: value for key, value in state["last"].items() if key != "segment"}
    taken = set(takers(parser.main.format).values()) - set(drop)
    state["event_steps"] = {kind: step for kind, step in state["event_steps"].items() if kind in taken}
    return json.dumps(state, sort_keys=True)


def takers(fmt: Format) -> Dict[str, str]:
    """Event kind -> the event kind whose last step it takes (`same_step_as`)."""
    return {rule.event: rule.same_step_as for rule in fmt.rules if rule.same_step_as}


Following = List[Tuple[Probe, Set[str]]]  # places still missing some steps, each with those not learnt yet


def _follow(following: Following, items: List[Item], taking: Dict[str, str]) -> Following:
    """Places still missing some steps (each with those it has not learnt yet), after `items` (met after them): an
    event of a missing kind is learnt, an event that takes a step not learnt yet makes the place useless. Returns the
    places still missing some."""
    for kind, data in items:
        if kind != "event":
            continue
        for probe, unknown in following:
            if taking.get(data.get("kind")) in unknown:  # type: ignore[arg-type,operator]  # an event has a kind
                probe.valid = False
            unknown.discard(data.get("kind"))
    return [(probe, unknown) for probe, unknown in following if probe.valid and unknown]


def _probes_path(folder: str, piece: Piece) -> str:
    return os.path.join(folder, f"probes-{piece.chain.source.replace('/', '_')}-{piece.index}.json")


def parse_piece(
    piece: Piece, formats: Sequence[Format], forced: Optional[Format], to: str, write: Callable[[str], object],
    rows: List[dict], with_events: bool, progress: Optional[Callable[[int], object]], now: float, folder: str,
    derived: Optional[Derived] = None,
) -> PieceResult:
    """Parse one piece (see the module docstring); the next piece's places are read from, and this piece's written
    to, files in `folder`."""
    parser = new_parser(piece.chain, formats, forced, derived)
    # Amends joined to their records as in one process. At a seam both pieces' settlers hold the same open record
    # (their parsers agree on the last record), so this piece drops what it holds there and the next one writes it.
    settler = Settler()
    result = PieceResult(_Part())
    part = result.part
    path = piece.chain.files[0]
    try:
        with open(path, "rb") as handle:
            number = _lines_before(handle, piece.start)
            splitter = LineSplitter(piece.start, first_number=number + 1)

            following: Following = []  # see `_follow`
            published = piece.index == 0  # the first piece has no places to tell

            def take(until: Optional[int], step: int) -> Iterator[bool]:
                """Read and parse up to `until` (None: the end) in reads of `step` bytes; yields after each read."""
                nonlocal following
                while until is None or handle.tell() < until:
                    data = handle.read(step if until is None else min(step, until - handle.tell()))
                    if not data:
                        return
                    if progress is not None:
                        progress(len(data))
                    items: List[Item] = []
                    for line in splitter.feed(data, blocks=True):
                        items += items_of(parser, line, now)
                    if following:
                        following = _follow(following, items, takers(parser.main.format))
                    write_items(settler.push(items), piece.chain.source, part, to, write, rows, with_events)
                    yield True

            def publish() -> None:
                nonlocal published
                for probe, _ in following:
                    probe.valid = False  # never learnt what it missed: it cannot be told to agree
                _publish(result.probes, _probes_path(folder, piece))
                published = True

            handle.seek(piece.start)
            try:
                if piece.index > 0:
                    window = piece.start + PROBE_BYTES
                    window = window if piece.end is None else min(piece.end, window)
                    for _ in take(window, PROBE_STEP):
                        state = None if parser.holding else comparable(parser)
                        if state is not None:
                            fmt = parser.main.format
                            known = parser.main.state.event_steps
                            missing = sorted(set(takers(fmt).values()) - set(known))
                            probe = Probe(splitter.offset, state, parser.main.state.segment, part.written, part.records,
                                          part.events, parser.counts["unmatched_metric_lines"], missing)
                            result.probes.append(probe)
                            following += [(probe, set(missing))] if missing else []
                for _ in take(piece.end, PROBE_STEP if following else READ_CHUNK):
                    if not published and not following:
                        publish()
            finally:
                if not published:
                    publish()
            if piece.end is None:
                if splitter.pending_bytes:  # a finished log may end without a newline
                    write_items(settler.push([i for line in splitter.feed(b"\n") for i in items_of(parser, line, now)]),
                                piece.chain.source, part, to, write, rows, with_events)
                write_items(settler.push(parser.flush(now, force=True)) + settler.finish(), piece.chain.source, part, to,
                            write, rows, with_events)
            else:
                result.seam = _seam(piece, parser, splitter, take, folder)
    finally:
        part.format = parser.format.name if parser.format else "none"
        part.unmatched = parser.counts["unmatched_metric_lines"]
    return result


def _seam(piece: Piece, parser: Parser, splitter: LineSplitter, take: Callable[..., Iterator[bool]],
          folder: str) -> Optional[List[int]]:
    """Read on into the next piece up to the first of its places where this parser is in the state the next one was."""
    probes = _wait_for(_probes_path(folder, Piece(piece.chain, piece.index + 1, piece.count, 0, None)))
    for index, probe in enumerate(probes or ()):
        for _ in take(probe.offset, READ_CHUNK):
            pass
        if splitter.offset != probe.offset:
            return None  # the file ended before (it changed while parsed)
        if probe.valid and not parser.holding and comparable(parser, probe.missing) == probe.state:
            return [index, parser.main.state.segment]
    return None


def _lines_before(handle: Any, offset: int) -> int:
    """Lines (newlines) in the first `offset` bytes of a file."""
    count, left = 0, offset
    handle.seek(0)
    while left > 0:
        data = handle.read(min(READ_CHUNK * 4, left))
        if not data:
            break
        count += _newlines(data)
        left -= len(data)
    return count


def _newlines(data: bytes) -> int:
    """How many newlines `data` holds. The last piece's worker counts nearly all the file before it parses: on log
    lines that is the bytes taking the newlines out removes (found by memchr), about twice as fast as `count`, which
    looks at every byte; on short lines (under 32 bytes in its first 64 KiB), where a memchr call per line costs
    more, `count`."""
    sample = min(len(data), 1 << 16)
    if data.count(b"\n", 0, sample) * 32 > sample:
        return data.count(b"\n")
    return len(data) - len(data.replace(b"\n", b""))


def _publish(probes: List[Probe], path: str) -> None:
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump([asdict(probe) for probe in probes], handle)
    os.replace(temporary, path)  # whole or not at all: the worker before reads it once it is there


def _wait_for(path: str) -> Optional[List[Probe]]:
    deadline = time.monotonic() + SEAM_WAIT_S
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return None
        time.sleep(0.005)
    with open(path, encoding="utf-8") as handle:
        return [Probe(**probe) for probe in json.load(handle)]


def stitch(results: Sequence[PieceResult]) -> Optional[List[Dict[str, int]]]:
    """How to join the pieces' outputs: per piece, the rows to skip at its start and what to add to its segments; None
    when a seam was not found (the file must be parsed whole)."""
    plan = [{"skip": 0, "segment": 0}]
    for before, after in zip(results, results[1:]):
        if before.seam is None:
            return None
        index, segment = before.seam
        probe = after.probes[index]
        plan.append({"skip": probe.written, "segment": plan[-1]["segment"] + segment - probe.segment})
    return plan


def joined_part(results: Sequence[PieceResult]) -> _Part:
    """The counts of the joined output (each piece's from where it took over)."""
    part = _Part(format=results[-1].part.format)
    for before, after in zip([None, *results], results):
        probe = after.probes[before.seam[0]] if before is not None and before.seam is not None else None
        part.records += after.part.records - (probe.records if probe else 0)
        part.events += after.part.events - (probe.events if probe else 0)
        part.unmatched += after.part.unmatched - (probe.unmatched if probe else 0)
    return part


def copy_piece(path: str, skip: int, segment: int, out: Any) -> None:
    """A piece's JSONL (UTF-8) onto `out` (as `copy_jsonl` writes: bytes onto `mstail parse`'s own output stream, else
    text), its first `skip` lines left out, `segment` added to every record's run segment (the key `"segment":`
    cannot occur elsewhere in a row: inside a JSON string a quote is escaped)."""
    write = byte_writer(out)
    renumbered: Dict[bytes, bytes] = {}  # b'"segment":N' -> its shifted form (a piece has few segments)

    def shifted(found: "re.Match[bytes]") -> bytes:
        text = found[0]
        new = renumbered.get(text)
        if new is None:
            new = renumbered[text] = b'"segment":%d' % (int(found[1]) + segment)
        return new

    with open(path, "rb") as handle:
        for _ in range(skip):
            handle.readline()
        for chunk in iter(lambda: handle.read(READ_CHUNK) + handle.readline(), b""):
            write(_SEGMENT.sub(shifted, chunk) if segment else chunk)


def shift_rows(rows: List[dict], skip: int, segment: int) -> List[dict]:
    """A piece's CSV rows, as `copy_piece` does its JSONL."""
    kept = rows[skip:]
    if segment:
        for row in kept:
            if "segment" in row:
                row["segment"] += segment
    return kept
