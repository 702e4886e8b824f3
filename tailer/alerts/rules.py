"""The alert rules, each defined once: `RULES` maps a rule's name to a `Rule` (what it judges, its settings' keys and
defaults, the values a text key may take, its one evaluation); `AlertEngine` (`tailer.alerts.engine`) feeds them and
turns their verdicts into alerts.

What a rule judges (`Rule.on`) says how its `judge` is called:

- "records": `judge(settings, state, columns) -> Verdicts`, over a batch of one source's records of one segment (a
  catch-up's hundreds or a live pass's one, their values a key at a time: `Columns`), the rule's memory of the source
  (`SourceState`) brought to the batch's end. `Verdicts`: which records it judged, at which it fired, their messages;
  the engine turns them into alert changes as judging each record in turn would (`AlertEngine._settle`).
- "events": `judge(settings, event) -> message or None` (None: not its event); the records after one count towards
  clearing the alert (`clear_after`).
- "ticks": judged for every source once per pass (`AlertEngine.tick`) -> `Verdict`: fire with a message, resolve
  with a reason, or None.
- "fate": `judge(settings, why) -> message`, when a source's run died (`AlertEngine.fate`).

Rules (a TOML file given with `--alerts` overrides any key per rule):

- `nonfinite`   NaN/Inf in `loss` or `grad_norm` (the metrics are configurable): at once.
- `loss_spike`  loss above its rolling window: `method = "mad"` fires when (x - median) > z * 1.4826 * MAD
                and x > median * (1 + min_rel); `method = "mean_ratio"` fires when x > ratio * rolling mean
                (the seed's "1.5 x rolling mean over 50 steps"). Nothing fires before `min_window` values.
- `grad_norm`   grad norm > ratio x its rolling median (after `min_window` values), or > `absolute`.
- `overflow`    `streak` consecutive records with `overflow` true.
- `loss_scale`  the loss scale fell (it was higher before) to `floor` or below.
- `error`       error events (tracebacks, ERROR records) and any event with `terminate training` or `terminating
                training`; the message is the exception line (a traceback's last `...Error: ...` line) and the step.
- `trend`       off by default: over the last `window` values of the loss, the second half's mean is above
                the first half's by more than `divergence_rel` (divergence) or below it by less than
                `plateau_rel` (plateau); checked every `every` records.
- `hang`        no new step for max(min_s, k x median step time) while the source has not logged the end
                of training; armed only by live data (a last record logged less than `live_within_s` ago).
- `gone`        the followed file disappeared.
- `died`        the run died (`tailer.alerts.fate`): its writer left before the total or after an error, or a JSONL
                stream that logged its start left without its end; raised by the tailer when it sees the writer
                leave while it watches, never for a run that was over before mstail read it.
- `straggler`   one source's median step time (last `window` steps) above `ratio` x the median of the other
                ranks' medians and at least `min_ms` slower: only sources whose id names their rank (`rank_3`,
                `worker_3`, `ID/rank3`), of one run read in one format, are compared (`AlertEngine.peers`), and never
                two files of one rank (needs 2+ ranks with step times).

Work per record is bounded: every rolling window is a `Window` of at most `window` values and a median is a sort of
at most `window` numbers. A windowed rule (loss_spike, grad_norm) fires only above a bound of its window's median;
every median of a batch is at least the lowest value any of its windows holds (the window before the batch and the
batch's values), so the values at or below that bound of it only join the window, and only the others are judged one
by one (`window_verdicts`).
"""

from __future__ import annotations

import math
import re
import statistics
from bisect import bisect_left, insort
from collections import Counter, deque
from dataclasses import dataclass, field
from functools import partial
from itertools import repeat
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Sequence, Tuple

from mstail.tailer.inputs.discovery import rank_of

#: How close (relative) to a bound a value is judged exactly: a rule's bound is rounded as its check is not.
MARGIN = 1e-9
#: A tick rule's verdict on a source: (True, message) fires, (False, reason) resolves, None changes nothing.
Verdict = Optional[Tuple[bool, str]]


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
    """A batch of records' values, a key at a time, as `number` reads them, made once per key."""

    __slots__ = ("records", "everyone", "_made")

    def __init__(self, records: Sequence[Dict[str, Any]]) -> None:
        self.records = records
        self.everyone = range(len(records))  # every record's position
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


_FIRST = range(1)


