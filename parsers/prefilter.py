"""Which lines of a block can matter to a locked format, found at C speed.

Most lines of a big log matter to no rule (config dumps, monitor lines, grouped-lr lines, warnings). A format file
declares, per rule, a `literal`: text every line the rule matches holds (as lnav's and Fluent Bit's prefilters do).
Searching a whole block of bytes for those literals (all at once, `LineFinder`) finds the few lines
that may matter, so the others never reach per-line Python (`parsers.blocks.feed_block`). Declared, not derived: a
literal no match can lack is not something Python's public API can tell about a regex.
"""

from __future__ import annotations

import itertools
import re
from typing import TYPE_CHECKING, List, Optional, Sequence

import ahocorasick_rs

from .interleave import TAG_TEXTS

if TYPE_CHECKING:
    from .schema import Format

#: Lines whose text the line reader or the engine changes before any rule sees it (NUL bytes dropped, ANSI escapes
#: stripped), and lines a launcher tagged (they go to another part's parser).
ALWAYS = (b"\x00", b"\x1b") + TAG_TEXTS
#: Non-ASCII letters that `re.IGNORECASE` matches to an ASCII one ("ſ" is an "s", "K" a "k", "İ"/"ı" an "i"): a line
#: holding their UTF-8 bytes may hold a case-folded text that lowering the block (ASCII only) cannot show.
_FOLDS = {"i": b"\xc4", "k": "\u212a".encode("utf-8"), "s": "\u017f".encode("utf-8")}


class LineFinder:
    """Finds the lines of a block of whole lines (bytes, each ending with b"\\n") that hold one of some texts.

    Every text is searched in one pass over the block (Aho-Corasick, `ahocorasick_rs`: one automaton for all of them,
    a match reported once per place, in order), instead of one `bytes.find` pass per text: a format declares about
    twenty. A text to be found in any ASCII case is searched as each of its spellings in upper and lower case letters.

    Args:
        exact: byte strings searched as they are.
        folded: short lowercase ASCII byte strings searched in any case (each is 2**letters needles: "loss" is 16).
    """

    def __init__(self, exact: Sequence[bytes], folded: Sequence[bytes] = ()) -> None:
        self.exact = tuple(dict.fromkeys(exact))
        self.folded = tuple(dict.fromkeys(folded))
        needles = list(dict.fromkeys(self.exact + tuple(v for text in self.folded for v in _case_variants(text))))
        # One-byte texts (NUL, ESC, a folded letter's lead byte) are rare in a log, and looked for first by `in` (a
        # memchr): a block holding none is searched by an automaton without them, which runs about twice as fast
        # (they defeat its prefilter). A text a block does not hold changes nothing of what is found in it.
        self._bytes = tuple(needle for needle in needles if len(needle) == 1)
        self._automaton = _automaton(needles)
        self._without_bytes = _automaton([needle for needle in needles if len(needle) > 1])

    def starts(self, block: bytes, pos: int = 0) -> List[int]:
        """Offsets, in order, of the lines from `pos` (a line start) on that hold one of the texts."""
        found: List[int] = []
        automaton = self._automaton if any(byte in block for byte in self._bytes) else self._without_bytes
        if automaton is not None:
            rfind, find = block.rfind, block.find
            line_end = -1  # the end of the last line found: later matches on it add nothing
            for _, at, _ in automaton.find_matches_as_indexes(memoryview(block)[pos:]):
                at += pos
                if at > line_end:
                    found.append(rfind(b"\n", 0, at) + 1)
                    line_end = find(b"\n", at)
        return found


def _automaton(needles: List[bytes]) -> Optional[ahocorasick_rs.BytesAhoCorasick]:
    """One automaton for all of `needles` (None for none). Leftmost-first, no overlaps: a text overlapped by a match
    reported before it lies on that match's line (no text holds a newline), so every line holding a text has a match
    reported."""
    return ahocorasick_rs.BytesAhoCorasick(
        needles, matchkind=ahocorasick_rs.MatchKind.LeftmostFirst, implementation=ahocorasick_rs.Implementation.DFA,
    ) if needles else None


def _case_variants(text: bytes) -> List[bytes]:
    """Every spelling of lowercase ASCII `text` in upper and lower case letters ("ab": ab, aB, Ab, AB)."""
    return [bytes(spelling) for spelling in itertools.product(*[(b, b - 32) if 97 <= b <= 122 else (b,) for b in text])]


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
