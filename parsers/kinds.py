"""Value converters for captured regex groups: the `type` of a field in a format file.

Every converter takes the captured text and returns a Python value, or raises ValueError. Numbers
are forgiving about the renderings real logs use: `[1.4372426]` (a shape-(1,) array), `  nan`
(padded), `1.e-05` / `0.` (numpy's array2string), `None` / `N/A` (no value -> None).
"""

from __future__ import annotations

import datetime
import functools
import math
import re
import time
from typing import Any, Callable, Dict, List, Optional, Union

Value = Union[int, float, str, None]

#: Words that mean "no value here" in MindFormers/MindSpore logs; they convert to None (JSON null).
NULL_WORDS = frozenset({"none", "n/a", "null", "unavailable", ""})

_BOOL_WORDS = {"true": 1, "false": 0, "1": 1, "0": 0, "yes": 1, "no": 0, "[ true]": 1, "[false]": 0}


def _bare(text: str, unit: str) -> str:
    """Strip whitespace, enclosing brackets and a trailing unit: ' [1.5] ' -> '1.5', '512ms' -> '512'."""
    text = text.strip()
    if unit and text.endswith(unit):
        text = text[: -len(unit)].rstrip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1].strip()
    return text


def fits(value: Value, text: str = "") -> bool:
    """Whether a converted value can be stored and charted: an int within 64 bits, a float that is finite or was
    written as infinite (`1` followed by 400 zeros becomes inf in `float()`: that is a value out of range, not an
    Infinity the log printed)."""
    if value.__class__ is int:
        return -(1 << 63) <= value < (1 << 63)
    if value.__class__ is float and (value == math.inf or value == -math.inf):
        return "inf" in text.lower()
    return True


def to_float(text: str, unit: str = "") -> Optional[float]:
    """'1.e-05' -> 1e-05, '[nan]' -> nan, 'inf' -> inf, 'None' -> None."""
    if not unit:
        try:
            # the common cases, at once: float() itself strips whitespace; `[1.5]` is a shape-(1,) array
            if "[" not in text:
                return float(text)
            bare = text.strip()
            if bare[:1] == "[" and bare[-1:] == "]":
                return float(bare[1:-1])
        except ValueError:
            pass
    bare = _bare(text, unit)
    if bare.lower() in NULL_WORDS:
        return None
    return float(bare)  # float() accepts nan/inf/Infinity/1.e-05/0. in any case


def to_int(text: str, unit: str = "") -> Optional[int]:
    """'  42' -> 42; '42.0' -> 42 (a float rendering of a whole number); 'None' -> None."""
    if not unit:
        try:
            return int(text)  # the common case, at once: int() itself strips whitespace
        except ValueError:
            pass
    bare = _bare(text, unit)
    if bare.lower() in NULL_WORDS:
        return None
    try:
        return int(bare)
    except ValueError:
        number = float(bare)
        if not number.is_integer():
            raise
        return int(number)


def to_bool(text: str, unit: str = "") -> Optional[int]:
    """'True' -> 1, 'False' -> 0 (numbers, so a bool can be charted); 'None' -> None."""
    bare = text.strip().lower()
    if bare in NULL_WORDS:
        return None
    if bare not in _BOOL_WORDS:
        raise ValueError(f"not a boolean: {text!r}")
    return _BOOL_WORDS[bare]


def to_str(text: str, unit: str = "") -> Optional[str]:
    return text.strip()


_DURATION = re.compile(r"^(?:(\d{1,12}) days?, )?(\d{1,12}):(\d\d):(\d\d)(?:\.\d{1,12})?$")  # bounded: linear


def to_duration_s(text: str, unit: str = "") -> Optional[float]:
    """`datetime.timedelta` renderings ('0:28:22', '1 day, 2:03:04') -> seconds."""
    match = _DURATION.match(text.strip())
    if not match:
        raise ValueError(f"not a duration: {text!r}")
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


#: Python logging's clock without its milliseconds, and the text it reads when every field is zero-padded: read
#: without strptime (about 20 µs a call, once per minute of a log), to the same datetime or the same ValueError.
_LOGGING_SECONDS = "%Y-%m-%d %H:%M:%S"
_PADDED_SECONDS = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}")


def parse_local_time(text: str, fmt: str) -> float:
    """A log timestamp (local time, no zone, as Python's logging writes it) -> unix seconds."""
    text = text.strip()
    if fmt == _LOGGING_SECONDS and _PADDED_SECONDS.fullmatch(text):
        parsed = datetime.datetime(int(text[:4]), int(text[5:7]), int(text[8:10]), int(text[11:13]), int(text[14:16]),
                                   int(text[17:19]))  # out of range (month 13, second 60): ValueError, as strptime
    else:
        parsed = datetime.datetime.strptime(text, fmt)
    return time.mktime(parsed.timetuple()) + parsed.microsecond / 1e6