class OneRecord(Columns):
    """A batch of one record (a live pass's): its values read as asked, no column made."""

    __slots__ = ("record",)

    def __init__(self, record: Dict[str, Any]) -> None:  # no columns to make: not `Columns.__init__`
        self.records, self.record, self.everyone, self._made = (record,), record, _FIRST, {}

    def finite(self, key: str) -> Tuple[Sequence[int], List[float]]:
        value = self.record.get(key)
        if type(value) is not float:  # most values are: `number` is then a call for nothing
            value = number(value)
        return (_FIRST, [value]) if value is not None and math.isfinite(value) else ((), [])

    def nonfinite(self, key: str) -> bool:
        value = self.record.get(key)
        if type(value) is not float:
            value = number(value)
        return value is not None and not math.isfinite(value)


#: A record rule's verdicts on a batch: the positions of the records it judged; which of them it fired at (None:
#: none); the message of the k-th judged record (asked where it fired only).
Verdicts = Tuple[Sequence[int], Optional[List[bool]], Callable[[int], str]]


def _median_without(ranked: List[float], index: int) -> float:
    """`statistics.median` of the ascending list `ranked` without its element at `index` (at least two elements)."""
    count = len(ranked) - 1
    def at(k: int) -> float:
        return ranked[k if k < index else k + 1]
    middle = count // 2
    return at(middle) if count % 2 else (at(middle - 1) + at(middle)) / 2


_EXCEPTION_LINE = re.compile(r"^\s*(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Warning)\b")


def what_happened(message: str) -> str:
    """The line that says what went wrong: a traceback's exception line (its last `...Error: ...` line, after the
    `Traceback (most recent call last):` and frames), else the message's first non-empty line."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    if any(line.startswith("Traceback (most recent call last)") for line in lines):
        for line in reversed(lines):
            if _EXCEPTION_LINE.match(line):
                return line
    return lines[0]


class Window:
    """The last `size` finite values, in arrival order and sorted: append is O(size) memmove, median O(1); the mean is
    that of their exactly rounded sum (`math.fsum`), the same whichever way the values came in (one by one, a run
    at once, a restart between)."""

    __slots__ = ("size", "order", "sorted")

    def __init__(self, size: int) -> None:
        self.size = size
        self.order: Deque[float] = deque(maxlen=size)
        self.sorted: List[float] = []

    def __len__(self) -> int:
        return len(self.order)

    def __iter__(self) -> Iterator[float]:
        return iter(self.order)

    def append(self, value: float) -> None:
        if len(self.order) == self.size:
            del self.sorted[bisect_left(self.sorted, self.order[0])]  # the value the append drops
        self.order.append(value)
        insort(self.sorted, value)

    def extend(self, values: List[float]) -> None:
        """`append` of each value in turn, the sorted copy made once (a few values: appended, not a whole re-sort)."""
        if len(values) < self.size // 8:
            for value in values:
                self.append(value)
            return
        self.order.extend(values)
        self.sorted = sorted(self.order)

    def median(self) -> float:
        ordered = self.sorted
        n = len(ordered)
        mid = n // 2
        return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0

    def mean(self) -> float:
        return math.fsum(self.order) / len(self.order)

    def clear(self) -> None:
        self.order.clear()
        self.sorted = []

    def dump(self) -> List[float]:
        """The values in arrival order."""
        return list(self.order)

    def load(self, saved: List[Any]) -> None:
        if saved and isinstance(saved[0], list):  # [values, running sum, appends]: saved before the mean was fsum's
            saved = saved[0]
        self.order = deque(saved, maxlen=self.size)
        self.sorted = sorted(self.order)


class SourceState:
    """What the rules remember about one source."""

    def __init__(self, r: Dict[str, Dict[str, Any]]) -> None:  # the rules' settings (`AlertRules.rules`)
        self.loss = Window(r["loss_spike"]["window"])
        self.norm = Window(r["grad_norm"]["window"])
        self.step_s: Deque[float] = deque(maxlen=50)
        self.step_ms: Deque[float] = deque(maxlen=r["straggler"]["window"])  # the log's own per_step_time
        self.trend: Deque[float] = deque(maxlen=r["trend"]["window"] if r["trend"]["enabled"] else 1)
        self.trend_count = 0
        self.overflow_run = 0
        self.max_scale: Optional[float] = None
        self.segment = 0
        self.last_step: Optional[int] = None
        self.last_record_time: Optional[float] = None  # the log's own time of the last record
        self.last_arrival: Optional[float] = None  # when the last new step was read
        self.live = False
        self.ended = False
        self.clear: Dict[str, int] = {}  # rule -> consecutive clear observations

    def new_segment(self, segment: Any) -> None:
        """A resume: the windows describe another run."""
        self.segment = segment
        self.loss.clear()
        self.norm.clear()
        self.overflow_run = 0

    _SCALARS = ("trend_count", "overflow_run", "max_scale", "segment", "last_step", "last_record_time", "last_arrival",
                "live", "ended", "clear")
    _DEQUES = ("step_s", "step_ms", "trend")

    def dump(self) -> Dict[str, Any]:
        """Everything above as JSON-able data (`load` takes it back)."""
        saved: Dict[str, Any] = {name: getattr(self, name) for name in self._SCALARS}
        saved.update({name: list(getattr(self, name)) for name in self._DEQUES})
        saved.update(loss=self.loss.dump(), norm=self.norm.dump())
        return saved

    def load(self, saved: Dict[str, Any]) -> None:
        for name in self._SCALARS:
            setattr(self, name, saved[name])
        for name in self._DEQUES:
            getattr(self, name).extend(saved[name])  # bounded deques: at most their window is kept
        self.loss.load(saved["loss"])
        self.norm.load(saved["norm"])


def _silence(state: "SourceState", gone: bool, now: float) -> Optional[float]:
    """How long a source's live run has waited for its next step (None: it waits for none: its file is gone, its
    run ended, its steps are history, or it has had none)."""
    if gone or state.ended or not state.live or state.last_arrival is None:
        return None
    return now - state.last_arrival


def _nonfinite_message(metrics: List[str], record: Dict[str, Any]) -> str:
    """The nonfinite rule's message for `record` ("" when its `metrics` are finite or absent)."""
    bad = []
    for name in metrics:
        value = number(record.get(name))
        if value is not None and not math.isfinite(value):
            bad.append(f"{name} = {'NaN' if value != value else value}")
    return "non-finite " + ", ".join(bad) if bad else ""


