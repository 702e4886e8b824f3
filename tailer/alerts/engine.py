"""Alerts: rules over the record/event stream of every source -> alert state changes.

`AlertEngine.observe_all(source, items, now, history)` is fed every stored record and event (from
`Tailer._deliver`, in the event loop; `observe` takes one); `tick(now, states)` runs the time-based rules (hang,
gone) once per pass. They return *changes*: dicts shaped like events (`kind: "alert"`) that the tailer stores (so
they get a `seq` and SSE replay covers them) and publishes. The engine keeps the alert table for `GET /api/alerts`
(active + recently resolved).

Work per record is bounded: every rolling window is a `deque(maxlen=window)` and a median is a sort of at most
`window` numbers. A run of `RUN_MIN` records or more of one source (a catch-up's batch) is judged a rule at a time,
with the changes, their order and the state after that judging each record in turn gives (`_run`; the rules'
verdicts over a run: `alertruns`): a windowed rule passes over the values no window's median can make fire; a rule
firing on many records in a row costs its first fire and one count, not a fire per record.

Rules (`DEFAULT_RULES` holds every key and its default; a TOML file given with `--alerts` overrides per rule):

- `nonfinite`   NaN/Inf in `loss` or `grad_norm` (the metrics are configurable): at once.
- `loss_spike`  loss above its rolling window: `method = "mad"` fires when (x - median) > z * 1.4826 * MAD
                and x > median * (1 + min_rel); `method = "mean_ratio"` fires when x > ratio * rolling mean
                (the seed's "1.5 x rolling mean over 50 steps"). Nothing fires before `min_window` values.
- `grad_norm`   grad norm > ratio x its rolling median (after `min_window` values), or > `absolute`.
- `overflow`    `streak` consecutive records with `overflow` true.
- `loss_scale`  the loss scale fell (it was higher before) to `floor` or below.
- `error`       error events (tracebacks, ERROR records) and any event with `terminate training` or `terminating
                training`; the message is the exception line (a traceback's last `...Error: ...` line) and the step.
- `hang`        no new step for max(min_s, k x median step time) while the source has not logged the end
                of training; armed only by live data (a last record logged less than `live_within_s` ago).
- `gone`        the followed file disappeared.
- `died`        the run died (`tailer.fate`): its writer left before the total or after an error, or a JSONL stream
                that logged its start left without its end; raised by the tailer (`fate`) when it sees the writer
                leave while it watches, never for a run that was over before mstail read it.
- `straggler`   one source's median step time (last `window` steps) above `ratio` x the median of the other
                ranks' medians and at least `min_ms` slower: only sources whose id names their rank (`rank_3`,
                `worker_3`, `ID/rank3`), of one run read in one format, are compared (`peers`), and never two
                files of one rank (needs 2+ ranks with step times).
- `trend`       off by default: over the last `window` values of the loss, the second half's mean is above
                the first half's by more than `divergence_rel` (divergence) or below it by less than
                `plateau_rel` (plateau); checked every `every` records.

Every alert: id, rule, source, step, severity, message, first_seen, last_seen, count, state (firing |
resolved). One alert per (rule, source) at a time; repeats while firing raise `count` and are published at
most once per `cooldown_s`; an alert resolves when its condition has been clear for `clear_after` records
(at once for hang/gone); a rule that fires again within `cooldown_s` of resolving reopens the same alert.
"""

from __future__ import annotations

import heapq
import math
import re
import statistics
from bisect import bisect_left, insort
from collections import Counter, deque
from itertools import compress, groupby, repeat
from operator import contains, ne
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Sequence, Tuple

from mstail.platform import tomllib

from mstail.tailer.alerts.runs import (MARGIN, Columns, Verdicts, judged_verdicts, norm_bound, overflow_verdicts, scale_verdicts,
                        spike_bound, window_verdicts)
from mstail.tailer.alerts.runs import number as _number
from mstail.tailer.inputs.discovery import rank_of


Change = Dict[str, Any]

