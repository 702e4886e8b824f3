"""`AlertEngine.observe_all` (a run of records judged a rule at a time) against `observe` of each item in turn: the
same changes in the same order, the same alert table and the same saved state, on streams made to hit what a run's
shortcuts could get wrong (an alert firing, resolving and firing again within one run, a NaN or a spike mid-run, a
resume, missing keys and values that are no numbers, events between records, history flags changing), for every
built-in record rule and the settings that change how a run is judged (no cooldown, mean_ratio, trend, clear_after)."""

from __future__ import annotations

import json
import random
from typing import Any, Dict, List, Optional

import pytest

from mstail.tailer.alerts.engine import RUN_MIN, AlertEngine, load_alert_rules

T0 = 1_800_000_000.0
NAN, INF = float("nan"), float("inf")


def _stream(seed: int, count: int = 700) -> List[Dict[str, Any]]:
    """Records of one source (and a few events): a calm run with stretches of NaN, spikes, grad norm bursts,
    overflow streaks, a loss scale that falls to the floor and comes back, resumes, odd values."""
    rng = random.Random(seed)
    items: List[Dict[str, Any]] = []
    step, segment, scale, t, level = 0, 0, 65536.0, T0, 2.0
    nan_until = spike_until = norm_until = overflow_until = low_scale_until = -1
    for number in range(count):
        step += 1 if rng.random() > 0.03 else rng.choice([0, 2, -3])
        t += rng.choice([0.5, 0.5, 0.5, 2.0, 0.0])
        if rng.random() < 0.01:
            segment += 1
        roll = rng.random()
        if roll < 0.02:
            nan_until = number + rng.choice([0, 1, 3, 8])
        elif roll < 0.04:
            spike_until = number + rng.choice([0, 2, 12])
        elif roll < 0.055:
            norm_until = number + rng.choice([0, 4, 9])
        elif roll < 0.07:
            overflow_until = number + rng.choice([3, 10, 14, 30])
        elif roll < 0.08:
            low_scale_until = number + rng.choice([0, 1, 5, 60])
        if rng.random() < 0.01:  # the loss level moves for good: a window's old values bound nothing after
            level *= rng.choice([0.2, 5.0])
        loss: Any = level * (1.0 + rng.random() * 0.05) - number * 0.0001
        if number <= spike_until:
            loss *= rng.choice([1.3, 5.0, 40.0])
        if number <= nan_until:
            loss = rng.choice([NAN, INF, -INF])
        norm: Any = 1.0 + rng.random() * 0.2
        if number <= norm_until:
            norm = rng.choice([15.0, 2e4, NAN])
        scale = 1.0 if number <= low_scale_until else (rng.choice([0.5, 1.0]) if rng.random() < 0.01 else 65536.0)
        record: Dict[str, Any] = {"seq": number + 1, "source": "r0", "step": step, "time": t, "segment": segment,
                                  "loss": loss, "step_time_ms": rng.choice([500, 500.0, 510])}
        if rng.random() > 0.05:
            record["grad_norm"] = norm
        if rng.random() > 0.05:
            record["loss_scale"] = scale
        if number <= overflow_until or rng.random() < 0.9:
            record["overflow"] = number <= overflow_until if rng.random() < 0.5 else int(number <= overflow_until)
        odd = rng.random()
        if odd < 0.01:
            record[rng.choice(["loss", "grad_norm", "loss_scale", "time", "step_time_ms"])] = rng.choice(
                [None, "x", True, 10 ** 400, 3, -1, 0])
        elif odd < 0.015:
            record["step"] = rng.choice([None, 2.5, True])
        items.append(record)
        event = rng.random()
        if event < 0.006:
            items.append({"source": "r0", "kind": "error", "step": step,
                          "message": "Traceback (most recent call last):\nValueError: boom"})
        elif event < 0.009:
            items.append({"source": "r0", "kind": rng.choice(["end", "start", "checkpoint"]), "message": "x"})
        elif event < 0.01:
            items.append({"source": "r0", "kind": "alert", "id": "a7", "message": "an alert stored before"})
    return items