def _spike_message(rule: Dict[str, Any], window: Window, value: float) -> str:
    """The loss_spike rule on a finite `value` against its `window` (which takes the value after): its message,
    or "" when no spike."""
    if len(window) >= rule["min_window"]:
        name = rule["metric"]
        if rule["method"] == "mean_ratio":
            low = window.sorted[0]  # `spike_bound`'s: the mean is at least the lowest value; at or below, no fsum
            if not (low > 0 and value <= rule["ratio"] * low * (1 - MARGIN)):
                mean = window.mean()
                if mean > 0 and value > rule["ratio"] * mean:
                    window.append(value)
                    return f"{name} {value:.4g} is {value / mean:.2f}x its rolling mean {mean:.4g}"
        else:
            median = window.median()
            if not (value <= median + rule["min_rel"] * abs(median) or value <= median):  # else no spike possible
                mad = statistics.median([abs(v - median) for v in window])
                spread = max(1.4826 * mad, 1e-12)
                score = (value - median) / spread
                if score > rule["z"] and value > median + rule["min_rel"] * abs(median):
                    window.append(value)
                    return f"{name} spike {value:.4g} vs rolling median {median:.4g} ({score:.0f} robust deviations)"
    window.append(value)
    return ""


def _norm_message(rule: Dict[str, Any], window: Window, value: float) -> str:
    """The grad_norm rule on a finite `value` against its `window` (which takes the value after): its message, or
    "" when the norm is in line."""
    message = ""
    if rule["absolute"] > 0 and value > rule["absolute"]:
        message = f"{rule['metric']} {value:.4g} above {rule['absolute']:.4g}"
    elif len(window) >= rule["min_window"]:
        median = window.median()
        if median > 0 and value > rule["ratio"] * median:
            message = f"{rule['metric']} {value:.4g} is {value / median:.1f}x its rolling median {median:.4g}"
    window.append(value)
    return message


def _overflow_message(run: int) -> str:
    return f"{run} consecutive overflow steps"


def _scale_message(scale: float, floor: float, highest: float) -> str:
    return f"loss scale fell to {scale:g} (floor {floor:g}, was up to {highest:g})"


