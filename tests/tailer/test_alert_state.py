"""The alert rules' state saved with the history: a restart takes it back instead of replaying every stored item,
and judges the next records as a run without the restart would (issue 16, goal 3)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from mstail.parsers import load_formats
from mstail.tailer.alerts.engine import AlertEngine, load_alert_rules
from mstail.tailer.config import Config
from mstail.tailer.history.db import StateDB, _item_json, _loads
from mstail.tailer.live.hub import Hub
from mstail.tailer.app.serve import _restore_then_tail
from mstail.tailer.history.store import Store
from mstail.tailer.live.sidecar import Tailer

T0 = 1.7e9


def _records(source: str, steps: range, ms: float = 500.0) -> List[Dict[str, Any]]:
    """Records whose loss wobbles around 2 (a rolling window the spike rule can judge), one NaN, overflows."""
    return [{"source": source, "step": s, "time": T0 + s, "loss": "NaN" if s == 7 else 2.0 + (s % 5) / 100,
             "grad_norm": 1.0 + (s % 3) / 10, "overflow": s % 40 < 3, "loss_scale": 2.0 ** (16 - s // 50),
             "step_time_ms": ms + s % 4} for s in steps]


def _stream(first: range, then: range) -> List[Dict[str, Any]]:
    items: List[Dict[str, Any]] = []
    for a, b in zip(_records("rank_0", first), _records("rank_1", first, ms=800.0)):
        items += [a, b]
    items.append({"source": "rank_1", "kind": "error", "step": first[-1], "message": "Traceback (most recent call last):\n"
                  "  File \"x.py\", line 1\nRuntimeError: device lost"})
    spike = [dict(r, loss=9.0) if r["step"] == then[0] + 2 else r for r in _records("rank_0", then)]
    return items + spike + _records("rank_1", then, ms=800.0)


def _feed(engine: AlertEngine, items: List[Dict[str, Any]], ticks: bool = True) -> List[Dict[str, Any]]:
    changes = []
    for item in items:
        data = {k: (float(v) if v == "NaN" else v) for k, v in item.items()}
        now = T0 + data.get("step", 0) + 0.5
        changes += engine.observe(data["source"], data, now)
        if ticks:
            changes += engine.tick(now, {"rank_0": "following", "rank_1": "following"}, lambda source: True)
    return changes


def test_a_restored_engine_judges_the_next_records_as_one_that_never_stopped() -> None:
    rules = load_alert_rules(overrides={"overflow": {"streak": 2}, "trend": {"enabled": True, "window": 20,
                                                                             "min_window": 20, "every": 5}})
    before, after = _stream(range(1, 61), range(61, 100))[:121], _stream(range(1, 61), range(61, 100))[121:]
    kept = AlertEngine(rules)
    _feed(kept, before)
    saved = _loads(_item_json(kept.snapshot()))  # through the state file's JSON
    restored = AlertEngine(load_alert_rules(overrides={"overflow": {"streak": 2}, "trend": {
        "enabled": True, "window": 20, "min_window": 20, "every": 5}}))
    assert restored.restore(saved) is None
    assert restored.table() == kept.table()

    went_on, came_back = _feed(kept, after), _feed(restored, after)
    assert came_back == went_on
    assert any(c["rule"] == "loss_spike" and c["state"] == "firing" for c in came_back)  # its window spans the restart
    assert "straggler" in {a["rule"] for a in restored.table()["active"]}  # fired before, judged on after it
    assert restored.table() == kept.table() and restored.snapshot() == kept.snapshot()
    assert restored.hang_bound("rank_0") == kept.hang_bound("rank_0")


def test_a_snapshot_whose_windows_kept_a_running_sum_still_restores() -> None:
    """Saved before a window's mean was its values' exact sum: [values, running sum, appends] per window."""
    before, after = _stream(range(1, 61), range(61, 100))[:121], _stream(range(1, 61), range(61, 100))[121:]
    kept = AlertEngine()
    _feed(kept, before)
    saved = json.loads(json.dumps(kept.snapshot()))
    for state in saved["sources"].values():
        for window in ("loss", "norm"):
            assert isinstance(state[window], list) and all(isinstance(v, float) for v in state[window])
            state[window] = [state[window], sum(state[window]) + 1e-9, 4095]  # the old shape, its sum drifted
    restored = AlertEngine()
    assert restored.restore(saved) is None
    assert _feed(restored, after) == _feed(kept, after) and restored.snapshot() == kept.snapshot()


def test_a_snapshot_for_other_rules_or_damaged_is_refused_and_takes_nothing() -> None:
    engine = AlertEngine()
    _feed(engine, _stream(range(1, 30), range(30, 31)))
    saved = engine.snapshot()
    other = AlertEngine(load_alert_rules(overrides={"loss_spike": {"z": 5.0}}))
    assert "rules changed" in (other.restore(saved) or "")
    broken = json.loads(json.dumps(saved))
    broken["current"].append("a999")
    fresh = AlertEngine()
    assert "does not hold together" in (fresh.restore(broken) or "")
    assert fresh.table() == AlertEngine().table() and fresh.snapshot() == AlertEngine().snapshot()


# -- through the state file and the server's start ----------------------------------------------------------
class _Counting(AlertEngine):
    """An engine that counts the stored items replayed into it."""

    replayed = 0

    def replay(self, item: Dict[str, Any]) -> None:
        self.replayed += 1
        super().replay(item)


def _no_loop(tailer: Tailer) -> None:
    """`tailer.run` returns at once: the passes are the test's. (Not by setting the stop event: a replay stopped
    by it leaves the rules' state incomplete, which is then not saved.)"""
    async def run(stop: asyncio.Event) -> None:
        return None

    tailer.run = run  # type: ignore[method-assign]


