"""Tiny MindSpore networks, data and probes shared by the callback tests (CPU, graph mode)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import Tensor, nn, ops
from mindspore.train import Callback

from tests.record_schema import check_items

ms.set_context(mode=ms.GRAPH_MODE)
ms.set_device("CPU")

BATCH = 4
STEPS_PER_EPOCH = 5


class MeanLoss(nn.LossBase):
    """Loss = mean of the network output: for a Dense layer its bias gradient is exactly 1, so an SGD step moves
    the bias by exactly the lr used at that step, which the tests read back as ground truth."""

    def construct(self, logits: Tensor, label: Tensor) -> Tensor:
        return logits.mean()


def features(seed: int = 0, nan_at: int | None = None) -> np.ndarray:
    """STEPS_PER_EPOCH batches of BATCH rows of 4 features; row ``nan_at`` is NaN when given."""
    x = np.random.default_rng(seed).random((STEPS_PER_EPOCH * BATCH, 4), dtype=np.float32)
    if nan_at is not None:
        x[nan_at] = np.nan
    return x


def dataset(x: np.ndarray) -> ds.Dataset:
    """(x, zeros) batched by BATCH, in order, so tests know every batch."""
    y = np.zeros((len(x), 1), np.float32)
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH)


def warmup_cosine(total: int, warmup: int = 3, peak: float = 0.05, floor: float = 0.005) -> list[float]:
    """A warmup + cosine lr list, as users build them for ``learning_rate=``."""
    lrs = []
    for i in range(total):
        if i < warmup:
            lrs.append(peak * (i + 1) / warmup)
        else:
            progress = (i - warmup) / max(1, total - warmup - 1)
            lrs.append(floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * progress)))
    return lrs


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of ``path`` as strict JSON (a bare NaN or Infinity fails the test): records and events, each one
    the record schema allows (parsers/record.schema.json; a JSONL writer's keys may come in any order)."""

    def reject(token: str) -> None:
        raise AssertionError(f"bare {token} in {path}")

    lines = [json.loads(line, parse_constant=reject) for line in path.read_text().splitlines()]
    check_items(lines, str(path), ordered=False)
    return lines


def read_records(path: Path) -> list[dict[str, Any]]:
    """The step records of ``path`` (lines without a ``kind``)."""
    return [line for line in read_lines(path) if "kind" not in line]


def read_events(path: Path) -> list[dict[str, Any]]:
    """The events of ``path`` (``end``, ``error`` ...)."""
    return [line for line in read_lines(path) if "kind" in line]


class BiasProbe(Callback):
    """Records the Dense bias after every step: with MeanLoss and plain SGD, bias[k-1] - bias[k] is the lr used."""

    def __init__(self, dense: nn.Dense) -> None:
        super().__init__()
        self.dense = dense
        self.bias = [float(dense.bias.asnumpy()[0])]

    def on_train_step_end(self, run_context: Any) -> None:
        self.bias.append(float(self.dense.bias.asnumpy()[0]))

    def lrs_used(self) -> list[float]:
        return [a - b for a, b in zip(self.bias, self.bias[1:])]


def _global_norm(grads: tuple[Tensor, ...]) -> Tensor:
    return ops.sqrt(ops.addn([ops.reduce_sum(ops.square(g)) for g in grads]))


class GradNormCell(nn.Cell):
    """A custom train cell returning (loss, grad_norm), as custom training setups do."""

    def __init__(self, network: nn.Cell, optimizer: nn.Optimizer) -> None:
        super().__init__(auto_prefix=False)
        self.network = network
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.grad = ops.GradOperation(get_by_list=True)

    def construct(self, *inputs: Tensor) -> tuple[Tensor, Tensor]:
        loss = self.network(*inputs)
        grads = self.grad(self.network, self.weights)(*inputs)
        self.optimizer(grads)
        return loss, _global_norm(grads)


class LossScaleCell(nn.Cell):
    """Returns (loss, overflow, loss_scale) like TrainOneStepWithLossScaleCell, which needs an NPU status op that
    the CPU lacks; overflow is computed with isfinite instead (and, to stay tiny, does not skip the update)."""

    def __init__(self, network: nn.Cell, optimizer: nn.Optimizer, scale: float) -> None:
        super().__init__(auto_prefix=False)
        self.network = network
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.scale = Tensor(scale, ms.float32)

    def construct(self, *inputs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        loss = self.network(*inputs)
        grads = self.grad(self.network, self.weights)(*inputs, ops.cast(self.scale, ms.float32))
        bad = ops.addn([ops.reduce_sum(ops.cast(ops.logical_not(ops.isfinite(g)), ms.float32)) for g in grads])
        self.optimizer(tuple(g / self.scale for g in grads))
        return loss, bad > 0, self.scale