def _trend_message(rule: Dict[str, Any], state: "SourceState", value: float) -> Optional[str]:
    """The trend rule takes a finite `value`: its message, "" when the trend is fine, None when not checked at
    this value (the window not full, or not one of every `every` values)."""
    state.trend.append(value)
    state.trend_count += 1
    if len(state.trend) < rule["min_window"] or state.trend_count % rule["every"]:
        return None
    values = list(state.trend)
    half = len(values) // 2
    first, second = sum(values[:half]) / half, sum(values[half:]) / (len(values) - half)
    scale = max(abs(first), 1e-12)
    change = (second - first) / scale
    if change > rule["divergence_rel"]:
        return f"{rule['metric']} diverging: mean {first:.4g} -> {second:.4g} over the last {len(values)} values"
    if -rule["plateau_rel"] < change <= rule["plateau_rel"]:
        return f"{rule['metric']} plateau: mean {first:.4g} -> {second:.4g} over the last {len(values)} values"
    return ""



def window_verdicts(rule: Dict[str, Any], values: Tuple[Sequence[int], List[float]], window: Window,
                    bound: Callable[[Dict[str, Any], float], float],
                    judge: Callable[[Dict[str, Any], Window, float], str]) -> Verdicts:
    """A windowed rule (loss_spike, grad_norm) on a batch's finite `values` (positions, numbers): the numbers at or
    below `bound` of the lowest number any of their windows can hold (which bounds every median below, so they
    cannot fire) only join the window; the others are judged one by one (`judge`, which appends them)."""
    at, listed = values
    if len(listed) == 1:  # a live pass's value: no bound to work out, it is judged
        message = judge(rule, window, listed[0])
        return at, [bool(message)], lambda k: message
    if not listed:
        return at, None, str
    low = min(listed[:-1])
    if len(window):
        low = min(low, window.sorted[0])
    limit = bound(rule, low) if math.isfinite(low) else -math.inf
    limit = limit - abs(limit) * MARGIN if math.isfinite(limit) else limit
    if max(listed) <= limit:
        window.extend(listed)
        return at, None, str
    firing, messages, start = [False] * len(listed), {}, 0
    for k in [k for k, value in enumerate(listed) if value > limit]:
        if k > start:
            window.extend(listed[start:k])
        message = judge(rule, window, listed[k])
        if message:
            firing[k] = True
            messages[k] = message
        start = k + 1
    if start < len(listed):
        window.extend(listed[start:])
    return at, firing, messages.__getitem__


def spike_bound(rule: Dict[str, Any], low: float) -> float:
    """The loss value at or below which no spike is possible when every window value is at least `low`."""
    if rule["method"] == "mean_ratio":  # the mean is at least the lowest value (within a rounding: `MARGIN`)
        return rule["ratio"] * low if low > 0 else -math.inf
    if rule["min_rel"] <= 1:  # median + min_rel * |median| grows with the median
        return low + rule["min_rel"] * abs(low)
    return -math.inf  # it does not: judge each


def norm_bound(rule: Dict[str, Any], low: float) -> float:
    """The grad norm at or below which the rule cannot fire when every window value is at least `low`."""
    absolute = rule["absolute"] if rule["absolute"] > 0 else math.inf
    return min(rule["ratio"] * max(low, 0.0), absolute)


def judged_verdicts(values: Tuple[Sequence[int], List[float]], judge: Callable[[float], Optional[str]]) -> Verdicts:
    """A rule that judges each of a batch's finite `values` (positions, numbers) in turn: `judge` gives its message,
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


# -- each rule's evaluation -------------------------------------------------------------------------------------
def judge_nonfinite(rule: Dict[str, Any], state: SourceState, columns: Columns) -> Verdicts:
    """Every record judged: it fires where one of the rule's metrics is NaN or infinite."""
    metrics, records = rule["metrics"], columns.records
    for name in metrics:
        if columns.nonfinite(name):
            break
    else:
        return columns.everyone, None, str
    firing = [bool(_nonfinite_message(metrics, record)) for record in records]
    return columns.everyone, firing, lambda k: _nonfinite_message(metrics, records[k])


def judge_loss_spike(rule: Dict[str, Any], state: SourceState, columns: Columns) -> Verdicts:
    """The records with a finite loss, each against the window of the losses before it."""
    return window_verdicts(rule, columns.finite(rule["metric"]), state.loss, spike_bound, _spike_message)