#: Every rule, every key, every default. Types of the defaults are the types a file must use (int where
#: a float is expected is accepted).
DEFAULT_RULES: Dict[str, Dict[str, Any]] = {
    "nonfinite": {"enabled": True, "severity": "critical", "metrics": ["loss", "grad_norm"], "clear_after": 5},
    "loss_spike": {
        "enabled": True, "severity": "warning", "metric": "loss", "method": "mad", "window": 100,
        "min_window": 20, "z": 10.0, "min_rel": 0.2, "ratio": 1.5, "clear_after": 5,
    },
    "grad_norm": {
        "enabled": True, "severity": "warning", "metric": "grad_norm", "window": 100, "min_window": 20,
        "ratio": 10.0, "absolute": 1.0e4, "clear_after": 5,
    },
    "overflow": {"enabled": True, "severity": "warning", "streak": 10, "clear_after": 1},
    "loss_scale": {"enabled": True, "severity": "critical", "floor": 1.0, "clear_after": 1},
    "error": {"enabled": True, "severity": "error", "kinds": ["error"], "phrases": ["terminate training", "terminating training"], "clear_after": 20},
    "trend": {
        "enabled": False, "severity": "warning", "metric": "loss", "window": 1000, "min_window": 1000,
        "plateau_rel": 0.002, "divergence_rel": 0.1, "every": 50, "clear_after": 1,
    },
    "hang": {"enabled": True, "severity": "critical", "min_s": 60.0, "k": 10.0, "live_within_s": 3600.0},
    "gone": {"enabled": True, "severity": "warning"},
    "died": {"enabled": True, "severity": "critical"},
    "straggler": {"enabled": True, "severity": "warning", "window": 20, "min_window": 10, "ratio": 1.3, "min_ms": 50.0},
}
#: Keys that are not rules: [general] settings.
DEFAULT_GENERAL: Dict[str, Any] = {"cooldown_s": 300.0, "keep_resolved": 200}
SNAPSHOT_VERSION = 1  # of `AlertEngine.snapshot`'s shape: a state saved in another is replayed instead
SEVERITIES = ("info", "warning", "error", "critical")
#: From this many records of one source in a row on, `observe_all` judges them a rule at a time over their columns;
#: fewer go record by record (a run's fixed cost, its columns and their checks, is more than they would save: at 8
#: records a run cost 3.3 µs a record against 5.3, at 4 5.9 against 4.8).
RUN_MIN = 8
_CHOICES = {("loss_spike", "method"): ("mad", "mean_ratio"), ("*", "severity"): SEVERITIES}


class AlertConfigError(ValueError):
    """An alerts file is unusable; the message names the file, the rule and the key."""

    def __init__(self, origin: str, reason: str, rule: Optional[str] = None, key: Optional[str] = None) -> None:
        where = origin + (f": rule '{rule}'" if rule else "") + (f": key '{key}'" if key else "")
        super().__init__(f"{where}: {reason}")
        self.origin, self.rule, self.key, self.reason = origin, rule, key, reason


class AlertRules:
    """The merged settings: `rules[name][key]` and `general[key]`."""

    def __init__(self, rules: Dict[str, Dict[str, Any]], general: Dict[str, Any]) -> None:
        self.rules = rules
        self.general = general

    def on(self, name: str) -> bool:
        return bool(self.rules[name]["enabled"])


def default_rules() -> AlertRules:
    return AlertRules({k: dict(v) for k, v in DEFAULT_RULES.items()}, dict(DEFAULT_GENERAL))


