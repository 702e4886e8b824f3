"""Lines of one source -> step records and events, driven by `Format` data.

One `SourceParser` per followed file (or rotated chain). It is stateful because logs are: the global
step is computed across epochs, a MindFormers step line waits for its progress line, multi-line
tracebacks are grouped, and a step that goes backwards opens a new run segment.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import orjson

from .bounded import BUDGET_S
from .kinds import fits
from .record import ESTIMATED, NON_FINITE, RESERVED, Item, Record, metric_key
from .schema import Format, Rule

log = logging.getLogger("mstail.parser")


#: A line that matched no rule but looks like it carries a metric ("loss: 2.3", "loss is nan"): counted, so
#: `mstail parse` can tell a user that their format misses lines. What it finds is what
#: `loss[\w ]*(?:[:=]| is)\s*\[?\s*[-+]?(?:\d|nan|inf)` (case-insensitive) finds, in time linear in the line: that
#: search tried every "loss" of a run of word characters and spaces and scanned the run to its end from each, so a
#: line of " loss is" took seconds per 10 KiB. Here only the run's first "loss" is tried (enough: from a later one, the
#: rest matches from the first too), held with `(?=(?P<x>...))(?P=x)`, an atomic group that Python 3.9 lacks: what it
#: matched is never given back to be tried shorter. Runs starting in the first METRIC_HINT_CHARS characters count,
#: and no piece is longer than that, which bounds the work on a 1 MiB line.
METRIC_HINT_CHARS = 4096
_METRIC_LOOKING = re.compile(
    r"^.{0,%(n)d}?(?<![\w ])(?=(?P<_run>[\w ]{0,%(n)d}?loss))(?P=_run)"  # a run's first "loss"
    r"(?:[\w ]{0,%(n)d}? is|(?=(?P<_rest>[\w ]{0,%(n)d}))(?P=_rest)[:=])"  # " is" in the run, or ":"/"=" after it
    r"(?=(?P<_sp>\s{0,%(n)d}))(?P=_sp)(?:\[(?=(?P<_sp2>\s{0,%(n)d}))(?P=_sp2))?[-+]?(?:\d|nan|inf)"  # [ -1.5
    % {"n": METRIC_HINT_CHARS},
    re.IGNORECASE | re.DOTALL,
)
#: Words of the metric names (as the generic reader names them) that make a counter line a training step: its loss, learning
#: rate, a time, a norm, a score: the generic reader makes no record of a line whose numbers are all other things (a
#: dataset dump's "num samples: 60000", a config's "warmup step = 500"; such a line may still amend the last record).
_TRAINING_WORDS = ("loss", "lr", "learning", "time", "norm", "acc", "ppl", "perplex", "throughput", "fps", "per_s", "flops",
                   "scale", "overflow", "grad", "score", "reward", "f1", "map", "iou", "bleu", "rouge", "auc", "err",
                   "precision", "recall", "speed")


def _training_metric(name: str) -> bool:
    """Whether metric `name` is one a training step prints (`_TRAINING_WORDS`)."""
    return any(word in name for word in _TRAINING_WORDS)
#: What a metric-looking line holds in any case (`str.casefold`), tested before `_METRIC_LOOKING` is tried.
METRIC_HINT = "loss"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
#: Bounds for a grouped multi-line event (a traceback): enough for any real one, bounded for garbage.
MAX_EVENT_LINES = 400
MAX_EVENT_CHARS = 64 * 1024
#: An int `fits` keeps is in [-_INT64, _INT64); so is every float there (finite, so `fits` keeps it too).
_INT64 = 1 << 63
#: A matched line's field texts in its rule's field order (`Rule.plan`), None where a group took no part: read by
#: the match's group numbers (`parsers.hotlines`), no lookup by name (`SourceParser.values`).
Texts = Sequence[Optional[str]]
#: The groups the record path (`record_line`, `attach_line`) reads by name from a rule's groups when it is handed the
#: field texts (`Texts`) and the rule has no epoch length: the step counters (`_global_step`, `_start_record`), and
#: the groups its extractors list (`[rule.pairs]`'s). `parsers.hotlines` hands out only these then, not every group.
COUNTER_GROUPS = ("total_steps", "step", "step_in_epoch", "epoch", "epochs", "steps_per_epoch")


class _Match(NamedTuple):
    fmt: Format
    rule: Optional[Rule]
    groups: Dict[str, Optional[str]]
    level: Optional[str]
    prefixed: bool
    message: str
    obj: Optional[Dict[str, Any]] = None  # a JSONL line's object
    stamp: Optional[str] = None  # the prefix's time text
    clock: Optional[Callable[[str], float]] = None  # the prefix's time parser

    def when(self) -> Optional[float]:
        """The line's time in unix seconds, None when it has none (`line_time`). Asked only for a line that makes an
        item: most lines do not, and parsing a time is not free."""
        return line_time(self.stamp, self.clock)


def line_time(stamp: Optional[str], clock: Optional[Callable[[str], float]]) -> Optional[float]:
    """A line's time: its prefix's time text `stamp` read by the prefix's `clock`; None when it has none (no
    timestamp, or one that does not parse)."""
    if stamp and clock is not None:
        try:
            return clock(stamp)
        except ValueError:
            pass
    return None


def mark_estimated(data: Record, key: str) -> None:
    """Say in `data` (a record or an event) that its reserved `key` was not printed by the log (`ESTIMATED`)."""
    marked = data.get(ESTIMATED)
    data[ESTIMATED] = key if marked is None else f"{marked} {key}"


def stamp_time(data: Record, when: Optional[float], now: float) -> None:
    """`data["time"]`: the line's time `when`, else the read time `now`, marked as such (`ESTIMATED` holds "time")."""
    if when is None:
        data["time"] = now
        marked = data.get(ESTIMATED)
        data[ESTIMATED] = "time" if marked is None else marked + " time"
    else:
        data["time"] = when