def judge_grad_norm(rule: Dict[str, Any], state: SourceState, columns: Columns) -> Verdicts:
    """The records with a finite grad norm, each against the window of the norms before it."""
    return window_verdicts(rule, columns.finite(rule["metric"]), state.norm, norm_bound, _norm_message)


def judge_overflow(rule: Dict[str, Any], state: SourceState, columns: Columns) -> Verdicts:
    """The records with an overflow flag: it fires from the `streak`-th flag in a row on."""
    streak = rule["streak"]
    values = list(map(dict.get, columns.records, repeat("overflow")))
    if values.count(0) == len(values):  # no overflow at all (False, 0 or 0.0 each: NaN is one, None no flag)
        state.overflow_run = 0
        return columns.everyone, None, str
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
    return at, firing, lambda k: _overflow_message(runs[k])


def judge_loss_scale(rule: Dict[str, Any], state: SourceState, columns: Columns) -> Verdicts:
    """The records with a finite loss scale: it fires where the scale is at the `floor` or below after being above it
    (the highest so far)."""
    floor = rule["floor"]
    at, listed = columns.finite("loss_scale")
    if not listed:
        return at, None, str
    before, top = state.max_scale, max(listed)
    state.max_scale = top if before is None else max(before, top)
    armed = before is not None and before > floor
    if armed and top <= floor:
        firing: Optional[List[bool]] = [True] * len(listed)
    elif not armed and top <= floor or min(listed) > floor:
        return at, None, str
    else:
        firing = []
        for value in listed:
            firing.append(armed and value <= floor)
            armed = armed or value > floor

    def highest(upto: int) -> float:  # after the first `upto` scales, with Python's max as a running max keeps it
        seen = max(listed[:upto])
        return seen if before is None else max(before, seen)

    return at, firing, lambda k: _scale_message(listed[k], floor, highest(k + 1))


def judge_trend(rule: Dict[str, Any], state: SourceState, columns: Columns) -> Verdicts:
    """The records with a finite loss where the trend is checked (a full window, every `every` values)."""
    return judged_verdicts(columns.finite(rule["metric"]), partial(_trend_message, rule, state))


def judge_error(rule: Dict[str, Any], event: Dict[str, Any]) -> Optional[str]:
    """An error event, or any event whose message holds one of the rule's phrases: what went wrong and at which step."""
    kind = event.get("kind")
    message = str(event.get("message") or "")
    lowered = message.lower()
    if kind not in rule["kinds"] and not any(p.lower() in lowered for p in rule["phrases"]):
        return None
    step = event.get("step")
    step = step if isinstance(step, int) else None
    said = what_happened(message) or str(kind)
    return said[:300] + (f" (step {step})" if step is not None else "")


def hang_bound_of(rule: Dict[str, Any], state: Optional[SourceState]) -> float:
    """Seconds without a new step before a source counts as hung: max(min_s, k x median step time)."""
    median = statistics.median(state.step_s) if state is not None and state.step_s else 0.0
    return max(float(rule["min_s"]), float(rule["k"]) * median)


def may_hang(rule: Dict[str, Any], state: SourceState, gone: bool, now: float) -> bool:
    """Whether the source can be hung at all: silent `min_s` or longer (shorter is within any bound)."""
    silence = _silence(state, gone, now)
    return silence is not None and silence >= float(rule["min_s"])


def judge_hang(rule: Dict[str, Any], state: SourceState, gone: bool, now: float,
               writing: Optional[Callable[[], Optional[bool]]]) -> Verdict:
    """A source at a tick (`gone`: its file disappeared; `writing()`: whether a process still holds it open for
    writing, None: cannot be seen): hung when silent past its bound while its writer is there."""
    bound = hang_bound_of(rule, state)
    silence = _silence(state, gone, now)
    hung = silence is not None and silence >= bound
    if hung and writing is not None and writing() is False:
        state.ended = True  # the writer closed the file: over (an error before it raised its own alert)
        hung = False
    if hung:
        return True, f"no new step for {silence:.0f} s after step {state.last_step} (bound {bound:.0f} s)"
    if state.ended or gone or (state.last_arrival is not None and now - state.last_arrival < bound):
        return False, "training ended" if state.ended else "steps again"
    return None


def judge_gone(rule: Dict[str, Any], follower_state: str) -> Verdict:
    """A source at a tick, by its follower's state (following | idle | gone | waiting)."""
    return (True, "log file disappeared") if follower_state == "gone" else (False, "log file is back")


