"""What JsonlCallback costs a MindSpore training step, next to LossMonitor(1) and to no callback at all.

One model is compiled once and trained on the same in-memory data in alternating runs: no callback,
LossMonitor(1), JsonlCallback, and JsonlCallback with lr reading switched off (to isolate the lr's share). Each
callback is wrapped so that perf counters around its ``on_train_step_end`` measure the time spent inside it; a
timestamp-only callback, present in every run, gives the end-to-end time per step. LossMonitor prints to a file,
as a training log would; JsonlCallback appends to a file next to it.

Run: python tests/bench/callback_overhead.py [--rounds 7] [--epochs 2] [--steps 100]

Goals (issue "The JSONL callback"): JsonlCallback's own time <= 0.6 x LossMonitor's in the same run, and reading
the lr of a list schedule adds <= 10 us per step.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import mindspore as ms  # noqa: E402
import mindspore.dataset as ds  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402
from mindspore.train import Callback, LossMonitor, Model  # noqa: E402

from tailer.callback import JsonlCallback  # noqa: E402


class Timed(Callback):
    """Forwards to ``inner`` and adds up the time spent in its on_train_step_end."""

    def __init__(self, inner: Callback) -> None:
        super().__init__()
        self.inner = inner
        self.seconds = 0.0
        self.calls = 0

    def on_train_begin(self, run_context: Any) -> None:
        self.inner.on_train_begin(run_context)

    def on_train_epoch_end(self, run_context: Any) -> None:
        self.inner.on_train_epoch_end(run_context)

    def on_train_step_end(self, run_context: Any) -> None:
        start = time.perf_counter()
        self.inner.on_train_step_end(run_context)
        self.seconds += time.perf_counter() - start
        self.calls += 1

    def on_train_end(self, run_context: Any) -> None:
        self.inner.on_train_end(run_context)


class StepClock(Callback):
    """Timestamps every step end; the median gap is the end-to-end time per step."""

    def __init__(self) -> None:
        super().__init__()
        self.stamps: list[float] = []

    def on_train_step_end(self, run_context: Any) -> None:
        self.stamps.append(time.perf_counter())

    def per_step(self) -> float:
        return statistics.median(b - a for a, b in zip(self.stamps, self.stamps[1:]))


class JsonlNoLr(JsonlCallback):
    """JsonlCallback with lr reading switched off, to measure what reading the lr adds."""

    def _lr(self, step: int) -> None:
        return None


def warmup_cosine(total: int, warmup: int, peak: float = 0.01) -> list[float]:
    return [peak * (i + 1) / warmup if i < warmup else
            0.5 * peak * (1 + math.cos(math.pi * (i - warmup) / max(1, total - warmup))) for i in range(total)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="runs of each variant, alternating (default 7)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per run (default 2)")
    parser.add_argument("--steps", type=int, default=100, help="steps per epoch (default 100)")
    parser.add_argument("--batch", type=int, default=32, help="batch size (default 32)")
    args = parser.parse_args()

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    rng = np.random.default_rng(0)
    x = rng.random((args.steps * args.batch, 32), dtype=np.float32)
    y = rng.integers(0, 10, args.steps * args.batch).astype(np.int32)
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(args.batch)
    total_steps = (1 + 4 * args.rounds) * args.epochs * args.steps
    net = nn.SequentialCell(nn.Dense(32, 64), nn.ReLU(), nn.Dense(64, 10))
    optimizer = nn.Momentum(net.trainable_params(), warmup_cosine(total_steps, total_steps // 20), 0.9)
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), optimizer)

    work = Path(tempfile.mkdtemp(prefix="mstail-bench-"))
    variants = {
        "none": lambda: None,
        "LossMonitor(1)": lambda: LossMonitor(1),
        "JsonlCallback": lambda: JsonlCallback(work / "rank_{rank}.jsonl"),
        "JsonlCallback, no lr": lambda: JsonlNoLr(work / "nolr_{rank}.jsonl"),
    }
    hook_us: dict[str, list[float]] = {name: [] for name in variants}
    step_ms: dict[str, list[float]] = {name: [] for name in variants}

    with open(work / "stdout.log", "w") as log, contextlib.redirect_stdout(log):
        model.train(args.epochs, data, callbacks=[StepClock()])  # compile and warm up, not counted
        for _ in range(args.rounds):
            for name, make in variants.items():
                clock = StepClock()
                inner = make()
                timed = Timed(inner) if inner is not None else None
                model.train(args.epochs, data, callbacks=[clock] + ([timed] if timed else []))
                step_ms[name].append(clock.per_step() * 1e3)
                if timed is not None:
                    hook_us[name].append(timed.seconds / timed.calls * 1e6)

    # The lr read in isolation: indexing the host copy of the list vs launching the lr cell.
    probe = JsonlCallback(work / "probe.jsonl")
    probe._lr_list = optimizer.learning_rate.learning_rate.asnumpy()
    host_lr_us = timeit.timeit(lambda: probe._lr(1000), number=20000) / 20000 * 1e6
    step_tensor = Tensor([1000], ms.int32)
    optimizer.learning_rate(step_tensor).asnumpy()  # compile once
    cell_lr_us = timeit.timeit(lambda: optimizer.learning_rate(step_tensor).asnumpy(), number=200) / 200 * 1e6

    records = sum(1 for _ in open(work / "rank_0.jsonl"))
    print(f"mstail callback overhead: MindSpore {ms.__version__}, numpy {np.__version__}, Python "
          f"{sys.version.split()[0]}, {os.cpu_count()} CPUs, CPU graph mode")
    print(f"{args.rounds} alternating rounds x {args.epochs} epochs x {args.steps} steps, batch {args.batch}, "
          f"MLP 32-64-10, Momentum with a {total_steps}-entry warmup+cosine lr list; medians over rounds")
    print(f"{'variant':<22} {'in hook, us/step':>17} {'end-to-end, ms/step':>20}")
    for name in variants:
        inside = f"{statistics.median(hook_us[name]):.1f}" if hook_us[name] else "-"
        print(f"{name:<22} {inside:>17} {statistics.median(step_ms[name]):>20.4f}")
    jsonl = statistics.median(hook_us["JsonlCallback"])
    loss_monitor = statistics.median(hook_us["LossMonitor(1)"])
    lr_share = jsonl - statistics.median(hook_us["JsonlCallback, no lr"])
    print(f"JsonlCallback / LossMonitor(1) in-hook time: {jsonl / loss_monitor:.2f} (goal <= 0.60) "
          f"{'PASS' if jsonl <= 0.6 * loss_monitor else 'FAIL'}")
    print(f"lr of a list schedule: {host_lr_us:.2f} us per read in isolation, {lr_share:+.1f} us per step in the "
          f"hook (goal <= 10) {'PASS' if max(host_lr_us, lr_share) <= 10 else 'FAIL'}; "
          f"the optimizer's lr cell costs {cell_lr_us:.0f} us per read")
    print(f"JsonlCallback wrote {records} records to {work / 'rank_0.jsonl'}")


if __name__ == "__main__":
    main()