def without_read_time(data: Record) -> Record:
    """`data` without the read time `stamp_time` gave it, if it did: `mstail parse` gives no time where the log has
    none (the read time is the sidecar's, the moment it read the line)."""
    marked = data.get(ESTIMATED)
    if marked == "time":  # most such items: the read time alone
        del data["time"], data[ESTIMATED]
    elif marked is not None and "time" in marked.split():
        del data["time"]
        rest = " ".join(key for key in marked.split() if key != "time")
        if rest:
            data[ESTIMATED] = rest
        else:
            del data[ESTIMATED]
    return data


_new_tuple = tuple.__new__


class _NotPlain(Exception):
    """A value `_plain_copy` leaves to the json module."""


def _plain_copy(value: Any) -> Any:
    cls = value.__class__
    if cls is str or cls is int or cls is float or cls is bool or value is None:
        return value
    if cls is dict:
        if not all(key.__class__ is str for key in value):
            raise _NotPlain
        return {key: _plain_copy(item) for key, item in value.items()}
    if cls is list or cls is tuple:
        return [_plain_copy(item) for item in value]
    raise _NotPlain


def json_copy(value: Any) -> Any:
    """`json.loads(json.dumps(value))`: a deep copy as JSON gives it back (tuples as lists, NaN kept), raising as
    `json.dumps` does for what JSON cannot hold. Values of the plain types (str keys; str, int, float, bool,
    None, list, tuple, dict) are copied directly, several times faster: a checkpoint copies the parser state
    twice per pass for every file read (a thousand rank files, a thousand times a second)."""
    try:
        return _plain_copy(value)
    except _NotPlain:
        return json.loads(json.dumps(value))


#: `json.dumps`, compact, non-ASCII kept: non-finite floats as its NaN/Infinity tokens, which `json.loads` reads back.
_JSON_TEXT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
#: orjson refuses, as the json module does, what it would otherwise write in a shape of its own.
_ORJSON_PLAIN = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS


def _finite(value: Any) -> bool:
    """Whether no float in `value` (in dicts, lists and tuples at any depth) is NaN or infinite."""
    cls = value.__class__
    if cls is dict:
        value = value.values()
    elif cls is not list and cls is not tuple:
        return cls is not float or value - value == 0
    total = 0.0  # a NaN or an infinity makes the sum one (so may an overflow: then the json module writes it)
    for item in value:
        kind = item.__class__
        if kind is float:
            total += item
        elif (kind is dict or kind is list or kind is tuple) and not _finite(item):
            return False
    return total - total == 0


def json_text(value: Any) -> str:
    """`json.dumps(value)`, compact and non-ASCII kept: text whose `json.loads` gives `json_copy(value)`, raising as
    `json.dumps` does. orjson writes it, several times faster, unless it had to write a NaN or an infinity as null
    (seen by `null` in its text, then looked for): the json module writes those (as its tokens), and what orjson
    refuses (an int beyond 64 bits, a key that is not a str, a lone surrogate). A checkpoint encodes its parser
    state this way (`ParserState.dumps`), for every file a pass read."""
    try:
        text = orjson.dumps(value, option=_ORJSON_PLAIN)
    except TypeError:  # orjson.JSONEncodeError
        return _JSON_TEXT(value)
    if b"null" in text and not _finite(value):
        return _JSON_TEXT(value)
    return text.decode()


@dataclass
class ParserState:
    """What a `SourceParser` carries from one line to the next, declared once: a checkpoint saves it (taken only
    while nothing is held, see `SourceParser.holding`), and restoring it makes the lines after the checkpoint
    parse exactly as they would have been. `to_json`/`from_json` give the checkpoint's JSON shape."""

    format: Optional[str] = None  # the name of the format locked in (None: still detecting)
    meta: Dict[str, Any] = field(default_factory=dict)  # facts about the run (`total_steps`)
    counts: Dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    segment: int = 0  # the run segment: a step that goes backwards (a restart) opens the next one
    spe_learned: int = 0  # steps per epoch inferred from step_in_epoch when the log does not print it
    epoch_max: Dict[int, int] = field(default_factory=dict)  # the largest step_in_epoch seen per epoch
    spe_told: int = 0  # steps per epoch told by an attach rule's `epoch_length` (TimeMonitor)
    spe_before: int = 0  # the epoch length of the run before, in the same file: a guess until this run tells its own
    guessing: bool = False  # this run's steps rest on a guessed epoch length until it is told or learned
    epochs_from_zero: bool = False  # the log printed an epoch 0: its epochs count from 0 (`_from_one`)
    print_every: int = 0  # LossMonitor's print interval in steps, once the log has shown it (0: not yet)
    in_epoch: int = 0  # the epoch-relative step of the last LossMonitor-style record
    counted_step: int = 0
    resume_told: bool = False  # the log said "resume" (an event rule) since the last record: no second resume event
    last: Optional[Record] = None  # the last record emitted, as amended since (a later attach line amends it)
    event_steps: Dict[str, int] = field(default_factory=dict)  # the step of the last event of each kind
    parts: Dict[str, "ParserState"] = field(default_factory=dict)  # launcher-tagged parts (InterleavedParser)

    def to_json(self) -> Dict[str, Any]:
        return json_copy(self._shared(self.parts))  # a deep copy, checked to be JSON

    def dumps(self, parts: Optional[Dict[str, "ParserState"]] = None) -> str:
        """`to_json()` as text (`json_text`), encoded from this state without copying it first: the text is the
        copy, at a fraction of the cost (a checkpoint takes one for every file a pass read). `parts`: the tagged
        parts' states in place of `self.parts` (an `InterleavedParser` keeps them in its parts' parsers)."""
        return json_text(self._shared(self.parts if parts is None else parts))

    def _shared(self, parts: Dict[str, "ParserState"]) -> Dict[str, Any]:
        """`to_json()`'s object holding this state's own values, not copies: to be copied or encoded at once."""
        out = dict(self.__dict__)  # the fields, by name (a shallow copy)
        out["epoch_max"] = [[epoch, most] for epoch, most in self.epoch_max.items()]  # JSON keys are strings
        del out["parts"]
        if parts:
            out["parts"] = {name: part._shared(part.parts) for name, part in parts.items()}
        return out

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "ParserState":
        # A field or a count added since the state was saved takes its default.
        plain = {name: data[name] for name in _PLAIN_FIELDS if name in data}
        plain["counts"] = {**dict.fromkeys(COUNTS, 0), **plain.get("counts", {})}
        return cls(
            **json_copy(plain),
            epoch_max={epoch: most for epoch, most in data["epoch_max"]},
            parts={name: cls.from_json(part) for name, part in data.get("parts", {}).items()},
        )