def judge_died(rule: Dict[str, Any], why: str) -> str:
    """A run that died (`why`: how, `tailer.alerts.fate`)."""
    return f"run died: {why}"


def judge_stragglers(rule: Dict[str, Any], medians: Dict[str, float]) -> Dict[str, Verdict]:
    """The median step times of one run's sources of one format, each against the median of the other ranks' (a
    second file of its own rank is not another rank)."""
    ranks = {source: rank_of(source) for source in medians}
    if len(set(ranks.values())) < 2:
        return {source: (False, "no other rank to compare with") for source in medians}
    ranked = sorted(medians.values())  # the others' median is read from it: a thousand ranks, not a million steps
    files = Counter(ranks.values())  # a rank with two files (info.log and worker_N.log): both left out by hand
    verdicts: Dict[str, Verdict] = {}
    for source, median in medians.items():
        if files[ranks[source]] > 1:
            others_list = [m for s, m in medians.items() if ranks[s] != ranks[source]]
            others, count = statistics.median(others_list), len(others_list)
        else:
            others, count = _median_without(ranked, bisect_left(ranked, median)), len(medians) - 1
        if median > rule["ratio"] * others and median - others >= rule["min_ms"]:
            verdicts[source] = True, (f"median step time {median:.0f} ms vs {others:.0f} ms on the other {count} "
                                      f"source(s) ({median / others:.2f}x)")
        else:
            verdicts[source] = False, "step time back in line"
    return verdicts


# -- the table ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """One alert rule. `defaults`: every key a `--alerts` file may set and its default, whose type is the type the
    file must use (an int where a float is expected is accepted); `choices`: the values a text key may take (besides
    `severity`'s, every rule's: `SEVERITIES`)."""

    on: str  # what it judges: "records", "events", "ticks" or "fate" (the module's docstring: how `judge` is called)
    defaults: Dict[str, Any]
    judge: Callable[..., Any]
    choices: Dict[str, Tuple[str, ...]] = field(default_factory=dict)


SEVERITIES = ("info", "warning", "error", "critical")

#: Every rule, in the order the engine judges a record: the record rules, then the clears of the event rules' alerts.
RULES: Dict[str, Rule] = {
    "nonfinite": Rule("records", {"enabled": True, "severity": "critical", "metrics": ["loss", "grad_norm"],
                                  "clear_after": 5}, judge_nonfinite),
    "loss_spike": Rule("records", {
        "enabled": True, "severity": "warning", "metric": "loss", "method": "mad", "window": 100,
        "min_window": 20, "z": 10.0, "min_rel": 0.2, "ratio": 1.5, "clear_after": 5,
    }, judge_loss_spike, {"method": ("mad", "mean_ratio")}),
    "grad_norm": Rule("records", {
        "enabled": True, "severity": "warning", "metric": "grad_norm", "window": 100, "min_window": 20,
        "ratio": 10.0, "absolute": 1.0e4, "clear_after": 5,
    }, judge_grad_norm),
    "overflow": Rule("records", {"enabled": True, "severity": "warning", "streak": 10, "clear_after": 1},
                     judge_overflow),
    "loss_scale": Rule("records", {"enabled": True, "severity": "critical", "floor": 1.0, "clear_after": 1},
                       judge_loss_scale),
    "error": Rule("events", {"enabled": True, "severity": "error", "kinds": ["error"],
                             "phrases": ["terminate training", "terminating training"], "clear_after": 20},
                  judge_error),
    "trend": Rule("records", {
        "enabled": False, "severity": "warning", "metric": "loss", "window": 1000, "min_window": 1000,
        "plateau_rel": 0.002, "divergence_rel": 0.1, "every": 50, "clear_after": 1,
    }, judge_trend),
    "hang": Rule("ticks", {"enabled": True, "severity": "critical", "min_s": 60.0, "k": 10.0,
                           "live_within_s": 3600.0}, judge_hang),
    "gone": Rule("ticks", {"enabled": True, "severity": "warning"}, judge_gone),
    "died": Rule("fate", {"enabled": True, "severity": "critical"}, judge_died),
    "straggler": Rule("ticks", {"enabled": True, "severity": "warning", "window": 20, "min_window": 10,
                                "ratio": 1.3, "min_ms": 50.0}, judge_stragglers),
}
