"""Literal text a regex cannot match without, and the fast search for lines that may hold it.

Most lines of a big log matter to no rule (config dumps, monitor lines, warnings). Searching a whole block
of bytes for each rule's mandatory literal (`bytes.find` runs at gigabytes per second) finds the few lines
that may matter, so the others never reach per-line Python (`SourceParser.feed_block`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Set, Tuple

if TYPE_CHECKING:
    from .schema import Format

try:  # Python 3.11+
    from re import _constants as _sre  # type: ignore[attr-defined]
    from re import _parser as _sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.9/3.10
    import sre_constants as _sre  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

_REPEATS = {_sre.MAX_REPEAT, _sre.MIN_REPEAT, getattr(_sre, "POSSESSIVE_REPEAT", _sre.MAX_REPEAT)}
_ATOMIC = getattr(_sre, "ATOMIC_GROUP", None)
#: Non-ASCII characters that `re.IGNORECASE` matches to an ASCII letter ("ſ" is an "s"): lines holding their UTF-8
#: bytes (the lead byte where it is rare enough) are searched for as well, so lowering a block (ASCII only) loses none.
_FOLDS = {"i": b"\xc4", "k": b"\xe2\x84\xaa", "s": b"\xc5"}


class Literal(NamedTuple):
    """Text every match contains; `folded` when it matches in any case (then it is lowercase ASCII)."""

    text: str
    folded: bool


def literals(regex: "re.Pattern[str]") -> List[Literal]:
    """The runs of literal characters every match of `regex` contains (empty when none can be told)."""
    ignore_case = bool(regex.flags & re.IGNORECASE)
    try:
        parsed = _sre_parse.parse(regex.pattern, regex.flags)
    except Exception:  # noqa: BLE001 - an internal parser that disagrees with re.compile: no literal, no harm
        return []
    return [run for run in _runs(parsed, ignore_case) if run.text]


def _runs(items: Iterable[Tuple[object, object]], folded: bool) -> List[Literal]:
    """Runs of consecutive LITERALs in a sequence (groups opened in place); anything else ends a run."""
    runs: List[Literal] = []
    current: List[str] = []
    current_folded = folded

    def cut() -> None:
        if current:
            text = "".join(current)
            if current_folded:
                text = text.lower() if text.isascii() else ""  # non-ASCII case folding: not searchable in bytes
            runs.append(Literal(text, current_folded))
            current.clear()

    for op, arg, case in _opened(items, folded):
        if op is _sre.LITERAL:
            if case != current_folded:
                cut()
                current_folded = case
            current.append(chr(arg))  # type: ignore[arg-type]
            continue
        cut()
        if op in _REPEATS and arg[0] >= 1:  # type: ignore[index]
            runs.extend(_runs(arg[2], case))  # type: ignore[index] - repeated at least once: its literals are there
        # Anything else (a class, an alternative, an anchor, a lookaround) leaves no literal certain.
    cut()
    return runs


def _opened(items: Iterable[Tuple[object, object]], folded: bool) -> Iterator[Tuple[object, object, bool]]:
    """The items with groups replaced by their contents (a group is plain concatenation), each with its case mode."""
    for op, arg in items:
        if op is _sre.SUBPATTERN:
            _, add, remove, sub = arg  # type: ignore[misc]
            yield from _opened(sub, (folded or bool(add & re.IGNORECASE)) and not remove & re.IGNORECASE)
        elif _ATOMIC is not None and op is _ATOMIC:
            yield from _opened(arg, folded)  # type: ignore[arg-type]
        else:
            yield op, arg, folded


#: A needle is searched through its rarest byte (`memchr` speed, each hit checked in Python) when that byte occurs
#: at most this often per byte of log; else with `bytes.find` (a few hundred MB/s... GB/s, whatever it holds).
RARE_BYTE_RATE = 1 / 1000
_SAMPLE_BYTES = 1 << 18


class LineFinder:
    """Finds the lines of a block of whole lines (bytes, each ending with b"\\n") that hold one of some literals.

    Args:
        exact: byte strings searched as they are.
        folded: lowercase ASCII byte strings searched in any case (in an ASCII-lowered copy of the block).
    """

    def __init__(self, exact: Sequence[bytes], folded: Sequence[bytes]) -> None:
        self.exact = tuple(dict.fromkeys(exact))
        self.folded = tuple(dict.fromkeys(folded))
        # How each exact needle is searched, planned on the first block (a log's byte mix hardly changes):
        self._by_byte: Optional[Dict[int, List[Tuple[bytes, int]]]] = None  # rare byte -> (needle, its index there)
        self._whole: Tuple[bytes, ...] = ()  # needles searched whole

    def starts(self, block: bytes, pos: int = 0) -> List[int]:
        """Offsets, in order, of the lines from `pos` (a line start) on that hold a literal."""
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
    """Lines holding one of `needles`, found through the rare byte they hold at their given index."""
    find, rfind, startswith = block.find, block.rfind, block.startswith
    at = find(byte, pos)
    while at >= 0:
        for needle, index in needles:
            if at - index >= pos and startswith(needle, at - index):
                found.add(rfind(b"\n", 0, at) + 1)
                at = find(b"\n", at)
                break
        at = find(byte, at + 1) if at >= 0 else -1


def line_finder(fmt: "Format", also: Sequence["re.Pattern[str]"] = ()) -> Optional[LineFinder]:
    """A finder for every line that can make `fmt` produce something or change state when no multi-line event is
    open: lines a record, attach or event rule can match, lines at an error level, lines any of `also` can match,
    and lines whose text the reader or the engine joins (NUL bytes, ANSI escapes). None when that cannot be told
    from literals (a JSONL format, a rule with no literal)."""
    if fmt.jsonl or "" in fmt.error_levels:
        return None
    needles = [Literal(level, False) for level in fmt.error_levels]
    for regex in also:
        found = _searchable(regex)
        if not found:
            return None
        needles.append(_best(found))
    for rule in fmt.rules:
        if rule.kind == "ignore":
            continue  # a line only an ignore rule knows changes nothing
        found = _searchable(rule.regex)
        if any("\n" in run.text for run in found):
            continue  # lines hold no newline: this rule never matches
        if not found:
            return None
        if not any(_covers(needle, run) for needle in needles for run in found):
            needles.append(_best(found))
    exact = [n.text.encode("utf-8") for n in needles if not n.folded] + [b"\x00", b"\x1b"]
    folded = [n.text.encode("ascii") for n in needles if n.folded]
    exact += [lead for letter, lead in _FOLDS.items() if any(letter in n.text for n in needles if n.folded)]
    return LineFinder(exact, folded)


def _searchable(regex: "re.Pattern[str]") -> List[Literal]:
    """The literals of `regex` that a line's bytes hold whenever its text does (not U+FFFD: the reader makes it
    of invalid bytes)."""
    return [run for run in literals(regex) if "\ufffd" not in run.text]


def _best(runs: Sequence[Literal]) -> Literal:
    """The longest run: the most selective, and the fastest to search (a long needle lets the search skip more)."""
    return max(runs, key=lambda run: (not run.folded, len(run.text.encode("utf-8"))))


def _covers(needle: Literal, run: Literal) -> bool:
    """Whether every line holding `run` is found by searching for `needle` already."""
    if needle.folded:
        return needle.text in run.text.lower()
    return not run.folded and needle.text in run.text
