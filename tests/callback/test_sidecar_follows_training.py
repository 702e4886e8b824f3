"""A real mstail follows the JSONL file while real MindSpore training writes it: every step, live."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, List

import pytest
from mindspore import nn
from mindspore.train import Callback, Model

from mstail.callback import JsonlCallback

from . import nets
from .nets import read_records

pytestmark = [pytest.mark.mindspore, pytest.mark.timeout(90)]
EPOCHS = 8  # x STEPS_PER_EPOCH steps


class SidecarProbe(Callback):
    """At every step end, asks the running sidecar how many records it already holds (bounded wait)."""

    def __init__(self, server: Any, wait_until: Any) -> None:
        super().__init__()
        self.server, self.wait_until = server, wait_until
        self.seen: List[int] = []

    def on_train_step_end(self, run_context: Any) -> None:
        step = run_context.original_args().cur_step_num
        # The JSONL line of this step is written by the callback before this one: the sidecar must show it
        # while training is still running.
        held = self.wait_until(lambda: self._held() >= step and self._held(), timeout=5, interval=0.005)
        self.seen.append(held)

    def _held(self) -> int:
        return sum(s["records"] for s in self.server.get_json("/api/sources"))


def test_sidecar_shows_every_step_while_model_train_runs(tmp_path: Path, mstail_server, wait_until) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "output" / "metrics" / "rank_0.jsonl"
    server = mstail_server(args=["--jsonl", str(tmp_path / "output" / "metrics" / "rank_*.jsonl")])
    total = EPOCHS * nets.STEPS_PER_EPOCH
    net = nn.Dense(4, 1)
    model = Model(net, loss_fn=nets.MeanLoss(), optimizer=nn.SGD(net.trainable_params(), learning_rate=nets.warmup_cosine(total)))
    probe = SidecarProbe(server, wait_until)
    started = time.monotonic()
    model.train(EPOCHS, nets.dataset(nets.features()), callbacks=[JsonlCallback(path), probe])
    assert time.monotonic() - started < 60

    assert probe.seen == sorted(probe.seen) and probe.seen[-1] >= total  # live, step by step
    written = read_records(path)
    served = server.get_json(f"/api/records?after=0&limit={total + 10}")
    assert [r["step"] for r in served] == list(range(1, total + 1))
    assert [(r["step"], r["loss"], r["lr"]) for r in served] == [(r["step"], r["loss"], r["lr"]) for r in written]
    [source] = server.get_json("/api/sources")
    assert source["id"] == "rank_0" and source["format"] == "jsonl"
    assert {"loss", "lr", "step_time_ms", "samples_per_s"} <= set(source["metrics"])