def load_alert_rules(path: Optional[str] = None, overrides: Optional[Dict[str, Any]] = None) -> AlertRules:
    """Defaults, overridden by the TOML file at `path` (or by `overrides`, a parsed mapping, for tests).

    File shape: `[general]` (cooldown_s, keep_resolved) and one table per rule (`[hang]`, `[loss_spike]` ...)
    with any of that rule's keys; `enabled = false` switches a rule off. Unknown rules/keys and wrong types
    raise `AlertConfigError`.
    """
    rules = default_rules()
    origin = path or "<alerts>"
    data: Dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as handle:
                data = tomllib.load(handle)
        except FileNotFoundError:
            raise AlertConfigError(origin, "no such file") from None
        except OSError as exc:
            raise AlertConfigError(origin, f"cannot read: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise AlertConfigError(origin, f"not valid TOML: {exc}") from None
    if overrides:
        data = {**data, **overrides}
    for name, table in data.items():
        if name == "general":
            target, defaults = rules.general, DEFAULT_GENERAL
        elif name in DEFAULT_RULES:
            target, defaults = rules.rules[name], DEFAULT_RULES[name]
        else:
            known = ", ".join(["general", *DEFAULT_RULES])
            raise AlertConfigError(origin, f"unknown rule (known: {known})", rule=name)
        if not isinstance(table, dict):
            raise AlertConfigError(origin, "must be a table, e.g. [" + name + "]", rule=name)
        for key, value in table.items():
            if key not in defaults:
                raise AlertConfigError(origin, f"unknown key (known: {', '.join(defaults)})", rule=name, key=key)
            target[key] = _checked(origin, name, key, value, defaults[key])
    if rules.general["keep_resolved"] < 0:
        raise AlertConfigError(origin, "must be at least 0", rule="general", key="keep_resolved")
    for name, table in rules.rules.items():
        for key in ("window", "min_window", "streak", "clear_after", "every"):
            if key in table and table[key] < 1:
                raise AlertConfigError(origin, "must be at least 1", rule=name, key=key)
        if "min_window" in table and table["min_window"] > table["window"]:
            raise AlertConfigError(origin, "min_window cannot exceed window", rule=name, key="min_window")
    return rules


def _checked(origin: str, rule: str, key: str, value: Any, default: Any) -> Any:
    def bad(expected: str) -> AlertConfigError:
        return AlertConfigError(origin, f"expected {expected}, got {value!r}", rule=rule, key=key)

    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("an integer")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise bad("a non-negative number")
        return float(value)
    if isinstance(default, list):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise bad("a list of strings")
        return list(value)
    if not isinstance(value, str):
        raise bad("a string")
    choices = _CHOICES.get((rule, key)) or _CHOICES.get(("*", key))
    if choices and value not in choices:
        raise bad("one of " + ", ".join(choices))
    return value


# -- the engine -------------------------------------------------------------------------------------------
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


class _Window:
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


class _SourceState:
    """What the rules remember about one source."""

    def __init__(self, rules: AlertRules) -> None:
        r = rules.rules
        self.loss = _Window(r["loss_spike"]["window"])
        self.norm = _Window(r["grad_norm"]["window"])
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


def _silence(state: "_SourceState", gone: bool, now: float) -> Optional[float]:
    """How long a source's live run has waited for its next step (None: it waits for none: its file is gone, its
    run ended, its steps are history, or it has had none)."""
    if gone or state.ended or not state.live or state.last_arrival is None:
        return None
    return now - state.last_arrival


def _nonfinite_message(metrics: List[str], record: Dict[str, Any]) -> str:
    """The nonfinite rule's message for `record` ("" when its `metrics` are finite or absent)."""
    bad = []
    for name in metrics:
        value = _number(record.get(name))
        if value is not None and not math.isfinite(value):
            bad.append(f"{name} = {'NaN' if value != value else value}")
    return "non-finite " + ", ".join(bad) if bad else ""


def _spike_message(rule: Dict[str, Any], window: _Window, value: float) -> str:
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


def _norm_message(rule: Dict[str, Any], window: _Window, value: float) -> str:
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


def _trend_message(rule: Dict[str, Any], state: "_SourceState", value: float) -> Optional[str]:
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


class AlertEngine:
    """Rules -> alerts. Used from one thread (the event loop).

    Args:
        rules: the settings (`load_alert_rules`); default: the built-in defaults.
    """

    def __init__(self, rules: Optional[AlertRules] = None) -> None:
        self.rules = rules or default_rules()
        self._on = {name: bool(rule["enabled"]) for name, rule in self.rules.rules.items()}  # `rules.on`, per record
        self._sources: Dict[str, _SourceState] = {}
        self._alerts: Dict[Tuple[str, str], Dict[str, Any]] = {}  # (rule, source) -> current alert of that key
        self._resolved: Deque[Dict[str, Any]] = deque(maxlen=int(self.rules.general["keep_resolved"]))
        self._published: Dict[str, float] = {}  # alert id -> when its last change was published
        self._next_id = 1
        self.fired = 0
        self._groups: Dict[str, Tuple[Optional[str], Optional[str]]] = {}  # source -> (run, format): `peers`

    # -- public ---------------------------------------------------------------------------------------------
    def table(self) -> Dict[str, Any]:
        """`GET /api/alerts`: active alerts (newest first) and recently resolved ones."""
        active = [dict(a) for a in self._alerts.values() if a["state"] == "firing"]
        active.sort(key=lambda a: a["last_seen"], reverse=True)
        resolved = [dict(a) for a in reversed(self._resolved) if a["state"] == "resolved"]
        return {"active": active, "resolved": resolved, "count": len(active)}

    def observe(self, source: str, item: Dict[str, Any], now: float, history: bool = False) -> List[Change]:
        """Feed one stored record or event of `source` (read at `now`); returns alert changes. `history`: the item
        was in the file before mstail started (the catch-up), so it never arms the hang rule, whatever its time
        says (a log without timestamps gets the read time)."""
        state = self._sources.get(source)
        if state is None:
            state = self._sources[source] = _SourceState(self.rules)
        out: List[Change] = []
        if "kind" in item:
            if item["kind"] != "alert":
                self._event(source, state, item, now, out)
            return out
        self._record(source, state, item, now, out, history)
        return out

    def observe_all(self, source: str, items: Sequence[Dict[str, Any]], now: float,
                    history: Sequence[bool]) -> List[Change]:
        """`observe` of each of `items` of `source` in turn (`history`: each item's flag), in one call: the same
        changes in the same order, the same state after. A run of `RUN_MIN` records or more with the same flag is
        judged a rule at a time over its columns (`_run`)."""
        state = self._sources.get(source)
        if state is None:
            state = self._sources[source] = _SourceState(self.rules)
        out: List[Change] = []
        count, start = len(items), 0
        if count >= RUN_MIN and history.count(history[0]) == count and not any(map(contains, items, repeat("kind"))):
            self._records(source, state, items, now, out, history[0])  # a catch-up's batch: records alone
            return out
        while start < count:
            item = items[start]
            if "kind" in item:
                if item["kind"] != "alert":
                    self._event(source, state, item, now, out)
                start += 1
                continue
            end, flag = start + 1, history[start]
            while end < count and "kind" not in items[end] and history[end] == flag:
                end += 1
            if end - start < RUN_MIN:  # a live pass's few records
                for record in items[start:end]:
                    self._record(source, state, record, now, out, flag)
            else:
                self._records(source, state, items[start:end], now, out, flag)
            start = end
        return out

    def _records(self, source: str, state: _SourceState, records: Sequence[Dict[str, Any]], now: float,
                 out: List[Change], history: bool) -> None:
        """Records in a row: split where the segment changes (a resume resets the windows); a long enough part is
        judged a rule at a time, the others record by record."""
        segments = list(map(dict.get, records, repeat("segment"), repeat(0)))
        starts = [0]
        if any(map(ne, segments, repeat(state.segment))):
            current = state.segment
            for position, segment in enumerate(segments):
                if segment != current:
                    current = segment
                    if position:
                        starts.append(position)
        for start, end in zip(starts, starts[1:] + [len(records)]):
            if end - start < RUN_MIN:
                for record in records[start:end]:
                    self._record(source, state, record, now, out, history)
                continue
            if segments[start] != state.segment:
                state.new_segment(segments[start])
            self._run(source, state, records[start:end], now, out, history)

    def _run(self, source: str, state: _SourceState, records: Sequence[Dict[str, Any]], now: float,
             out: List[Change], history: bool) -> None:
        """A run of one segment's records, judged as `_record` judges each in turn: each rule's verdicts over the
        run first (its state brought to the run's end), then the alerts they change, in record and rule order."""
        rules, on = self.rules.rules, self._on
        columns = Columns(records)
        self._clock_all(state, records, columns, now, history)
        everyone = range(len(records))
        verdicts: List[Tuple[str, Verdicts]] = []
        if on["nonfinite"]:
            metrics = rules["nonfinite"]["metrics"]
            fires: Optional[List[bool]] = None
            if any(columns.nonfinite(name) for name in metrics):
                fires = [bool(_nonfinite_message(metrics, record)) for record in records]
            verdicts.append(("nonfinite", (everyone, fires, lambda k: _nonfinite_message(metrics, records[k]))))
        if on["loss_spike"]:
            rule = rules["loss_spike"]
            verdicts.append(("loss_spike", window_verdicts(columns.finite(rule["metric"]), state.loss,
                                                           spike_bound(rule), lambda w, v: _spike_message(rule, w, v))))
        if on["grad_norm"]:
            norm_rule = rules["grad_norm"]
            verdicts.append(("grad_norm", window_verdicts(columns.finite(norm_rule["metric"]), state.norm,
                                                          norm_bound(norm_rule),
                                                          lambda w, v: _norm_message(norm_rule, w, v))))
        if on["overflow"]:
            verdicts.append(("overflow", overflow_verdicts(state, records, rules["overflow"]["streak"],
                                                           _overflow_message)))
        if on["loss_scale"]:
            verdicts.append(("loss_scale", scale_verdicts(state, columns.finite("loss_scale"),
                                                          rules["loss_scale"]["floor"], _scale_message)))
        if on["trend"]:
            trend = rules["trend"]
            verdicts.append(("trend", judged_verdicts(columns.finite(trend["metric"]),
                                                      lambda value: _trend_message(trend, state, value))))
        if on["error"]:  # a step after an error counts towards clearing it
            verdicts.append(("error", (everyone, None, str)))
        self._settle(source, state, records, verdicts, now, out)

    def _clock_all(self, state: _SourceState, records: Sequence[Dict[str, Any]], columns: Columns, now: float,
                   history: bool) -> None:
        """`_clock` of each record in turn; at once where every step is an int and every step time a positive
        number (each new step then appends its step time, and the last step is the run's last)."""
        steps = list(map(dict.get, records, repeat("step")))
        step_ms, _, finite = columns.numbers("step_time_ms")
        if set(map(type, steps)) != {int} or not finite or min(step_ms) <= 0:
            for record in records:
                self._clock(state, record, now, history)
            return
        new = [state.last_step is None or steps[0] != state.last_step, *map(ne, steps[1:], steps)]
        taken = step_ms if False not in new else list(compress(step_ms, new))
        if taken:
            state.step_s.extend([ms / 1000.0 for ms in taken[-(state.step_s.maxlen or 0):]])
            state.step_ms.extend(taken[-(state.step_ms.maxlen or 0):])
            state.last_step, state.last_arrival, state.ended = steps[-1], now, False
        if not history and not state.live:
            _, timed = columns.finite("time")
            bound = self.rules.rules["hang"]["live_within_s"]
            state.live = len(timed) < len(records) or any(now - when <= bound for when in timed)
        for record in reversed(records):  # the last record's time, as a rule
            when = _number(record.get("time"))
            if when is not None and math.isfinite(when):
                state.last_record_time = when
                break

    def _settle(self, source: str, state: _SourceState, records: Sequence[Dict[str, Any]],
                verdicts: List[Tuple[str, Verdicts]], now: float, out: List[Change]) -> None:
        """The alerts a run's `verdicts` change, as `_condition` at each judged record would change them, in record
        order (and rule order within a record): per rule, a stretch of fires is its first fire (`_fire`: a new
        alert, a reopened one, a published change) and the others' count, step and message (published none: the
        stretch's `now` is within the cooldown of the first); a stretch of clears counts them and resolves the
        alert at the record that reaches `clear_after`."""
        cooldown = float(self.rules.general["cooldown_s"])
        pending: List[Tuple[int, int, int, int, bool, bool]] = []  # (position, rank, start, end, resolve, fired)
        for rank, (rule, (at, firing, _)) in enumerate(verdicts):
            if not at:
                continue
            if firing is None or True not in firing:
                if (rule, source) in self._alerts:  # clears count only for an alert
                    pending.append((at[0], rank, 0, len(at), False, False))
                continue
            if False not in firing and cooldown > 0:
                pending.append((at[0], rank, 0, len(at), False, True))
                continue
            start = 0
            for fired, stretch in groupby(firing):
                end = start + sum(1 for _ in stretch)
                if fired and cooldown <= 0:  # every fire is published: each in its place
                    pending.extend((at[k], rank, k, k + 1, False, True) for k in range(start, end))
                else:
                    pending.append((at[start], rank, start, end, False, fired))
                start = end
        heapq.heapify(pending)
        while pending:
            _, rank, start, end, resolve, fired = heapq.heappop(pending)
            rule, (at, _, message) = verdicts[rank]
            key = (rule, source)
            if resolve:
                self._resolve(rule, source, now, out, "condition cleared")
            elif fired:
                self._condition(rule, source, state, records[at[start]].get("step"), now, out, True, message(start))
                if end - start > 1:
                    alert = self._alerts[key]
                    alert["count"] += end - start - 1
                    alert["last_seen"] = now
                    for k in range(end - 1, start, -1):
                        step = records[at[k]].get("step")
                        if isinstance(step, int):
                            alert["step"] = step
                            break
                    alert["message"] = message(end - 1)
            elif key in self._alerts:
                cleared = state.clear.get(rule, 0)
                state.clear[rule] = cleared + end - start
                clears = start + max(0, self.rules.rules[rule].get("clear_after", 1) - cleared - 1)
                if self._alerts[key]["state"] == "firing" and clears < end:
                    heapq.heappush(pending, (at[clears], rank, clears, clears, True, False))

    def snapshot(self) -> Dict[str, Any]:
        """The rules' whole state as JSON-able data: saved with the history (`Store.save_alerts`) so that a restart
        judges the next records as if it had never stopped (`restore`) instead of replaying every stored item."""
        alerts = {a["id"]: a for a in self._alerts.values()}
        alerts.update((a["id"], a) for a in self._resolved)
        return {
            "version": SNAPSHOT_VERSION, "rules": self.rules.rules, "general": self.rules.general,
            "next_id": self._next_id, "fired": self.fired, "alerts": list(alerts.values()),
            "current": [a["id"] for a in self._alerts.values()], "resolved": [a["id"] for a in self._resolved],
            "published": self._published, "sources": {source: state.dump() for source, state in self._sources.items()},
        }

    def restore(self, saved: Dict[str, Any]) -> Optional[str]:
        """Take back a `snapshot`; returns why it cannot be used (another version, other rules, a damaged state:
        the engine is then left empty, for a replay), or None."""
        if saved.get("version") != SNAPSHOT_VERSION:
            return "written by another mstail version"
        if saved.get("rules") != self.rules.rules or saved.get("general") != self.rules.general:
            return "the alert rules changed since"
        try:
            alerts = {a["id"]: a for a in saved["alerts"]}
            current = {(alerts[i]["rule"], alerts[i]["source"]): alerts[i] for i in saved["current"]}
            sources = {}
            for source, dumped in saved["sources"].items():
                state = sources[source] = _SourceState(self.rules)
                state.load(dumped)
            resolved = [alerts[i] for i in saved["resolved"]]
            published = {str(i): float(t) for i, t in saved["published"].items()}
            next_id, fired = int(saved["next_id"]), int(saved["fired"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # nothing is taken from it then
            return f"it does not hold together ({type(exc).__name__}: {exc})"
        self._alerts, self._sources, self._published = current, sources, published
        self._resolved.clear()
        self._resolved.extend(resolved)
        self._next_id, self.fired = next_id, fired
        return None

    def replay(self, item: Dict[str, Any]) -> None:
        """Rebuild the rules' state from a stored item at start (`--state-dir`): records and events feed the
        rules as when they were read (at their own time) and the changes are dropped — they are in the history
        already; a stored alert only keeps new alert ids unique. Time-driven alerts (hang, straggler) are not
        rebuilt: the next `tick` judges the sources afresh."""
        if item.get("kind") == "alert":
            number = str(item.get("id", ""))[1:]
            if number.isdigit():
                self._next_id = max(self._next_id, int(number) + 1)
            return
        if item.get("kind") == "amend":
            return  # the rules judge records and events; an amend's values are in its record already
        when = item.get("time")
        self.observe(item["source"], item, when if isinstance(when, (int, float)) else 0.0, history=True)

    def tick(self, now: float, states: Dict[str, str],
             writing: Optional[Callable[[str], Optional[bool]]] = None) -> List[Change]:
        """Time-based rules; `states` maps source id -> follower state (following | idle | gone | waiting).
        `writing(source)`, asked only when a source has been silent past its hang bound, says whether a process
        still holds its file open for writing (None: cannot be seen, e.g. written from another node): a silent
        file nobody writes any more is a run that ended, not a hang."""
        out: List[Change] = []
        if self.rules.on("straggler"):
            self._stragglers(now, out)
        gone_on, hang_on = self.rules.on("gone"), self.rules.on("hang")
        min_s = float(self.rules.rules["hang"]["min_s"])
        alerts = self._alerts
        # A thousand sources a tick: what cannot change an alert is passed over before any median is taken (a
        # source silent less than `min_s` is within its hang bound; a resolve without an alert is a no-op).
        for source, follower_state in states.items():
            state = self._sources.get(source)
            gone = follower_state == "gone"
            if gone_on:
                if gone:
                    self._fire("gone", source, state.last_step if state else None, now, "log file disappeared", out)
                elif ("gone", source) in alerts:
                    self._resolve("gone", source, now, out, "log file is back")
            if state is None or not hang_on:
                continue
            silence = _silence(state, gone, now)
            if (silence is not None and silence >= min_s) or ("hang", source) in alerts:
                self._hang(source, state, gone, now, writing, out)
        return out

    def _hang(self, source: str, state: _SourceState, gone: bool, now: float,
              writing: Optional[Callable[[str], Optional[bool]]], out: List[Change]) -> None:
        """The hang rule for one source at a tick (`tick`'s `writing`; `gone`: its file disappeared)."""
        bound = self.hang_bound(source)
        silence = _silence(state, gone, now)
        hung = silence is not None and silence >= bound
        if hung and writing is not None and writing(source) is False:
            state.ended = True  # the writer closed the file: over (an error before it raised its own alert)
            hung = False
        if hung:
            self._fire("hang", source, state.last_step, now,
                       f"no new step for {silence:.0f} s after step {state.last_step} (bound {bound:.0f} s)", out)
        elif state.ended or gone or (state.last_arrival is not None and now - state.last_arrival < bound):
            self._resolve("hang", source, now, out, "training ended" if state.ended else "steps again")

    def fate(self, source: str, fate: Optional[str], why: str, step: Optional[int], now: float, guess: bool = False,
             witnessed: bool = True) -> List[Change]:
        """A source's run ended (`fate`: finished | died | stopped, `tailer.fate`; `why` says how) or runs again
        (None). Over, it is not hung (unless the end is a `guess` of the time bound that it did not finish: then the
        hang rule goes on); died raises the `died` alert when the end was `witnessed` (seen while mstail watched:
        an old log that died years ago is not news); running again resolves it."""
        state = self._sources.get(source)
        if state is None:
            state = self._sources[source] = _SourceState(self.rules)
        out: List[Change] = []
        if fate is None:
            self._resolve("died", source, now, out, "it runs again")
            return out
        if not guess or fate == "finished":
            state.ended = True
            self._resolve("hang", source, now, out, "training ended")
        if fate == "died" and not guess and witnessed and self.rules.on("died"):
            self._fire("died", source, step, now, f"run died: {why}", out)
        return out

    def hang_bound(self, source: str) -> float:
        """Seconds without a new step before `source` counts as hung: max(min_s, k x median step time)."""
        rule = self.rules.rules["hang"]
        state = self._sources.get(source)
        median = statistics.median(state.step_s) if state is not None and state.step_s else 0.0
        return max(float(rule["min_s"]), float(rule["k"]) * median)

    # -- records --------------------------------------------------------------------------------------------
    def _record(self, source: str, state: _SourceState, record: Dict[str, Any], now: float, out: List[Change],
                history: bool = False) -> None:
        rules, on = self.rules.rules, self._on
        step = record.get("step")
        segment = record.get("segment", 0)
        if segment != state.segment:  # a resume: the windows describe another run
            state.new_segment(segment)
        self._clock(state, record, now, history)

        if on["nonfinite"]:
            message = _nonfinite_message(rules["nonfinite"]["metrics"], record)
            self._condition("nonfinite", source, state, step, now, out, bool(message), message)

        if on["loss_spike"]:
            value = _number(record.get(rules["loss_spike"]["metric"]))
            if value is not None and math.isfinite(value):
                message = _spike_message(rules["loss_spike"], state.loss, value)
                self._condition("loss_spike", source, state, step, now, out, bool(message), message)

        if on["grad_norm"]:
            value = _number(record.get(rules["grad_norm"]["metric"]))
            if value is not None and math.isfinite(value):
                message = _norm_message(rules["grad_norm"], state.norm, value)
                self._condition("grad_norm", source, state, step, now, out, bool(message), message)

        overflow = record.get("overflow")
        if on["overflow"] and overflow is not None:
            flag = _number(overflow)
            state.overflow_run = state.overflow_run + 1 if flag else 0
            firing = state.overflow_run >= rules["overflow"]["streak"]
            self._condition("overflow", source, state, step, now, out, firing,
                            _overflow_message(state.overflow_run) if firing else "")

        scale = _number(record.get("loss_scale"))
        if on["loss_scale"] and scale is not None and math.isfinite(scale):
            floor = rules["loss_scale"]["floor"]
            fell = state.max_scale is not None and state.max_scale > floor and scale <= floor
            state.max_scale = scale if state.max_scale is None else max(state.max_scale, scale)
            self._condition("loss_scale", source, state, step, now, out, fell,
                            _scale_message(scale, floor, state.max_scale) if fell else "")

        if on["trend"]:
            value = _number(record.get(rules["trend"]["metric"]))
            if value is not None and math.isfinite(value):
                trend = _trend_message(rules["trend"], state, value)
                if trend is not None:
                    self._condition("trend", source, state, step, now, out, bool(trend), trend)

        if on["error"]:  # a step after an error counts towards clearing it
            self._condition("error", source, state, step, now, out, False, "")

    def _clock(self, state: _SourceState, record: Dict[str, Any], now: float, history: bool) -> None:
        """What a record says of its source's pace (step times, its last step and time, live or not): the hang and
        straggler rules' evidence."""
        step = record.get("step")
        when = _number(record.get("time"))
        if when is not None and not math.isfinite(when):
            when = None
        if isinstance(step, int) and (state.last_step is None or step != state.last_step):
            step_ms = _number(record.get("step_time_ms"))
            if step_ms is not None and math.isfinite(step_ms) and step_ms > 0:
                state.step_s.append(step_ms / 1000.0)
                state.step_ms.append(step_ms)
            elif when is not None and state.last_record_time is not None and isinstance(state.last_step, int):
                delta_steps = step - state.last_step
                if 0 < delta_steps < 1 << 62 and when > state.last_record_time:
                    state.step_s.append((when - state.last_record_time) / delta_steps)
            state.last_step = step
            state.last_arrival = now
            state.ended = False
        if when is not None:
            state.last_record_time = when
            state.live = state.live or (not history and now - when <= self.rules.rules["hang"]["live_within_s"])
        else:
            state.live = state.live or not history

    def peers(self, source: str, run: Optional[str], fmt: Optional[str]) -> None:
        """Which sources `source`'s step time may be compared with (the straggler rule): those of the same run read
        in the same format (a rank's info.log and its own JSONL measure a step differently), of another rank."""
        self._groups[source] = (run, fmt)

    def _stragglers(self, now: float, out: List[Change]) -> None:
        rule = self.rules.rules["straggler"]
        groups: Dict[Any, Dict[str, float]] = {}
        for source, st in self._sources.items():
            if len(st.step_ms) >= rule["min_window"] and rank_of(source) is not None:
                groups.setdefault(self._groups.get(source), {})[source] = statistics.median(st.step_ms)
        for medians in groups.values():
            self._stragglers_among(medians, rule, now, out)

    def _stragglers_among(self, medians: Dict[str, float], rule: Dict[str, Any], now: float, out: List[Change]) -> None:
        """The straggler rule over the median step times of one run's sources of one format: each against the
        median of the other ranks' (a second file of its own rank is not another rank)."""
        ranks = {source: rank_of(source) for source in medians}
        if len(set(ranks.values())) < 2:
            for source in medians:
                self._resolve("straggler", source, now, out, "no other rank to compare with")
            return
        ranked = sorted(medians.values())  # the others' median is read from it: a thousand ranks, not a million steps
        files = Counter(ranks.values())  # a rank with two files (info.log and worker_N.log): both left out by hand
        for source, median in medians.items():
            if files[ranks[source]] > 1:
                others_list = [m for s, m in medians.items() if ranks[s] != ranks[source]]
                others, count = statistics.median(others_list), len(others_list)
            else:
                others, count = _median_without(ranked, bisect_left(ranked, median)), len(medians) - 1
            slow = median > rule["ratio"] * others and median - others >= rule["min_ms"]
            if slow:
                step = self._sources[source].last_step
                self._fire("straggler", source, step, now, f"median step time {median:.0f} ms vs {others:.0f} ms on "
                           f"the other {count} source(s) ({median / others:.2f}x)", out)
            else:
                self._resolve("straggler", source, now, out, "step time back in line")

    # -- events ---------------------------------------------------------------------------------------------
    def _event(self, source: str, state: _SourceState, event: Dict[str, Any], now: float, out: List[Change]) -> None:
        kind = event.get("kind")
        if kind == "end":
            state.ended = True
            self._resolve("hang", source, now, out, "training ended")
        elif kind in ("start", "resume"):
            state.ended = False
        if not self.rules.on("error"):
            return
        rule = self.rules.rules["error"]
        message = str(event.get("message") or "")
        lowered = message.lower()
        if kind in rule["kinds"] or any(p.lower() in lowered for p in rule["phrases"]):
            step = event.get("step")
            step = step if isinstance(step, int) else None
            said = what_happened(message) or str(kind)
            self._fire("error", source, step, now, (said[:300] + (f" (step {step})" if step is not None else "")), out)
            state.clear["error"] = 0

    # -- alert bookkeeping ----------------------------------------------------------------------------------
    def _condition(self, rule: str, source: str, state: _SourceState, step: Any, now: float, out: List[Change],
                   firing: bool, message: str) -> None:
        if firing:
            state.clear[rule] = 0
            self._fire(rule, source, step if isinstance(step, int) else None, now, message, out)
            return
        if (rule, source) not in self._alerts:
            return
        state.clear[rule] = state.clear.get(rule, 0) + 1
        if state.clear[rule] >= self.rules.rules[rule].get("clear_after", 1):
            self._resolve(rule, source, now, out, "condition cleared")

    def _fire(self, rule: str, source: str, step: Optional[int], now: float, message: str, out: List[Change],
              ) -> None:
        key = (rule, source)
        alert = self._alerts.get(key)
        cooldown = float(self.rules.general["cooldown_s"])
        if alert is None:
            alert = {
                "id": f"a{self._next_id}", "rule": rule, "source": source, "step": step,
                "severity": self.rules.rules[rule]["severity"], "message": message, "first_seen": now,
                "last_seen": now, "count": 1, "state": "firing", "resolved_at": None,
            }
            self._next_id += 1
            self._alerts[key] = alert
            self.fired += 1
            out.append(self._change(alert, now, notify=True))
            return
        if alert["state"] == "resolved":
            if alert["resolved_at"] is not None and now - alert["resolved_at"] > cooldown:
                del self._alerts[key]  # long enough ago: a new alert
                self._fire(rule, source, step, now, message, out)
                return
            alert["state"], alert["resolved_at"] = "firing", None  # flapping: reopen the same alert
            with_notify = now - self._published.get(alert["id"], -math.inf) >= cooldown
            self._bump(alert, step, now, message)
            out.append(self._change(alert, now, notify=with_notify))
            return
        self._bump(alert, step, now, message)
        if now - self._published.get(alert["id"], -math.inf) >= cooldown:
            out.append(self._change(alert, now, notify=True))

    @staticmethod
    def _bump(alert: Dict[str, Any], step: Optional[int], now: float, message: str) -> None:
        alert["count"] += 1
        alert["last_seen"] = now
        if step is not None:
            alert["step"] = step
        if message:
            alert["message"] = message

    def _resolve(self, rule: str, source: str, now: float, out: List[Change], why: str) -> None:
        alert = self._alerts.get((rule, source))
        if alert is None or alert["state"] != "firing":
            return
        alert["state"] = "resolved"
        alert["resolved_at"] = now
        if not any(a is alert for a in self._resolved):
            self._resolved.append(alert)
        change = self._change(alert, now, notify=True)
        change["message"] = f"resolved ({why}): {alert['message']}"
        out.append(change)

    def _change(self, alert: Dict[str, Any], now: float, notify: bool) -> Change:
        self._published[alert["id"]] = now
        change = {"kind": "alert", "time": now, **alert}
        change["notify"] = notify
        if change["step"] is None:
            del change["step"]
        return change

