"""Append one JSON record per training step to a local file, from inside MindSpore training.

Plain MindSpore scripts print only ``epoch: 1 step: 5, loss is ...``. This module gives them, and custom training
loops, a minimal sink: one flat JSON object per line (the record shape, `mstail.parsers.record`) appended to a local file that the
mstail sidecar follows like any log. The training loop never opens a socket, never starts a thread and never
raises because of monitoring: write failures are logged once and counted in ``dropped``.

Only mindspore, numpy and the standard library are imported, so a training environment needs nothing else::

    model.train(epochs, ds, callbacks=[JsonlCallback("output/metrics/rank_{rank}.jsonl")])

    w = JsonlWriter("output/metrics/rank_{rank}.jsonl")
    w.log(step, loss=loss, lr=lr, grad_norm=gn)
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Callable

import numpy as np
from mindspore import Parameter, Tensor, nn
from mindspore import dtype as mstype
from mindspore.communication import GlobalComm, get_rank
from mindspore.train import Callback

from mstail.parsers.record import MAX_NAME_CHARS, RESERVED, finite_or_name, metric_key

try:
    # Private classes: how Optimizer wraps a list schedule and a per-group fixed lr. Knowing them lets the lr be
    # read on the host; if a future MindSpore renames them, lr falls back to the (slower) schedule-cell read.
    from mindspore.nn.optim.optimizer import _ConvertToCell, _IteratorLearningRate
except ImportError:  # pragma: no cover - depends on the MindSpore version
    _ConvertToCell = _IteratorLearningRate = ()

__all__ = ["JsonlCallback", "JsonlWriter"]

logger = logging.getLogger("mstail.callback")


# Names given to the positions of a train cell's output tuple when ``outputs`` is not set, by tuple length:
# TrainOneStepWithLossScaleCell returns (loss, overflow, scaling_sens); MindFormers' cells add lr and global_norm
# (and, with local_norm, two more entries that are per-group arrays, left out).
_AUTO_OUTPUTS: dict[int, tuple[str, ...]] = {
    1: ("loss",),
    3: ("loss", "overflow", "loss_scale"),
    4: ("loss", "overflow", "loss_scale", "lr"),
    5: ("loss", "overflow", "loss_scale", "lr", "grad_norm"),
}


def _number(value: Any) -> int | float | str | None:
    """Turn a metric value (Python/numpy number, Tensor, Parameter, None) into what the record holds.

    A Tensor costs one device-to-host read. Arrays of several elements are averaged (booleans: any is set), as
    LossMonitor does for the loss. Non-finite floats become the strings the record contract names (`mstail.parsers.record.NON_FINITE`).
    """
    if isinstance(value, Tensor):
        try:
            # One element: Tensor.item() is a C path, ~30 us cheaper than asnumpy() on a fresh graph output.
            value = value.item()
        except (TypeError, ValueError):
            value = value.asnumpy()
    if type(value) is float and math.isfinite(value):  # the usual case (a loss, an lr): skip the checks below
        return value
    if isinstance(value, np.ndarray):
        if value.size == 1:
            value = value.item()
        elif value.dtype == np.bool_:
            return int(value.any())
        else:
            value = value.astype(np.float64).mean()
    if isinstance(value, np.generic):
        value = value.item()
    if value is None:
        return None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    return finite_or_name(float(value))


def _current_rank() -> int:
    """The process's rank: ``get_rank()`` once distributed init happened, else env ``RANK_ID``, else 0."""
    if GlobalComm.INITED:
        return int(get_rank())
    try:
        return int(os.environ.get("RANK_ID", "0"))
    except ValueError:
        return 0


def _crossed(prev: int | None, step: int, every: int) -> bool:
    """Whether ``step`` passed a multiple of ``every`` since ``prev`` (the step seen last; None: none yet).

    For consecutive steps this is ``step % every == 0``. When steps jump (sink mode) it fires at the first step
    past each multiple; when they go back (a resumed run), it fires at once.
    """
    if prev is None:
        prev = step - 1
    return step // every != prev // every


