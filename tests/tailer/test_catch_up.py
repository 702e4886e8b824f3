"""The sidecar's catch-up (what a file holds when mstail reaches it) is read in blocks through the parsers' fast path
(`parsers.blocks`): what it stores, and every count, is what feeding each line to the parser gives, on every sample
and real log and the chunk-boundary log (amends joined to their records on both sides: the tailer joins those of one
pass, the store the others)."""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from mstail.parsers import Item, SourceParser
from mstail.parsers.amends import settled
from mstail.parsers.interleave import InterleavedParser
from mstail.tailer.live import catchup
from mstail.tailer.live import sidecar as tailer_module
from mstail.tailer.inputs.checkpoint import SourceCheckpoint
from mstail.tailer.alerts.engine import AlertEngine
from mstail.tailer.config import Config
from mstail.tailer.app.state import open_state
from mstail.tailer.history.db import _item_json, _loads
from mstail.tailer.live.hub import Hub
from mstail.tailer.history.store import Store, prepare
from mstail.tailer.live.sidecar import Tailer

from tests.parsers.support import FORMATS, READ_TIME
from tests.tailer.test_offline_chains import LOGS, TRACEBACK, mixed_log, whole_file_lines


#: the logs whose records raise no alert (the others raise non-finite, error alerts and their resolutions)
QUIET = {"mindformers_pynative_r2.0_pp_stage0_info.log", "mindyolo_train.log", "mindformers-2.0.0_graph_stdout.log",
         "mindformers-2.0.0_graph_output_log_rank_0_info.log", "mindspore-2.10_lossmonitor_timemonitor_stdout.log"}

#: the logs long enough that the second half's worker finds a seam within its first 8 KiB
SEAMED = {"mindformers_v1.9_eval_worker_0.log", "mixed.log"}


@pytest.mark.parametrize("child", [False, pytest.param(True, marks=pytest.mark.slow),  # a catch-up child process
                                   pytest.param("ahead", marks=pytest.mark.slow),
                                   pytest.param("split", marks=pytest.mark.slow), "no fork"],
                         ids=["passes", "child", "ahead", "split", "no-fork"])
