"""One file holding several processes' lines, each tagged by its launcher: one parser per tag.

torchrun (`--tee`, and PyTorch's error output) starts every line of worker N with `[rankN]:` (or, with its
older default template, `[defaultN]:`); `mpirun --tag-output` with `[1,N]<stdout>:`. The ranks' lines
interleave, so a rank-3 traceback can be cut by a rank-0 step line. `InterleavedParser` strips the tag and
feeds each rank's lines to that rank's own `SourceParser`: a traceback groups with its own continuation
lines, steps never mix across ranks, and every item comes out marked with its part (`PART_KEY`: "rank3"),
which the caller turns into a source of its own. Untagged lines (the launcher's own, or a file with no tags
at all) go to the main parser and carry no mark, so a normal log parses exactly as with a `SourceParser`.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Optional, Tuple

from .derived import Derived, Deriver
from .engine import ParserState, SourceParser
from .record import PART_KEY, Item
from .schema import Format

#: launcher tags one file may hold (ranks of one job on one node are far fewer; a job of 1,024 ranks fits).
MAX_PARTS = 1024

_TAG = re.compile(r"^\[(?:(?P<word>rank|default)(?P<n>\d{1,9})\]|\d{1,9},(?P<mpi>\d{1,9})\]<std(?:out|err)>): ?")
#: What follows the "[" of a tag: "rank", "default" or a digit.
_TAG_SECOND = frozenset("rd0123456789")
#: Text every tagged line holds (`[rank3]:`, `[default3]:`, `[1,3]<stdout>:`): the fast path feeds such lines. Not the
#: shorter "]:": a two-byte needle of common bytes is searched at a third of the speed.
TAG_TEXTS = (b"[rank", b"[default", b"]<std")


def part_of(text: str) -> Optional[re.Match]:
    """The launcher's tag at the start of a line, if any."""
    # Most lines start otherwise, or with "[INFO]": two characters rule them out without running the regex.
    return _TAG.match(text) if text[:1] == "[" and text[1:2] in _TAG_SECOND else None


class InterleavedParser:
    """A `SourceParser` look-alike (feed, flush, holding, emitted, counts, snapshot, restore) that keeps one
    parser per launcher tag.

    Args:
        make: builds a fresh `SourceParser` (same formats, forced format and grace period for every part).
        derived: derived series added to every part's records and amends (`mstail.parsers.derived`); None = none.
    """

    def __init__(self, make: Callable[[], SourceParser], derived: Optional[Derived] = None) -> None:
        self._make = make
        self._derived = derived if derived is not None and not derived.empty else None
        self._derivers: Dict[Optional[str], Deriver] = {}  # part name (None: the main parser) -> its deriver
        self.main = make()
        self.parts: Dict[str, SourceParser] = {}
        #: lines whose tag would have made a part beyond MAX_PARTS: parsed by the main parser, tag and all
        self.overflow_lines = 0

    def route(self, text: str) -> Tuple[Optional[str], SourceParser, str]:
        """Where a line goes: its part's name (None: untagged), that part's parser, and the line without its tag."""
        tag = part_of(text)
        if tag is None:
            return None, self.main, text
        name = f"{tag['word'] or 'rank'}{tag['n'] or tag['mpi']}"
        parser = self.parts.get(name)
        if parser is None:
            if len(self.parts) >= MAX_PARTS:  # 20,000 tags must not become 20,000 sources
                self.overflow_lines += 1
                return None, self.main, text
            parser = self.parts[name] = self._make()
        return name, parser, text[tag.end():]

    def feed(self, text: str, line_no: int, now: float) -> List[Item]:
        name, parser, text = self.route(text)
        items = self._derive(name, parser.feed(text, line_no, now))
        return items if name is None else _marked(items, name)

    def flush(self, now: float, force: bool = False) -> List[Item]:
        out = self._derive(None, self.main.flush(now, force))
        for name, parser in self.parts.items():
            out += _marked(self._derive(name, parser.flush(now, force)), name)
        return out

    def derive_main(self, items: List[Item]) -> List[Item]:
        """The main parser's items (in order, as its `feed` gave them) with the derived series added, as `feed` adds
        them: for `parsers.blocks`, which feeds untagged lines to the main parser itself."""
        return self._derive(None, items)

    def _derive(self, name: Optional[str], items: List[Item]) -> List[Item]:
        if self._derived is None or not items:
            return items
        deriver = self._derivers.get(name)
        if deriver is None:
            deriver = self._derivers[name] = Deriver(self._derived)
        return deriver.apply(items)

    @property
    def holding(self) -> bool:
        return self.main.holding or any(parser.holding for parser in self.parts.values())

    @property
    def emitted(self) -> int:
        return self.main.emitted + sum(parser.emitted for parser in self.parts.values())

    @property
    def counts(self) -> Dict[str, int]:
        total = dict(self.main.counts)
        for parser in self.parts.values():
            for key, value in parser.counts.items():
                total[key] = total.get(key, 0) + value
        return total

    @property
    def format(self) -> Optional[Format]:
        """The main part's format, else the first tagged part's that has one."""
        for parser in (self.main, *self.parts.values()):
            if parser.format is not None:
                return parser.format
        return None

    @property
    def meta(self) -> Dict[str, Any]:
        return self.main.meta

    def snapshot(self) -> ParserState:
        state = self.main.snapshot()
        state.parts = {name: parser.snapshot() for name, parser in self.parts.items()}
        return state

    def snapshot_json(self) -> str:
        """`snapshot().to_json()` as text (`ParserState.dumps`), encoded from the parsers' states without copying
        them first: what a checkpoint keeps."""
        return self.main.state.dumps({name: parser.state for name, parser in self.parts.items()})

    def restore(self, state: ParserState) -> bool:
        parts = {name: self._make() for name in state.parts}
        if not all(parser.restore(state.parts[name]) for name, parser in parts.items()):
            return False
        if not self.main.restore(ParserState.from_json({**state.to_json(), "parts": {}})):
            return False
        self.parts = parts
        return True


def _marked(items: List[Item], name: str) -> List[Item]:
    for item in items:
        item.data[PART_KEY] = name
    return items
