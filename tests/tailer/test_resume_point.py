"""The resume point a pass commits for every file it read (`SourceCheckpoint`, the parser state as JSON text):
after a restart the lines parse exactly as they would have without one, also when the state learnt something once,
long before the restart (an epoch length, a new run segment), and whatever NaN the last record holds."""

from __future__ import annotations

import asyncio
import json
import math
from functools import partial
from pathlib import Path
from typing import List, Tuple

from mstail.parsers import SourceParser, load_formats
from mstail.parsers.interleave import InterleavedParser
from mstail.tailer.inputs.checkpoint import SourceCheckpoint
from mstail.tailer.config import Config
from mstail.tailer.history.db import StateDB
from mstail.tailer.live.hub import Hub
from mstail.tailer.history.store import Store
from mstail.tailer.live.sidecar import Tailer

EPOCH = 8  # steps per epoch; LossMonitor prints every 3rd step, so only TimeMonitor's line tells the length
EPOCH_END = "Train epoch time: 1600.000 ms, per step time: 200.000 ms (data time: 4.112 ms)"


def loss_monitor(epochs: range) -> List[str]:
    """LossMonitor(per_print_times=3) and TimeMonitor lines of `epochs`; epoch 5's step 6 logs a NaN loss."""
    lines = []
    for epoch in epochs:
        for step in (3, 6):
            loss = "nan" if (epoch, step) == (5, 6) else f"{2.0 / (epoch * EPOCH + step):.7f}"
            lines.append(f"epoch: {epoch} step: {step}, loss is {loss}")
        lines.append(EPOCH_END)
    return lines


def _tailer(state: Path, log: Path) -> Tailer:
    config = Config(logs=(str(log),), alert_rules=None)
    formats = load_formats(user_dir=Path("/nonexistent"))
    store = Store(StateDB(state, expected="test"))
    tailer = Tailer(config, formats, store, Hub())
    tailer.resume(store.load())
    return tailer


def _append(path: Path, lines: List[str]) -> None:
    with open(path, "a", encoding="utf-8") as out:
        out.write("".join(line + "\n" for line in lines))


def _shape(record: dict) -> Tuple:
    return record["step"], record["epoch"], record["segment"], json.dumps(record["loss"])  # NaN compared as written


def test_a_restart_resumes_with_what_the_state_learnt_long_before(tmp_path: Path) -> None:
    log, state = tmp_path / "train.log", tmp_path / "state.sqlite"
    written: List[str] = []

    def write(lines: List[str]) -> None:
        written.extend(lines)
        _append(log, lines)

    first = _tailer(state, log)
    write(loss_monitor(range(1, 3)))  # epoch 1's TimeMonitor line teaches the epoch length, once
    asyncio.run(first.pass_once())
    for epoch in range(3, 13):  # many passes that change only the counts and the last record
        write(loss_monitor(range(epoch, epoch + 1)))
        asyncio.run(first.pass_once())
    write(loss_monitor(range(10, 11)))  # the training restarted from epoch 10: the step goes back, a new segment
    asyncio.run(first.pass_once())
    first.store.close()  # mstail dies here: what is committed is all there is

    second = _tailer(state, log)
    write(loss_monitor(range(11, 13)))  # read with the epoch length and the segment learnt before the restart
    asyncio.run(second.pass_once())
    stored = second.store.records_after(0, 1000)

    oracle = InterleavedParser(partial(SourceParser, load_formats(user_dir=Path("/nonexistent"))))
    expected = [item.data for number, line in enumerate(written, 1)
                for item in oracle.feed(line, number, 0.0) if item.kind == "record"]
    assert [_shape(r) for r in stored] == [_shape(r) for r in expected]
    assert [r["step"] for r in stored[-4:]] == [11 * EPOCH + 3 - EPOCH, 11 * EPOCH + 6 - EPOCH,
                                                12 * EPOCH + 3 - EPOCH, 12 * EPOCH + 6 - EPOCH]
    assert {r["segment"] for r in stored[-6:]} == {1}
    second.store.close()


def test_a_nan_in_the_last_record_comes_back_a_nan(tmp_path: Path) -> None:
    log, state = tmp_path / "train.log", tmp_path / "state.sqlite"
    _append(log, loss_monitor(range(1, 6))[:-1])  # ends on epoch 5's NaN step, its TimeMonitor line not yet written
    first = _tailer(state, log)
    asyncio.run(first.pass_once())
    first.store.close()
    (checkpoint,) = [c for _, c in StateDB(state, expected="test").sources().values()]
    assert math.isnan(checkpoint.parser.last["loss"])
    assert SourceCheckpoint.from_json(json.loads(checkpoint.dumps())) == checkpoint
