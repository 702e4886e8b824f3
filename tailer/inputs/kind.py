"""The one interface an input kind implements, and the kinds there are.

An input kind turns one source's files into items (records, amends, events) in two halves:

- a `Follower` reads the files as pieces (lines, blocks of whole lines, event-file frames), survives rotation,
  truncation and replacement, reports its state and counters, and resumes from a checkpoint;
- a `Parser` turns the pieces into items, holds a record a later piece may still amend, and snapshots its state
  (the parser half of a `SourceCheckpoint`, taken only while it holds nothing).

The live pass (`mstail.tailer.live.sidecar`), the catch-up child (`mstail.tailer.live.catchup`) and `mstail parse`
(`mstail.tailer.offline.reading`) get both halves from `KINDS` (by `InputSpec`) and turn pieces into items with
`items_of` only. A new kind is one module with an object implementing `InputKind` (as `textlog` and `eventfiles`
do), added to `KINDS`, and its tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Union

from mstail.parsers import Format, Item
from mstail.parsers.blocks import feed_block
from mstail.parsers.derived import Derived
from mstail.parsers.engine import ParserState
from mstail.tailer.inputs.checkpoint import FollowerCheckpoint
from mstail.tailer.inputs.eventfiles import EVENTS
from mstail.tailer.inputs.frames import Frame
from mstail.tailer.inputs.lines import Block, Line
from mstail.tailer.inputs.peer import PEER, PeerMessage
from mstail.tailer.inputs.textlog import JSONL, TEXT

#: What a follower hands out: a line, a block of whole lines (`LineSplitter.feed(blocks=True)`), an event-file frame,
#: a node mstail's message (`inputs.peer`).
Piece = Union[Line, Block, Frame, PeerMessage]


@dataclass(frozen=True)
class InputSpec:
    """What a source is made from: its path and the settings its two halves need.

    Args:
        path: the file (or, for event files named as such, the folder holding them).
        source: the source's id (named in a slow user regex's warning).
        formats: the text formats in detection order (`parsers.load_formats`); default none.
        forced: the format every line is read with (`--format`, or JSONL's), None to detect one (default).
        derived: derived series added to every record (`--series`); default none.
        max_line_bytes: longer lines are cut; default 1 MiB.
        grace_s: how long a multi-line event (a traceback) waits for more lines; default 0.5 s.
        variant: what the kind needs to know beyond the path: for event files the kind their names say
            (`tensorboard`, `mindspore-summary`) or "" (known by content), for a node mstail its URL; default "".
        token: a node mstail's access token (the `peer` kind), None for none (default).
    """

    path: Path
    source: str = ""
    formats: Sequence[Format] = ()
    forced: Optional[Format] = None
    derived: Optional[Derived] = None
    max_line_bytes: int = 1 << 20
    grace_s: float = 0.5
    variant: str = ""
    token: Optional[str] = None


class Follower(Protocol):
    """Reads one source's files as pieces (`mstail.tailer.inputs.follower.FileFollower` is the model)."""

    path: Path
    #: a real folder the files read must stay in (a file found below a folder of runs), or None: any
    confine: Optional[str]
    #: "waiting", "active", "idle", "unreadable", ... (shown on the source's card)
    state: str
    #: why the path cannot be read, or None
    problem: Optional[str]
    #: bytes, lines, rotations, truncations and such, shown in /api/sources and /metrics
    counters: Dict[str, int]
    #: wall time of the newest data read, None before any
    last_data_time: Optional[float]
    #: the file being read now (its `splitter.next_number` is the next piece's number), None before one is open
    current: Any

    @property
    def source_path(self) -> Path:
        """The file the source is known by (for event files, the newest one)."""

    def read(self, budget: int, now: float, blocks: bool = False) -> Sequence[Piece]:
        """Up to about `budget` bytes of complete pieces, oldest first; never raises for IO trouble."""

    def may_have_news(self, rotation: bool = True, quiet: bool = False) -> bool:
        """Whether a stat shows something to read (`rotation`: a new file at the path too)."""

    def checkpoint(self) -> FollowerCheckpoint:
        """Where reading stands, to resume from after a restart."""

    def restore(self, checkpoint: FollowerCheckpoint) -> bool:
        """Resume at `checkpoint`; False when a file it was reading is gone (what it held cannot be read again)."""

    def close(self) -> None:
        """Close every file held open."""


class Parser(Protocol):
    """Turns one source's pieces into items (`mstail.parsers.interleave.InterleavedParser` is the model)."""

    @property
    def parts(self) -> Mapping[str, Any]:
        """Launcher-tagged parts seen (`[rank3]:` -> that part's parser); empty for most sources."""

    @property
    def main(self) -> Any:
        """The parser of the untagged lines (itself for a kind without parts)."""

    @property
    def format(self) -> Any:
        """The format recognised (with a `name`), None while none is."""

    @property
    def holding(self) -> bool:
        """Whether a record is held for a piece that may amend it (then no snapshot is a resume point)."""

    @property
    def emitted(self) -> int:
        """Items given out so far (a checkpoint's `emitted_at`)."""

    @property
    def counts(self) -> Dict[str, int]:
        """Counters (unmatched metric lines, undecodable frames, ...)."""

    @property
    def meta(self) -> Dict[str, Any]:
        """What the source's card shows beside the counters (format, total steps, ...)."""

    def feed(self, text: Any, number: int, now: float) -> List[Item]:
        """The items one piece's text (a line's str, a frame's payload bytes) completes."""

    def flush(self, now: float, force: bool = False) -> List[Item]:
        """Records held longer than their grace (all of them with `force`)."""

    def snapshot_json(self) -> str:
        """The parser's state as JSON (a checkpoint's parser half)."""

    def restore(self, state: ParserState) -> bool:
        """Resume from a snapshot; False when it names a format this parser does not know."""


class InputKind(Protocol):
    """One kind of input: its name, a line for `mstail formats`, and its two halves."""

    #: the kind's name (`KINDS`' key; what a folder walk calls a file: `RunFile.kind`)
    name: str
    #: its history may go to a catch-up child (`mstail.tailer.live.catchup`): a plain file of lines
    bulk: bool

    def follower(self, spec: InputSpec) -> Follower:
        """The follower of a source."""

    def parser(self, spec: InputSpec) -> Parser:
        """A parser for a source, at its start."""

    def splitter(self, spec: InputSpec) -> Any:
        """What splits a finished file's bytes into pieces (`mstail parse`): `.feed(data, blocks)`, `.pending_bytes`."""


#: The input kinds by name.
KINDS: Dict[str, InputKind] = {kind.name: kind for kind in (TEXT, JSONL, EVENTS, PEER)}


def items_of(parser: Parser, piece: Piece, now: float,
             on_error: Optional[Callable[[int, Exception], None]] = None) -> List[Item]:
    """The items a piece gives: a block of lines through `feed_block` (the fast path), a line or a frame through
    `parser.feed`. With `on_error`, a line the parser fails on is handed to it (number, exception) and skipped;
    default None: the exception propagates."""
    if isinstance(piece, Block):
        return feed_block(parser, piece.data, piece.number, now, piece.decode,  # type: ignore[arg-type]  # a text kind's
                          piece.start, on_error)                                 # parser: only its followers give blocks
    try:
        return parser.feed(piece.text, piece.number, now)
    except Exception as exc:  # a piece the parser cannot take is skipped and said (with on_error), not fatal
        if on_error is None:
            raise
        on_error(piece.number, exc)
        return []
