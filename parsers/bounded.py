"""A user's regexes, bounded in time: a format file's (`--formats`, the user folder) or `--pattern`'s regex runs on
the third-party `regex` module with a timeout, so one that backtracks catastrophically on some line costs at most
`BUDGET_S` per call instead of freezing the sidecar. (`regex` copes with some such patterns by itself: `(a+)+b$` on
forty `a`s, days in `re`, takes it a millisecond; `(a|aa)+b$` is exponential in both and runs into the limit.)

`regex` is `re`'s syntax and semantics (its default VERSION0 mode) plus `timeout=` on every call, raising
TimeoutError; with `concurrent=True` it releases the GIL while it matches, so the web server and Ctrl-C go on
meanwhile. A user's regex is still checked with `re` first: what a format file may contain is Python `re` syntax, as
the README says, and a bad one is the same one-line FormatError as ever.

The built-in formats stay on `re`: a line costs about a third of what it costs on `regex` with a timeout (which reads
the process's CPU clock on every call), and their regexes are written to run in linear time, which
tests/parsers/test_regex_bounds.py holds on adversarial lines up to the 1 MiB line cap.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Mapping

#: Seconds one call of a user's regex may take on one line, as the `regex` module counts them: CPU time of the
#: process (a loaded machine stretches it in wall time). Ample for a regex that is linear on a 1 MiB line (a copy of
#: the built-in step rule: 5-30 ms on adversarial ones), small enough that a line on which every rule backtracks
#: without end costs a fraction of a second per rule.
BUDGET_S = 0.1


class BoundedPattern:
    """A compiled user regex whose calls give up after `budget_s` (TimeoutError) and release the GIL while they run.

    It offers what the loader and the engine use of a `re.Pattern`: `pattern`, `groupindex`, `groups`, and `search`,
    `match`, `fullmatch`, `finditer` taking the text (the budget of `finditer` covers the whole iteration).
    """

    __slots__ = ("pattern", "groupindex", "groups", "budget_s", "search", "match", "fullmatch", "finditer")

    def __init__(self, compiled: Any, budget_s: float = BUDGET_S) -> None:
        self.pattern: str = compiled.pattern
        self.groupindex: Mapping[str, int] = compiled.groupindex
        self.groups: int = compiled.groups
        self.budget_s = budget_s
        bound = {"timeout": budget_s, "concurrent": True}
        self.search = functools.partial(compiled.search, **bound)
        self.match = functools.partial(compiled.match, **bound)
        self.fullmatch = functools.partial(compiled.fullmatch, **bound)
        self.finditer = functools.partial(compiled.finditer, **bound)

    def __repr__(self) -> str:
        return f"BoundedPattern({self.pattern!r}, budget_s={self.budget_s})"


def compile_bounded(pattern: str, budget_s: float = BUDGET_S) -> BoundedPattern:
    """`pattern` (Python `re` syntax) compiled for bounded calls; raises `re.error` as `re.compile` would, or
    `re.error` too when `regex` refuses a pattern that `re` takes (none is known)."""
    import regex  # here: a training process importing mstail.parsers.record never loads it

    re.compile(pattern)
    try:
        compiled = regex.compile(pattern, regex.VERSION0)  # VERSION0: `re`'s behaviour, whatever regex's default
    except regex.error as exc:  # pragma: no cover - no pattern `re` accepts is known to fail here
        raise re.error(f"{exc} (the regex module, which runs user regexes with a time limit)") from None
    return BoundedPattern(compiled, budget_s)