def _loaded(log: Path, state: Path, engine: Optional[AlertEngine] = None) -> Tailer:
    """A tailer of `log` with the history in `state` loaded; `engine`: its alert engine (default a `_Counting`)."""
    config = Config(jsonl=(str(log),), alert_rules=None)
    store = Store(StateDB(state, expected="test"))
    tailer = Tailer(config, load_formats(user_dir=Path("/nonexistent")), store, Hub(), alerts=engine or _Counting())
    tailer.resume(store.load())
    _no_loop(tailer)
    return tailer


def _alter(state: Path, sql: str) -> None:
    """Run `sql` on the state file (what an older mstail left, a damaged file)."""
    db = StateDB(state, expected="test")
    with db.conn:
        db.conn.execute(sql)
    db.close()


def _start(log: Path, state: Path) -> Tailer:
    """What `serve` does at start, without the server: load the history, give the rules back their state, and
    one pass over the log."""
    tailer = _loaded(log, state)
    store = tailer.store

    async def start() -> None:
        await _restore_then_tail(store, tailer, asyncio.Event(), {})
        await tailer.pass_once()

    asyncio.run(start())
    return tailer


def _write(log: Path, steps: range, spike_at: int = -1) -> None:
    with open(log, "a", encoding="utf-8") as out:
        for s in steps:
            out.write(json.dumps({"step": s, "time": T0 + s, "loss": 9.0 if s == spike_at else 2.0 + (s % 5) / 100,
                                  "grad_norm": "NaN" if s == 3 else 1.0}) + "\n")


def test_a_restart_takes_the_rules_state_back_without_a_replay_and_a_spike_spanning_it_fires(tmp_path: Path) -> None:
    log, state = tmp_path / "metrics.jsonl", tmp_path / "state.sqlite"
    _write(log, range(1, 41))
    first = _start(log, state)
    [nan] = first.alerts.table()["resolved"]  # type: ignore[union-attr]  # fired at step 3, cleared 5 steps later
    first.store.close()

    _write(log, range(41, 46), spike_at=43)
    second = _start(log, state)
    assert second.alerts.replayed == 0  # type: ignore[union-attr]
    table = second.alerts.table()  # type: ignore[union-attr]
    assert [(a["id"], a["rule"]) for a in table["active"]] == [("a2", "loss_spike")]  # ids go on; 20+ values judged it
    assert [(a["id"], a["rule"]) for a in table["resolved"]] == [(nan["id"], "nonfinite")]
    second.store.close()