#: The fields of `ParserState` that JSON holds as they are (epoch_max's int keys and the parts need a shape).
_PLAIN_FIELDS = tuple(f.name for f in fields(ParserState) if f.name not in ("epoch_max", "parts"))

#: What a parser counts (`ParserState.counts`); they show on `/api/sources` and in `mstail parse`'s summary.
#: `slow_lines`: lines on which a user's regex ran out of its time budget (`bounded`) and was skipped.
#: `amends`: items that added a later line's values to a record already emitted (an "amend" `Item`).
#: `unmatched_metric_lines`: lines that look like they carry a metric no rule read: a line no rule matched
#: (`_METRIC_LOOKING`), or a matched line holding `name: number` pairs its rule's pairs did not take.
#: `read_times`: records and events whose time is the moment the line was read (it has none: `stamp_time`), which the
#: page says on its wall-time axes.
COUNTS: Tuple[str, ...] = ("lines", "records", "events", "amends", "field_errors", "unmatched_metric_lines", "slow_lines", "read_times")

#: (format origin, format name, where) of the user regexes that ran out of time and were warned about: once each.
_WARNED: set = set()


class SourceParser:
    """Parse the lines of one source in order.

    Args:
        formats: candidates in detection order; the first whose record rule matches a line is locked in.
        forced: use this format from the first line (`--format NAME`), no detection.
        grace_s: how long a multi-line event (a traceback) is held open for more lines before it is emitted.
            Default 0.5 s; the wait normally ends at the next line that is not part of it. Records are never held:
            a step is emitted at its line, and a line that attaches later yields an "amend" item (`_amend`).
        source: what the lines come from (a source id, a file), named in warnings; optional.
    """

    def __init__(
        self, formats: Sequence[Format], forced: Optional[Format] = None, grace_s: float = 0.5, source: str = ""
    ) -> None:
        self.candidates = [forced] if forced else list(formats)
        self.format: Optional[Format] = forced
        self.grace_s = grace_s
        self.state = ParserState(format=forced.name if forced else None)
        self._open_event: Optional[Tuple[Record, List[str], float]] = None
        self.last_match: Optional[_Match] = None  # how the last fed line matched (for --explain)
        self.last_slow: List[str] = []  # "format rule 'name'": the user regexes that ran out of time on the last line
        self.source = source
        self._timeouts: List[Tuple[Format, str]] = []  # filled by `_match_format`, emptied by `feed`
        self._plans: Dict[int, tuple] = {}  # id(rule) -> its `plan` for `values`, when this log needs another one
        self._step_guessed = False  # the step being worked out rests on a guessed epoch length (`_guessed_step`)

    # -- public ---------------------------------------------------------------------------------------------
    def feed(self, text: str, line_no: int, now: float) -> List[Item]:
        """Parse one complete line (without its newline); `now` is the read time, used when the line has no
        timestamp and to age held records."""
        self.state.counts["lines"] += 1
        if self.last_slow:
            self.last_slow = []
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        out: List[Item] = []
        fmt = self.format
        match = self.last_match = (  # for --explain
            _match_format(fmt, text, self._timeouts) if fmt is not None else self._match(text))
        if self._timeouts:
            for timed_out, where in self._timeouts:
                self._slow(timed_out, where)
            self._timeouts.clear()
        if match is None:
            return self.flush(now)
        if match.obj is None and not match.prefixed and self._continues_event(match.rule):
            self._continue_event(match.message)
            return out
        if self._open_event is not None:
            self._close_event(out)
        if match.obj is not None:
            self._feed_json(match.obj, line_no, now, out)
            return out
        rule = match.rule
        if rule is not None and rule.kind == "ignore":  # known, and deliberately not a record
            out += self.flush(now)
            return out
        if rule is None:
            # Most lines have no "loss" in any case (casefold finds all that IGNORECASE does), and skip the regex.
            if METRIC_HINT in match.message.casefold() and _METRIC_LOOKING.search(match.message):
                self.state.counts["unmatched_metric_lines"] += 1
            if match.prefixed and match.level in match.fmt.error_levels:
                error: Dict[str, Any] = {"kind": "error"}
                stamp_time(error, match.when(), now)
                error.update(line=line_no, level=match.level)
                self._open_event = (error, [match.message], now)
            out += self.flush(now)
            return out
        kind = rule.kind
        if kind == "record":
            if match.fmt.fallback:
                self._generic(rule, match, now, line_no, out)
            else:
                self.record_line(rule, match.groups, match.when(), now, line_no, out)
        elif kind == "attach":
            self.attach_line(rule, match.groups, out)
        else:
            event: Dict[str, Any] = {"kind": rule.event}
            stamp_time(event, match.when(), now)
            event["line"] = line_no
            own_step = match.groups.get("step")
            if own_step is not None:  # e.g. "initial step: 500": the event's own step
                try:
                    event["step"] = int(own_step)
                except ValueError:
                    self.state.counts["field_errors"] += 1
            if rule.same_step_as and rule.same_step_as in self.state.event_steps:
                event["step"] = self.state.event_steps[rule.same_step_as]
            values = self.values(rule, match.groups)
            event.update(values)
            if rule.multiline:
                self._open_event = (event, [match.message], now)
            else:
                event["message"] = match.message
                self._emit_event(event, out)
            if rule.record:  # eval results: the numbers are charted at the current step too
                self._amend(dict(values), out)
        held = self._open_event
        if held is not None and now - held[2] >= self.grace_s:  # what `flush(now)` would emit
            out += self.flush(now)
        return out

    def feed_hot(self, rule: Rule, groups: Dict[str, Optional[str]], clock: Optional[Callable[[str], float]],
                 stamp: Optional[str], texts: Optional[Texts], line_no: int, now: float) -> List[Item]:
        """`feed` of a line matched already to a record or attach rule of the locked format (`parsers.hotlines`, which
        says when that is the match `feed` finds) while no multi-line event is open: its items and counts, the
        same. `groups`: the rule's (with `texts`, of a rule with no epoch length, its step counters and its
        extractors' groups are enough: `COUNTER_GROUPS`); `clock`, `stamp`: the prefix's time parser and time text;
        `texts`: the rule's field texts (`Texts`), or None."""
        self.state.counts["lines"] += 1
        if self.last_slow:
            self.last_slow = []
        out: List[Item] = []
        if rule.kind == "record":
            self.record_line(rule, groups, line_time(stamp, clock), now, line_no, out, texts)
        else:
            self.attach_line(rule, groups, out, texts)
        return out

    def record_line(self, rule: Rule, groups: Dict[str, Optional[str]], when: Optional[float], now: float,
                    line_no: int, out: List[Item], texts: Optional[Texts] = None) -> None:
        """A record rule's line, matched (its `groups`; `when`: the line's time, None: it has none, and the read time
        `now` is given, marked): its record onto `out`. The record
        path of `feed` and of `parsers.blocks` (which matches a block's step lines itself, `parsers.hotlines`, and
        gives the field `texts`; default None: they are read from `groups`)."""
        record = self._start_record(rule, groups, when, now, line_no, texts=texts)
        if record is not None:
            self._emit(record, out)

    def attach_line(self, rule: Rule, groups: Dict[str, Optional[str]], out: List[Item],
                    texts: Optional[Texts] = None) -> None:
        """An attach rule's line, matched: its values join the last record (an amend onto `out`). As `record_line`."""
        values = self.values(rule, groups, texts=texts)
        if rule.epoch_length:
            self._learn_epoch_length(rule, groups, values)
        self._amend(values, out)

    def flush(self, now: float, force: bool = False) -> List[Item]:
        """Emit an open multi-line event that has waited `grace_s` (or at once with force=True: end of input)."""
        out: List[Item] = []
        if self._open_event is not None and (force or now - self._open_event[2] >= self.grace_s):
            self._close_event(out)
        return out

    @property
    def collecting(self) -> bool:
        """True while a multi-line event (a traceback) is open: whatever the next line holds, it may belong to it."""
        return self._open_event is not None

    @property
    def holding(self) -> bool:
        """True while a multi-line event waits for more lines (the caller should call flush() later)."""
        return self._open_event is not None

    # -- matching -------------------------------------------------------------------------------------------
    def _match(self, text: str) -> Optional[_Match]:
        if self.format is not None:
            return _match_format(self.format, text, self._timeouts)
        # Not locked yet: the first candidate whose *record* rule matches wins the file; events seen before
        # that come from the first candidate that recognises the line at all.
        first: Optional[_Match] = None
        plain: Optional[_Match] = None  # a line no candidate recognises (a traceback's frame) is still a line
        ruled = False  # a candidate has a rule for the line: it is that format's line, never the generic reader's
        for fmt in self.candidates:
            if fmt.fallback and ruled:
                break  # fallback formats come last (`load_formats`)
            match = _match_format(fmt, text, self._timeouts)
            if match is None:
                continue
            if fmt.fallback:  # never locks the file: a specific format's step line later still can
                if match.rule is not None and match.rule.kind != "ignore":  # its ignore rules only keep lines from it
                    return match
                continue
            ruled = ruled or match.rule is not None
            if _starts_record(match):
                self.format = fmt
                self.state.format = fmt.name
                return match
            if first is None and (match.rule is not None or match.prefixed or match.obj is not None):
                first = match
            if plain is None:
                plain = match
        return first if first is not None else plain

    def _start_record(self, rule: Rule, groups: Dict[str, Optional[str]], when: Optional[float], now: float,
                      line_no: int, values: Optional[Record] = None, texts: Optional[Texts] = None) -> Optional[Record]:
        """The record of a record rule's line (None: no usable step); `values`: the rule's values, if already read;
        `texts`: its field texts (`Texts`), if read already. A step resting on a guessed epoch length is marked so
        (`ESTIMATED` holds "step"), as is the read time given to a line without one ("time")."""
        self._step_guessed = False
        step = self._global_step(groups)
        if step is None:
            return None
        if not -_INT64 <= step < _INT64:  # a step no history can hold: the line is a field error, not a record
            self.state.counts["field_errors"] += 1
            return None
        record: Record = {"step": step}
        epoch = groups.get("epoch")
        if epoch is not None:
            record["epoch"] = int(epoch)
        if self._step_guessed:
            mark_estimated(record, "step")
        if when is None:
            stamp_time(record, when, now)
        else:
            record["time"] = when
        record["line"] = line_no
        if values is None:
            self.values(rule, groups, record, texts)
        else:
            record.update(values)
        return record

    def _generic(self, rule: Rule, match: _Match, now: float, line_no: int, out: List[Item]) -> None:
        """A line the generic step-line reader (a `fallback` format) took: its counter and `name: number` pairs make
        a record, except that a line with no metric makes nothing (a counter alone is no step), and a line amends the
        last record instead when it prints that record's counter again (MindYOLO's step-time line after its loss line)
        or only an epoch in a log whose records count steps (the epoch's time, its eval: they join its last step)."""
        groups = match.groups
        values = self.values(rule, groups)
        if not values:
            return
        last = self.state.last
        if last is not None:
            epoch_only = groups.get("step") is None and groups.get("step_in_epoch") is None
            if (epoch_only and self.state.meta.get("x_axis") != "epoch") or self._same_counter(groups, last):
                self._amend(values, out)
                return
        if not any(_training_metric(name) for name in values):
            return  # a counter beside "num rows: 32" only is a dump, not a step
        record = self._start_record(rule, groups, match.when(), now, line_no, values)
        if record is not None:
            self._emit(record, out)

    def _same_counter(self, groups: Dict[str, Optional[str]], last: Record) -> bool:
        """Whether a line's step counter is the one of the `last` record."""
        get = groups.get
        try:
            step = get("step")
            if step is not None:
                return int(step) == last["step"]
            in_epoch, epoch, per_epoch = get("step_in_epoch"), get("epoch"), get("steps_per_epoch")
            if in_epoch is None or epoch is None or int(epoch) != last.get("epoch"):
                return False
            if per_epoch is not None:
                return (self._from_one(int(epoch)) - 1) * int(per_epoch) + int(in_epoch) == last["step"]
            return int(in_epoch) == self.state.in_epoch
        except ValueError:
            return False

    def _global_step(self, groups: Dict[str, Optional[str]]) -> Optional[int]:
        get = groups.get
        try:
            total_steps = get("total_steps")
            if total_steps is not None:
                self.state.meta["total_steps"] = int(total_steps)
            step = get("step")
            if step is not None:
                return int(step)
            step_in_epoch = get("step_in_epoch")
            if step_in_epoch is None and "step_in_epoch" in groups and get("epoch") is not None:
                # Only the epoch of a rule that reads steps too (the generic reader's "epoch: [ 1/ 90], ..."): the
                # epoch is the step, and the source says its x axis counts epochs.
                epochs = get("epochs")
                if epochs is not None:
                    self.state.meta["total_steps"] = int(epochs)
                self.state.meta["x_axis"] = "epoch"
                return int(get("epoch"))  # type: ignore[arg-type]  # not None: the if checked it
            if step_in_epoch is None:
                # A rule without a step group (a --pattern), or whose step group did not take part (a Trainer dict
                # line): the step counts the matching lines, an estimate (a line every 10 steps is 10 steps).
                self._step_guessed = True
                self.state.counted_step += 1
                return self.state.counted_step
            in_epoch = int(step_in_epoch)
            epoch = int(get("epoch") or 1)
            if not epoch or self.state.epochs_from_zero:
                epoch = self._from_one(epoch)
            per_epoch = get("steps_per_epoch")
            if per_epoch is not None:
                spe = int(per_epoch)
                epochs = get("epochs")
                if epochs is not None:
                    self.state.meta["total_steps"] = spe * int(epochs)
            else:
                return self._loss_monitor_step(epoch, in_epoch)
            return (epoch - 1) * spe + in_epoch
        except ValueError:
            self.state.counts["field_errors"] += 1
            return None

    def _from_one(self, epoch: int) -> int:
        """The printed `epoch` counted from 1 (a log that printed an epoch 0, "Epoch:[0/19]", counts from 0)."""
        if epoch == 0:
            self.state.epochs_from_zero = True
        return epoch + 1 if self.state.epochs_from_zero else epoch

    def _loss_monitor_step(self, epoch: int, in_epoch: int) -> int:
        """The global step of a line that prints only the epoch and the step within it (MindSpore's LossMonitor).

        LossMonitor(N) prints every N steps, so the step within the epoch repeats with the epoch length only when
        N divides it. Exact sources, best first: the epoch length TimeMonitor told (`spe_told`); else the print
        interval N, seen as the gap between two lines of one epoch or as the first line of a run (printed at step
        N), which makes the first line of a new epoch N steps after the last one — and tells the epoch length.
        Without either (N larger than an epoch and no TimeMonitor) the epoch length is the largest step within an
        epoch seen so far, a guess: `meta["steps_per_epoch"]` then says "guessed" (shown on the source), never
        silently wrong."""
        state = self.state
        last = state.last
        prev_epoch = last.get("epoch") if last is not None else None
        if isinstance(prev_epoch, int) and state.epochs_from_zero:
            prev_epoch += 1  # as printed: counted from 1 as `epoch` is
        if isinstance(prev_epoch, int) and (epoch < prev_epoch or epoch == prev_epoch and in_epoch <= state.in_epoch):
            self._new_run()
            last = prev_epoch = None
        state.epoch_max[epoch] = max(state.epoch_max.get(epoch, 0), in_epoch)
        if state.spe_told:
            step = (epoch - 1) * state.spe_told + in_epoch
        elif last is None or not isinstance(prev_epoch, int):
            if epoch == 1:
                state.print_every = in_epoch  # the first line of a run is printed at step N
                step = in_epoch
            else:
                step = self._guessed_step(epoch, in_epoch)
        elif epoch == prev_epoch and in_epoch > state.in_epoch:
            gap = in_epoch - state.in_epoch
            if state.print_every and gap != state.print_every:
                state.print_every = 0  # not LossMonitor's fixed interval after all: learn again
            else:
                state.print_every = gap
            step = last["step"] + gap
        elif epoch > prev_epoch and state.print_every and self._epoch_length(epoch, in_epoch, last["step"]):
            step = last["step"] + state.print_every
        else:  # an epoch without a known length, or a step going backwards (a restart: a new segment)
            step = self._guessed_step(epoch, in_epoch)
        state.in_epoch = in_epoch
        if state.guessing:
            self._step_guessed = not (state.spe_told or state.spe_learned)
        return step

    def _new_run(self) -> None:
        """A step within an epoch going backwards: another run (a relaunch appended to the same file, a resume), whose
        epoch length is learned again (`python train.py >> train.log` with another dataset or batch size); the length
        before stays a guess (`spe_before`) until it is."""
        state = self.state
        state.spe_before = state.spe_told or state.spe_learned or state.spe_before
        state.spe_told = state.spe_learned = state.print_every = state.in_epoch = 0
        state.guessing = False
        state.epoch_max = {}
        state.meta.pop("steps_per_epoch", None)

    def _epoch_length(self, epoch: int, in_epoch: int, last_step: int) -> bool:
        """Learn the epoch length from a new epoch's first line printed `print_every` steps after `last_step`;
        False when that gives no whole, plausible length (it must fit every step seen within an epoch)."""
        state = self.state
        spe, rest = divmod(last_step + state.print_every - in_epoch, epoch - 1)
        if rest or spe < max(state.epoch_max.values(), default=1):
            return False
        state.spe_learned = spe
        state.meta["steps_per_epoch"] = spe
        return True

    def _guessed_step(self, epoch: int, in_epoch: int) -> int:
        """(epoch - 1) x the epoch length known (told or learned), else x a guess (`guessing`): the largest step within
        an epoch seen, or the run before's length if longer."""
        state = self.state
        spe = state.spe_told or state.spe_learned
        if not spe and epoch > 1:
            spe = max(state.spe_before, *state.epoch_max.values(), in_epoch)
            state.meta["steps_per_epoch"] = "guessed"
            state.guessing = True
        return (epoch - 1) * spe + in_epoch

    def values(self, rule: Rule, groups: Dict[str, Optional[str]], into: Optional[Record] = None,
               texts: Optional[Texts] = None) -> Record:
        """The typed values a rule extracts from its groups (conversion failures are counted, not raised); added to
        `into` (as `into.update` would) and returned, if given. `texts`: the fields' texts, when the caller read them
        by group number (`Texts`); default None: looked up in `groups` by name."""
        values: Record = {} if into is None else into
        plan = self._plans.get(id(rule), rule.plan)
        if texts is None:
            get = groups.get
            texts = [get(entry[0]) for entry in plan]
        for text, entry in zip(texts, plan):
            if text is None:
                continue  # an optional part of the line that is not there
            _, name, fast, convert = entry
            if fast is not None:
                try:
                    value = fast(text)
                except (ValueError, KeyError):  # "[1.5]", "None", ...: the full converter knows
                    self._skip_fast(rule, plan, entry)
                else:
                    # `fits` inlined for the common case (an int or float within 64 bits): one compare per field
                    if -_INT64 <= value < _INT64 or fits(value, text):
                        values[name] = value
                    else:  # beyond 64 bits or the float range: a field error, the rest of the record kept
                        self.state.counts["field_errors"] += 1
                    continue
            try:
                value = convert(text)
            except (ValueError, OverflowError):
                self.state.counts["field_errors"] += 1
                continue
            if fits(value, text):
                values[name] = value
            else:
                self.state.counts["field_errors"] += 1
        for extract in rule.extract:  # multi-valued fields: pydict, pairs
            try:
                found, errors, missed = extract(groups)
            except TimeoutError:  # a user's pairs regex ran out of time: this line gives none of its values
                if self.last_match is not None:
                    self._slow(self.last_match.fmt, f"rule '{rule.name}' (pairs)")
                continue
            values.update(found)
            self.state.counts["field_errors"] += errors
            if missed:  # `name: number` pairs the rule did not read: the line is a metric-looking one, partly unread
                self.state.counts["unmatched_metric_lines"] += 1
        return values

    def _slow(self, fmt: Format, where: str) -> None:
        """A user's regex (`where` in `fmt`) ran out of its time budget on the line being fed, which is skipped for it:
        the line is counted once in `slow_lines`, and each (format, regex) is warned about once, in one line."""
        label = f"{fmt.name} {where}"
        if label in self.last_slow:
            return  # --explain asking for the values again
        if not self.last_slow:
            self.state.counts["slow_lines"] += 1
        self.last_slow.append(label)
        key = (fmt.origin, fmt.name, where)
        if key not in _WARNED:
            _WARNED.add(key)
            source = f"{self.source}: " if self.source else ""
            log.warning(
                "%sformat '%s' (%s), %s: a line took longer than %g s to match, the time limit of a user's regex; "
                "such lines are skipped for it and counted as slow_lines (said once)",
                source, fmt.name, fmt.origin, where, BUDGET_S,
            )

    def _skip_fast(self, rule: Rule, plan: Tuple[tuple, ...], entry: tuple) -> None:
        """A field whose text the fast converter refused (a log that prints `[1.5]`) goes straight to the full one
        from now on: raising costs more than the full converter. Only speed changes: both give the same values."""
        self._plans[id(rule)] = tuple(e if e is not entry else (e[0], e[1], None, e[3]) for e in plan)

    def _feed_json(self, obj: Dict[str, Any], line_no: int, now: float, out: List[Item]) -> None:
        values = jsonl_values(obj)
        for key, value in list(values.items()):
            if value.__class__ is int and not fits(value):  # beyond 64 bits: a field error (the step: no record)
                del values[key]
                self.state.counts["field_errors"] += 1
        for key in ("seq", "source", "segment", "line", ESTIMATED):
            values.pop(key, None)  # ours to assign, whatever the writer put there
        if not isinstance(values.get("time"), (int, float)):
            stamp_time(values, None, now)
        values["line"] = line_no
        for key in ("step", "epoch"):  # a writer that keeps numbers as floats: "step": 2.0
            if isinstance(values.get(key), float) and values[key].is_integer():
                values[key] = int(values[key])
        if isinstance(values.get("kind"), str):
            self._emit_event(values, out)
        elif isinstance(values.get("step"), int):
            self._emit({"step": values.pop("step"), **values}, out)

    # -- state transitions ----------------------------------------------------------------------------------
    def _amend(self, values: Record, out: List[Item]) -> None:
        """A later line's values (TimeMonitor's epoch times, MindFormers' progress line, eval results) join the last
        record, which was emitted at its own line: the keys it lacks are added to it and go out as an "amend" item
        (step, segment and the new values; `fold_amends` joins it to its record when both are still in hand). Keys
        the record has keep their value; with no record yet, the values have no step to join and are dropped."""
        last = self.state.last
        if last is None:
            return
        new = {key: value for key, value in values.items() if key not in last}
        if not new:
            return
        last.update(new)
        self.state.counts["amends"] += 1
        out.append(Item("amend", {"step": last["step"], "segment": last["segment"], **new}))

    def _learn_epoch_length(self, rule: Rule, groups: Dict[str, Optional[str]], values: Record) -> None:
        """MindSpore's TimeMonitor prints the epoch time and the per-step time (epoch time / steps in the epoch):
        their quotient is the epoch length, exact even when LossMonitor's interval does not divide it. The printed
        numbers are rounded ("%5.3f"), so the quotient is used only when that rounding cannot change it."""
        numerator, denominator = rule.epoch_length
        top, bottom = values.get(numerator), values.get(denominator)
        if not (isinstance(top, (int, float)) and isinstance(bottom, (int, float)) and math.isfinite(top)):
            return
        top_error, bottom_error = _rounding(rule, groups, numerator), _rounding(rule, groups, denominator)
        if top_error < 0 or not 0 <= bottom_error < bottom:
            return
        low = round((top - top_error) / (bottom + bottom_error))
        high = round((top + top_error) / (bottom - bottom_error))
        if low == high and low >= max(self.state.epoch_max.values(), default=1):  # never shorter than a step seen
            self.state.spe_told = low
            self.state.meta["steps_per_epoch"] = low

    def _emit(self, record: Record, out: List[Item]) -> None:
        last = self.state.last
        if last is not None and record["step"] < last["step"]:
            self.state.segment += 1  # resume from a checkpoint or a relaunch: a new run segment, never a zig-zag
            if not self.state.resume_told:  # the log did not say it: a resume event all the same, for the marker
                resume = {"kind": "resume", "time": record["time"], "line": record["line"], "step": record["step"]}
                if "time" in record.get(ESTIMATED, "").split():
                    mark_estimated(resume, "time")  # the record's read time
                resume.update(from_step=last["step"],
                              message=f"resumed at step {record['step']} (the step before was {last['step']})")
                self._emit_event(resume, out)
        self.state.resume_told = False
        record["segment"] = self.state.segment
        self.state.last = dict(record)  # the parser's own copy: amends add to it, the emitted record is the caller's
        counts = self.state.counts
        counts["records"] += 1
        marked = record.get(ESTIMATED)
        if marked is not None and "time" in marked:
            counts["read_times"] += 1
        out.append(Item("record", record))

    def _emit_event(self, event: Record, out: List[Item]) -> None:
        last = self.state.last
        if "step" not in event and last is not None:
            event["step"] = last["step"]
        if isinstance(event.get("step"), int):
            self.state.event_steps[event["kind"]] = event["step"]
        if event["kind"] == "resume":
            self.state.resume_told = True
        self.state.counts["events"] += 1
        if ESTIMATED in event and "time" in event[ESTIMATED]:
            self.state.counts["read_times"] += 1
        out.append(Item("event", event))

    def _continues_event(self, rule: Optional[Rule]) -> bool:
        """Whether an unprefixed line belongs to the open multi-line event: it matches no rule, or it starts
        another block of the same kind (a chained traceback's second "Traceback (most recent call last):")."""
        if self._open_event is None:
            return False
        if rule is None:
            return True
        return rule.kind == "event" and rule.multiline and rule.event == self._open_event[0]["kind"]

    def _continue_event(self, text: str) -> None:
        event, lines, since = self._open_event  # type: ignore[misc]  # called while an event is open
        if len(lines) < MAX_EVENT_LINES:
            lines.append(text[:MAX_EVENT_CHARS])

    def _close_event(self, out: List[Item]) -> None:
        if self._open_event is not None:
            event, lines, _ = self._open_event
            self._open_event = None
            event["message"] = "\n".join(lines)[:MAX_EVENT_CHARS].rstrip()  # no trailing blank lines
            self._emit_event(event, out)

    # -- persistence ----------------------------------------------------------------------------------------
    @property
    def emitted(self) -> int:
        """Items handed out so far (records, events and amends)."""
        counts = self.state.counts
        return counts["records"] + counts["events"] + counts["amends"]

    @property
    def meta(self) -> Dict[str, Any]:
        return self.state.meta

    @property
    def counts(self) -> Dict[str, int]:
        return self.state.counts

    def snapshot(self) -> ParserState:
        """A copy of the cross-line state; only meaningful while no multi-line event is open (`holding` is False),
        which is when a checkpoint is taken."""
        return ParserState.from_json(self.state.to_json())

    def restore(self, state: ParserState) -> bool:
        """Continue from a `snapshot()`; False (and nothing changed) when its format is not among the candidates."""
        if state.format is not None:
            table = {fmt.name: fmt for fmt in self.candidates}
            if state.format not in table:
                return False
            self.format = table[state.format]
        self.state = ParserState.from_json(state.to_json())
        return True


