"""Which lines of a block can matter to a locked format, found at C speed.

Most lines of a big log matter to no rule (config dumps, monitor lines, grouped-lr lines, warnings). A format file
declares, per rule, a `literal`: text every line the rule matches holds (as lnav's and Fluent Bit's prefilters do).
Searching a whole block of bytes for those literals (`bytes.find`, or `memchr` on a rare byte) finds the few lines
that may matter, so the others never reach per-line Python (`parsers.blocks.feed_block`). Declared, not derived: a
literal no match can lack is not something Python's public API can tell about a regex.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Set, Tuple

from .interleave import TAG_TEXTS

if TYPE_CHECKING:
    from .schema import Format

#: A needle is searched through its rarest byte (`memchr` speed, each hit checked in Python) when that byte occurs at
#: most this often per byte of log; else with `bytes.find` (a few GB/s, whatever the needle).
RARE_BYTE_RATE = 1 / 1000
_SAMPLE_BYTES = 1 << 18
#: Lines whose text the line reader or the engine changes before any rule sees it (NUL bytes dropped, ANSI escapes
#: stripped), and lines a launcher tagged (they go to another part's parser).
ALWAYS = (b"\x00", b"\x1b") + TAG_TEXTS
#: Non-ASCII letters that `re.IGNORECASE` matches to an ASCII one ("ſ" is an "s", "K" a "k", "İ"/"ı" an "i"): a line
#: holding their UTF-8 bytes may hold a case-folded text that lowering the block (ASCII only) cannot show.
_FOLDS = {"i": b"\xc4", "k": "\u212a".encode("utf-8"), "s": "\u017f".encode("utf-8")}


class LineFinder:
    """Finds the lines of a block of whole lines (bytes, each ending with b"\\n") that hold one of some texts.

    Args:
        exact: byte strings searched as they are.
        folded: lowercase ASCII byte strings searched in any case (in an ASCII-lowered copy of the block).
    """

    def __init__(self, exact: Sequence[bytes], folded: Sequence[bytes] = ()) -> None:
        self.exact = tuple(dict.fromkeys(exact))
        self.folded = tuple(dict.fromkeys(folded))
        # How each exact needle is searched, planned on the first block (a log's mix of bytes hardly changes):
        self._by_byte: Optional[Dict[int, List[Tuple[bytes, int]]]] = None  # rare byte -> (needle, its index there)
        self._whole: Tuple[bytes, ...] = ()  # needles searched whole

    def starts(self, block: bytes, pos: int = 0) -> List[int]:
        """Offsets, in order, of the lines from `pos` (a line start) on that hold one of the texts."""
        if self._by_byte is None:
            self._plan(block[pos:pos + _SAMPLE_BYTES])
        found: Set[int] = set()
        _search(block, self._whole, pos, found)
        for byte, needles in self._by_byte.items():  # type: ignore[union-attr]
            _search_by_byte(block, byte, needles, pos, found)
        if self.folded:
            _search(block.lower(), self.folded, pos, found)
        return sorted(found)

    def _plan(self, sample: bytes) -> None:
        counts = {byte: sample.count(byte) for byte in {b for needle in self.exact for b in needle}}
        self._by_byte, whole = {}, []
        for needle in self.exact:
            index = min(range(len(needle)), key=lambda i: counts[needle[i]])
            if counts[needle[index]] <= RARE_BYTE_RATE * max(len(sample), 1):
                self._by_byte.setdefault(needle[index], []).append((needle, index))
            else:
                whole.append(needle)
        self._whole = tuple(whole)


def _search(block: bytes, needles: Sequence[bytes], pos: int, found: Set[int]) -> None:
    find, rfind = block.find, block.rfind
    for needle in needles:
        at = find(needle, pos)
        while at >= 0:
            found.add(rfind(b"\n", 0, at) + 1)
            end = find(b"\n", at)
            at = find(needle, end + 1) if end >= 0 else -1  # one hit per line is enough


def _search_by_byte(block: bytes, byte: int, needles: Sequence[Tuple[bytes, int]], pos: int, found: Set[int]) -> None:
    """Lines holding one of `needles`, found through the rare byte each holds at its given index."""
    find, rfind, startswith = block.find, block.rfind, block.startswith
    at = find(byte, pos)
    while at >= 0:
        for needle, index in needles:
            if at - index >= pos and startswith(needle, at - index):
                found.add(rfind(b"\n", 0, at) + 1)
                at = find(b"\n", at)
                break
        at = find(byte, at + 1) if at >= 0 else -1


def line_finder(fmt: "Format", hint: str) -> Optional[LineFinder]:
    """A finder for every line that can make `fmt` give something or change state while no multi-line event is open:
    lines a record, attach or event rule can match (each declares its `literal`), lines naming an error level (a
    prefixed line at that level becomes an error event), lines holding `hint` in any case (the engine's test for an
    unmatched metric-looking line), and `ALWAYS`. None when lines cannot be told apart so: a JSONL format, a
    non-ignore rule without a literal, or a user's regex (its time limit may count a line in `slow_lines` even when
    no rule matches it)."""
    if fmt.jsonl or "" in fmt.error_levels:
        return None
    regexes = [prefix.regex for prefix in fmt.prefixes] + [rule.regex for rule in fmt.rules]
    if not all(isinstance(regex, re.Pattern) for regex in regexes):
        return None
    exact = [level.encode("utf-8") for level in fmt.error_levels] + list(ALWAYS)
    for rule in fmt.rules:
        if rule.kind == "ignore":
            continue  # a line only an ignore rule knows changes nothing
        if not rule.literal:
            return None
        exact += [text.encode("utf-8") for text in rule.literal]
    if not hint.isascii():
        return None
    exact += [lead for letter, lead in _FOLDS.items() if letter in hint.lower()]
    return LineFinder(exact, [hint.lower().encode("ascii")])