def _batches(items: List[Dict[str, Any]], rng: random.Random) -> List[List[Dict[str, Any]]]:
    """The items cut into deliveries of random sizes, most long enough to be judged as runs."""
    out, start = [], 0
    while start < len(items):
        size = rng.choice([1, 3, RUN_MIN - 1, RUN_MIN, 40, 84, 84, 200])
        out.append(items[start:start + size])
        start += size
    return out


def _text(value: Any) -> str:
    return json.dumps(value)  # key order, and NaN as NaN: equal texts are equal states


SETTINGS: Dict[str, Optional[Dict[str, Any]]] = {
    "defaults": None,
    "no cooldown": {"general": {"cooldown_s": 0.0}},
    "short cooldown, quick clears": {"general": {"cooldown_s": 30.0}, "nonfinite": {"clear_after": 1},
                                     "loss_spike": {"clear_after": 1, "min_window": 5, "window": 10},
                                     "grad_norm": {"clear_after": 2, "min_window": 3, "window": 7}},
    "mean_ratio, trend": {"loss_spike": {"method": "mean_ratio", "ratio": 1.2, "window": 30, "min_window": 10},
                          "trend": {"enabled": True, "window": 40, "min_window": 40, "every": 7,
                                    "divergence_rel": 0.01, "plateau_rel": 0.05}},
    "wide min_rel, nonfinite on the scale": {"loss_spike": {"min_rel": 2.0, "z": 1.0},
                                             "nonfinite": {"metrics": ["loss", "loss_scale", "time"]},
                                             "overflow": {"streak": 1, "clear_after": 3}},
    "rules off": {"loss_spike": {"enabled": False}, "error": {"enabled": False}, "loss_scale": {"enabled": False}},
}