def _rounding(rule: Rule, groups: Dict[str, Optional[str]], name: str) -> float:
    """Half a unit of the last printed digit of metric `name` ("65.811" -> 0.0005), scaled as its field is; -1 when
    it cannot be told (an exponent)."""
    for spec in rule.fields:
        text = groups.get(spec.group)
        if spec.name == name and text:
            digits = text.strip()
            if not digits.replace(".", "", 1).isdigit():
                return -1.0
            places = len(digits.partition(".")[2])
            return 0.5 * 10 ** -places * (spec.scale if spec.scale is not None else 1)
    return -1.0


def _starts_record(match: _Match) -> bool:
    if match.obj is not None:
        return "kind" not in match.obj and "step" in match.obj
    return match.rule is not None and match.rule.kind == "record"


def _match_format(fmt: Format, text: str, timeouts: List[Tuple[Format, str]]) -> Optional[_Match]:
    """Strip the first matching prefix, then try the rules on the message (stateless). A user's regex that runs out of
    time (TimeoutError, see `bounded`) counts as not matching; it is added to `timeouts`."""
    if fmt.jsonl:
        return _match_jsonl(fmt, text)
    prefixes, rules = fmt.plan
    message, parts, clock = text, None, None
    for match, parse_time, prefix in prefixes:
        try:
            found = match(text)
        except TimeoutError:
            timeouts.append((fmt, f"prefix '{prefix.name}'"))
            continue
        if found is not None:
            parts, clock = found.groupdict(), parse_time
            message = parts["message"]
            break
    rule, groups = None, {}
    for search, candidate, literals in rules:
        if literals is not None:  # a built-in rule matches only messages holding one of its literals: cheaper to ask
            for literal in literals:
                if literal in message:
                    break
            else:
                continue
        try:
            found = search(message)
        except TimeoutError:
            timeouts.append((fmt, f"rule '{candidate.name}'"))
            continue
        if found is not None:
            rule, groups = candidate, found.groupdict()
            break
    if parts is None:
        return _Match(fmt, rule, groups, None, False, message)
    # `_Match(...)` without its generated `__new__` (a Python frame per line)
    return _new_tuple(_Match, (fmt, rule, groups, parts.get("level"), True, message, None, parts.get("time"), clock))


def _match_jsonl(fmt: Format, text: str) -> Optional[_Match]:
    """A JSON object per line in DESIGN.md's record shape (what mstail.callback writes)."""
    stripped = text.strip()
    if not stripped.startswith("{"):
        return _Match(fmt, None, {}, None, False, text)
    try:
        obj = json.loads(stripped)
    except ValueError:
        return _Match(fmt, None, {}, None, False, text)
    if not isinstance(obj, dict):
        return None
    return _Match(fmt, None, {}, None, False, text, obj)


def jsonl_values(obj: Dict[str, Any]) -> Record:
    """Numbers of a JSONL record, with "NaN"/"Infinity" strings back to floats; reserved keys are kept, the others
    made metric keys (`metric_key`)."""
    out: Record = {}
    for key, value in obj.items():
        if key not in RESERVED:
            key = metric_key(key)  # type: ignore[assignment]  # None: skipped just below
            if key is None:
                continue
        if isinstance(value, bool):
            out[key] = int(value)
        elif isinstance(value, (int, float)) or value is None:
            out[key] = value
        elif isinstance(value, str) and (value in NON_FINITE or key in RESERVED):
            out[key] = NON_FINITE.get(value, value)
    return out