_MINDSPORE_CLOCK = re.compile(r"^(\d{4}-\d\d-\d\d-\d\d:\d\d:\d\d)\.(\d{1,3})\.(\d{0,3})$")


def parse_mindspore_time(text: str) -> float:
    """MindSpore's logger clock `2026-01-20-03:15:44.908.089` -> unix seconds.

    MindSpore prints `str(round(msecs * 1000))` split after three digits, without zero padding, so 43.152 ms
    prints as `.431.52`: the digits concatenated are the microseconds (43152), whatever their count.
    """
    match = _MINDSPORE_CLOCK.match(text.strip())
    if not match:
        raise ValueError(f"not a MindSpore timestamp: {text!r}")
    return _mindspore_seconds(match.group(1), time.timezone) + int(match.group(2) + match.group(3)) / 1e6


@functools.lru_cache(maxsize=1024)
def _mindspore_seconds(text: str, zone: int) -> float:
    return time.mktime(datetime.datetime.strptime(text, "%Y-%m-%d-%H:%M:%S").timetuple())


CONVERTERS: Dict[str, Callable[[str, str], Value]] = {
    "float": to_float,
    "int": to_int,
    "bool": to_bool,
    "str": to_str,
    "duration": to_duration_s,
}

#: Converters whose first step, with no unit, is this builtin on the text as it is (what it accepts, it returns;
#: what it refuses raises ValueError or KeyError, and the converter itself decides).
PLAIN_BUILTINS: Dict[Callable[[str, str], Value], Callable[[str], Value]] = {
    to_float: float,
    to_int: int,
    # as logs print them; with the space before them a rule may take in (`overflow cond:(?P<overflow>...)`)
    to_bool: {"False": 0, "True": 1, "false": 0, "true": 1, " False": 0, " True": 1}.__getitem__,
}

#: Time formats accepted by a prefix's `time_format`: any strptime string, or one of these names.
NAMED_TIME_FORMATS: Dict[str, Callable[[str], float]] = {
    "mindspore": parse_mindspore_time,
    "unix": lambda text: float(text),
}


def time_parser(fmt: str) -> Callable[[str], float]:
    """The function turning a captured timestamp into unix seconds for a `time_format` setting.

    strptime is slow and a log has many lines per second, so the whole-second part is parsed once per second
    (cached) and a trailing `%f` fraction is added arithmetically.
    """
    if fmt in NAMED_TIME_FORMATS:
        return NAMED_TIME_FORMATS[fmt]
    if fmt.endswith("%f") and len(fmt) > 3:
        separator = fmt[-3]
        last: List[Any] = ["", 0, 0.0]  # the last minute parsed by `whole_seconds` ("2026-01-20 03:15:"), its zone, unix time
        whole_seconds = _cached_parser(fmt[:-3], last)

        def parse(text: str) -> float:
            head, found, fraction = text.strip().rpartition(separator)
            if not found or not fraction.isdigit() or len(fraction) > 6:
                return parse_local_time(text, fmt)
            if head[:-2] == last[0] and last[1] == time.timezone:  # `whole_seconds` inlined for the last minute
                seconds = head[-2:]
                if seconds.isdigit() and seconds < "62":
                    return last[2] + int(seconds) + int(fraction) / 10 ** len(fraction)
            return whole_seconds(head, time.timezone) + int(fraction) / 10 ** len(fraction)

        return parse
    cached = _cached_parser(fmt)
    return lambda text: cached(text, time.timezone)


def _cached_parser(fmt: str, last: Optional[list] = None) -> Callable[[str, int], float]:
    """`parse_local_time(text, fmt)` cached, by (text, zone). With `last` ([minute, zone, seconds]), the last minute
    parsed whole is kept there (`time_parser` adds a line's seconds to it without a call)."""
    # The zone is part of the key: local time means the zone in force (TZ may be changed and tzset() called).
    cached = functools.lru_cache(maxsize=1024)(lambda text, zone: parse_local_time(text, fmt))
    if not fmt.endswith(":%S"):
        return cached

    def by_minute(text: str, zone: int) -> float:
        # A big model logs a step every few seconds, so a per-second cache would miss on every step: the minute is
        # parsed once and its two-digit seconds are added (a zone's offset never changes within a minute).
        head, seconds = text[:-2], text[-2:]
        if head.endswith(":") and seconds.isdigit() and seconds < "62":
            minute = cached(head + "00", zone)
            if last is not None:
                last[:] = head, zone, minute
            return minute + int(seconds)
        return cached(text, zone)

    return by_minute
