"""Alerts: the rules (`tailer.alerts.rules.RULES`) over the record/event stream of every source -> alert state changes.

`AlertEngine.observe_all(source, items, now, history)` is fed every stored record and event (from
`Tailer._deliver`, in the event loop; `observe` takes one); `tick(now, states)` runs the time-based rules (hang,
gone, straggler) once per pass; `fate` raises `died`. They return *changes*: dicts shaped like events (`kind:
"alert"`) that the tailer stores (so they get a `seq` and SSE replay covers them) and publishes. The engine keeps the
alert table for `GET /api/alerts` (active + recently resolved).

Records take one path: each record rule's `judge` over a batch of one source's records (`_judge`), then the alert
changes its verdicts make, in the order judging each record in turn would make them (`_settle`). A run of `RUN_MIN`
records or more of one source (a catch-up's batch) is one batch; fewer go one record at a time, each a batch of one.
A rule firing on many records in a row costs its first fire and one count, not a fire per record.

The settings: `DEFAULT_RULES` (each rule's keys and defaults, from `RULES`) and `DEFAULT_GENERAL`; a TOML file given
with `--alerts` overrides them per rule (`load_alert_rules`).

Every alert: id, rule, source, step, severity, message, first_seen, last_seen (mstail's clock), logged_at (the log's
time of the record at `step`, for a rule judging records; None where the log has no time or for a rule of mstail's
clock), count, state (firing | resolved). One alert per (rule, source) at a time; repeats while firing raise `count` and are published at
most once per `cooldown_s`; an alert resolves when its condition has been clear for `clear_after` records
(at once for hang/gone); a rule that fires again within `cooldown_s` of resolving reopens the same alert.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections import deque
from functools import partial
from itertools import compress, groupby, repeat
from operator import contains, ne
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

from mstail.parsers.record import ESTIMATED
from mstail.platform import tomllib

from mstail.tailer.alerts.rules import (RULES, SEVERITIES, Columns, OneRecord, SourceState, Verdict, Verdicts,
                                        hang_bound_of, may_hang, number)
from mstail.tailer.inputs.discovery import rank_of


Change = Dict[str, Any]

#: Every rule, every key, every default (`RULES`).
DEFAULT_RULES: Dict[str, Dict[str, Any]] = {name: rule.defaults for name, rule in RULES.items()}
#: Keys that are not rules: [general] settings.
DEFAULT_GENERAL: Dict[str, Any] = {"cooldown_s": 300.0, "keep_resolved": 200}
SNAPSHOT_VERSION = 1  # of `AlertEngine.snapshot`'s shape: a state saved in another is replayed instead
#: From this many records of one source in a row on, `observe_all` judges them as one batch (`_run`); fewer go one
#: record at a time, a batch of one each (no columns to make: at 3 records that cost 17.5 µs a record against 18.8
#: as a batch, at 4 13.6 against 11.3; tests/bench/alert_rules.py's records, batches of 3 and 4).
RUN_MIN = 4
_CHOICES = {**{(name, key): values for name, rule in RULES.items() for key, values in rule.choices.items()},
            ("*", "severity"): SEVERITIES}


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
class AlertEngine:
    """Rules -> alerts. Used from one thread (the event loop).

    Args:
        rules: the settings (`load_alert_rules`); default: the built-in defaults.
    """

    def __init__(self, rules: Optional[AlertRules] = None) -> None:
        self.rules = rules or default_rules()
        self._on = {name: bool(rule["enabled"]) for name, rule in self.rules.rules.items()}  # `rules.on`, per record
        on = [(name, rule) for name, rule in RULES.items() if self._on[name]]
        # What judges a batch of records: the record rules, then every record counts towards clearing an event rule's
        # alert (a step after an error).
        self._record_judges = [(name, rule.judge) for name, rule in on if rule.on == "records"] + [
            (name, _counts_towards_clearing) for name, rule in on if rule.on == "events"]
        self._event_judges = [(name, rule.judge) for name, rule in on if rule.on == "events"]
        self._sources: Dict[str, SourceState] = {}
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
            state = self._sources[source] = SourceState(self.rules.rules)
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
        judged as one batch (`_run`)."""
        state = self._sources.get(source)
        if state is None:
            state = self._sources[source] = SourceState(self.rules.rules)
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

    def _records(self, source: str, state: SourceState, records: Sequence[Dict[str, Any]], now: float,
                 out: List[Change], history: bool) -> None:
        """Records in a row: split where the segment changes (a resume resets the windows); a long enough part is
        judged as one batch, the others record by record."""
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

    def _run(self, source: str, state: SourceState, records: Sequence[Dict[str, Any]], now: float,
             out: List[Change], history: bool) -> None:
        """A run of one segment's records, judged as one batch."""
        columns = Columns(records)
        self._clock_all(state, records, columns, now, history)
        self._judge(source, state, columns, now, out)

    def _record(self, source: str, state: SourceState, record: Dict[str, Any], now: float, out: List[Change],
                history: bool = False) -> None:
        """One record, judged as a batch of one."""
        segment = record.get("segment", 0)
        if segment != state.segment:  # a resume: the windows describe another run
            state.new_segment(segment)
        self._clock(state, record, now, history)
        self._judge(source, state, OneRecord(record), now, out)

    def _judge(self, source: str, state: SourceState, columns: Columns, now: float, out: List[Change]) -> None:
        """A batch of one segment's records: each record rule's verdicts over the batch first (its state brought to
        the batch's end), then the alerts they change, in record and rule order (a rule reads no alert, so a batch of
        one settles each verdict as it comes)."""
        settings = self.rules.rules
        if len(columns.records) == 1:  # each rule's verdict changes its alert in turn: nothing to order
            record = columns.records[0]
            step = record.get("step")
            for name, judge in self._record_judges:
                at, firing, message = judge(settings[name], state, columns)
                if at:
                    fired = firing is not None and firing[0]
                    self._condition(name, source, state, step, now, out, fired, message(0) if fired else "",
                                    logged_time(record) if fired else None)
            return
        verdicts = [(name, judge(settings[name], state, columns)) for name, judge in self._record_judges]
        self._settle(source, state, columns.records, verdicts, now, out)

    def _clock_all(self, state: SourceState, records: Sequence[Dict[str, Any]], columns: Columns, now: float,
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
            when = number(record.get("time"))
            if when is not None and math.isfinite(when):
                state.last_record_time = when
                break

    def _settle(self, source: str, state: SourceState, records: Sequence[Dict[str, Any]],
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
                first = records[at[start]]
                self._condition(rule, source, state, first.get("step"), now, out, True, message(start),
                                logged_time(first))
                if end - start > 1:
                    alert = self._alerts[key]
                    alert["count"] += end - start - 1
                    alert["last_seen"] = now
                    for k in range(end - 1, start, -1):
                        step = records[at[k]].get("step")
                        if isinstance(step, int):
                            alert["step"], alert["logged_at"] = step, logged_time(records[at[k]])
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
                state = sources[source] = SourceState(self.rules.rules)
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
        settings, alerts = self.rules.rules, self._alerts
        if self._on["straggler"]:
            self._stragglers(now, out)
        gone_on, hang_on = self._on["gone"], self._on["hang"]
        # A thousand sources a tick: what cannot change an alert is passed over before any median is taken (a
        # source silent less than `min_s` is within its hang bound; a resolve without an alert is a no-op).
        for source, follower_state in states.items():
            state = self._sources.get(source)
            gone = follower_state == "gone"
            if gone_on and (gone or ("gone", source) in alerts):
                self._apply("gone", source, state.last_step if state else None, now,
                            RULES["gone"].judge(settings["gone"], follower_state), out)
            if state is None or not hang_on:
                continue
            if may_hang(settings["hang"], state, gone, now) or ("hang", source) in alerts:
                self._hang(source, state, gone, now, writing, out)
        return out

    def _hang(self, source: str, state: SourceState, gone: bool, now: float,
              writing: Optional[Callable[[str], Optional[bool]]], out: List[Change]) -> None:
        """The hang rule for one source at a tick (`tick`'s `writing`; `gone`: its file disappeared)."""
        asked = None if writing is None else partial(writing, source)
        self._apply("hang", source, state.last_step, now,
                    RULES["hang"].judge(self.rules.rules["hang"], state, gone, now, asked), out)

    def fate(self, source: str, fate: Optional[str], why: str, step: Optional[int], now: float, guess: bool = False,
             witnessed: bool = True) -> List[Change]:
        """A source's run ended (`fate`: finished | died | stopped, `tailer.alerts.fate`; `why` says how) or runs again
        (None). Over, it is not hung (unless the end is a `guess` of the time bound that it did not finish: then the
        hang rule goes on); died raises the `died` alert when the end was `witnessed` (seen while mstail watched:
        an old log that died years ago is not news); running again resolves it."""
        state = self._sources.get(source)
        if state is None:
            state = self._sources[source] = SourceState(self.rules.rules)
        out: List[Change] = []
        if fate is None:
            self._resolve("died", source, now, out, "it runs again")
            return out
        if not guess or fate == "finished":
            state.ended = True
            self._resolve("hang", source, now, out, "training ended")
        if fate == "died" and not guess and witnessed and self.rules.on("died"):
            self._fire("died", source, step, now, RULES["died"].judge(self.rules.rules["died"], why), out)
        return out

    def hang_bound(self, source: str) -> float:
        """Seconds without a new step before `source` counts as hung: max(min_s, k x median step time)."""
        return hang_bound_of(self.rules.rules["hang"], self._sources.get(source))

    # -- records ------------------------------------------------------------------------------------------
    def _clock(self, state: SourceState, record: Dict[str, Any], now: float, history: bool) -> None:
        """What a record says of its source's pace (step times, its last step and time, live or not): the hang and
        straggler rules' evidence."""
        step = record.get("step")
        when = number(record.get("time"))
        if when is not None and not math.isfinite(when):
            when = None
        if isinstance(step, int) and (state.last_step is None or step != state.last_step):
            step_ms = number(record.get("step_time_ms"))
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
            for source, verdict in RULES["straggler"].judge(rule, medians).items():
                self._apply("straggler", source, self._sources[source].last_step, now, verdict, out)

    # -- events ---------------------------------------------------------------------------------------------
    def _event(self, source: str, state: SourceState, event: Dict[str, Any], now: float, out: List[Change]) -> None:
        kind = event.get("kind")
        if kind == "end":
            state.ended = True
            self._resolve("hang", source, now, out, "training ended")
        elif kind in ("start", "resume"):
            state.ended = False
        for name, judge in self._event_judges:
            message = judge(self.rules.rules[name], event)
            if message is not None:
                step = event.get("step")
                self._fire(name, source, step if isinstance(step, int) else None, now, message, out,
                           logged_time(event))
                state.clear[name] = 0

    # -- alert bookkeeping ----------------------------------------------------------------------------------
    def _condition(self, rule: str, source: str, state: SourceState, step: Any, now: float, out: List[Change],
                   firing: bool, message: str, logged: Optional[float] = None) -> None:
        if firing:
            state.clear[rule] = 0
            self._fire(rule, source, step if isinstance(step, int) else None, now, message, out, logged)
            return
        if (rule, source) not in self._alerts:
            return
        state.clear[rule] = state.clear.get(rule, 0) + 1
        if state.clear[rule] >= self.rules.rules[rule].get("clear_after", 1):
            self._resolve(rule, source, now, out, "condition cleared")

    def _apply(self, rule: str, source: str, step: Optional[int], now: float, verdict: Verdict,
               out: List[Change]) -> None:
        """A tick rule's `verdict` on `source`: fire, resolve, or nothing."""
        if verdict is not None:
            firing, text = verdict
            if firing:
                self._fire(rule, source, step, now, text, out)
            else:
                self._resolve(rule, source, now, out, text)

    def _fire(self, rule: str, source: str, step: Optional[int], now: float, message: str, out: List[Change],
              logged: Optional[float] = None) -> None:
        """Raise, reopen or repeat the alert of (`rule`, `source`) at `step`; `logged`: the log's time of the record
        at that step (None: the log has none there, or the rule judges on mstail's clock)."""
        key = (rule, source)
        alert = self._alerts.get(key)
        cooldown = float(self.rules.general["cooldown_s"])
        if alert is None:
            alert = {
                "id": f"a{self._next_id}", "rule": rule, "source": source, "step": step,
                "severity": self.rules.rules[rule]["severity"], "message": message, "first_seen": now,
                "last_seen": now, "logged_at": logged, "count": 1, "state": "firing", "resolved_at": None,
            }
            self._next_id += 1
            self._alerts[key] = alert
            self.fired += 1
            out.append(self._change(alert, now, notify=True))
            return
        if alert["state"] == "resolved":
            if alert["resolved_at"] is not None and now - alert["resolved_at"] > cooldown:
                del self._alerts[key]  # long enough ago: a new alert
                self._fire(rule, source, step, now, message, out, logged)
                return
            alert["state"], alert["resolved_at"] = "firing", None  # flapping: reopen the same alert
            with_notify = now - self._published.get(alert["id"], -math.inf) >= cooldown
            self._bump(alert, step, now, message, logged)
            out.append(self._change(alert, now, notify=with_notify))
            return
        self._bump(alert, step, now, message, logged)
        if now - self._published.get(alert["id"], -math.inf) >= cooldown:
            out.append(self._change(alert, now, notify=True))

    @staticmethod
    def _bump(alert: Dict[str, Any], step: Optional[int], now: float, message: str, logged: Optional[float]) -> None:
        alert["count"] += 1
        alert["last_seen"] = now
        if step is not None:
            alert["step"], alert["logged_at"] = step, logged
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


def _counts_towards_clearing(settings: Dict[str, Any], state: SourceState, columns: Columns) -> Verdicts:
    """An event rule's verdicts on a batch of records: each judged, none fired (a step after an error counts towards
    clearing its alert)."""
    return columns.everyone, None, str


def logged_time(record: Dict[str, Any]) -> Optional[float]:
    """The log's time of a record: its `time`, unless that is the moment mstail read the line (`estimated`)."""
    when = number(record.get("time"))
    if when is None or not math.isfinite(when) or "time" in str(record.get(ESTIMATED, "")).split():
        return None
    return when