def test_a_state_without_the_rules_state_is_replayed_whole_then_saved(tmp_path: Path, caplog: Any) -> None:
    log, state = tmp_path / "metrics.jsonl", tmp_path / "state.sqlite"
    _write(log, range(1, 41))
    _start(log, state).store.close()
    _alter(state, "DELETE FROM meta WHERE key = 'alerts'")  # what an mstail before the saved state left

    _write(log, range(41, 46), spike_at=43)
    with caplog.at_level(logging.WARNING):
        second = _start(log, state)
    assert second.alerts.replayed == 42  # type: ignore[union-attr]  # 40 records, the NaN alert fired and resolved
    assert [a["rule"] for a in second.alerts.table()["active"]] == ["loss_spike"]  # type: ignore[union-attr]
    second.store.close()
    assert not caplog.records  # an older state is not a problem to report
    third = _start(log, state)
    assert third.alerts.replayed == 0  # type: ignore[union-attr]
    third.store.close()


@pytest.mark.parametrize("rules, damage, said", [
    ({"loss_spike": {"window": 50}}, None, "rules changed"),
    ({}, "json_set(value, '$.current', json_array('a999'))", "does not hold together"),
    ({}, "'{\"seq\": 1, \"vers'", "does not fit the stored items"),  # cut short: no JSON
    ({}, "'[1, 2]'", "does not fit the stored items"),
    ({}, "json_set(value, '$.seq', 10000)", "does not fit the stored items"),
])
def test_changed_rules_or_a_damaged_saved_state_replay_the_history_said_once(
        tmp_path: Path, caplog: Any, rules: Dict[str, Any], damage: Any, said: str) -> None:
    log, state = tmp_path / "metrics.jsonl", tmp_path / "state.sqlite"
    _write(log, range(1, 41))
    _start(log, state).store.close()
    if damage is not None:
        _alter(state, f"UPDATE meta SET value = {damage} WHERE key = 'alerts'")
    engine = _Counting(load_alert_rules(overrides=rules))
    tailer = _loaded(log, state, engine)
    with caplog.at_level(logging.WARNING):
        asyncio.run(_restore_then_tail(tailer.store, tailer, asyncio.Event(), {}))
    assert engine.replayed == 42
    [warning] = caplog.records
    assert said in warning.getMessage()
    tailer.store.close()


def test_after_a_crash_only_the_items_after_the_last_saved_state_are_replayed(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr("mstail.tailer.history.store.ALERT_SAVE_ITEMS", 10)
    log, state = tmp_path / "metrics.jsonl", tmp_path / "state.sqlite"
    _write(log, range(1, 16))
    first = _start(log, state)  # 15 records: the state saved with them
    _write(log, range(16, 21))
    asyncio.run(first.pass_once())  # 5 more: committed, the state not saved again (fewer than 10 since)
    first.store.db.close()  # the process dies: nothing more is written
    second = _start(log, state)
    assert second.alerts.replayed == 5  # type: ignore[union-attr]
    assert second.store.last_seq == 20 + 2  # 20 records, the NaN's alert fired and resolved
    second.store.close()


def test_a_replay_cut_short_by_a_stop_saves_no_state(tmp_path: Path, monkeypatch: Any) -> None:
    log, state = tmp_path / "metrics.jsonl", tmp_path / "state.sqlite"
    _write(log, range(1, 400))
    _start(log, state).store.close()
    _alter(state, "DELETE FROM meta WHERE key = 'alerts'")
    monkeypatch.setattr("mstail.tailer.app.serve.REPLAY_SLICE_S", 0.0)  # the stop is looked at after every batch
    tailer = _loaded(log, state)
    stop = asyncio.Event()
    stop.set()  # Ctrl-C during the replay
    asyncio.run(_restore_then_tail(tailer.store, tailer, stop, {}))
    assert 0 < tailer.alerts.replayed < tailer.store.last_seq  # type: ignore[union-attr]
    tailer.store.close()
    reopened = StateDB(state, expected="test")
    assert reopened.saved_alerts() is None  # an incomplete state is never taken as whole
    reopened.close()
