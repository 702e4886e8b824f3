"""Many lines at once: the items a parser gives for a block of whole lines, without feeding it every line.

The fast path in front of `SourceParser.feed`, shared by `mstail parse` and the sidecar's catch-up (what a file
held when mstail reached it). Once the file's format is locked, the lines no rule can be about are found by
searching the block for the literals its rules declare (`prefilter`); each run of them is counted as `feed` would
count it and followed by the `flush(now)` such a line costs, and only the lines that may matter are decoded and
fed; of those, the step and progress lines are matched here (`hotlines`) and go straight to the engine's record path
(`SourceParser.feed_hot`). Every line is fed while the format is unknown, while a multi-line event (a traceback) is
open, and for a format whose lines cannot be told apart so (JSONL, a user's regexes).
"""

from __future__ import annotations

import weakref
from typing import Callable, Dict, List, Optional, Tuple, Union

from .engine import METRIC_HINT, SourceParser
from .hotlines import HotLines, hot_lines
from .interleave import InterleavedParser, part_of
from .prefilter import LineFinder, line_finder
from .record import Item
from .schema import Format
from .steplines import StepLines

#: A format's line finder (or None), hot lines (or None) and usual step lines (or None: it has no hot lines)
_Made = Tuple[Optional[LineFinder], Optional[HotLines], Optional[StepLines]]
#: id(format) -> what `_made_for` made of it, for as long as the format lives
_MADE: Dict[int, _Made] = {}


def _made_for(fmt: Format) -> _Made:
    key = id(fmt)
    if key not in _MADE:
        hot = hot_lines(fmt)
        _MADE[key] = line_finder(fmt, METRIC_HINT), hot, StepLines(hot) if hot is not None else None
        weakref.finalize(fmt, _MADE.pop, key, None)  # gone with the format, before its id can be reused
    return _MADE[key]


def finder_for(fmt: Format) -> Optional[LineFinder]:
    """The line finder of a format (made once per format), or None when every line must be fed."""
    return _made_for(fmt)[0]


def feed_block(
    parser: Union[InterleavedParser, SourceParser], block: bytes, line_no: int, now: float,
    decode: Callable[[bytes, int], str], offset: int = 0, on_error: Optional[Callable[[int, Exception], None]] = None,
) -> List[Item]:
    """The items (and counts) that feeding the block's lines to `parser` one by one gives, faster.

    Args:
        parser: the source's parser: an `InterleavedParser` (untagged lines go to its main `SourceParser`, tagged
            ones are always fed) or a `SourceParser`.
        block: whole lines, each ending with b"\\n", as read from the file (valid UTF-8, none over the length limit).
        line_no: the number of the block's first line.
        now: as for `feed` (one read time for the whole block).
        decode: a line's bytes (without the newline) and its file offset -> its text, as the line reader hands
            it out (`LineSplitter.decode`).
        offset: the block's offset in its file.
        on_error: called with a line's number and the exception when feeding it raised, and parsing goes on;
            default None: the exception propagates.
    """
    main = parser.main if isinstance(parser, InterleavedParser) else parser
    feed = parser.feed
    out: List[Item] = []
    pos, size = 0, len(block)
    find = block.find

    def feed_next() -> None:
        """Feed the line at `pos` and move past it."""
        nonlocal pos, line_no
        end = find(b"\n", pos)
        try:
            out.extend(feed(decode(block[pos:end], offset + pos), line_no, now))
        except Exception as exc:  # the caller decides what a line the parser fails on costs
            if on_error is None:
                raise
            on_error(line_no, exc)
        pos, line_no = end + 1, line_no + 1

    while pos < size and main.format is None:  # every line, until a line locks the format
        feed_next()
    finder, hot, steps = _made_for(main.format) if main.format is not None else (None, None, None)
    if finder is None:
        while pos < size:  # a format whose lines cannot be told apart (or none locked): every line
            feed_next()
        return out
    # An untagged line goes to the main parser straight away; its items join `pending`, which gets the derived
    # series (`InterleavedParser.derive_main`) in one call before anything else joins `out`: the same items as
    # `parser.feed` line by line gives, with fewer calls per line.
    main_feed, feed_hot = main.feed, main.feed_hot
    hot_match = hot.match if hot is not None else None
    take = steps.take if steps is not None else None
    interleaved = isinstance(parser, InterleavedParser)
    pending: List[Item] = []
    pending_line = line_no  # the last line whose items are in `pending`

    def settle() -> None:
        """`pending`, with its derived series, onto `out` (a failure is the last such line's, as `feed` would say)."""
        nonlocal pending
        items, pending = pending, []
        try:
            out.extend(parser.derive_main(items) if interleaved else items)  # type: ignore[union-attr]  # interleaved: an InterleavedParser
        except Exception as exc:  # as in `feed_next`
            if on_error is None:
                raise
            on_error(pending_line, exc)

    counts = main.counts  # the state's own dict: feeding lines never replaces it
    collecting = main.collecting  # read again after a line is fed: `feed_hot` never opens a multi-line event
    for start in finder.starts(block, pos):
        if collecting and pos < start:  # an open multi-line event takes whatever line comes next
            if pending:
                settle()
            while main.collecting and pos < start:
                feed_next()
            collecting = main.collecting
            if pos > start:
                continue  # the event took this line too
        if start > pos:
            # The lines before the next that may matter are only counted, as `feed` counts a line no rule matches.
            # (The `flush(now)` such a line ends with emits nothing: no multi-line event is open here.)
            skipped = block.count(b"\n", pos, start)
            counts["lines"] += skipped
            pos, line_no = start, line_no + skipped
        end = find(b"\n", pos)
        text = decode(block[pos:end], offset + pos)
        if interleaved and part_of(text) is not None:  # a launcher-tagged line: its part's parser, in line order
            if pending:
                settle()
            feed_next()
            collecting = main.collecting
            continue
        fed = True  # whether the line reached `feed` (then it may have opened a multi-line event)
        try:
            # A usual step or progress line is made into items here (`StepLines`); another one the engine would
            # take by its record path is matched here and handed to it; any other line, and any while a
            # multi-line event is open, is fed.
            found = None
            if take is not None and not collecting and "\x1b" not in text:
                found = take(main, text, line_no, now)
                fed = found is None
            if fed:
                taken = hot_match(text) if hot_match is not None and not collecting and "\x1b" not in text else None
                found = main_feed(text, line_no, now) if taken is None else feed_hot(*taken, line_no, now)
                fed = taken is None
        except Exception as exc:  # as in `feed_next`
            if on_error is None:
                raise
            on_error(line_no, exc)
        else:
            if found:
                pending += found
                pending_line = line_no
        if fed:
            collecting = main.collecting
        pos, line_no = end + 1, line_no + 1
    if pending:
        settle()
    while main.collecting and pos < size:
        feed_next()
    if pos < size:  # the lines after the last that may matter: counted
        main.counts["lines"] += block.count(b"\n", pos, size)
    return out
