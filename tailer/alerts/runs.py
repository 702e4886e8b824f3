"""A run of one source's records judged a rule at a time (`AlertEngine.observe_all`): the run's values a key at a
time (`Columns`), and each record rule's verdicts over them (`Verdicts`: which records it judged, at which it fired,
their messages), its state brought to the run's end; the engine turns them into alert changes as judging each record
in turn would (`AlertEngine._settle`).

A windowed rule (loss_spike, grad_norm) fires only above a bound of its window's median; every median of a run is at
least the lowest value any of its windows holds (the window before the run and the run's values), so the values at
or below that bound of it only join the window, and only the others are judged one by one.
"""

from __future__ import annotations

import math
from itertools import repeat
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

if TYPE_CHECKING:
    from mstail.tailer.alerts.engine import _SourceState, _Window

#: How close (relative) to a bound a value is judged exactly: a rule's bound is rounded as its check is not.
MARGIN = 1e-9


def number(value: Any) -> Optional[float]:
    """A record value as a float (NaN/Inf included: the store keeps them as floats); None when not a number, or
    an int beyond the float range."""
    if type(value) is float:  # most values: this runs for several keys of every record
        return value
    try:
        return float(value) if isinstance(value, (int, float)) else None
    except OverflowError:
        return None


class Columns:
    """A run of records' values, a key at a time, as `number` reads them, made once per key."""

    def __init__(self, records: Sequence[Dict[str, Any]]) -> None:
        self.records = records
        self._made: Dict[str, Tuple[List[Any], bool, bool]] = {}

    def numbers(self, key: str) -> Tuple[List[Any], bool, bool]:
        """The values of `key` as floats (None: no number), whether every record held a number there, and whether
        every record held a finite one."""
        made = self._made.get(key)
        if made is None:
            values = list(map(dict.get, self.records, repeat(key)))
            kinds = set(map(type, values))
            numbers: Optional[List[Any]] = None
            if kinds <= {float}:
                numbers = values
            elif kinds <= {float, int}:  # anything else (a bool, a text, None) goes through `number` one by one
                try:
                    numbers = list(map(float, values))  # type: ignore[arg-type]  # ints and floats: no None
                except OverflowError:  # an int beyond the float range is no number to `number`
                    pass
            if numbers is not None:
                made = numbers, True, all(map(math.isfinite, numbers))
            else:
                numbers = list(map(number, values))
                made = numbers, None not in numbers, None not in numbers and all(map(math.isfinite, numbers))
            self._made[key] = made
        return made

    def finite(self, key: str) -> Tuple[Sequence[int], List[float]]:
        """The positions of the records holding a finite number at `key`, and those numbers."""
        values, _, finite = self.numbers(key)
        if finite:
            return range(len(values)), values
        at = [position for position, value in enumerate(values) if value is not None and math.isfinite(value)]
        return at, [values[position] for position in at]

    def nonfinite(self, key: str) -> bool:
        """Whether a record holds a NaN or an infinity at `key`."""
        values, every, finite = self.numbers(key)
        if finite or every:
            return not finite
        return any(value is not None and not math.isfinite(value) for value in values)


#: A rule's verdicts on a run: the positions of the records it judged; which of them it fired at (None: none); the
#: message of the k-th judged record (asked where it fired only).
Verdicts = Tuple[Sequence[int], Optional[List[bool]], Callable[[int], str]]


def window_verdicts(values: Tuple[Sequence[int], List[float]], window: _Window, bound: Callable[[float], float],
                     judge: Callable[[_Window, float], str]) -> Verdicts:
    """A windowed rule (loss_spike, grad_norm) on a run's finite `values` (positions, numbers): the numbers at or
    below `bound` of the lowest number any of their windows can hold (which bounds every median below, so they
    cannot fire) only join the window; the others are judged one by one (`judge`, which appends them)."""
    at, listed = values
    if not listed:
        return at, None, str
    low = min(listed[:-1]) if len(listed) > 1 else math.inf
    if len(window):
        low = min(low, window.sorted[0])
    limit = bound(low) if math.isfinite(low) else -math.inf
    limit = limit - abs(limit) * MARGIN if math.isfinite(limit) else limit
    if max(listed) <= limit:
        window.extend(listed)
        return at, None, str
    firing, messages, start = [False] * len(listed), {}, 0
    for k in [k for k, value in enumerate(listed) if value > limit]:
        if k > start:
            window.extend(listed[start:k])
        message = judge(window, listed[k])
        if message:
            firing[k] = True
            messages[k] = message
        start = k + 1
    if start < len(listed):
        window.extend(listed[start:])
    return at, firing, messages.__getitem__


