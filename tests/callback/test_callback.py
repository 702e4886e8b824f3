"""JsonlCallback and JsonlWriter against real MindSpore training (CPU, graph mode)."""

from __future__ import annotations

import json
import math
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import mindspore as ms
import mindspore.train.model as ms_model
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn
from mindspore.amp import FixedLossScaleManager
from mindspore.train import Model

from mstail.callback import JsonlCallback, JsonlWriter
from mstail.parsers.record import RESERVED

from . import nets
from .nets import BATCH, STEPS_PER_EPOCH, read_events, read_records

STEPS = STEPS_PER_EPOCH

# Each test trains a few steps of a tiny net or writes a few records (well under a second); a hang must not stall CI.
pytestmark = [pytest.mark.mindspore, pytest.mark.timeout(60)]


def sgd_model(lr: Any, **model_kwargs: Any) -> tuple[Model, nn.Dense]:
    net = nn.Dense(4, 1)
    optimizer = nn.SGD(net.trainable_params(), learning_rate=lr)
    return Model(net, loss_fn=nets.MeanLoss(), optimizer=optimizer, **model_kwargs), net


def expected_grad_norm(batch: np.ndarray) -> float:
    # MeanLoss over Dense(4, 1): dL/dW = column means of the batch, dL/db = 1.
    return math.sqrt(float(np.sum(batch.astype(np.float64).mean(axis=0) ** 2)) + 1.0)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "mstail.callback"]


def test_model_train_writes_every_step_with_the_lr_used_and_counts_on_across_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ms_warnings: list[str] = []
    monkeypatch.setattr(ms_model.logger, "warning", lambda msg, *args: ms_warnings.append(msg % args if args else msg))
    lrs = nets.warmup_cosine(3 * STEPS)
    model, net = sgd_model(lrs)
    probe = nets.BiasProbe(net)
    callback = JsonlCallback(tmp_path / "metrics" / "rank_{rank}.jsonl")
    path = tmp_path / "metrics" / "rank_0.jsonl"

    started = time.time()
    model.train(2, nets.dataset(nets.features()), callbacks=[probe, callback])
    assert [r["step"] for r in read_records(path)] == list(range(1, 2 * STEPS + 1))
    model.train(1, nets.dataset(nets.features(seed=1)), callbacks=[probe, callback])
    finished = time.time()

    records = read_records(path)
    assert [r["step"] for r in records] == list(range(1, 3 * STEPS + 1))
    # MindSpore restarts epochs (and cur_step_num) at every Model.train call; only the step is global.
    assert [r["epoch"] for r in records] == [1] * STEPS + [2] * STEPS + [1] * STEPS
    for record, configured, used in zip(records, lrs, probe.lrs_used()):
        assert set(record) == {"step", "epoch", "time", "loss", "lr", "step_time_ms", "samples_per_s"}
        assert np.float32(record["lr"]) == np.float32(configured)
        assert record["lr"] == pytest.approx(used, rel=1e-4)
        assert isinstance(record["loss"], float)
        assert started - 1 <= record["time"] <= finished + 1
        assert record["step_time_ms"] > 0
        assert record["samples_per_s"] == pytest.approx(BATCH * 1000 / record["step_time_ms"], rel=0.01)
    assert callback.writer.written == 3 * STEPS and callback.writer.dropped == 0
    # on_train_step_end, not the deprecated step_end, which makes Model.train print a warning.
    assert not [m for m in ms_warnings if "may not be supported" in m]


def test_training_that_ends_writes_an_end_event_and_one_that_raises_an_error_and_an_end(tmp_path: Path) -> None:
    # Before: no end event, so a silence after a run that exited 0 was taken for a hang (someone paged); no start
    # event with the total, so a run killed half-way could not be told from one that finished.
    model, _ = sgd_model(0.01)
    path = tmp_path / "m.jsonl"
    model.train(2, nets.dataset(nets.features()), callbacks=[JsonlCallback(path)])
    start, end = read_events(path)
    assert (start["kind"], start["step"], start["total_steps"]) == ("start", 0, 2 * STEPS_PER_EPOCH)
    assert (end["kind"], end["step"], end["message"]) == ("end", 2 * STEPS_PER_EPOCH, "training ended")

    class Boom(ms.train.Callback):
        def on_train_step_end(self, run_context: Any) -> None:
            if run_context.original_args().cur_step_num == 3:
                raise ValueError("loss is NAN or INF, terminating training")

    crashed = tmp_path / "crashed.jsonl"
    model, _ = sgd_model(0.01)  # a fresh optimizer: steps count from 1 again
    with pytest.raises(ValueError, match="terminating training"):
        model.train(1, nets.dataset(nets.features()), callbacks=[JsonlCallback(crashed), Boom()])
    assert [r["step"] for r in read_records(crashed)] == [1, 2, 3]
    start, error, end = read_events(crashed)
    assert (start["kind"], start["total_steps"]) == ("start", STEPS_PER_EPOCH)
    assert (error["kind"], error["step"], end["kind"], end["step"]) == ("error", 3, "end", 3)
    assert error["message"].endswith("ValueError: loss is NAN or INF, terminating training")
    assert end["message"] == "training ended by an exception (ValueError)"  # the error event says which