@pytest.mark.parametrize("name", [p.name for p in LOGS] + ["mixed.log"])
def test_the_catch_up_gives_what_feeding_every_line_gives(name: str, child: bool, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`child`: the history after the first 1 KiB goes to a catch-up child (`tailer.catchup`) in 4 KiB batches,
    handed over to the source's own follower and parser at the end; "ahead": likewise, the first pass read before the
    loop (`Tailer.read_ahead`, as `serve` does), the child started by it; "split": the child's history parsed in two
    halves, the second by a worker of the child's (probing for the seam in its first 8 KiB); "no fork": the child
    cannot be started (said), the passes read it."""
    monkeypatch.setattr(tailer_module.time, "time", lambda: READ_TIME)  # one read time, as in the line-by-line parse
    children = []
    if child:
        monkeypatch.setattr(tailer_module, "CATCH_UP_SLICE", 1024)
        monkeypatch.setattr(tailer_module, "BULK_MIN_BYTES", 1)
        monkeypatch.setattr(catchup, "BULK_BLOCK_BYTES", 4096)
        monkeypatch.setattr(tailer_module, "CatchUp", lambda *args: children.append(catchup.CatchUp(*args)) or
                            children[-1])
    pieces: List[int] = []  # which half each batch came from
    if child == "split":
        monkeypatch.setattr(catchup, "SPLIT_MIN_BYTES", 1)
        monkeypatch.setattr(catchup.split, "PROBE_BYTES", 8192)
        take = catchup.CatchUp.take
        monkeypatch.setattr(catchup.CatchUp, "take", lambda self, *args: [
            pieces.append(batch.piece) or batch for batch in take(self, *args)])
    if child == "no fork":
        monkeypatch.setattr(tailer_module, "CatchUp", lambda *args: children.append(None) or _no_fork())
    path = tmp_path / name
    source = next((p for p in LOGS if p.name == name), None)
    if source is None:
        path.write_text("\n".join(mixed_log()) + "\n", encoding="utf-8")
    else:
        shutil.copy(source, path)
    # with a child, one round per pass: the first pass reads 1 KiB, the rest goes to the child
    tailer = Tailer(Config(logs=(str(path),), persist=False, pass_time_s=0.0 if child else 0.01), FORMATS, Store(),
                    Hub())
    parsed: List[Item] = []  # the parser's items, as each pass hands them to the store
    deliver = tailer._deliver

    def noted(results):  # type: ignore[no-untyped-def]
        parsed.extend(Item(item.kind, dict(item.data)) for _, items in results for item in items)
        deliver(results)

    monkeypatch.setattr(tailer, "_deliver", noted)
    if child == "ahead":
        tailer.read_ahead()
        assert len(children) == (path.stat().st_size > 1024) and not parsed  # forked, nothing delivered yet

    _passes_until_done(tailer)
    (followed,) = tailer._sources.values()
    assert followed.caught_up
    held = followed.parser.flush(READ_TIME, force=True)  # a finished log: nothing held (never stored)
    parsed += held
    reference = InterleavedParser(lambda: SourceParser(FORMATS))
    expected = [item for text, number in whole_file_lines(path) for item in reference.feed(text, number, READ_TIME)]
    expected += reference.flush(READ_TIME, force=True)
    # a child's items come as the store keeps them (`store.prepare`: no line numbers, reserved keys first)
    as_kept = prepare if child else (lambda item: item)
    assert [repr(as_kept(item)) for item in settled(parsed)] == [repr(as_kept(item)) for item in settled(expected)]
    assert followed.parser.counts == reference.counts
    # numbered as one reading of the file numbers its lines (halves: the worker counted those before its half)
    assert followed.follower.current.splitter.next_number == path.read_bytes().count(b"\n") + 1
    assert followed.catch_up is None and bool(children) == bool(child and path.stat().st_size > 1024)
    assert not followed.no_child  # a child ended as one that did its work (exit status 0)
    if child == "split" and name in SEAMED:
        assert 0 in pieces and 1 in pieces, pieces  # both halves' batches: the seam was found
    store = tailer.store
    store.commit()
    for (text,) in store.db._rows("SELECT data FROM items"):  # the texts a child prepared are the store's own
        assert text == _item_json(_loads(text))
    # the alert rules judged the history as they judge its records fed one by one (the same read time)
    rules = AlertEngine()
    judged = [change for item in settled(expected[:len(expected) - len(held)]) if item.kind != "amend"
              for change in rules.observe(followed.id, prepare(item).data, READ_TIME, history=True)]
    assert [{k: v for k, v in e.items() if k != "seq"} for e in store.events(kind="alert")] == judged
    assert judged or name in QUIET, "a log that raises no alert tests none"


@pytest.mark.slow  # a catch-up child process
def test_a_childs_batches_are_committed_together_and_its_hand_over_commits_them_all(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a child runs, deliveries commit at most every HISTORY_COMMIT_S (here: only the first): the ones between
    queue their items and checkpoints, which readers see and the state file does not hold yet; the delivery after the
    hand-over commits everything, with the checkpoint the source resumed from."""
    monkeypatch.setattr(tailer_module.time, "time", lambda: READ_TIME)
    monkeypatch.setattr(tailer_module, "CATCH_UP_SLICE", 1024)
    monkeypatch.setattr(tailer_module, "BULK_MIN_BYTES", 1)
    monkeypatch.setattr(tailer_module, "HISTORY_COMMIT_S", 1e9)
    monkeypatch.setattr(catchup, "BULK_BLOCK_BYTES", 2048)
    path = tmp_path / "logs" / "info.log"
    path.parent.mkdir()
    path.write_text("\n".join(mixed_log() * 4) + "\n", encoding="utf-8")
    config = Config(logs=(str(path),), state_dir=str(tmp_path / "state"), pass_time_s=0.0, alert_rules=None)
    store = Store(open_state(config, FORMATS))
    tailer = Tailer(config, FORMATS, store, Hub())
    tailer.resume(store.load())
    on_disk = sqlite3.connect(f"file:{store.db.path}?mode=ro", uri=True)

    def committed() -> Tuple[int, Any]:
        """(items, the source's checkpoint) the state file holds"""
        [(items,)] = on_disk.execute("SELECT count(*) FROM items")
        return items, on_disk.execute("SELECT checkpoint FROM sources").fetchall()

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(tailer.pass_once())  # the first KiB, committed; the child started
        (followed,) = tailer._sources.values()
        assert followed.catch_up is not None
        first = committed()
        assert first[0] == store.last_seq > 0
        while followed.catch_up is not None and store.db.unsaved == 0:
            loop.run_until_complete(tailer.pass_once())
        assert followed.catch_up is not None, "the child ended before a batch was queued: nothing tested"
        assert committed() == first and len(store.items_after(0, 1 << 30)) == store.last_seq > first[0]
        for _ in range(1000):
            if followed.catch_up is None:
                break
            loop.run_until_complete(tailer.pass_once())
        assert followed.catch_up is None and store.db.unsaved == 0
        items, [(checkpoint,)] = committed()
        assert items == store.last_seq and checkpoint == followed.committed.dumps()
    finally:
        on_disk.close()
        tailer.stop_catch_ups()
        for source in tailer._sources.values():
            source.follower.close()
        store.close()
        loop.close()


@pytest.mark.slow  # a catch-up child process
def test_a_sources_counters_follow_its_childs_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a child reads a file's history, the source's counters (/api/sources, the stream's `source` messages) are
    the child's, batch by batch: lines and bytes read, records parsed; not the first pass's until the hand-over."""
    monkeypatch.setattr(tailer_module, "CATCH_UP_SLICE", 1024)
    monkeypatch.setattr(tailer_module, "BULK_MIN_BYTES", 1)
    monkeypatch.setattr(catchup, "BULK_BLOCK_BYTES", 2048)
    path = tmp_path / "info.log"
    path.write_text("\n".join(mixed_log() * 4) + "\n", encoding="utf-8")
    store = Store()
    tailer = Tailer(Config(logs=(str(path),), persist=False, pass_time_s=0.0, alert_rules=None), FORMATS, store, Hub())
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(tailer.pass_once())  # the first KiB; the child started
        (followed,) = tailer._sources.values()
        first = dict(store.sources[followed.id].counters)
        seen = []
        while followed.catch_up is not None:
            loop.run_until_complete(tailer.pass_once())
            if followed.catch_up is not None:
                seen.append(dict(store.sources[followed.id].counters))
    finally:
        tailer.stop_catch_ups()
        followed.follower.close()
        loop.close()
    assert len(seen) >= 3, "too few passes during the catch-up to test"
    for name in ("lines", "bytes", "records"):
        steps = [first[name]] + [counters[name] for counters in seen]
        assert steps == sorted(steps) and steps[-1] > steps[len(steps) // 2] > first[name], name
    assert seen[-1]["records"] == store.sources[followed.id].records  # every batch delivered: the records stored


@pytest.mark.slow  # a catch-up child process
@pytest.mark.parametrize("batches", [0, 1, 3, 7, "hand-over"])
@pytest.mark.parametrize("kill", [False, True], ids=["stopped", "killed"])
@pytest.mark.parametrize("halves", [False, True], ids=["whole", "split"])
def test_a_restart_during_a_childs_catch_up_loses_and_repeats_nothing(batches: Any, kill: bool, halves: bool,
                                                                     tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """mstail stopped (or killed before its last pass's commit) after the child's `batches`-th batch was stored: the
    restarted mstail resumes from the checkpoint committed with the batches (or, inside a traceback, from the one
    before them, skipping what was stored since), and the history ends as one uninterrupted line-by-line read has it:
    every item once, in order, seqs without a gap. `halves`: the child parses the history in two halves (the
    checkpoints after the seam carried on from the child's: the hand-over resumes from one)."""
    monkeypatch.setattr(tailer_module.time, "time", lambda: READ_TIME)
    monkeypatch.setattr(tailer_module, "CATCH_UP_SLICE", 1024)
    monkeypatch.setattr(tailer_module, "BULK_MIN_BYTES", 1)
    monkeypatch.setattr(catchup, "BULK_BLOCK_BYTES", 2048)
    pieces: List[int] = []  # which half each batch delivered came from
    if halves:
        monkeypatch.setattr(catchup, "SPLIT_MIN_BYTES", 1)
        monkeypatch.setattr(catchup.split, "PROBE_BYTES", 8192)
        take = catchup.CatchUp.take
        monkeypatch.setattr(catchup.CatchUp, "take", lambda self, *args: [
            pieces.append(batch.piece) or batch for batch in take(self, *args)])
    path = tmp_path / "logs" / "info.log"
    path.parent.mkdir()
    # tracebacks across batch ends; one still open at the end, so the hand-over resumes before it, with items to skip
    path.write_text("\n".join(mixed_log() * 4 + TRACEBACK.splitlines()) + "\n", encoding="utf-8")
    # pass_time_s 0: one round a pass, one batch a pass
    config = Config(logs=(str(path),), state_dir=str(tmp_path / "state"), pass_time_s=0.0, alert_rules=None)

    def boot() -> Tuple[Store, Tailer]:
        store = Store(open_state(config, FORMATS))
        checkpoints = store.load()
        tailer = Tailer(config, FORMATS, store, Hub())
        tailer.resume(checkpoints)
        return store, tailer

    def stop(store: Store, tailer: Tailer) -> None:
        tailer.stop_catch_ups()
        for source in tailer._sources.values():
            source.follower.close()
        store.close()

    store, tailer = boot()
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(tailer.pass_once())  # the first KiB, and the child started
        (followed,) = tailer._sources.values()
        assert followed.catch_up is not None
        for _ in range(batches if isinstance(batches, int) else 0):
            loop.run_until_complete(tailer.pass_once())
        if batches == "hand-over":  # until the hand-over, and a pass that reads a KiB of what it skips
            for _ in range(1000):
                loop.run_until_complete(tailer.pass_once())
                if followed.catch_up is None:
                    break
            assert followed.skip > 0
            monkeypatch.setattr(tailer_module, "CATCH_UP_SLICE", 64)
            loop.run_until_complete(tailer.pass_once())
            assert followed.skip > 0  # the restart comes while items are still to be skipped
        assert (1 in pieces) == (halves and batches == "hand-over")  # the worker's half comes after the child's
        if kill:
            store.commit = lambda *args, **kwargs: None  # type: ignore[method-assign]  # dies before COMMIT
            loop.run_until_complete(tailer.pass_once())
        stop(store, tailer)
        store, tailer = boot()
        for _ in range(1000):
            if not loop.run_until_complete(tailer.pass_once()):
                break
        (followed,) = tailer._sources.values()
        assert followed.caught_up and followed.catch_up is None
        tail = followed.parser.flush(READ_TIME, force=True)  # a finished log: what it still holds
        stored = store.items_after(0, 1 << 30)
    finally:
        stop(store, tailer)
        loop.close()
    assert [item["seq"] for item in stored] == list(range(1, len(stored) + 1))
    reference = InterleavedParser(lambda: SourceParser(FORMATS))
    expected = [item for text, number in whole_file_lines(path) for item in reference.feed(text, number, READ_TIME)]
    expected = settled(expected + reference.flush(READ_TIME, force=True))
    got = [{k: v for k, v in item.items() if k not in ("seq", "source")} for item in stored if item.get("kind") != "amend"]
    got += [{k: v for k, v in item.data.items() if k != "line"} for item in settled(tail)]
    assert list(map(_sorted_json, got)) == [_sorted_json({k: v for k, v in item.data.items() if k != "line"})
                                            for item in expected]


def _passes_until_done(tailer: Tailer) -> None:
    """The tailer's passes until one reads nothing (1,000 at most)."""
    async def passes() -> None:
        for _ in range(1000):
            if not await tailer.pass_once():
                break

    asyncio.run(passes())


def _no_fork() -> None:
    raise BlockingIOError(11, "Resource temporarily unavailable")


def _sorted_json(data: Dict[str, Any]) -> str:
    return json.dumps(data, sort_keys=True)  # NaN as a token: equal to itself


def _catch_up_with_a_failing_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   caplog: pytest.LogCaptureFixture, fail: Any) -> str:
    """Catch a mixed log up through children whose third checkpoint calls `fail()`; asserts the source ends caught
    up with every item stored once (the passes read what the child did not) and one child started; returns the
    warnings said."""
    monkeypatch.setattr(tailer_module.time, "time", lambda: READ_TIME)
    monkeypatch.setattr(tailer_module, "CATCH_UP_SLICE", 1024)
    monkeypatch.setattr(tailer_module, "BULK_MIN_BYTES", 1)
    monkeypatch.setattr(catchup, "BULK_BLOCK_BYTES", 2048)
    taken, parent, started = [], os.getpid(), []

    def checkpoint(*args: Any, **kwargs: Any) -> Any:
        taken.append(os.getpid())
        if taken.count(os.getpid()) > 2 and os.getpid() != parent:
            fail()
        return SourceCheckpoint(*args, **kwargs)

    def counted(*args: Any, **kwargs: Any) -> Any:
        started.append(1)
        return real_catch_up(*args, **kwargs)

    real_catch_up = tailer_module.CatchUp
    monkeypatch.setattr(catchup, "SourceCheckpoint", checkpoint)
    monkeypatch.setattr(tailer_module, "CatchUp", counted)
    path = tmp_path / "info.log"
    path.write_text("\n".join(mixed_log() * 4) + "\n", encoding="utf-8")
    store = Store()
    tailer = Tailer(Config(logs=(str(path),), persist=False, pass_time_s=0.0, alert_rules=None), FORMATS, store, Hub())

    with caplog.at_level(logging.WARNING, logger="mstail.sidecar"):
        _passes_until_done(tailer)
    (followed,) = tailer._sources.values()
    assert len(started) == 1  # a child that ended early is not forked again for that file
    _assert_caught_up_once(tailer, path)
    return "\n".join(record.getMessage() for record in caplog.records)


def _assert_caught_up_once(tailer: Tailer, path: Path) -> None:
    """The tailer's one source is caught up, its child gone, and its store holds every item of the file once, in
    order (what the parser still holds at the end added), as feeding every line gives them."""
    (followed,) = tailer._sources.values()
    assert followed.caught_up and followed.catch_up is None
    tail = followed.parser.flush(READ_TIME, force=True)
    stored = tailer.store.items_after(0, 1 << 30)
    assert [item["seq"] for item in stored] == list(range(1, len(stored) + 1))
    got = [{k: v for k, v in item.items() if k not in ("seq", "source")} for item in stored if item.get("kind") != "amend"]
    got += [{k: v for k, v in item.data.items() if k != "line"} for item in settled(tail)]
    reference = InterleavedParser(lambda: SourceParser(FORMATS))
    expected = [item for text, number in whole_file_lines(path) for item in reference.feed(text, number, READ_TIME)]
    expected = settled(expected + reference.flush(READ_TIME, force=True))
    assert list(map(_sorted_json, got)) == [_sorted_json({k: v for k, v in item.data.items() if k != "line"})
                                            for item in expected]


@pytest.mark.slow  # a catch-up child process
def test_a_child_that_dies_leaves_the_history_to_the_passes_and_is_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """The child fails after its second batch (here: taking a checkpoint raises): the source resumes from the last
    checkpoint delivered, its passes read the rest, every item is stored once, and a warning says what happened."""
    def bug() -> None:
        raise RuntimeError("a bug in the child")

    assert "ended early (exit status 1)" in _catch_up_with_a_failing_child(tmp_path, monkeypatch, caplog, bug)


@pytest.mark.slow  # a catch-up child process
def test_a_child_that_stops_sending_is_stopped_and_the_passes_read_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """A child stuck after its second batch (a lock another thread held at the fork, a filesystem that stopped
    answering: here a sleep) is stopped after STALL_S without a batch, said once, and the passes read the rest."""
    monkeypatch.setattr(catchup, "STALL_S", 0.5)
    said = _catch_up_with_a_failing_child(tmp_path, monkeypatch, caplog, lambda: catchup.time.sleep(120))
    assert "ended early (no batch for 0.5 s)" in said, said


@pytest.mark.slow  # a catch-up child process and its worker
@pytest.mark.parametrize("after_the_seam", [False, True, "stuck"], ids=["before", "after", "stuck"])
def test_a_worker_that_fails_leaves_its_half_to_the_child_or_the_passes(
        after_the_seam: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The worker parsing a history's second half fails: at once (before the seam), the child parses that half
    itself and nothing is said; after half its piece (the seam found), the child sends what it spooled until then,
    ends early (said once) and the passes read on from the last checkpoint; "stuck" there (a sleep), likewise once
    the child has waited WORKER_WAIT_S for its next batch. Either way every item is stored once."""
    monkeypatch.setattr(tailer_module.time, "time", lambda: READ_TIME)
    monkeypatch.setattr(tailer_module, "CATCH_UP_SLICE", 1024)
    monkeypatch.setattr(tailer_module, "BULK_MIN_BYTES", 1)
    monkeypatch.setattr(catchup, "BULK_BLOCK_BYTES", 2048)
    monkeypatch.setattr(catchup, "SPLIT_MIN_BYTES", 1)
    monkeypatch.setattr(catchup.split, "PROBE_BYTES", 8192)
    monkeypatch.setattr(catchup, "WORKER_WAIT_S", 0.5)
    spool = catchup._spool

    def failing(follower: Any, parser: Any, end: int, *args: Any) -> None:
        if after_the_seam:
            spool(follower, parser, (follower.current.pos + end) // 2, *args)
        if after_the_seam == "stuck":
            catchup.time.sleep(120)
        raise RuntimeError("a bug in the worker")

    monkeypatch.setattr(catchup, "_spool", failing)
    pieces: List[int] = []
    take = catchup.CatchUp.take
    monkeypatch.setattr(catchup.CatchUp, "take", lambda self, *args: [
        pieces.append(batch.piece) or batch for batch in take(self, *args)])
    path = tmp_path / "info.log"
    path.write_text("\n".join(mixed_log() * 8) + "\n", encoding="utf-8")
    tailer = Tailer(Config(logs=(str(path),), persist=False, pass_time_s=0.0, alert_rules=None), FORMATS, Store(),
                    Hub())

    with caplog.at_level(logging.WARNING, logger="mstail.sidecar"):
        _passes_until_done(tailer)
    _assert_caught_up_once(tailer, path)
    (followed,) = tailer._sources.values()
    said = [record.getMessage() for record in caplog.records]
    assert (1 in pieces) == bool(after_the_seam) and followed.no_child == bool(after_the_seam)
    assert [message for message in said if "ended early (exit status 1)" in message] == (said if after_the_seam else [])
    assert len(said) == bool(after_the_seam)


@pytest.mark.slow  # a catch-up child process
@pytest.mark.parametrize("bounded", [False, True], ids=["ahead", "bounded"])
def test_a_child_parses_on_while_the_parent_takes_no_batch(bounded: bool, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`serve` takes no batch while it imports the web part and starts the server: the child reads the whole history
    meanwhile (its batches queued in it, far more than the pipe holds), and the passes then store every item once,
    in order, as feeding every line gives them. `bounded`: with at most 2 batches allowed to wait in it
    (AHEAD_BATCHES), the child stops reading until the parent takes some, and the passes store the same."""
    monkeypatch.setattr(tailer_module.time, "time", lambda: READ_TIME)
    monkeypatch.setattr(tailer_module, "CATCH_UP_SLICE", 1024)
    monkeypatch.setattr(tailer_module, "BULK_MIN_BYTES", 1)
    monkeypatch.setattr(catchup, "BULK_BLOCK_BYTES", 2048)
    monkeypatch.setattr(catchup, "PIPE_BYTES", 4096)  # the smallest pipe: a child waiting on it read a few blocks
    if bounded:
        monkeypatch.setattr(catchup, "AHEAD_BATCHES", 2)
    path = tmp_path / "info.log"
    path.write_text("\n".join(mixed_log() * 8) + "\n", encoding="utf-8")
    store = Store()
    tailer = Tailer(Config(logs=(str(path),), persist=False, pass_time_s=0.0, alert_rules=None), FORMATS, store, Hub())
    tailer.read_ahead()
    (followed,) = tailer._sources.values()
    assert followed.catch_up is not None
    left = path.stat().st_size - followed.follower.current.pos  # what the child has to read
    io = Path(f"/proc/{followed.catch_up._process.pid}/io")
    if bounded:
        catchup.time.sleep(1.0)  # were it not bounded, the child would read everything in milliseconds
        assert _bytes_read(io) < left, "the child read on with AHEAD_BATCHES of batches unsent"
    else:
        for _ in range(600):  # up to a minute for the child to read what it has left (it takes milliseconds)
            if _bytes_read(io) >= left:
                break
            catchup.time.sleep(0.1)
        assert _bytes_read(io) >= left, "the child waits for the parent"

    _passes_until_done(tailer)
    _assert_caught_up_once(tailer, path)
    assert not followed.no_child  # the child ended as one that did its work (exit status 0)


def _bytes_read(io: Path) -> int:
    """What a process has read so far (`rchar` of /proc/PID/io: files and pipes alike)."""
    for line in io.read_text(encoding="ascii").splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError(f"no rchar in {io}")


@pytest.mark.slow  # a catch-up child process
def test_a_catch_up_child_parses_at_a_lower_priority_than_the_sidecar() -> None:
    """A forked child set up as a catch-up child is (`_as_a_child`) runs CHILD_NICE above the sidecar's niceness (19 at
    most): a history is bulk work, so the live files, the page and the training job go first when CPUs are short."""
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()

    def probe() -> None:
        catchup._as_a_child(os.getppid())
        theirs.send(os.nice(0))

    child = context.Process(target=probe)
    child.start()
    try:
        assert ours.poll(30), "the probe child said nothing"
        assert ours.recv() == min(19, os.nice(0) + catchup.CHILD_NICE)
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
