"""One-line notices for a person watching stderr: each said once per key and interval, repeats counted.

A sidecar left running for days must neither hide a problem nor repeat it on every pass: the first time a key
(a file and what is wrong with it) comes up it is logged; while it keeps coming up it is logged again at most
once per `every` seconds, with how often it happened in between.
"""

from __future__ import annotations

import logging
import shlex
import time
from pathlib import Path
from typing import Callable, Dict, Hashable, Tuple


class Notices:
    """Rate-limited notices through `log`.

    Args:
        log: where notices go (the CLI shows the `mstail` loggers' INFO and above on stderr).
        every: seconds before the same key is said again; default 600.
        clock: monotonic seconds; default `time.monotonic`.
    """

    def __init__(self, log: logging.Logger, every: float = 600.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.log, self.every, self.clock = log, every, clock
        self._said: Dict[Hashable, Tuple[float, int]] = {}  # key -> (when last said, repeats since)

    def say(self, key: Hashable, message: str, level: int = logging.WARNING) -> bool:
        """Log `message` unless `key` was said less than `every` seconds ago; True when it was logged."""
        now = self.clock()
        last = self._said.get(key)
        if last is not None and now - last[0] < self.every:
            self._said[key] = (last[0], last[1] + 1)
            return False
        repeats = f" (and {last[1]} more times since)" if last is not None and last[1] else ""
        self.log.log(level, "%s%s", message, repeats)
        self._said[key] = (now, 0)
        if len(self._said) > 10_000:  # bounded: the oldest keys go first
            self._said.pop(next(iter(self._said)))
        return True

    def forget(self, key: Hashable) -> None:
        """The problem is over: the next time it comes up is said at once."""
        self._said.pop(key, None)


def no_format_hint(path: Path, unmatched: int) -> str:
    """What to try for a log no format matches (`serve` and `mstail parse` say the same)."""
    looks = ("no format matches and no line looks like a metric" if not unmatched else
             f"{unmatched} lines look like metrics but no format matches" if unmatched > 1 else
             "1 line looks like a metric but no format matches")
    return f"{looks}; try `mstail parse {shlex.quote(str(path))} --explain`, or --pattern 'REGEX' with named groups"
