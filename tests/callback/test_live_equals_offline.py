"""Live equals offline with real MindSpore training (issue 15): mstail follows the stdout of a real `Model.train`
run (LossMonitor, TimeMonitor, a slow epoch end), started before the log exists; when the run is over, the
records the sidecar served equal `mstail parse` of the final file, and both equal the steps the trainer ran,
each exactly once, with TimeMonitor's times on the epoch's last step (one record per step).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, List

import pytest

from mstail.parsers.engine import without_read_time

from tests.conftest import ROOT, wait_until

pytestmark = [pytest.mark.mindspore, pytest.mark.timeout(240)]

STEPS_PER_EPOCH, EPOCHS = 20, 3

TRAIN = r'''
import sys, time
import numpy as np
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn
from mindspore.train import Callback, LossMonitor, Model, TimeMonitor

mode, every, time_monitor, slow_end, steps, epochs = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
ms.set_device("CPU")


class SlowEpochEnd(Callback):
    """A checkpoint save at the epoch end: the TimeMonitor line comes this long after the epoch's last step."""
    def on_train_epoch_end(self, run_context):
        time.sleep(slow_end)


class Pace(Callback):
    """Steps of 0.05 s, so a follower reads the run as it happens."""
    def on_train_step_end(self, run_context):
        time.sleep(0.05)


x = np.random.default_rng(0).random((steps * 4, 4), dtype=np.float32)
data = ds.NumpySlicesDataset({"x": x, "y": np.zeros((len(x), 1), np.float32)}, shuffle=False).batch(4)
net = nn.Dense(4, 1)
model = Model(net, loss_fn=nn.MSELoss(), optimizer=nn.SGD(net.trainable_params(), learning_rate=0.01))
callbacks = [Pace(), LossMonitor(every)] + ([SlowEpochEnd()] if slow_end else []) + ([TimeMonitor()] if time_monitor else [])
model.train(epochs, data, callbacks=callbacks, dataset_sink_mode=False)
'''


def true_steps(every: int) -> List[int]:
    """The global steps LossMonitor(every) prints at (every `every` steps since the last print)."""
    return [step for step in range(1, STEPS_PER_EPOCH * EPOCHS + 1) if step % every == 0]


@pytest.mark.parametrize("mode, every, time_monitor, slow_end", [
    ("graph", 1, True, 1.2),    # TimeMonitor's line 1.2 s after the epoch's last step: an amend, not a second record
    ("graph", 7, False, 0.0),   # the LossMonitor(7), 20 steps an epoch: steps 7, 14, 21, ...
    ("pynative", 7, True, 1.2),
])
def test_live_records_equal_mstail_parse_and_the_steps_trained(
    tmp_path: Path, mstail_server: Any, mode: str, every: int, time_monitor: bool, slow_end: float,
) -> None:
    log = tmp_path / "run" / "train.log"
    server = mstail_server(args=["--log", str(log)])  # before the log exists
    log.parent.mkdir()
    with open(log, "wb") as out:
        subprocess.run([sys.executable, "-c", TRAIN, mode, str(every), "1" if time_monitor else "0", str(slow_end),
                        str(STEPS_PER_EPOCH), str(EPOCHS)],
                       stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "GLOG_v": "3"}, check=True, timeout=200)
    expected = true_steps(every)
    printed = [line for line in log.read_text(encoding="utf-8").splitlines() if line.startswith("epoch: ")]
    assert len(printed) == len(expected)  # the trainer's own lines: one per printed step

    def live() -> List[dict]:
        return server.get_json(f"/api/records?after=0&limit={len(expected) + 50}")

    wait_until(lambda: len(live()) >= len(expected) and (not time_monitor or sum(
        "epoch_time_ms" in r for r in live()) >= EPOCHS), timeout=20, message="the sidecar did not catch up")
    served = live()
    parsed = subprocess.run([sys.executable, "-m", "mstail", "parse", str(log), "--to", "jsonl"], cwd=ROOT,
                            capture_output=True, check=True, timeout=60)
    offline = [json.loads(line) for line in parsed.stdout.decode("utf-8").splitlines()]
    # LossMonitor prints no time: live gives the read time, marked, and `mstail parse` none; the rest is the same.
    assert all(r["estimated"] == "time" for r in served) and not any("time" in r for r in offline)
    drop = {"seq", "source", "line"}
    assert [{k: v for k, v in without_read_time(r).items() if k not in drop} for r in served] == \
        [{k: v for k, v in r.items() if k not in drop} for r in offline]
    assert [r["step"] for r in served] == expected  # each step once, and its true global step
    if time_monitor:  # the epoch's times joined its last printed step
        with_times = [r["step"] for r in served if "epoch_time_ms" in r]
        assert with_times == [max(s for s in expected if s <= e * STEPS_PER_EPOCH) for e in range(1, EPOCHS + 1)]
    [source] = server.get_json("/api/sources")
    assert source["problem"] is None  # steps are exact here: nothing guessed
