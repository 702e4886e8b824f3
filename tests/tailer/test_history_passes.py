"""Many files' history is read in short passes that take turns: a pass reads the history of one file after another,
the one read longest ago first, only while it has time (a first pass over 1,024 files once parsed 64 KiB of every one
before it looked at the clock: 12-29 s, and 0.9 GB of records in memory at once); a live file's new line is read by
the very next pass however many files are still reading their history, and a flooding live file cannot stop them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Dict, List, Set

import pytest

from mstail.parsers import load_formats
from mstail.tailer.live import sidecar as tailer_module
from mstail.tailer.config import Config
from mstail.tailer.live.hub import Hub, ItemsMessage
from mstail.tailer.live.planner import Plan
from mstail.tailer.history.store import Store
from mstail.tailer.live.sidecar import Tailer

PATTERN = r"^step=(?P<step>\d+) loss=(?P<loss>\S+)$"
HISTORY_STEPS = 150  # about 4 KiB: three slices of 1.5 KiB each


def _append(path: Path, steps: range) -> None:
    with open(path, "a", encoding="utf-8") as out:
        out.write("".join(f"step={step} loss=0.{step:04d}\n" for step in steps))


@pytest.mark.parametrize("flood", [False, True])
def test_history_comes_a_file_at_a_time_in_turns_and_never_holds_a_live_line_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flood: bool) -> None:
    monkeypatch.setattr(tailer_module, "HISTORY_PASS_S", 0.0)  # no time for more than one file's slice: deterministic
    monkeypatch.setattr(tailer_module, "CATCH_UP_SLICE", 1536)
    history = [tmp_path / f"rank_{rank}.log" for rank in range(6)]
    for path in history:
        _append(path, range(1, HISTORY_STEPS + 1))
    live = tmp_path / "live.log"
    live.touch()
    config = Config(logs=tuple(map(str, [live, *history])), patterns=(PATTERN,), format="pattern", alert_rules=None,
                    pass_time_s=0.0)
    hub = Hub()
    tailer = Tailer(config, load_formats(patterns=config.patterns, user_dir=Path("/nonexistent")), Store(), hub)
    client = hub.subscribe()

    asyncio.run(tailer.pass_once())  # finds the files; reads one of them (the live one, empty: now followed live)
    client.drain()
    steps: Dict[str, List[int]] = {path.stem: [] for path in [live, *history]}
    turns: List[str] = []  # the history file each pass read
    live_step = 0
    for _ in range(200):  # bounded: 6 files x 3 slices, and the live line every pass
        live_step += 1
        _append(live, range(live_step, live_step + (100 if flood else 1)))  # a flood: 100 lines, 2.3 KiB a pass
        live_step += 99 if flood else 0
        more = asyncio.run(tailer.pass_once(Plan({str(live)}, sweep=False)))
        items = [i for m in client.drain() if isinstance(m, ItemsMessage) for i in m.items]
        read: Set[str] = set()
        for item in items:
            name = Path(item["source"]).stem
            steps.setdefault(name, []).append(item["step"])
            if name != "live":
                read.add(name)
        assert len(read) <= 1, f"one file's history a pass, not {sorted(read)}"
        turns += sorted(read)
        assert steps["live"] and steps["live"][-1] == live_step  # the live line of this pass, in this pass
        if not more:
            break
    assert not more, "the history was not all read within the passes allowed"
    for path in history:  # each file's history whole, once, in order
        assert steps[path.stem] == list(range(1, HISTORY_STEPS + 1))
    assert steps["live"] == list(range(1, live_step + 1))
    # Turns: no file reads a second slice before every file still reading its history has read one more.
    counts = dict.fromkeys(steps.keys() - {"live"}, 0)
    for name in turns:
        counts[name] += 1
        assert counts[name] - min(counts.values()) <= 1, turns


def test_files_waiting_for_their_turn_cost_a_pass_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass asks its questions (does the parser hold a record? its items, its bytes taken) of the files it reads
    only: a thousand files waiting for their history's turn once cost every short pass 2-7 ms, the same questions
    asked of each of them (1,024 files x 2,000 records: about a thousand passes)."""
    monkeypatch.setattr(tailer_module, "HISTORY_PASS_S", 0.0)  # one history file's slice a pass
    monkeypatch.setattr(tailer_module, "CATCH_UP_SLICE", 1536)
    history = [tmp_path / f"rank_{rank}.log" for rank in range(6)]
    for path in history:
        _append(path, range(1, HISTORY_STEPS + 1))
    config = Config(logs=tuple(map(str, history)), patterns=(PATTERN,), format="pattern", alert_rules=None,
                    pass_time_s=0.0)
    hub = Hub()
    tailer = Tailer(config, load_formats(patterns=config.patterns, user_dir=Path("/nonexistent")), Store(), hub)
    client = hub.subscribe()
    asked: List[str] = []  # the sources whose parser a pass asked whether it holds a record
    holds = tailer_module._holds
    monkeypatch.setattr(tailer_module, "_holds", lambda source: asked.append(source.id) or holds(source))

    plan = None  # the first pass finds the files (and reads one of them)
    for _ in range(100):  # bounded: 6 files x 3 slices
        asked.clear()
        more = asyncio.run(tailer.pass_once(plan))
        plan = Plan(set(), sweep=False)
        read = {item["source"] for m in client.drain() if isinstance(m, ItemsMessage) for item in m.items}
        assert len(read) == 1 and asked == sorted(read), f"asked {asked}, read {sorted(read)}"
        if not more:
            break
    assert not more, "the history was not all read within the passes allowed"
    assert [info.records for info in tailer.store.sources.values()] == [HISTORY_STEPS] * len(history)
