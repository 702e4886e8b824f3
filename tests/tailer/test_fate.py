"""`tailer.fate.judge`: how a run ended, from its events, its last step and total, and whether its writer left."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import pytest

from mstail.tailer.alerts.engine import AlertEngine, load_alert_rules
from mstail.tailer.alerts.fate import RunEvidence, judge

TRACEBACK = "Traceback (most recent call last):\n  File \"train.py\", line 3\nValueError: loss is NaN"


def evidence(*events: Dict[str, Any]) -> RunEvidence:
    seen = RunEvidence()
    for event in events:
        seen.see(event)
    return seen


@pytest.mark.parametrize("events, last, total, jsonl, left, fate", [
    ([], 10, 100, False, False, None),  # running: no end, the writer is there
    ([], 10, 100, False, True, "died"),  # the writer left before the total
    ([], 100, 100, False, True, "finished"),  # ... at the total
    ([], 10, None, False, True, "stopped"),  # nothing says more
    ([{"kind": "end", "step": 10}], 10, None, False, False, "finished"),  # an end logged: over, whatever the writer
    ([{"kind": "end", "step": 5}], 10, None, False, False, None),  # an end a later step went past: running again
    ([{"kind": "error", "step": 10, "message": TRACEBACK}], 10, None, False, False, None),  # not over yet
    ([{"kind": "error", "step": 10, "message": TRACEBACK}], 10, None, False, True, "died"),
    ([{"kind": "error", "step": 8, "message": TRACEBACK}], 10, None, False, True, "stopped"),  # steps went on after it
    ([{"kind": "error", "step": 3, "message": TRACEBACK}, {"kind": "end", "step": 3}], 3, 20, True, False, "died"),
    ([{"kind": "error", "step": 20, "message": TRACEBACK}, {"kind": "end", "step": 20}], 20, 20, False, False,
     "finished"),  # an error the run finished despite
    ([{"kind": "end", "step": 20}, {"kind": "error", "step": 20, "message": TRACEBACK}], 20, 20, False, False,
     "died"),  # an error after the end: a crash
    ([{"kind": "start", "step": 0}], 10, None, True, True, "died"),  # a JSONL stream: a start and no end
    ([{"kind": "start", "step": 0}], 10, None, False, True, "stopped"),  # a text log's start proves less
    ([{"kind": "start", "step": 0, "total_steps": 50}], 50, None, True, True, "finished"),  # the start's total
    ([{"kind": "end", "step": 9}, {"kind": "start", "step": 9}], 12, None, False, True, "stopped"),  # a new run
])
def test_judge(events: List[Dict[str, Any]], last: int, total: Optional[int], jsonl: bool, left: bool,
               fate: Optional[str]) -> None:
    verdict = judge(evidence(*events), last, total, jsonl, left)
    assert (verdict[0] if verdict else None) == fate


def test_a_death_names_its_step_total_and_error_line() -> None:
    died = judge(evidence({"kind": "error", "step": 15, "message": TRACEBACK}), 15, 100, False, True)
    assert died == ("died", "ValueError: loss is NaN (step 15 of 100)")
    earlier = judge(evidence({"kind": "error", "step": 9, "message": TRACEBACK}), 15, 100, False, True)
    assert earlier == ("died", "its writer left before the last step (step 15 of 100), no end logged; the last "
                       "error read: ValueError: loss is NaN (step 9)")


def test_the_died_alert_is_for_a_death_watched_and_resolves_when_the_run_goes_on() -> None:
    engine = AlertEngine()
    [fired] = engine.fate("rank_0", "died", "ValueError: x (step 5 of 10)", 5, 100.0)
    assert (fired["rule"], fired["severity"], fired["step"], fired["message"]) == (
        "died", "critical", 5, "run died: ValueError: x (step 5 of 10)")
    [resolved] = engine.fate("rank_0", None, "", None, 101.0)
    assert (resolved["rule"], resolved["state"]) == ("died", "resolved")
    assert engine.fate("rank_1", "died", "old", 5, 100.0, witnessed=False) == []  # over before mstail read it
    assert engine.fate("rank_2", "died", "guess", 5, 100.0, guess=True) == []  # the hang rule's to say
    assert engine.fate("rank_3", "stopped", "left", 5, 100.0) == engine.fate("rank_4", "finished", "end", 5, 100.0) == []
    off = AlertEngine(load_alert_rules(overrides={"died": {"enabled": False}}))
    assert off.fate("rank_0", "died", "x", 5, 100.0) == []
