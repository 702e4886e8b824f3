"""The sidecar on logs only the generic step-line reader reads: real writer processes append a MindYOLO log and a
model-zoo log of epoch summaries line by line while the tailer follows; the records, their amends (MindYOLO's
step-time line, the epoch's eval and time) and the source's x-axis note are what `mstail parse` gives."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from mstail.tailer.live.sidecar import EPOCH_STEPS

from ..parsers.support import SAMPLES, parse_file
from ..parsers.test_no_steps import NO_STEPS
from .scenario_support import Running, finished, make_tailer, records

#: Appends a file's lines to another, flushing each, a few milliseconds apart.
COPY_SLOWLY = ("import sys, time\n"
               "lines = open(sys.argv[1], encoding='utf-8').read().splitlines(True)\n"
               "with open(sys.argv[2], 'a', encoding='utf-8') as out:\n"
               "    for line in lines:\n"
               "        out.write(line); out.flush(); time.sleep(0.005)\n"
               "print('done')\n")
ZOO = ("epoch: [  1/  3], epoch time: 123456.789, steps:  5004, per step time: 24.672, avg loss: 6.900, lr:[0.098889]\n"
       "epoch: [  2/  3], epoch time: 120000.000, steps:  5004, per step time: 23.981, avg loss: 5.100, lr:[0.097778]\n"
       "epoch: [  3/  3], epoch time: 119500.500, steps:  5004, per step time: 23.881, avg loss: 4.200, lr:[0.096667]\n")


def writer(source: Path, target: Path) -> "subprocess.Popen[bytes]":
    return subprocess.Popen([sys.executable, "-c", COPY_SLOWLY, str(source), str(target)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def metrics_only(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in ("seq", "source", "time", "line")}


@pytest.mark.slow
def test_generic_sources_live_equal_offline(tmp_path: Path) -> None:
    zoo = tmp_path / "zoo.txt"
    zoo.write_text(ZOO, encoding="utf-8")
    tailer = make_tailer("events", str(tmp_path / "*.log"), format=None, patterns=())

    async def scenario() -> None:
        async with Running(tailer) as run:
            procs = [writer(SAMPLES / "mindyolo_train.log", tmp_path / "yolo.log"), writer(zoo, tmp_path / "zoo.log")]
            await finished(*procs)
            await run.until(lambda: len(records(tailer, "yolo")) == 6 and len(records(tailer, "zoo")) == 3, 20,
                            "6 + 3 records")
            await run.until(lambda: all("epoch_time_ms" in r for r in records(tailer, "yolo")[2::3]), 10, "amends")

    asyncio.run(scenario())
    offline, _, _ = parse_file(SAMPLES / "mindyolo_train.log")
    assert [metrics_only(r) for r in records(tailer, "yolo")] == [metrics_only(r) for r in offline]
    assert [r["step"] for r in records(tailer, "zoo")] == [1, 2, 3]
    assert tailer.store.sources["zoo"].problem == EPOCH_STEPS
    assert tailer.store.sources["yolo"].problem is None


@pytest.mark.slow
def test_logs_without_step_lines_give_no_record_live(tmp_path: Path) -> None:
    """tests/parsers/test_no_steps.py's corpus (glog, dumps, pip, compiler output), written line by line while followed."""
    tailer = make_tailer("events", str(tmp_path / "*.log"), format=None, patterns=())
    lines = {path.stem: len(path.read_text(encoding="utf-8").splitlines()) for path in NO_STEPS}

    async def scenario() -> None:
        async with Running(tailer) as run:
            await finished(*[writer(path, tmp_path / path.name) for path in NO_STEPS])
            await run.until(lambda: all(tailer.store.sources.get(stem) is not None and
                                        tailer.store.sources[stem].counters.get("lines") == count
                                        for stem, count in lines.items()), 20, "every line read")

    asyncio.run(scenario())
    assert records(tailer) == []
