"""A locked format's step and progress lines made into the engine's items in one tight function, for the usual case.

The block path's record builder (`parsers.blocks.feed_block`): a line that `HotLines` would hand to the engine's
record path (`SourceParser.feed_hot`) is matched the same way here, and when it is the usual case its items are
built here, with the counts and state changes the engine makes, and nothing else: no dict of groups, no generic
field plan, no call per step of the engine's record path. The usual case is what most lines of a big log are:

- a record rule whose step is printed (a `step` group) or worked out from the epoch, the step within it and the
  epoch length (`step_in_epoch`, `steps_per_epoch`, `epoch`), going forward (a step that
  goes back opens a new segment: the engine's);
- an attach rule with no epoch length (it amends the last record);
- each field's text converted without a field error, `[rule.pairs]` groups with nothing in them.

Anything else (another kind of line, the first epoch 0, a step going back, a field error, a pair to read) is not taken
(`take` gives None, nothing changed) and the caller asks the engine, which judges.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

from .engine import SourceParser
from .hotlines import HotLines
from .kinds import fits
from .loader import _Pairs
from .record import ESTIMATED, Item, Record
from .schema import Rule

_INT64 = 1 << 63
#: The step counters a usual record rule reads, in this order (`_Rule.counters`; absent from its regex: group 0).
_COUNTERS = ("step", "total_steps", "step_in_epoch", "steps_per_epoch", "epoch", "epochs")


class _Rule:
    """What `take` needs of one hot rule: the group numbers of its counters (`_COUNTERS`, 0: absent), of its fields
    (with the field's name, fast and full converter) and of its pairs' groups."""

    def __init__(self, rule: Rule, hot: Any) -> None:
        index = hot.__self__.groupindex  # `hot` is the rule's compiled `match` (`hotlines.hot_lines`)
        self.record = rule.kind == "record"
        self.counters = tuple(index.get(name, 0) for name in _COUNTERS)
        self.fields = [[index[group], name, fast, full] for group, name, fast, full in rule.plan]
        self.pairs = tuple(index[group] for extract in rule.extract for group in extract.groups)  # type: ignore[attr-defined]  # _Pairs

    def numbers(self) -> Tuple[int, ...]:
        """The group numbers `take` reads, in one `group` call: the counters present, the fields, the pairs' groups."""
        return tuple(n for n in self.counters if n) + tuple(field[0] for field in self.fields) + self.pairs


def _usual(rule: Rule, hot: Any) -> bool:
    """Whether `take` can build a line of `rule` (a hot rule's, `hot` its compiled `match`) in the usual case."""
    index = getattr(getattr(hot, "__self__", None), "groupindex", None)
    if index is None or rule.kind not in ("record", "attach") or rule.epoch_length:
        return False
    if not all(isinstance(extract, _Pairs) for extract in rule.extract):
        return False
    if not all(group in index for group, _, _, _ in rule.plan):
        return False
    if rule.kind == "record":  # the step printed, or worked out from an epoch's length the line prints
        return "step" in index or {"step_in_epoch", "steps_per_epoch"} <= set(index)
    return True


class StepLines:
    """The usual step and progress lines of one format, made into items (`parsers.blocks` makes one per format, from
    its `HotLines`)."""

    def __init__(self, hot: HotLines) -> None:
        self._prefixes = hot._prefixes
        self._steps: List[Tuple[Any, Any, Any, Optional[_Rule], Tuple[int, ...]]] = []
        for rule, literals, match, search, _, _ in hot._steps:
            usual = _Rule(rule, match) if match is not None and _usual(rule, match) else None
            self._steps.append((literals, match, search, usual, usual.numbers() if usual is not None else ()))

    def take(self, parser: SourceParser, text: str, line_no: int, now: float) -> Optional[List[Item]]:
        """`parser.feed(text, line_no, now)`'s items for a usual line (`text`: no ANSI escape, while no multi-line
        event is open), with its counts and state changes; None, with nothing changed, for any other line."""
        for envelope, clock, timed in self._prefixes:  # noqa: B007 - read after the break
            found = envelope(text)
            if found is not None:
                break
        else:
            return None
        start = found.end()
        find = text.find
        for literals, match, search, usual, numbers in self._steps:
            if literals is not None:
                for literal in literals:
                    if find(literal, start) >= 0:
                        break
                else:
                    continue
            if match is not None:
                matched = match(text, start)
                if matched is None:
                    continue
                if usual is None:
                    return None
                texts = matched.group(*numbers) if len(numbers) > 1 else (matched.group(numbers[0]),) if numbers else ()
                if usual.record:
                    return _record(parser, usual, texts, found["time"] if timed else None, clock, line_no, now)
                return _amend(parser, usual, texts)
            if search(text[start:]) is not None:
                return None  # another kind of rule takes the message
        return None


def _values(usual: _Rule, texts: Any, at: int, into: Record) -> bool:
    """The fields' values from `texts[at:]` into `into`, as `SourceParser.values` gives them; False when a field
    error or a pair to read leaves the line to the engine."""
    for field in usual.fields:
        text = texts[at]
        at += 1
        if text is None:
            continue
        fast = field[2]
        if fast is not None:
            try:
                value = fast(text)
            except (ValueError, KeyError):  # "[1.5]": the full converter, from now on (only speed changes)
                field[2] = None
            else:
                if -_INT64 <= value < _INT64 or fits(value, text):
                    into[field[1]] = value
                    continue
                return False
        try:
            value = field[3](text)
        except (ValueError, OverflowError):
            return False
        if not fits(value, text):
            return False
        into[field[1]] = value
    for text in texts[at:]:
        if text:
            return False  # a pairs group with text: the engine reads its pairs
    return True


def _record(parser: SourceParser, usual: _Rule, texts: Any, stamp: Optional[str],
            clock: Optional[Callable[[str], float]], line_no: int, now: float) -> Optional[List[Item]]:
    """A record rule's usual line: `feed_hot` → `record_line` → `_start_record` and `_emit`, as the engine does them."""
    state = parser.state
    step_n, total_n, in_epoch_n, per_epoch_n, epoch_n, epochs_n = usual.counters
    at = 0
    step_t = total_t = in_epoch_t = per_epoch_t = epoch_t = epochs_t = None
    if step_n:
        step_t, at = texts[at], at + 1
    if total_n:
        total_t, at = texts[at], at + 1
    if in_epoch_n:
        in_epoch_t, at = texts[at], at + 1
    if per_epoch_n:
        per_epoch_t, at = texts[at], at + 1
    if epoch_n:
        epoch_t, at = texts[at], at + 1
    if epochs_n:
        epochs_t, at = texts[at], at + 1
    total = None
    try:
        if total_t is not None:
            total = int(total_t)
        if step_t is not None:
            step = int(step_t)
        elif in_epoch_t is not None and per_epoch_t is not None:
            epoch = int(epoch_t or 1)
            if state.epochs_from_zero:
                epoch += 1  # counted from 1
            elif not epoch:
                return None  # the first epoch 0: the engine learns that the log counts epochs from 0
            per_epoch = int(per_epoch_t)
            step = (epoch - 1) * per_epoch + int(in_epoch_t)
            if epochs_t is not None:
                total = per_epoch * int(epochs_t)
        else:
            return None
        record: Record = {"step": step}
        if epoch_t is not None:
            record["epoch"] = int(epoch_t)
    except ValueError:
        return None  # a field error: the engine counts it
    last = state.last
    if not -_INT64 <= step < _INT64 or (last is not None and step < last["step"]):
        return None  # no step a history can hold, or a step going back (a new segment): the engine's
    when = None
    if stamp and clock is not None:
        try:
            when = clock(stamp)
        except ValueError:
            pass
    if when is None:
        record["time"] = now
        record[ESTIMATED] = "time"
    else:
        record["time"] = when
    record["line"] = line_no
    if not _values(usual, texts, at, record):
        return None
    # The line is the usual case: from here on, what the engine changes.
    counts = state.counts
    counts["lines"] += 1
    if parser.last_slow:
        parser.last_slow = []
    if total is not None:
        state.meta["total_steps"] = total
    state.resume_told = False
    record["segment"] = state.segment
    state.last = dict(record)
    counts["records"] += 1
    if when is None:
        counts["read_times"] += 1
    return [Item("record", record)]


def _amend(parser: SourceParser, usual: _Rule, texts: Any) -> Optional[List[Item]]:
    """An attach rule's usual line: `feed_hot` → `attach_line` → `_amend`, as the engine does them."""
    values: Record = {}
    if not _values(usual, texts, 0, values):
        return None
    state = parser.state
    state.counts["lines"] += 1
    if parser.last_slow:
        parser.last_slow = []
    last = state.last
    if last is None:
        return []
    new = {key: value for key, value in values.items() if key not in last}
    if not new:
        return []
    last.update(new)
    state.counts["amends"] += 1
    return [Item("amend", {"step": last["step"], "segment": last["segment"], **new})]