@pytest.mark.parametrize("settings", list(SETTINGS))
@pytest.mark.parametrize("seed", range(12))
def test_a_run_judged_at_once_changes_what_each_record_in_turn_changes(settings: str, seed: int,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    rules = load_alert_rules(overrides=SETTINGS[settings])
    one_by_one, at_once = AlertEngine(rules), AlertEngine(rules)
    runs: List[int] = []
    judge = AlertEngine._run
    monkeypatch.setattr(AlertEngine, "_run", lambda self, *args: runs.append(len(args[2])) or judge(self, *args))
    rng = random.Random(seed)
    now, expected, got = T0, [], []
    for batch in _batches(_stream(seed), rng):
        now += rng.choice([0.1, 1.0, 40.0, 400.0])
        history = [rng.random() < 0.9] * len(batch) if rng.random() < 0.8 else [rng.random() < 0.5 for _ in batch]
        for item, flag in zip(batch, history):
            expected += one_by_one.observe("r0", item, now, history=flag)
        got += at_once.observe_all("r0", batch, now, history)
        assert _text(got) == _text(expected)
    assert sum(runs) > 300  # most records were judged in runs, not one by one
    assert sum(1 for change in expected if change["state"] == "resolved") > 0
    assert _text(at_once.snapshot()) == _text(one_by_one.snapshot())
    assert _text(at_once.table()) == _text(one_by_one.table())
    assert at_once.hang_bound("r0") == one_by_one.hang_bound("r0")


def _calm(first: int, count: int, **at: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Records `first`.. of a calm run; `at={"step": {...}}` changes some (the keys are steps as text)."""
    return [{"seq": s, "source": "r0", "step": s, "time": T0 + s, "loss": 2.0 + (s % 5) / 100, "grad_norm": 1.0,
             "step_time_ms": 500, "overflow": 0, "loss_scale": 65536.0, **at.get(str(s), {})}
            for s in range(first, first + count)]


def _one_by_one(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    engine, changes = AlertEngine(), []
    for record in records:
        changes += engine.observe("r0", record, T0, history=True)
    return changes


def test_an_alert_that_fires_resolves_and_fires_again_within_one_run() -> None:
    """NaNs at 30 and at 40-41 in one run of 84: fire, resolve after 5 clean records, reopen (the same alert, within
    the cooldown: not notified; 41 counts silently), resolve again; and a loss scale at the floor in the same run."""
    records = _calm(1, 84, **{"30": {"loss": NAN}, "40": {"loss": NAN}, "41": {"loss": NAN},
                              "60": {"loss_scale": 1.0}, "61": {"loss_scale": 1.0}})
    engine = AlertEngine()
    changes = engine.observe_all("r0", records, T0, [True] * len(records))
    seen = [(c["rule"], c["state"], c["step"], c["count"], c["notify"]) for c in changes]
    assert seen == [("nonfinite", "firing", 30, 1, True), ("nonfinite", "resolved", 30, 1, True),
                    ("nonfinite", "firing", 40, 2, False), ("nonfinite", "resolved", 41, 3, True),
                    ("loss_scale", "firing", 60, 1, True), ("loss_scale", "resolved", 61, 2, True)]
    assert [c["id"] for c in changes] == ["a1"] * 4 + ["a2"] * 2
    assert changes[1]["time"] == T0 and "loss = NaN" in changes[2]["message"]
    assert _text(changes) == _text(_one_by_one(records))


def test_a_nan_and_a_spike_mid_run_are_judged_at_their_records() -> None:
    """A spike at step 50 of a run of 84 fires at 50 (its window the 49 steps before, not the run's end), the NaN
    at 70 at 70, and the spike's alert resolves at 55."""
    records = _calm(1, 84, **{"50": {"loss": 9.0}, "70": {"loss": NAN}})
    changes = AlertEngine().observe_all("r0", records, T0, [True] * len(records))
    assert [(c["rule"], c["state"], c["step"]) for c in changes] == [
        ("loss_spike", "firing", 50), ("loss_spike", "resolved", 50), ("nonfinite", "firing", 70),
        ("nonfinite", "resolved", 70)]
    assert "vs rolling median 2.02" in changes[0]["message"]
    assert _text(changes) == _text(_one_by_one(records))


def test_a_spike_after_the_loss_fell_within_the_run() -> None:
    """The window holds a loss of ~10; the run's first 60 records fall to ~2, then 5 at step 170: below anything the
    window held before the run, yet a spike against the median of its own window (mostly the run's ~2s)."""
    engine = AlertEngine()
    engine.observe_all("r0", _calm(1, 100, **{str(s): {"loss": 10.0 + (s % 3) / 10} for s in range(1, 101)}), T0,
                       [True] * 100)
    records = _calm(101, 84, **{"170": {"loss": 5.0}})
    changes = engine.observe_all("r0", records, T0, [True] * len(records))
    assert [(c["rule"], c["state"], c["step"]) for c in changes] == [
        ("loss_spike", "firing", 170), ("loss_spike", "resolved", 170)]


def test_a_run_is_judged_as_a_run_only_from_run_min_records_on(monkeypatch: pytest.MonkeyPatch) -> None:
    judged: List[int] = []
    judge = AlertEngine._run
    monkeypatch.setattr(AlertEngine, "_run", lambda self, source, state, records, *rest: judged.append(len(records))
                        or judge(self, source, state, records, *rest))
    engine = AlertEngine()
    engine.observe_all("r0", _calm(1, RUN_MIN - 1), T0, [True] * (RUN_MIN - 1))
    assert judged == []
    engine.observe_all("r0", _calm(RUN_MIN, 2 * RUN_MIN), T0, [True] * RUN_MIN + [False] * RUN_MIN)
    assert judged == [RUN_MIN, RUN_MIN]  # split where the history flag changes
