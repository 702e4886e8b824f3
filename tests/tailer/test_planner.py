"""A pass costs what changed (issue 16, goal 4): with file events a pass reads the files the events named and the
ones with something due, a sweep finds what an event missed through one stat per file, new files are looked for
only when an event may name one; the O(n^2) pieces of a thousand sources (ids, the straggler rule) are gone."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from bisect import bisect_left
from pathlib import Path
from typing import Dict, List

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mstail.parsers import load_formats
from mstail.tailer.alerts.rules import _median_without
from mstail.tailer.config import Config
from mstail.tailer.inputs.discovery import PatternFilter, SourceNamer
from mstail.tailer.inputs.follower import FileFollower
from mstail.tailer.live.hub import Hub
from mstail.tailer.live import planner
from mstail.tailer.live.planner import QUIET_S, ROTATION_SWEEP_EVERY, Pacer, Plan
from mstail.tailer.history.store import Store
from mstail.tailer.live.sidecar import Tailer
from mstail.tailer.inputs.watch import Changes

PATTERN = r"^line=(?P<step>\d+)$"


def _tailer(pattern: str) -> Tailer:
    config = Config(logs=(pattern,), patterns=(PATTERN,), format="pattern", alert_rules=None)
    return Tailer(config, load_formats(patterns=config.patterns, user_dir=Path("/nonexistent")), Store(), Hub())


def _append(path: Path, *steps: int) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(f"line={step}\n" for step in steps))


def _steps(tailer: Tailer) -> Dict[str, List[int]]:
    out: Dict[str, List[int]] = {}
    for record in tailer.store.records_after(0, 10**6):
        out.setdefault(record["source"], []).append(record["step"])
    return out


def test_an_event_pass_reads_the_named_files_and_a_sweep_finds_what_no_event_named(tmp_path: Path) -> None:
    logs = {rank: tmp_path / f"rank_{rank}" / "info.log" for rank in range(3)}
    for _rank, log in logs.items():
        log.parent.mkdir()
        _append(log, 1)
    tailer = _tailer(str(tmp_path / "rank_*" / "info.log"))

    async def scenario() -> None:
        await tailer.pass_once()  # full: every file
        assert _steps(tailer) == {"rank_0": [1], "rank_1": [1], "rank_2": [1]}
        _append(logs[0], 2)
        _append(logs[1], 2)
        await tailer.pass_once(Plan({str(logs[1])}))  # an event named rank_1 only
        assert _steps(tailer) == {"rank_0": [1], "rank_1": [1, 2], "rank_2": [1]}
        _append(logs[2], 2)
        await tailer.pass_once(Plan({str(logs[2]) + ".1"}))  # a rotated backup's event is its live file's
        assert _steps(tailer)["rank_2"] == [1, 2]
        await tailer.pass_once(Plan(set(), sweep=True))  # the event for rank_0 was missed: one stat sees it
        assert _steps(tailer) == {"rank_0": [1, 2], "rank_1": [1, 2], "rank_2": [1, 2]}
        _append(logs[0], 3)
        await tailer.pass_once(Plan(set(), sweep=True, rotations=False))  # missed again: the open file's stat sees it
        assert _steps(tailer)["rank_0"] == [1, 2, 3]
        # a file quiet for QUIET_S: its missed write waits for the next sweep that stats paths
        for source in tailer._sources.values():
            source.follower.last_data_time = time.time() - QUIET_S
        _append(logs[1], 3)
        await tailer.pass_once(Plan(set(), sweep=True, rotations=False))
        assert _steps(tailer)["rank_1"] == [1, 2]
        await tailer.pass_once(Plan(set(), sweep=True))
        assert _steps(tailer) == {"rank_0": [1, 2, 3], "rank_1": [1, 2, 3], "rank_2": [1, 2]}

    asyncio.run(scenario())


def test_new_files_are_looked_for_when_an_event_may_name_one_not_for_other_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(planner, "DISCOVER_EVENT_S", 0.0)  # the passes here come faster than its 0.1 s
    (tmp_path / "rank_0").mkdir()
    _append(tmp_path / "rank_0" / "info.log", 1)
    tailer = _tailer(str(tmp_path / "rank_*" / "info.log"))
    globbed: List[int] = []
    discover = tailer.discover
    tailer.discover = lambda: globbed.append(1) or discover()  # type: ignore[method-assign]

    async def scenario() -> None:
        await tailer.pass_once()
        assert len(globbed) == 1
        (tmp_path / "rank_0" / "error.log").write_text("line=9\n")
        await tailer.pass_once(Plan({str(tmp_path / "rank_0" / "error.log")}))
        assert len(globbed) == 1  # no pattern names error.log: no glob over a thousand folders
        (tmp_path / "rank_1").mkdir()
        _append(tmp_path / "rank_1" / "info.log", 1)
        await tailer.pass_once(Plan({str(tmp_path / "rank_1")}))  # a new folder on the way to a file
        assert len(globbed) == 2
        assert _steps(tailer) == {"rank_0": [1], "rank_1": [1]}

    asyncio.run(scenario())


def test_a_stat_tells_whether_a_read_may_find_anything(tmp_path: Path) -> None:
    log = tmp_path / "info.log"
    _append(log, 1)
    follower = FileFollower(log)
    assert follower.may_have_news()  # never opened
    follower.read(1 << 20, time.time())
    assert not follower.may_have_news()
    _append(log, 2)
    assert follower.may_have_news()
    follower.read(1 << 20, time.time())
    assert not follower.may_have_news()
    os.rename(log, tmp_path / "info.log.1")
    _append(log, 3)
    assert not follower.may_have_news(rotation=False)  # the open file's own stat: nothing new in it
    assert follower.may_have_news()  # another file at the path
    _append(tmp_path / "info.log.1", 3)
    assert follower.may_have_news(rotation=False)  # the open file grew
    assert not follower.may_have_news(rotation=False, quiet=True)  # a quiet file is not looked at between path stats
    assert follower.may_have_news(quiet=True)
    follower.close()


def test_pattern_filter_takes_matches_and_folders_on_the_way_only(tmp_path: Path) -> None:
    wanted = PatternFilter([str(tmp_path / "output" / "log" / "rank_*" / "info.log")])
    assert wanted(str(tmp_path / "output" / "log" / "rank_7" / "info.log"))
    assert wanted(str(tmp_path / "output" / "log" / "rank_7"))
    assert wanted(str(tmp_path / "output"))
    assert not wanted(str(tmp_path / "output" / "log" / "rank_7" / "error.log"))
    assert not wanted(str(tmp_path / "output" / "checkpoint" / "rank_7"))
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "output")
    through_link = PatternFilter([str(link / "log" / "rank_*" / "info.log")])
    assert through_link(str(tmp_path / "output" / "log" / "rank_7" / "info.log"))  # as the watched root resolves


def test_ids_of_many_files_at_once_are_those_given_one_by_one(tmp_path: Path) -> None:
    paths = [tmp_path / "run" / "output" / "log" / f"rank_{r}" / "info.log" for r in range(40)]
    paths += [tmp_path / "run" / "train.log", tmp_path / "run" / "metrics.jsonl", tmp_path / "other" / "rank_3" / "info.log"]
    one_by_one = SourceNamer()
    expected = [one_by_one.name(path, paths) for path in paths]
    assert SourceNamer().names(paths, paths) == expected
    assert expected[0] == "rank_0" and "run/train" in expected and "other/rank_3" in expected
    many = [tmp_path / f"rank_{r}" / "info.log" for r in range(4096)]
    began = time.process_time()
    SourceNamer().names(many, many)
    assert time.process_time() - began < 2.0  # was quadratic: minutes for 4,096 files


@given(st.lists(st.sampled_from([1.0, 2.0, 2.5, 100.0, 101.0, 7e3]), min_size=2, max_size=40))
def test_the_others_median_read_from_the_sorted_list_is_statistics_median(values: List[float]) -> None:
    ranked = sorted(values)
    for index, value in enumerate(values):
        others = values[:index] + values[index + 1:]
        assert _median_without(ranked, bisect_left(ranked, value)) == statistics.median(others)


def test_the_pacer_reads_everything_when_polling_or_blind_and_sweeps_on_its_timer() -> None:
    async def scenario() -> None:
        changes = Changes()
        polling = Pacer(poll_s=0.5, sweep_s=1.0)
        assert polling.plan(changes) is None
        assert 0.4 < polling.timeout() <= 0.5
        assert polling.plan(changes) == Plan(set(), sweep=False)  # early (more to read): the files with something due
        await asyncio.sleep(polling.timeout())
        assert polling.plan(changes) is None
        events = Pacer(poll_s=None, sweep_s=0.2)
        assert events.plan(changes) is None  # the first pass reads every file
        changes.add(["/logs/rank_0/info.log"])
        assert events.plan(changes) == Plan({"/logs/rank_0/info.log"}, sweep=False)
        assert not changes.event.is_set() and events.plan(changes) == Plan(set(), sweep=False)
        await asyncio.sleep(events.timeout())
        assert events.plan(changes) == Plan(set(), sweep=True)  # its stats name the paths (rotations)
        for _ in range(ROTATION_SWEEP_EVERY - 1):  # the next sweeps stat the open files only
            await asyncio.sleep(events.timeout())
            assert events.plan(changes) == Plan(set(), sweep=True, rotations=False)
        await asyncio.sleep(events.timeout())
        assert events.plan(changes) == Plan(set(), sweep=True)
        events.full_pass_next()  # a watcher (re)started
        assert events.plan(changes) is None
        changes.failed = True  # no file events: the timer alone
        assert events.plan(changes) is None

    asyncio.run(scenario())