class JsonlWriter:
    """Append step records (`mstail.parsers.record`), one JSON object per line, to a local file.

    Every record is one ``write`` on a file opened in append mode (no buffering, no fsync), so a follower never
    sees half a line and the file is readable while it grows. The file and its directory are created on the
    first record. Nothing here raises during training: a failed write is logged once (logger
    ``mstail.callback``) and counted in ``dropped``.

    Args:
        path: file to append to; ``{rank}`` is replaced by the rank id (``get_rank()`` after distributed init,
            else env ``RANK_ID``, else 0), resolved at the first record.
        every: write only steps that pass a multiple of ``every`` (default 1: every step). Skipped calls cost
            no device read: their values are never converted.
        ranks: rank ids that write; the others write nothing and read nothing. Default None: every rank writes
            its own file, which is what lets the page show stragglers.
        batch_size: samples per step on this rank; when set, records get ``samples_per_s``. Default None.

    Attributes:
        written: records written so far.
        dropped: records lost to write errors (full disk, missing permissions, vanished directory).
        path: the resolved file path (None until the first record).
    """

    # How often (seconds) to check that ``path`` still names the open file, and to retry a failed open: a
    # deleted directory is recreated instead of records going into an unlinked file forever.
    CHECK_INTERVAL_S = 1.0

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        every: int = 1,
        ranks: Iterable[int] | None = None,
        batch_size: int | None = None,
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive int, got {every!r}")
        self._template = os.fspath(path)
        self.every = every
        self._ranks = None if ranks is None else frozenset(int(r) for r in ranks)
        self.batch_size = batch_size
        self.written = 0
        self.dropped = 0
        self.path: str | None = None
        self._enabled: bool | None = None  # decided at the first call, once the rank is known
        self._file: Any = None
        self._identity: tuple[int, int] | None = None
        self._next_check = 0.0
        self._retry_at = 0.0
        self._torn = False
        self._metrics: dict[str, Any] = {}
        self._prev_step: int | None = None
        self._clock: tuple[int, float] | None = None
        self._reported: set[str] = set()

    def add_metric(self, name: str, value: Any) -> None:
        """Add ``name`` to every record from now on.

        Args:
            name: metric name; one of RESERVED, or one mstail would not read as it is (`metric_key`), raises
                ValueError (a setup mistake, caught before training).
            value: a number, a Tensor/Parameter (read at each record: one device-to-host copy) or a callable
                taking no argument that returns one of those (called at each record; if it raises, the record
                gets null and the error is logged once).
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"metric name must be a non-empty str, got {name!r}")
        if name in RESERVED:
            raise ValueError(f"{name!r} is reserved in mstail records ({', '.join(sorted(RESERVED))})")
        if metric_key(name) != name:  # mstail would read it under another name, or none
            raise ValueError(f"{name!r} cannot be a metric name: blank, over {MAX_NAME_CHARS} characters, control "
                             "characters, or __proto__")
        self._metrics[name] = value

    def reset_clock(self, step: int) -> None:
        """Time the next record from now, as if ``step`` had just ended (e.g. at the start of training).

        Without it, the first record has no ``step_time_ms``; after it, the next record's ``step_time_ms`` is the
        wall time since this call divided by the steps done since ``step``.
        """
        self._clock = (step, time.perf_counter())

    def log(self, step: int, /, *, epoch: int | None = None, **metrics: Any) -> bool:
        """Append a record for ``step`` unless ``every`` skips it; return whether it was written.

        Args:
            step: global step (1-based, monotonic within a run).
            epoch: epoch number, or None (default) to leave it out.
            **metrics: values by name (numbers, Tensors, None for null). ``step_time_ms`` and ``samples_per_s``
                are filled in from the wall time between records unless given.
        """
        try:
            step = int(step)
            if not self._due(step):
                return False
            return self._write(step, epoch, metrics)
        except Exception:  # noqa: BLE001 - monitoring must never stop training
            self.dropped += 1
            self._report("log", "a record could not be built", exc_info=True)
            return False

    def event(self, kind: str, step: int | None = None, message: str | None = None,
              total_steps: int | None = None) -> bool:
        """Append an event line, ``{"kind": ..., "step": ..., "time": ..., "message": ...}``: ``start`` when
        training begins (with ``total_steps``, the global step it will end at, when known), ``end`` when it is over
        (so the sidecar knows a silence that follows is not a hang, and a run that started and left without its
        end died), ``error`` for a crash, or any kind of your own (``checkpoint``, ``eval`` ...). Written by every
        rank that writes records; never raises. Returns whether it was written."""
        try:
            if not self._this_rank():
                return False
            record: dict[str, Any] = {"kind": str(kind)}
            if step is not None:
                record["step"] = int(step)
            record["time"] = round(time.time(), 3)
            if message:
                record["message"] = str(message)
            if total_steps is not None:
                record["total_steps"] = int(total_steps)
            return self._append((json.dumps(record) + "\n").encode(), time.perf_counter())
        except Exception:  # noqa: BLE001 - monitoring must never stop training
            self.dropped += 1
            self._report("event", "an event could not be written", exc_info=True)
            return False

    def close(self) -> None:
        """Close the file; a later record reopens it (appending)."""
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _due(self, step: int) -> bool:
        """Whether a record for ``step`` is to be written (this rank writes and ``every`` does not skip it)."""
        if not self._this_rank():
            return False
        prev, self._prev_step = self._prev_step, step
        return self.every == 1 or _crossed(prev, step, self.every)

    def _this_rank(self) -> bool:
        """Whether this rank writes (decided, and the path resolved, at the first call)."""
        if self._enabled is None:
            rank = _current_rank()
            self._enabled = self._ranks is None or rank in self._ranks
            self.path = self._template.replace("{rank}", str(rank))
        return self._enabled

    def _write(self, step: int, epoch: int | None, metrics: Mapping[str, Any]) -> bool:
        """Build the record (converting every value) and append it."""
        now = time.time()
        tick = time.perf_counter()
        record: dict[str, Any] = {"step": int(step)}
        if epoch is not None:
            record["epoch"] = int(epoch)
        record["time"] = round(now, 3)
        for name, value in metrics.items():
            if name in RESERVED:
                self._report(f"reserved:{name}", f"metric {name!r} is a reserved key; left out")
                continue
            record[name] = self._convert(name, value)
        for name, source in self._metrics.items():
            try:
                value = source() if callable(source) else source
            except Exception:  # noqa: BLE001 - a user's metric may raise anything: said, recorded as null
                self._report(f"metric:{name}", f"metric {name!r} raised; null", exc_info=True)
                value = None
            record[name] = self._convert(name, value)
        if self._clock is not None and step > self._clock[0]:
            seconds = (tick - self._clock[1]) / (step - self._clock[0])
            record.setdefault("step_time_ms", round(seconds * 1e3, 3))
            if self.batch_size and seconds > 0:
                record.setdefault("samples_per_s", round(self.batch_size / seconds, 3))
        self._clock = (step, tick)
        if not self._append((json.dumps(record) + "\n").encode(), tick):
            return False
        self.written += 1
        return True

    def _convert(self, name: str, value: Any) -> int | float | str | None:
        try:
            return _number(value)
        except Exception:  # noqa: BLE001 - as for a metric: said, recorded as null
            self._report(f"value:{name}", f"metric {name!r} is not a number ({type(value).__name__}); null")
            return None

    def _append(self, data: bytes, tick: float) -> bool:
        if self._file is None:
            if tick >= self._retry_at:
                self._open(tick)
        elif tick >= self._next_check:
            self._next_check = tick + self.CHECK_INTERVAL_S
            if not self._still_there():
                self._open(tick)
        if self._file is None:
            self.dropped += 1
            return False
        if self._torn:
            # A partial line from a failed write is in the file: end it so this record stays a line of its own.
            data = b"\n" + data
        try:
            n = self._file.write(data)
        except OSError as exc:
            self.dropped += 1
            self._report("write", f"cannot write {self.path}: {exc}")
            return False
        if n is not None and n < len(data):
            self._torn = True
            self.dropped += 1
            self._report("write", f"short write to {self.path} (disk full?)")
            return False
        self._torn = False
        return True

    def _still_there(self) -> bool:
        """Whether ``path`` still names the open file (not deleted, not replaced)."""
        try:
            st = os.stat(self.path)  # type: ignore[arg-type]  # resolved by _this_rank() before any write
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._identity

    def _open(self, tick: float) -> None:
        if self._file is not None:
            self._report("vanished", f"{self.path} was removed or replaced; reopening it")
            self.close()
        try:
            directory = os.path.dirname(self.path)  # type: ignore[type-var]  # as in _still_there
            if directory:
                os.makedirs(directory, exist_ok=True)
            self._file = open(self.path, "ab", buffering=0)  # type: ignore[arg-type]  # as in _still_there
            st = os.fstat(self._file.fileno())
        except OSError as exc:
            self._file = None
            self._retry_at = tick + self.CHECK_INTERVAL_S
            self._report("open", f"cannot open {self.path}: {exc}")
            return
        self._identity = (st.st_dev, st.st_ino)
        self._next_check = tick + self.CHECK_INTERVAL_S

    def _report(self, kind: str, message: str, exc_info: bool = False) -> None:
        """Log ``message`` the first time a problem of this ``kind`` happens; later ones only count."""
        if kind not in self._reported:
            self._reported.add(kind)
            logger.warning(
                "mstail: %s (reported once; lost records are counted in dropped)", message, exc_info=exc_info
            )


class JsonlCallback(Callback):
    """MindSpore ``Model.train`` callback that writes one record per step through a JsonlWriter.

    Each record has ``step`` (global: across epochs and repeated ``Model.train`` calls, taken from the optimizer's
    ``global_step``), ``epoch`` (as MindSpore counts it), ``time``, ``loss``, ``step_time_ms`` (wall time per step
    since the previous record, or since training began for the first one, so it includes graph compilation),
    ``samples_per_s`` when the batch size is known, ``lr`` (the lr used at that step), ``loss_scale``,
    ``overflow`` and ``grad_norm`` when the train cell returns them, and user metrics.

    Cost per written step: one device-to-host read of the loss (LossMonitor pays it too), one more per extra
    output the train cell returns, and a ``json.dumps`` plus one ``write``. The lr of a list schedule (or a
    Tensor of lrs) is copied to the host once per ``Model.train`` call and indexed per step for free; a fixed lr
    or a LearningRateSchedule cell needs a device read or a kernel launch, so it is read every ``lr_every``
    steps only and left out of the records in between.

    Args:
        path: file to append to, ``{rank}`` replaced by the rank id (see JsonlWriter).
        every: write a record every ``every`` steps (default 1). Skipped steps read nothing from the device.
        ranks: rank ids that write; default None: every rank writes its own file.
        batch_size: samples per step on this rank, for ``samples_per_s``. Default None: the training dataset's
            ``get_batch_size()``.
        lr_every: read an lr that lives on the device (a fixed lr, a LearningRateSchedule cell) every
            ``lr_every`` steps (default 10). List schedules and lrs the train cell returns are logged every step.
        outputs: names for the positions of a train cell's output tuple, None to skip one, e.g.
            ``("loss", "grad_norm")``. Default None: a scalar is the loss; a tuple is named by its length:
            1 ``(loss,)``, 2 ``(loss, overflow)`` if the second is boolean else ``(loss, grad_norm)``,
            3 ``(loss, overflow, loss_scale)`` (TrainOneStepWithLossScaleCell), 4 adds ``lr``, 5 or more
            ``(loss, overflow, loss_scale, lr, grad_norm)`` (MindFormers' train cells).
        extra: callable taking MindSpore's ``cb_params`` and returning a mapping of more metrics for the record,
            or None (default). If it raises, the record is written without them and the error logged once.

    Attributes:
        writer: the JsonlWriter doing the writing; its ``written`` and ``dropped`` count records.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        every: int = 1,
        ranks: Iterable[int] | None = None,
        batch_size: int | None = None,
        lr_every: int = 10,
        outputs: Sequence[str | None] | None = None,
        extra: Callable[[Any], Mapping[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        if isinstance(lr_every, bool) or not isinstance(lr_every, int) or lr_every < 1:
            raise ValueError(f"lr_every must be a positive int, got {lr_every!r}")
        if outputs is not None:
            for name in outputs:
                if name in RESERVED:
                    raise ValueError(f"output name {name!r} is reserved in mstail records")
        self.writer = JsonlWriter(path, every=every, ranks=ranks, batch_size=batch_size)
        self._batch_size = batch_size
        self._lr_every = lr_every
        self._outputs = None if outputs is None else tuple(outputs)
        self._extra = extra
        self._offset = 0  # global step = offset + cb_params.cur_step_num
        self._last_step = 0
        self._lr_list: list[float] | None = None
        self._lr_device: Any = None  # Parameter or LearningRateSchedule cell
        self._lr_prev: int | None = None
        self._loss_scale_manager: Any = None

    def add_metric(self, name: str, value: Any) -> None:
        """Add ``name`` to every record; see JsonlWriter.add_metric."""
        self.writer.add_metric(name, value)

    def on_train_begin(self, run_context: Any) -> None:
        """Find where the global step, the lr and the loss scale come from, once per ``Model.train`` call, and
        write the ``start`` event with the step training will end at."""
        cb = run_context.original_args()
        try:
            self._begin(cb)
        except Exception:  # noqa: BLE001 - said; monitoring must never stop training
            self.writer._report("begin", "could not inspect the training setup", exc_info=True)
        self.writer.event("start", self._offset + cb.cur_step_num, "training started", _total_steps(cb, self._offset))

    def on_train_step_end(self, run_context: Any) -> None:
        """Write the record of the step that just ended (unless ``every`` skips it)."""
        try:
            self._step_end(run_context.original_args())
        except Exception:  # noqa: BLE001 - monitoring must never stop training
            self.writer.dropped += 1
            self.writer._report("step", "a record could not be built", exc_info=True)

    def on_train_end(self, run_context: Any) -> None:
        """Write the ``end`` event and close the file; a later ``Model.train`` call reopens it."""
        self.writer.event("end", self._last_step, "training ended")
        self.writer.close()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """MindSpore leaves every callback's context when ``Model.train`` ends, also by an exception (which
        ``on_train_end`` never sees): then an ``error`` event with the exception line, and an ``end`` event
        saying training ended by it. The exception goes on as it was."""
        if exc_type is not None and not issubclass(exc_type, GeneratorExit):
            what = "".join(traceback.format_exception_only(exc_type, exc)).strip().splitlines()[-1]
            self.writer.event("error", self._last_step, f"Traceback (most recent call last):\n{what}")
            self.writer.event("end", self._last_step, f"training ended by an exception ({exc_type.__name__})")
            self.writer.close()

    def _begin(self, cb: Any) -> None:
        optimizer = cb.get("optimizer")
        if optimizer is None:
            optimizer = _find_optimizer(cb.get("train_network"))
        # Model.train restarts cur_step_num at every call; the optimizer's global_step keeps counting (and is
        # restored with a checkpoint). One device read per Model.train call, not per step.
        done = self._last_step
        if optimizer is not None:
            done = int(optimizer.global_step.item())
        self._offset = done - cb.cur_step_num
        self.writer.reset_clock(done)
        self._lr_list, self._lr_device = _lr_sources(optimizer)
        self._lr_prev = None
        self.writer.batch_size = self._batch_size
        if self._batch_size is None and cb.get("train_dataset") is not None:
            self.writer.batch_size = cb.train_dataset.get_batch_size()
        self._loss_scale_manager = cb.get("loss_scale_mananger")  # sic: MindSpore's spelling

    def _step_end(self, cb: Any) -> None:
        step = self._offset + cb.cur_step_num
        self._last_step = step
        if not self.writer._due(step):
            return
        metrics = self._named_outputs(cb.net_outputs)
        if "lr" not in metrics:
            lr = self._lr(step)
            if lr is not None:
                metrics["lr"] = lr
        if "loss_scale" not in metrics and self._loss_scale_manager is not None:
            # A host-side float; Model updates it on the host when the manager drops overflowed updates.
            metrics["loss_scale"] = self._loss_scale_manager.get_loss_scale()
        if self._extra is not None:
            try:
                metrics.update(self._extra(cb))
            except Exception:  # noqa: BLE001 - a user's extra() may raise anything: said, left out
                self.writer._report("extra", "extra() raised; its metrics are left out", exc_info=True)
        self.writer._write(step, cb.cur_epoch_num, metrics)

    def _named_outputs(self, outputs: Any) -> dict[str, Any]:
        if not isinstance(outputs, (tuple, list)):
            return {"loss": outputs}
        names = self._outputs
        if names is None:
            if len(outputs) == 2:
                second = outputs[1]
                is_flag = isinstance(second, Tensor) and second.dtype == mstype.bool_
                names = ("loss", "overflow" if is_flag else "grad_norm")
            else:
                names = _AUTO_OUTPUTS.get(min(len(outputs), 5), ())
        return {name: value for name, value in zip(names, outputs) if name is not None}

    def _lr(self, step: int) -> int | float | str | None:
        """The lr used at ``step`` (1-based global step), or None when it is not read at this step."""
        if self._lr_list is not None:
            # The optimizer gathered lr[global_step] before incrementing it, so step k used entry k - 1.
            index = step - 1
            return self._lr_list[index] if 0 <= index < len(self._lr_list) else None
        if self._lr_device is None:
            return None
        prev, self._lr_prev = self._lr_prev, step
        if not _crossed(prev, step, self._lr_every):
            return None
        if isinstance(self._lr_device, Parameter):
            return _number(self._lr_device)
        return _number(self._lr_device(Tensor([step - 1], mstype.int32)))


def _total_steps(cb: Any, offset: int) -> int | None:
    """The global step a ``Model.train`` call ends at (its epochs x steps per epoch after where it starts), or None
    when the dataset does not say how long an epoch is."""
    try:
        total = offset + int(cb.cur_step_num) + int(cb.epoch_num) * int(cb.batch_num)
    except (AttributeError, TypeError, ValueError):
        return None
    return total if total > 0 and int(cb.batch_num) > 0 else None


def _find_optimizer(network: Any) -> nn.Optimizer | None:
    """The optimizer inside a custom train cell handed to Model without ``optimizer=``."""
    if network is None:
        return None
    for _, cell in network.cells_and_names():
        if isinstance(cell, nn.Optimizer):
            return cell
    return None


def _lr_sources(optimizer: nn.Optimizer | None) -> tuple[list[float] | None, Any]:
    """(host copy of a list schedule, or None; the Parameter or schedule cell to read otherwise, or None).

    With parameter groups, the first group's lr is the one logged.
    """
    if optimizer is None:
        return None, None
    lr = optimizer.learning_rate
    if optimizer.is_group_lr:
        lr = lr[0]
    if isinstance(lr, _IteratorLearningRate):
        return lr.learning_rate.asnumpy().tolist(), None
    if isinstance(lr, _ConvertToCell):
        lr = lr.learning_rate
    if isinstance(lr, (Parameter, nn.Cell)):
        return None, lr
    return None, None