def test_custom_train_cell_returning_loss_and_grad_norm(tmp_path: Path) -> None:
    lrs = nets.warmup_cosine(STEPS)
    net = nn.Dense(4, 1)
    cell = nets.GradNormCell(nn.WithLossCell(net, nets.MeanLoss()), nn.SGD(net.trainable_params(), lrs))
    x = nets.features()
    # No optimizer= for Model: the lr still comes from the optimizer found inside the cell.
    Model(cell).train(1, nets.dataset(x), callbacks=[JsonlCallback(tmp_path / "m.jsonl")])

    records = read_records(tmp_path / "m.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for k, record in enumerate(records):
        assert record["grad_norm"] == pytest.approx(expected_grad_norm(x[k * BATCH : (k + 1) * BATCH]), rel=1e-5)
        assert np.float32(record["lr"]) == np.float32(lrs[k])
        assert "overflow" not in record


def test_loss_scale_and_overflow_from_the_train_cell_outputs(tmp_path: Path) -> None:
    net = nn.Dense(4, 1)
    cell = nets.LossScaleCell(nn.WithLossCell(net, nets.MeanLoss()), nn.SGD(net.trainable_params(), 0.01), 1024.0)
    x = nets.features(nan_at=2 * BATCH + 1)  # a NaN in the third batch
    Model(cell).train(1, nets.dataset(x), callbacks=[JsonlCallback(tmp_path / "m.jsonl")])

    records = read_records(tmp_path / "m.jsonl")
    assert [r["loss_scale"] for r in records] == [1024.0] * STEPS
    # The gradients of this linear model do not depend on the (now NaN) weights: only the NaN batch overflows.
    assert [r["overflow"] for r in records] == [0, 0, 1, 0, 0]
    assert [r["loss"] for r in records[2:]] == ["NaN"] * 3


def test_non_finite_loss_is_recorded_not_raised(tmp_path: Path) -> None:
    model, _ = sgd_model(0.01)
    x = nets.features(nan_at=2 * BATCH)
    model.train(1, nets.dataset(x), callbacks=[JsonlCallback(tmp_path / "m.jsonl")])

    records = read_records(tmp_path / "m.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert all(isinstance(r["loss"], float) for r in records[:2])
    # The NaN reaches the weights, so every later loss is NaN too.
    assert [r["loss"] for r in records[2:]] == ["NaN"] * 3
    assert "NaN" not in (tmp_path / "m.jsonl").read_text().replace('"NaN"', "")


def test_every_n_steps_fixed_lr_every_lr_every_steps_and_fixed_loss_scale(tmp_path: Path) -> None:
    manager = FixedLossScaleManager(1024.0, drop_overflow_update=False)
    model, _ = sgd_model(0.01, loss_scale_manager=manager)
    callback = JsonlCallback(tmp_path / "m.jsonl", every=2, lr_every=4)
    model.train(2, nets.dataset(nets.features()), callbacks=[callback])

    records = read_records(tmp_path / "m.jsonl")
    assert [r["step"] for r in records] == [2, 4, 6, 8, 10]
    # A fixed lr lives in a device Parameter: read only when the step passes a multiple of lr_every.
    lr = np.float32(0.01)
    assert [r.get("lr") for r in records] == [None, lr, None, lr, None]
    assert [r["loss_scale"] for r in records] == [1024.0] * 5
    # step_time_ms is the mean over the steps since the previous record.
    assert all(r["step_time_ms"] > 0 for r in records)


def test_lr_schedule_cell_is_read_every_lr_every_steps_with_the_lr_used(tmp_path: Path) -> None:
    model, net = sgd_model(nn.CosineDecayLR(0.001, 0.05, 4))
    probe = nets.BiasProbe(net)
    model.train(1, nets.dataset(nets.features()), callbacks=[probe, JsonlCallback(tmp_path / "m.jsonl", lr_every=2)])

    records = read_records(tmp_path / "m.jsonl")
    used = probe.lrs_used()
    assert [r["step"] for r in records if "lr" in r] == [2, 4]
    for record in records:
        if "lr" in record:
            assert record["lr"] == pytest.approx(used[record["step"] - 1], rel=1e-4)


def test_functional_value_and_grad_loop_with_writer(tmp_path: Path) -> None:
    lrs = nets.warmup_cosine(STEPS)
    net = nn.Dense(4, 1)
    optimizer = nn.SGD(net.trainable_params(), learning_rate=lrs)

    def forward(x: Tensor) -> Tensor:
        return net(x).mean()

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

    @ms.jit
    def train_step(x: Tensor) -> tuple[Tensor, Tensor]:
        loss, grads = grad_fn(x)
        optimizer(grads)
        return loss, nets._global_norm(grads)

    x = nets.features()
    with JsonlWriter(tmp_path / "rank_{rank}.jsonl", batch_size=BATCH) as writer:
        for step in range(1, STEPS + 1):
            batch = x[(step - 1) * BATCH : step * BATCH]
            loss, grad_norm = train_step(Tensor(batch))
            assert writer.log(step, epoch=1, loss=loss, lr=lrs[step - 1], grad_norm=grad_norm)

    records = read_records(tmp_path / "rank_0.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert [r["lr"] for r in records] == lrs
    for k, record in enumerate(records):
        assert record["grad_norm"] == pytest.approx(expected_grad_norm(x[k * BATCH : (k + 1) * BATCH]), rel=1e-5)
    # Timing needs a previous record: none on the first, then per step.
    assert "step_time_ms" not in records[0]
    assert all(r["step_time_ms"] > 0 and r["samples_per_s"] > 0 for r in records[1:])


def test_user_metrics_from_add_metric_and_extra(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model, _ = sgd_model(0.01)
    callback = JsonlCallback(tmp_path / "m.jsonl", extra=lambda cb: {"in_epoch": cb.cur_step_num})
    callback.add_metric("tokens", 128)
    callback.add_metric("wd", lambda: np.float32(0.1))
    callback.add_metric("param", Parameter(Tensor(2.5, ms.float32), name="mstail_test_param"))
    callback.add_metric("broken", lambda: 1 / 0)
    model.train(1, nets.dataset(nets.features()), callbacks=[callback])

    records = read_records(tmp_path / "m.jsonl")
    assert [r["in_epoch"] for r in records] == list(range(1, STEPS + 1))
    assert {(r["tokens"], r["wd"], r["param"], r["broken"]) for r in records} == {(128, np.float32(0.1), 2.5, None)}
    assert len([m for m in warnings_of(caplog) if "'broken'" in m]) == 1


def test_extra_that_raises_leaves_the_records_alone(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model, _ = sgd_model(0.01)

    def extra(cb: Any) -> dict[str, float]:
        raise RuntimeError("user bug")

    model.train(1, nets.dataset(nets.features()), callbacks=[JsonlCallback(tmp_path / "m.jsonl", extra=extra)])
    assert len(read_records(tmp_path / "m.jsonl")) == STEPS
    assert len(warnings_of(caplog)) == 1


def test_names_mstail_would_not_read_as_they_are_are_refused_at_setup(tmp_path: Path) -> None:
    writer = JsonlWriter(tmp_path / "m.jsonl")
    for name in (" ", "a\nb", "\x1b[31m", "__proto__", "_part", "x" * 257):
        with pytest.raises(ValueError, match="cannot be a metric name"):
            writer.add_metric(name, 1.0)
    writer.add_metric("损失 λ", 1.0)


def test_reserved_names_are_refused_at_setup_and_left_out_during_training(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = JsonlWriter(tmp_path / "m.jsonl")
    for name in RESERVED:
        with pytest.raises(ValueError, match="reserved"):
            writer.add_metric(name, 1.0)
    with pytest.raises(ValueError, match="reserved"):
        JsonlCallback(tmp_path / "m.jsonl", outputs=("loss", "seq"))
    with pytest.raises(ValueError):
        JsonlWriter(tmp_path / "m.jsonl", every=0)

    assert writer.log(1, loss=1.0, seq=7, source="x")
    assert writer.log(2, loss=1.0, seq=8)
    writer.close()
    assert [set(r) for r in read_records(tmp_path / "m.jsonl")] == [
        {"step", "time", "loss"},
        {"step", "time", "loss", "step_time_ms"},
    ]
    assert len([m for m in warnings_of(caplog) if "'seq'" in m]) == 1


def test_non_finite_values_are_strings_and_none_is_null(tmp_path: Path) -> None:
    with JsonlWriter(tmp_path / "m.jsonl") as writer:
        writer.log(
            1,
            loss=float("nan"),
            a=float("inf"),
            b=-math.inf,
            c=None,
            d=np.float32("nan"),
            e=Tensor(np.array(np.inf, np.float32)),
            overflow=np.bool_(True),
        )
    text = (tmp_path / "m.jsonl").read_text()
    (record,) = read_records(tmp_path / "m.jsonl")
    assert (record["loss"], record["a"], record["b"], record["c"], record["d"], record["e"], record["overflow"]) == (
        "NaN",
        "Infinity",
        "-Infinity",
        None,
        "NaN",
        "Infinity",
        1,
    )
    assert "NaN," not in text and "Infinity," not in text.replace('"Infinity",', "")


def test_every_counts_passed_multiples_when_steps_jump(tmp_path: Path) -> None:
    with JsonlWriter(tmp_path / "m.jsonl", every=5) as writer:
        for step in [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 14, 18, 21, 25]:
            writer.log(step, loss=Tensor(1.0))
        writer.log(3, loss=1.0)  # stepped back (resume): written at once
    assert [r["step"] for r in read_records(tmp_path / "m.jsonl")] == [5, 10, 18, 21, 25, 3]


def test_rank_in_path_and_ranks_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK_ID", "3")
    with JsonlWriter(tmp_path / "rank_{rank}.jsonl") as writer:
        assert writer.log(1, loss=1.0)
    assert writer.path == str(tmp_path / "rank_3.jsonl")
    assert read_records(tmp_path / "rank_3.jsonl")[0]["loss"] == 1.0

    class Unreadable:
        def __float__(self) -> float:
            raise AssertionError("a rank that does not write must not read values")

    with JsonlWriter(tmp_path / "other_{rank}.jsonl", ranks=[0, 1]) as writer:
        assert not writer.log(1, loss=Unreadable())
    assert not list(tmp_path.glob("other_*")) and writer.written == 0


def test_callback_on_a_rank_that_does_not_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK_ID", "1")
    model, _ = sgd_model(0.01)
    callback = JsonlCallback(tmp_path / "rank_{rank}.jsonl", ranks=[0])
    model.train(1, nets.dataset(nets.features()), callbacks=[callback])
    assert not list(tmp_path.iterdir()) and callback.writer.written == 0


def test_unwritable_directory_is_reported_once_and_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "blocker").write_text("a file where a directory should be")
    writer = JsonlWriter(tmp_path / "blocker" / "metrics" / "m.jsonl")
    writer.CHECK_INTERVAL_S = 0.0  # retry the open at every record
    for step in range(1, 6):
        assert not writer.log(step, loss=1.0)
    assert (writer.written, writer.dropped) == (0, 5)
    assert len(warnings_of(caplog)) == 1


def test_full_disk_is_reported_once_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    with JsonlWriter("/dev/full") as writer:  # every write fails with ENOSPC
        for step in range(1, 4):
            assert not writer.log(step, loss=1.0)
    assert (writer.written, writer.dropped) == (0, 3)
    assert len(warnings_of(caplog)) == 1 and "No space" in warnings_of(caplog)[0]


def test_vanished_directory_is_recreated(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    writer = JsonlWriter(tmp_path / "out" / "m.jsonl")
    writer.CHECK_INTERVAL_S = 0.0
    writer.log(1, loss=1.0)
    shutil.rmtree(tmp_path / "out")
    writer.log(2, loss=2.0)
    writer.log(3, loss=3.0)
    writer.close()
    assert [r["step"] for r in read_records(tmp_path / "out" / "m.jsonl")] == [2, 3]
    assert writer.written == 3 and len(warnings_of(caplog)) == 1


def test_a_short_write_does_not_glue_the_next_record_to_it(tmp_path: Path) -> None:
    writer = JsonlWriter(tmp_path / "m.jsonl")
    writer.log(1, loss=1.0)
    real = writer._file

    class ShortOnce:
        def write(self, data: bytes) -> int:
            self.write = real.write  # type: ignore[method-assign]
            return real.write(data[:7])

        def close(self) -> None:
            real.close()

    writer._file = ShortOnce()
    assert not writer.log(2, loss=2.0)
    assert writer.log(3, loss=3.0)
    writer.close()
    lines = (tmp_path / "m.jsonl").read_text().splitlines()
    assert len(lines) == 3 and lines[1] == '{"step"'
    assert [json.loads(lines[0])["step"], json.loads(lines[2])["step"]] == [1, 3]
    assert (writer.written, writer.dropped) == (2, 1)


def test_a_follower_sees_only_whole_lines_while_the_file_grows(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    total = 3000
    seen: list[str] = []
    done = threading.Event()

    def follow() -> None:
        while not path.exists():
            time.sleep(0.001)
        pending = b""
        with open(path, "rb") as f:
            while True:
                finished = done.is_set()
                pending += f.read()
                *complete, pending = pending.split(b"\n")
                seen.extend(line.decode() for line in complete)
                if finished:
                    break
                time.sleep(0.0005)
        assert pending == b""

    reader = threading.Thread(target=follow)
    reader.start()
    with JsonlWriter(path) as writer:
        for step in range(1, total + 1):
            writer.log(step, loss=step / 7, note=Tensor(np.float32(step)))
    done.set()
    reader.join(30)
    assert [json.loads(line)["step"] for line in seen] == list(range(1, total + 1))