def spike_bound(rule: Dict[str, Any]) -> Callable[[float], float]:
    """The loss value at or below which no spike is possible when every window value is at least `low`."""
    if rule["method"] == "mean_ratio":  # the mean is at least the lowest value (within a rounding: `MARGIN`)
        return lambda low: rule["ratio"] * low if low > 0 else -math.inf
    if rule["min_rel"] <= 1:  # median + min_rel * |median| grows with the median
        return lambda low: low + rule["min_rel"] * abs(low)
    return lambda low: -math.inf  # it does not: judge each


def norm_bound(rule: Dict[str, Any]) -> Callable[[float], float]:
    """The grad norm at or below which the rule cannot fire when every window value is at least `low`."""
    absolute = rule["absolute"] if rule["absolute"] > 0 else math.inf
    return lambda low: min(rule["ratio"] * max(low, 0.0), absolute)


def overflow_verdicts(state: _SourceState, records: Sequence[Dict[str, Any]], streak: int,
                      message: Callable[[int], str]) -> Verdicts:
    """The overflow rule: `streak` records in a row with overflow (`message`: of a run of that many)."""
    values = list(map(dict.get, records, repeat("overflow")))
    if set(map(type, values)) <= {int, float, bool} and not any(values):  # no overflow at all (NaN is one)
        state.overflow_run = 0
        return range(len(values)), None, message
    at: List[int] = []
    firing: List[bool] = []
    runs: Dict[int, int] = {}
    for position, value in enumerate(values):
        if value is not None:
            state.overflow_run = state.overflow_run + 1 if number(value) else 0
            if state.overflow_run >= streak:
                runs[len(at)] = state.overflow_run
            at.append(position)
            firing.append(state.overflow_run >= streak)
    return at, firing, lambda k: message(runs[k])


def scale_verdicts(state: _SourceState, values: Tuple[Sequence[int], List[float]], floor: float,
                   message: Callable[[float, float, float], str]) -> Verdicts:
    """The loss_scale rule: it fell, it was above the `floor` before (the highest so far) and is at it or below
    (`message`: of the scale, the floor and the highest scale)."""
    at, listed = values
    if not listed:
        return at, None, str
    before = state.max_scale
    armed = before is not None and before > floor
    if armed and max(listed) <= floor:
        firing: Optional[List[bool]] = [True] * len(listed)
    elif not armed and max(listed) <= floor or min(listed) > floor:
        firing = None
    else:
        firing = []
        for value in listed:
            firing.append(armed and value <= floor)
            armed = armed or value > floor

    def highest(upto: int) -> float:  # after the first `upto` scales, with Python's max as `_record` keeps it
        seen = max(listed[:upto])
        return seen if before is None else max(before, seen)

    state.max_scale = highest(len(listed))
    return at, firing, lambda k: message(listed[k], floor, highest(k + 1))


def judged_verdicts(values: Tuple[Sequence[int], List[float]], judge: Callable[[float], Optional[str]]) -> Verdicts:
    """A rule that judges each of a run's finite `values` (positions, numbers) in turn: `judge` gives its message,
    "" (fine) or None (not judged at that value)."""
    at: List[int] = []
    firing: List[bool] = []
    messages: Dict[int, str] = {}
    for position, value in zip(*values):
        message = judge(value)
        if message is not None:
            if message:
                messages[len(at)] = message
            at.append(position)
            firing.append(bool(message))
    return at, firing, messages.__getitem__
