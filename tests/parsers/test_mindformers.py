"""The built-in `mindformers` format (MFLossMonitor, graph mode, <= v0.6 up to r2.0) against lines built from the
exact format strings in shared/research/log-formats.md, in every logger envelope; plus the sample logs."""

from __future__ import annotations

import datetime
import math
import time
from typing import Callable, List, Optional

import pytest

from mstail.parsers import Item, SourceParser

from .support import FORMATS, INF, NAN, READ_TIME, SAMPLES, assert_metrics, metrics, parse, same


# -- format strings, verbatim from MindFormers (log-formats.md section 1) -----------------------------------------
# r0.7 ... v1.2 (v1.3 appends GLOBAL_NORM; v1.4 ... v1.6 append THROUGHPUT or nothing)
SINK = "{ Epoch:[%3d/%3d], step:[%5d/%5d], loss: %5.3f, per_step_time: %dms, lr: %s, overflow cond: %s, loss_scale: %s"
SINK_NO_LR = "{ Epoch:[%3d/%3d], step:[%5d/%5d], loss: %5.3f, per_step_time: %dms, overflow cond: %s, loss_scale: %s"
NONSINK = (
    "{ Epoch:[%3d/%3d], step:[%5d/%5d], loss:[%5.3f/%5.3f], per_step_time: %dms, lr: %s, overflow cond: %s, "
    "loss_scale: %s"
)
GLOBAL_NORM = ", global_norm: %s"
THROUGHPUT = ", train_throughput_per_npu: %.3fT"
# v1.7.0-beta2 ... v1.7.0 (pieces; "lm loss:" with a space in the betas, "lm_loss:" from v1.7.0)
HEAD_V17 = "{ Epoch:[%3d/%3d], step:[%5d/%5d], "
LOSS_SINK_V17 = "loss: %5.6f, "
LOSS_NONSINK_V17 = "loss:[%5.6f/%5.6f], "
LM_BETA = "lm loss: %5.6f, "
LM = "lm_loss: %5.6f, "
LB = "load_balancing_loss: %5.6f, "
MTP = "mtp_loss: %5.6f, "
TAIL_V17 = "per_step_time: %dms, lr: %s, overflow cond: %s, loss_scale: %s, global_norm: %s%s"
# <= v0.6
V06 = "Epoch:[%3d/%3d], step:[%5d/%5d], loss:[%5.3f/%5.3f], time:%5.3f ms, lr:%s, overflow cond: %s, loss_scale: %s"
V06_NO_LR = "Epoch:[%3d/%3d], step:[%5d/%5d], loss:[%5.3f/%5.3f], time:%5.3f ms, overflow cond: %s, loss_scale: %s"
V06_EPOCH_SUMMARY = "Per sink_size step time: %5.3f ms, per step time: %5.3f ms, avg loss: %5.3f"
# progress line: v0.8/v1.0.0 "%.2f", v1.0.1+ "%.5f"
PROGRESS = "  %4.1f%% %s %.5f samples/s/p  %s }"
PROGRESS_V08 = "  %4.1f%% %s %.2f samples/s/p  %s }"
# TrainingStateMonitor (v1.5-v1.7 "%.4f", v1.8+ "%s"): starts with "Epoch:[" but is not a step
TSM_V15 = "Epoch:[%3d/%3d], step:[%5d/%5d] %s: %.4f"
TSM_V18 = "Epoch:[%3d/%3d], step:[%5d/%5d] %s: %s"


def v18_line(
    epoch: int, epochs: int, step: int, spe: int, loss: float, *, avg: Optional[float] = None,
    lm: Optional[float] = None, lb: Optional[float] = None, mtp: Optional[float] = None,
    indexer: Optional[float] = None, ms: int = 14103, lr: str = "0.0002178", gn: str = "[1.6002668]",
    tp: Optional[float] = 134.005,
) -> str:
    """v1.8.0+ (f-strings) and v1.9/r2.0 (indexer_loss), assembled as MFLossMonitor.print_output_info does."""
    loss_info = f"loss: {loss:5.6f}, " if avg is None else f"loss:[{loss:5.6f}/{avg:5.6f}], "
    separate = ""
    if lm is not None:
        separate += f"lm_loss: {lm:5.6f}, "
    if lb is not None:
        separate += f"load_balancing_loss: {lb:5.6f}, "
    if mtp is not None:
        separate += f"mtp_loss: {mtp:5.6f}, "
    if indexer is not None:
        separate += f"indexer_loss: {indexer:5.6f}, "
    throughput = f", train_throughput_per_npu: {tp:.3f}T" if tp is not None else ""
    return (
        "{ Epoch:[%3d/%3d], step:[%5d/%5d], " % (epoch, epochs, step, spe) + loss_info + separate
        + "per_step_time: %dms, lr: %s, overflow cond: %s, loss_scale: %s, global_norm: %s%s"
        % (ms, lr, "False", "1.0", gn, throughput)
    )


def bar(percent: float) -> str:
    return ("|%%-%ds|" % 50) % (int(50 * percent / 100) * "\u2588")


def progress(percent: float, samples: float, remain_s: int, fmt: str = PROGRESS) -> str:
    return fmt % (percent, bar(percent), samples, datetime.timedelta(seconds=remain_s))


# -- logger envelopes (log-formats.md section 2.1 and 3.4) ---------------------------------------------------------
TS = "2024-04-02 09:13:51,110"


def local_ts(text: str) -> float:
    """`YYYY-MM-DD HH:MM:SS,mmm` read as local time, as Python's logging wrote it."""
    parsed = datetime.datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f")
    return time.mktime(parsed.timetuple()) + parsed.microsecond / 1e6


# The logger format strings (mindformers/tools/logger.py), filled in as logging does.
FILE_FORMAT = "[%(levelname)s] %(asctime)s [%(filepath)s:%(lineno)d] %(funcName)s: %(message)s"  # v1.0+
FILE_FORMAT_V06 = "[%(levelname)s] %(asctime)s [%(pathname)s:%(lineno)d] %(funcName)s: %(message)s"  # <= r0.8
STDOUT_V06 = "%(asctime)s - %(name)s - %(levelname)s - %(message)s"  # <= v0.6
STDOUT_R07 = "%(asctime)s - %(name)s[%(filename)s:%(lineno)d] - %(levelname)s - %(message)s"  # r0.7, r0.8
STDOUT_V10 = "%(asctime)s - %(name)s[%(filepath)s:%(lineno)d] - %(levelname)s - %(message)s"  # v1.0+
CALLER = {
    "filepath": "mindformers/core/callback/callback.py",
    "pathname": "/home/user/mindformers/mindformers/core/callback.py",
    "filename": "callback.py",
    "lineno": 314,
    "funcName": "print_output_info",
}


def envelope(fmt: str, name: str = "mindformers") -> Callable[..., str]:
    def wrap(message: str, ts: str = TS, lv: str = "INFO") -> str:
        return fmt % {**CALLER, "name": name, "asctime": ts, "levelname": lv, "message": message}

    return wrap


PREFIXES = {
    "file_v10": envelope(FILE_FORMAT),
    "file_v06": envelope(FILE_FORMAT_V06),
    "stdout_v06": envelope(STDOUT_V06),
    "stdout_r07": envelope(STDOUT_R07),
    "stdout_v10": envelope(STDOUT_V10),
    # v1.6+: the logger name embeds the log path (absolute with msrun_launcher.sh) ...
    "stdout_v16": envelope(STDOUT_V10, name="mindformers/home/ma-user/mindformers/output/log"),
    # ... relative in v1.6.0 without LOG_MF_PATH ...
    "stdout_v16_relative": envelope(STDOUT_V10, name="mindformers./output/log"),
    # ... and it may hold a space.
    "stdout_v16_space": envelope(STDOUT_V10, name="mindformers/home/user/my runs/output/log"),
}



# -- the step-line variants ---------------------------------------------------------------------------------------
# (id, message, global step, epoch, exact metrics). Epoch 2 of 3 with 400 steps per epoch unless noted.
VARIANTS = [
    (
        "r0.7-v1.2 sink",
        SINK % (2, 3, 5, 400, 10.461, 95873, "1e-05", "False", "65536.0"),
        405, 2,
        {"loss": 10.461, "step_time_ms": 95873, "lr": 1e-05, "overflow": 0, "loss_scale": 65536.0},
    ),
    (
        "r0.7-v1.2 sink, no lr",
        SINK_NO_LR % (2, 3, 5, 400, 2.312, 512, "False", "65536.0"),
        405, 2,
        {"loss": 2.312, "step_time_ms": 512, "overflow": 0, "loss_scale": 65536.0},
    ),
    (
        "r0.7-v1.2 non-sink",
        NONSINK % (1, 3, 7, 400, 4.849680, 4.872238, 43, "0.0005", "False", "65536.0"),
        7, 1,
        {"loss": 4.85, "loss_avg": 4.872, "step_time_ms": 43, "lr": 0.0005, "overflow": 0, "loss_scale": 65536.0},
    ),
    (
        "v1.3 sink global_norm",
        SINK % (2, 3, 5, 400, 10.461, 512, "5.4518532e-05", "False", "65536.0") + GLOBAL_NORM % "[1.4372426]",
        405, 2,
        {"loss": 10.461, "step_time_ms": 512, "lr": 5.4518532e-05, "overflow": 0, "loss_scale": 65536.0,
         "grad_norm": 1.4372426},
    ),
    (
        "v1.3 global_norm None (clipping off), loss_scale unavailable",
        SINK % (2, 3, 5, 400, 10.461, 512, "0.000105", "False", "unavailable") + GLOBAL_NORM % "None",
        405, 2,
        {"loss": 10.461, "step_time_ms": 512, "lr": 0.000105, "overflow": 0, "loss_scale": None, "grad_norm": None},
    ),
    (
        "v1.4-v1.6 sink throughput",
        SINK % (2, 3, 5, 400, 7.766, 14103, "0.0002685324", "False", "1.0") + GLOBAL_NORM % "[1.6002668]"
        + THROUGHPUT % 134.005,
        405, 2,
        {"loss": 7.766, "step_time_ms": 14103, "lr": 0.0002685324, "overflow": 0, "loss_scale": 1.0,
         "grad_norm": 1.6002668, "throughput_tflops": 134.005},
    ),
    (
        "v1.4-v1.6 non-sink, flops not computable (empty suffix)",
        NONSINK % (2, 3, 5, 400, 3.25, 3.5, 512, "1.5e-05", "True", "32768.0") + GLOBAL_NORM % "[2.0170105]" + "",
        405, 2,
        {"loss": 3.25, "loss_avg": 3.5, "step_time_ms": 512, "lr": 1.5e-05, "overflow": 1, "loss_scale": 32768.0,
         "grad_norm": 2.0170105},
    ),
    (
        "v1.7.0-beta2 'lm loss:' with a space, MoE + MTP, sink",
        HEAD_V17 % (2, 3, 5, 400) + LOSS_SINK_V17 % 7.765897 + LM_BETA % 5.845463 + LB % 0.012553 + MTP % 6.279163
        + TAIL_V17 % (14103, "0.0002178", "False", "1.0", "[1.6002668]", THROUGHPUT % 134.005),
        405, 2,
        {"loss": 7.765897, "lm_loss": 5.845463, "load_balancing_loss": 0.012553, "mtp_loss": 6.279163,
         "step_time_ms": 14103, "lr": 0.0002178, "overflow": 0, "loss_scale": 1.0, "grad_norm": 1.6002668,
         "throughput_tflops": 134.005},
    ),
    (
        "v1.7.0 'lm_loss:', MTP only, non-sink",
        HEAD_V17 % (2, 3, 5, 400) + LOSS_NONSINK_V17 % (7.765897, 7.9) + LM % 5.845463 + MTP % 6.279163
        + TAIL_V17 % (14103, "0.0002178", "False", "1.0", "[1.6002668]", ""),
        405, 2,
        {"loss": 7.765897, "loss_avg": 7.9, "lm_loss": 5.845463, "mtp_loss": 6.279163, "step_time_ms": 14103,
         "lr": 0.0002178, "overflow": 0, "loss_scale": 1.0, "grad_norm": 1.6002668},
    ),
    (
        "v1.8 f-strings, non-sink, MoE",
        v18_line(2, 3, 5, 400, 4.5, avg=4.75, lm=4.4, lb=0.1),
        405, 2,
        {"loss": 4.5, "loss_avg": 4.75, "lm_loss": 4.4, "load_balancing_loss": 0.1, "step_time_ms": 14103,
         "lr": 0.0002178, "overflow": 0, "loss_scale": 1.0, "grad_norm": 1.6002668, "throughput_tflops": 134.005},
    ),
    (
        "v1.9/r2.0 indexer_loss (MoE + MTP + DSA), sink",
        v18_line(1, 1, 100, 1000, 7.765897, lm=5.845463, lb=0.012553, mtp=6.279163, indexer=0.241317),
        100, 1,
        {"loss": 7.765897, "lm_loss": 5.845463, "load_balancing_loss": 0.012553, "mtp_loss": 6.279163,
         "indexer_loss": 0.241317, "step_time_ms": 14103, "lr": 0.0002178, "overflow": 0, "loss_scale": 1.0,
         "grad_norm": 1.6002668, "throughput_tflops": 134.005},
    ),
    (
        "unreleased r1.7.0-beta1 aux_loss, and a separate loss no release prints yet (kept under its name)",
        HEAD_V17 % (2, 3, 5, 400) + "loss: %5.3f, " % 7.766 + "lm_loss: %5.3f, " % 5.845 + "aux_loss: %5.3f, " % 0.013
        + "z_loss: %5.3f, " % 0.5 + TAIL_V17 % (512, "0.0002178", "False", "1.0", "[1.6002668]", ""),
        405, 2,
        {"loss": 7.766, "lm_loss": 5.845, "aux_loss": 0.013, "z_loss": 0.5, "step_time_ms": 512, "lr": 0.0002178,
         "overflow": 0, "loss_scale": 1.0, "grad_norm": 1.6002668},
    ),
    (
        "<= v0.6",
        V06 % (2, 3, 5, 400, 2.345, 2.401, 512.345, "0.0001", "False", "1.0"),
        405, 2,
        {"loss": 2.345, "loss_avg": 2.401, "step_time_ms": 512.345, "lr": 0.0001, "overflow": 0, "loss_scale": 1.0},
    ),
    (
        "<= v0.6, no lr",
        V06_NO_LR % (2, 3, 5, 400, 2.345, 2.401, 512.345, "False", "1.0"),
        405, 2,
        {"loss": 2.345, "loss_avg": 2.401, "step_time_ms": 512.345, "overflow": 0, "loss_scale": 1.0},
    ),
    (
        "wide counters (>999 epochs, >99999 steps)",
        SINK % (1200, 2000, 123456, 200000, 1.5, 512, "1e-05", "False", "1.0"),
        1199 * 200000 + 123456, 1200,
        {"loss": 1.5, "step_time_ms": 512, "lr": 1e-05, "overflow": 0, "loss_scale": 1.0},
    ),
]


@pytest.mark.parametrize("prefix", sorted(PREFIXES))
@pytest.mark.parametrize("message,step,epoch,expected", [v[1:] for v in VARIANTS], ids=[v[0] for v in VARIANTS])
def test_step_line_variants(prefix: str, message: str, step: int, epoch: int, expected: dict) -> None:
    records, events, parser = parse([PREFIXES[prefix](message)])
    assert parser.format is not None and parser.format.name == "mindformers"
    assert events == []
    assert len(records) == 1
    record = records[0]
    assert record["step"] == step and record["epoch"] == epoch
    assert record["time"] == pytest.approx(local_ts(TS), abs=1e-6)
    assert record["line"] == 1 and record["segment"] == 0
    assert_metrics(record, expected)
    assert parser.counts["field_errors"] == 0


@pytest.mark.parametrize("message,step,epoch,expected", [v[1:] for v in VARIANTS], ids=[v[0] for v in VARIANTS])
def test_step_line_without_prefix_uses_read_time(message: str, step: int, epoch: int, expected: dict) -> None:
    records, _, _ = parse([message], fmt="mindformers")
    assert len(records) == 1
    assert records[0]["step"] == step and records[0]["time"] == READ_TIME
    assert_metrics(records[0], expected)


# -- lr renderings (section 1.3) --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text,value",
    [
        ("0.0", 0.0), ("1e-05", 1e-05), ("1.5e-05", 1.5e-05), ("0.000105", 0.000105), ("0.0002685324", 0.0002685324),
        ("5.4518532e-05", 5.4518532e-05),  # str() of a 0-d float32
        ("0.", 0.0), ("1.e-05", 1e-05), ("0.00012346", 0.00012346),  # np.array2string (LearningRateSchedule)
    ],
)
def test_lr_renderings(text: str, value: float) -> None:
    line = PREFIXES["file_v10"](SINK % (1, 1, 3, 10, 2.0, 512, text, "False", "1.0") + GLOBAL_NORM % "[1.0]")
    records, _, _ = parse([line])
    assert len(records) == 1
    assert same(records[0]["lr"], value)


def test_missing_lr_is_absent_not_null() -> None:
    records, _, _ = parse([PREFIXES["file_v10"](SINK_NO_LR % (1, 1, 3, 10, 2.0, 512, "False", "1.0"))])
    assert "lr" not in records[0]


# -- non-finite values (padded by %5.3f / 5.6f) -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "message,expected",
    [
        (SINK % (1, 2, 3, 10, NAN, 512, "1e-05", "True", "65536.0") + GLOBAL_NORM % "[nan]",
         {"loss": NAN, "grad_norm": NAN, "overflow": 1}),
        (NONSINK % (1, 2, 3, 10, NAN, NAN, 512, "1e-05", "False", "65536.0"), {"loss": NAN, "loss_avg": NAN}),
        (NONSINK % (1, 2, 3, 10, 2.5, NAN, 512, "1e-05", "False", "65536.0"), {"loss": 2.5, "loss_avg": NAN}),
        (NONSINK % (1, 2, 3, 10, INF, -INF, 512, "1e-05", "False", "65536.0"), {"loss": INF, "loss_avg": -INF}),
        (SINK % (1, 2, 3, 10, -INF, 512, "1e-05", "False", "65536.0") + GLOBAL_NORM % "[inf]",
         {"loss": -INF, "grad_norm": INF}),
        (v18_line(1, 2, 3, 10, NAN, avg=NAN, lm=NAN, mtp=NAN, gn="[nan]"),
         {"loss": NAN, "loss_avg": NAN, "lm_loss": NAN, "mtp_loss": NAN, "grad_norm": NAN}),
        (V06 % (1, 2, 3, 10, NAN, NAN, 512.0, "0.0001", "False", "1.0"), {"loss": NAN, "loss_avg": NAN}),
    ],
    ids=["sink nan", "non-sink nan/nan", "non-sink mean nan", "inf/-inf", "sink -inf", "v1.8 nan", "v0.6 nan"],
)
def test_non_finite_values_are_kept(message: str, expected: dict) -> None:
    assert "  nan" in message or "  inf" in message or " -inf" in message  # printed padded, as MindFormers does
    records, _, parser = parse([PREFIXES["stdout_v16"](message)])
    assert len(records) == 1, "a NaN step must never be dropped"
    for key, value in expected.items():
        assert same(records[0][key], value), (key, records[0][key])
    assert parser.counts["field_errors"] == 0


def test_overflow_and_global_norm_renderings() -> None:
    lines = [
        PREFIXES["file_v10"](SINK % (1, 1, 1, 10, 2.0, 512, "1e-05", "True", "65536.0") + GLOBAL_NORM % "[ 1.5]"),
        PREFIXES["file_v10"](SINK % (1, 1, 2, 10, 2.0, 512, "1e-05", "[ True]", "32768.0") + GLOBAL_NORM % "[1.2 ]"),
        PREFIXES["file_v10"](SINK % (1, 1, 3, 10, 2.0, 512, "1e-05", "[False]", "32768.0") + GLOBAL_NORM % "None"),
    ]
    records, _, _ = parse(lines)
    assert [(r["overflow"], r["grad_norm"], r["loss_scale"]) for r in records] == [
        (1, 1.5, 65536.0), (1, 1.2, 32768.0), (0, None, 32768.0)
    ]


# -- fields the format does not name ---------------------------------------------------------------------------------
# A step line as MindFormers v1.4+ prints it, with `name: number` / `name=number` parts no release prints (a fork's
# callback, a later release), in each place one can stand: the step is kept whole, those parts become metrics.
KNOWN = {"loss": 4.99, "loss_avg": 4.99, "step_time_ms": 31, "lr": 0.0005, "overflow": 0, "loss_scale": 65536.0,
         "grad_norm": 2.0170105, "throughput_tflops": 0.0}


@pytest.mark.parametrize("message,extra", [
    ("{ Epoch:[  1/  1], step:[    1/  100], loss:[4.990000/4.990000], per_step_time: 31ms, lr: 0.0005, "
     "overflow cond: False, loss_scale: 65536.0, global_norm: [2.0170105], train_throughput_per_npu: 0.000T, "
     "tokens_per_s: 1234.5", {"tokens_per_s": 1234.5}),
    ("{ Epoch:[  1/  1], step:[    1/  100], loss:[4.990000/4.990000], per_step_time: 31ms, lr: 0.0005, "
     "overflow cond: False, loss_scale: 65536.0, global_norm: [2.0170105], train_throughput_per_npu: 0.000T, "
     "my_metric: 1.5, other=2", {"my_metric": 1.5, "other": 2.0}),
    ("{ Epoch:[  1/  1], step:[    1/  100], loss:[4.990000/4.990000], per_step_time: 31ms, lr: 0.0005, "
     "tokens_per_s: 1234.5, overflow cond: False, loss_scale: 65536.0, global_norm: [2.0170105], "
     "train_throughput_per_npu: 0.000T", {"tokens_per_s": 1234.5}),
    ("{ Epoch:[  1/  1], step:[    1/  100], loss:[4.990000/4.990000], my_loss=0.25, per_step_time: 31ms, "
     "lr: 0.0005, overflow cond: False, loss_scale: 65536.0, global_norm: [2.0170105], "
     "train_throughput_per_npu: 0.000T", {"my_loss": 0.25}),
    # a field this format names, printed after one it does not: read under its own metric name still
    ("{ Epoch:[  1/  1], step:[    1/  100], loss:[4.990000/4.990000], per_step_time: 31ms, lr: 0.0005, "
     "overflow cond: False, loss_scale: 65536.0, tokens_per_s: 1234.5, global_norm: [2.0170105], "
     "train_throughput_per_npu: 0.000T", {"tokens_per_s": 1234.5}),
])
def test_a_step_line_with_fields_the_format_does_not_name_is_kept(message: str, extra: dict) -> None:
    line = PREFIXES["file_v10"](message)
    assert "mindformers" in line  # not the generic reader's lines: the format's own
    records, _, parser = parse([line])
    assert len(records) == 1 and parser.state.format == "mindformers"
    assert_metrics(records[0], {**KNOWN, **extra})
    assert records[0]["step"] == 1 and records[0]["time"] == local_ts(TS)
    assert parser.counts["unmatched_metric_lines"] == 0 and parser.counts["field_errors"] == 0


def test_a_part_of_a_step_line_it_cannot_read_is_counted_and_the_step_kept() -> None:
    line = PREFIXES["file_v10"](
        "{ Epoch:[  1/  1], step:[    1/  100], loss:[4.990000/4.990000], per_step_time: 31ms, lr: 0.0005, "
        "overflow cond: False, loss_scale: 65536.0, global_norm: [2.0170105], train_throughput_per_npu: 0.000T, "
        "data_time: 1.5 ms, note: warm")
    records, _, parser = parse([line])
    assert_metrics(records[0], KNOWN)  # "1.5 ms" is no number as printed: counted, not guessed; "warm" no metric
    assert parser.counts["unmatched_metric_lines"] == 1 and parser.counts["field_errors"] == 0


@pytest.mark.parametrize("extra_from", [5, 0])  # half the steps carry a field the format does not name, or all
def test_a_log_whose_step_lines_carry_extra_fields_is_read_as_mindformers(extra_from: int) -> None:
    lines = [PREFIXES["file_v10"](".........Starting Training Model..........")]
    for step in range(1, 11):
        message = NONSINK % (1, 1, step, 100, 4.99, 4.99, 31, "0.0005", "False", "65536.0") \
            + GLOBAL_NORM % "[2.0170105]" + THROUGHPUT % 0.0
        lines += [PREFIXES["file_v10"](message + (", my_metric: 1.5, other=2" if step > extra_from else "")),
                  PREFIXES["file_v10"](progress(step, 56.59756, 60))]
    records, _, parser = parse(lines)
    assert parser.state.format == "mindformers" and [r["step"] for r in records] == list(range(1, 11))
    for record in records:
        extra = {"my_metric": 1.5, "other": 2.0} if record["step"] > extra_from else {}
        assert_metrics(record, {**KNOWN, "samples_per_s": 56.59756, **extra})
        assert record["time"] == local_ts(TS)
    assert parser.counts["unmatched_metric_lines"] == 0 and parser.counts["field_errors"] == 0


# -- global step, progress line, segments ------------------------------------------------------------------------------
def test_global_step_across_epochs_and_total_steps() -> None:
    lines = []
    for epoch in (1, 2, 3):
        for step in (24, 25):
            lines.append(PREFIXES["file_v10"](NONSINK % (epoch, 3, step, 25, 2.0, 2.0, 40, "1e-05", "False", "1.0")))
    records, _, parser = parse(lines)
    assert [(r["epoch"], r["step"]) for r in records] == [(1, 24), (1, 25), (2, 49), (2, 50), (3, 74), (3, 75)]
    assert parser.meta["total_steps"] == 75
    assert {r["segment"] for r in records} == {0}


@pytest.mark.parametrize(
    "progress_line,samples",
    [
        (progress(25.0, 3.84644, 1247), 3.84644),
        (progress(2.0, 0.2359, 415), 0.2359),
        (progress(100.0, 55.29917, 0), 55.29917),
        (progress(12.5, 1.5, 4 * 86400 + 18 * 3600 + 17 * 60 + 45), 1.5),  # "4 days, 18:17:45"
        (progress(50.0, 1.25, 86400 + 7384), 1.25),  # "1 day, 2:03:04"
        (progress(6.0, 45.77, 2, fmt=PROGRESS_V08), 45.77),  # v0.8 / v1.0.0: %.2f
    ],
)
def test_progress_line_merges_into_its_step(progress_line: str, samples: float) -> None:
    for name in ("file_v10", "stdout_v16", "stdout_v06"):
        lines = [
            PREFIXES[name](SINK % (1, 2, 5, 20, 2.5, 512, "1e-05", "False", "1.0")),
            PREFIXES[name](progress_line, ts="2024-04-02 09:13:51,112"),
        ]
        records, events, _ = parse(lines)
        assert len(records) == 1 and events == []
        assert records[0]["samples_per_s"] == samples
        assert records[0]["line"] == 1 and records[0]["time"] == pytest.approx(local_ts(TS))  # the step line's


def test_interleaved_mindspore_lines_do_not_break_the_merge() -> None:
    """msrun worker logs mix MindSpore Python and C++ logger lines (other threads) between the two records."""
    lines = [
        PREFIXES["stdout_v16"](v18_line(1, 1, 3, 10, 2.5, avg=2.6)),
        "[WARNING] DEVICE(56203,ffffa4786be0,python):2026-07-14-06:49:02.340.398 [mindspore/ccsrc/x/file.cc:48] "
        "FuncName] Reserved memory size is less than recommend size",
        "[WARNING] ME(88317:281473680449568,MainProcess):2026-01-20-03:15:44.908.089 [mindspore/context.py:1338] "
        "For 'context.set_context', the parameter 'ascend_config' will be deprecated",
        "NET_OUTPUTS tuple 5",
        PREFIXES["stdout_v16"](progress(30.0, 7.5, 60)),
    ]
    records, events, parser = parse(lines)
    assert len(records) == 1 and events == []
    assert records[0]["samples_per_s"] == 7.5 and records[0]["loss_avg"] == 2.6


def test_step_without_progress_line_is_still_emitted() -> None:
    """r0.7 printed no progress line: the next step line (or the end of input) releases a held record."""
    lines = [PREFIXES["file_v10"](SINK % (1, 1, s, 10, 2.0 - s / 10, 512, "1e-05", "False", "1.0")) for s in (1, 2, 3)]
    records, _, _ = parse(lines)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert [r["loss"] for r in records] == [1.9, 1.8, 1.7]
    assert all("samples_per_s" not in r for r in records)


def test_a_step_is_emitted_at_its_line_and_its_progress_line_amends_it() -> None:
    parser = SourceParser(FORMATS, grace_s=0.5)
    step = PREFIXES["file_v10"](SINK % (1, 1, 1, 10, 2.0, 512, "1e-05", "False", "1.0"))
    emitted = parser.feed(step, 1, 100.0)
    assert [(i.kind, i.data["step"], i.data["loss"]) for i in emitted] == [("record", 1, 2.0)]
    assert not parser.holding and parser.flush(100.6) == []
    # However late the progress line comes, it amends step 1 (never a second record of it).
    late = parser.feed(PREFIXES["file_v10"](progress(10.0, 2.0, 5)), 2, 160.0)
    assert late == [Item("amend", {"step": 1, "segment": 0, "samples_per_s": 2.0})]
    assert parser.counts["amends"] == 1 and parser.emitted == 2
    # A second progress line for the same step adds nothing: the record keeps the value it has.
    assert parser.feed(PREFIXES["file_v10"](progress(10.0, 3.0, 5)), 3, 161.0) == []


def test_step_going_backwards_opens_a_new_segment() -> None:
    lines = [PREFIXES["file_v10"](SINK % (1, 1, s, 100, 2.0, 512, "1e-05", "False", "1.0")) for s in (1, 2, 3)]
    lines.append(PREFIXES["file_v10"]("initial step: 1"))
    lines += [PREFIXES["file_v10"](SINK % (1, 1, s, 100, 2.0, 512, "1e-05", "False", "1.0")) for s in (2, 3, 4)]
    records, events, _ = parse(lines)
    assert [(r["step"], r["segment"]) for r in records] == [(1, 0), (2, 0), (3, 0), (2, 1), (3, 1), (4, 1)]
    assert [(e["kind"], e["step"]) for e in events] == [("resume", 1)]


# -- lines that start like a step but are not one ----------------------------------------------------------------------
NOT_STEPS = [
    TSM_V15 % (1, 2, 3, 25, "local_norm/model.layers.0.attention.wq.weight", 0.1234),
    TSM_V18 % (1, 2, 3, 25, "local_norm/x", "0.1"),
    TSM_V18 % (1, 2, 3, 25, "micro_local_main_loss", "[2.345]"),
    TSM_V18 % (1, 2, 3, 25, "device_local_loss", "[nan]"),
    TSM_V18 % (1, 2, 3, 25, "max_attention_logit/model.layers.0.attention", "12.5"),
    "embedding_local_norm: 0.5",
    f"default_lr: {1e-4:.6e}, equal to `lr:` above.",
    f"group_0_lr: {1e-4:.6e}, group_0_params: ['model.layers.0.attention.wq.weight', 'model.norm_out.weight']",
    f"group_1_lr: {0.0:.6e}, group_1_params: ['lm_head.weight']",
    "Full model flops is 18087936, Shard model flops is 18087936.",
    "Full model flops calculated: 51814158336000",
    "global_batch_size: 8", "epoch_num: 10", "step_num: 20", "global_step: 20",
    "pipeline stages: 4 > 1, the loss on the last card is valid.",
    "opt_global_step: 25, skip_data_grad_norm_threshold: 10.0, is_skip: [ True]",
    "initial epoch: 1",
    " norm_size: 2",
    V06_EPOCH_SUMMARY % (512.345, 5.123, 2.345),
    "Create train dataset finish, dataset size:25",
    ".........Evaluate Over!.............",
]


@pytest.mark.parametrize("prefix", ["file_v10", "stdout_v16", "stdout_v06"])
def test_lines_that_are_not_steps_make_no_records(prefix: str) -> None:
    step = PREFIXES[prefix](NONSINK % (1, 2, 3, 25, 2.0, 2.0, 40, "1e-05", "False", "1.0"))
    lines = [step] + [PREFIXES[prefix](text) for text in NOT_STEPS]
    records, events, parser = parse(lines)
    assert [r["step"] for r in records] == [3]
    assert_metrics(records[0], {"loss": 2.0, "loss_avg": 2.0, "step_time_ms": 40, "lr": 1e-05, "overflow": 0,
                                "loss_scale": 1.0})
    assert events == []
    # They are known lines, not lines a format misses (TrainingStateMonitor's "micro_local_main_loss: [2.345]").
    assert parser.counts["unmatched_metric_lines"] == 0 and parser.counts["field_errors"] == 0
    # TrainingStateMonitor alone must not lock the format either (a file of only those lines has no records).
    _, _, alone = parse([PREFIXES[prefix](text) for text in NOT_STEPS[:5]])
    assert alone.counts["records"] == 0


# -- events ---------------------------------------------------------------------------------------------------------
FILE = PREFIXES["file_v10"]


def test_events_start_checkpoint_resume_end() -> None:
    lines = [
        FILE("initial epoch: 2", ts="2024-04-02 09:00:00,001"),
        FILE("initial step: 500", ts="2024-04-02 09:00:00,002"),
        FILE(".........Starting Training Model..........", ts="2024-04-02 09:00:01,000"),
        FILE(SINK % (2, 3, 1, 500, 2.0, 512, "1e-05", "False", "1.0"), ts="2024-04-02 09:00:02,000"),
        FILE(progress(40.0, 2.0, 60), ts="2024-04-02 09:00:02,001"),
        FILE("......Saving ckpt......", ts="2024-04-02 09:00:03,000"),
        FILE("global_step: 501", ts="2024-04-02 09:00:03,000"),
        FILE(".........Training Over!.............", ts="2024-04-02 09:00:04,000"),
    ]
    records, events, _ = parse(lines)
    assert [r["step"] for r in records] == [501]
    assert [(e["kind"], e.get("step"), e["line"]) for e in events] == [
        ("resume", 500, 2), ("start", None, 3), ("checkpoint", 501, 6), ("end", 501, 8)
    ]
    assert events[2]["message"] == "......Saving ckpt......"
    assert events[3]["time"] == pytest.approx(local_ts("2024-04-02 09:00:04,000"))
    assert all(set(e) >= {"kind", "time", "line", "message"} for e in events)


TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/home/ma-user/work/mindformers/run_mindformer.py", line 263, in <module>',
    "    main(config_)",
    '  File "/home/ma-user/work/mindformers/mindformers/trainer/trainer.py", line 485, in train',
    "    self.trainer.train(",
    "RuntimeError: Call aclnnMatmul failed, detail:EZ9999: Inner Error!",
    "",
    "----------------------------------------------------",
    "- C++ Call Stack: (For framework developers)",
    "----------------------------------------------------",
    "mindspore/ccsrc/plugin/device/ascend/kernel/opapi/aclnn_kernel_mod.h:212 Launch",
    "",
]


def test_raw_traceback_is_one_error_event_with_its_continuation_lines() -> None:
    step = PREFIXES["stdout_v16"](v18_line(1, 1, 3, 10, 2.5, avg=2.6))
    after = PREFIXES["stdout_v16"](".........Training Over!.............")
    records, events, _ = parse([step] + TRACEBACK + [after])
    assert [r["step"] for r in records] == [3]
    assert [e["kind"] for e in events] == ["error", "end"]
    error = events[0]
    assert error["message"] == "\n".join(TRACEBACK).rstrip()
    assert error["step"] == 3 and error["line"] == 2 and error["time"] == READ_TIME


def test_chained_traceback_is_one_error_event() -> None:
    chained = [
        "Traceback (most recent call last):",
        '  File "train.py", line 10, in step',
        "ValueError: loss is nan, terminate training.",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "train.py", line 20, in <module>',
        "RuntimeError: TREError occurred......",
    ]
    _, events, _ = parse([FILE(SINK % (1, 1, 1, 10, 2.0, 512, "1e-05", "False", "1.0"))] + chained)
    assert len(events) == 1
    assert events[0]["kind"] == "error" and events[0]["message"] == "\n".join(chained)


@pytest.mark.parametrize("level", ["ERROR", "CRITICAL"])
@pytest.mark.parametrize("prefix", sorted(PREFIXES))
def test_error_level_record_is_an_error_event(prefix: str, level: str) -> None:
    lines = [
        PREFIXES[prefix](SINK % (1, 1, 4, 10, 2.0, 512, "1e-05", "False", "1.0")),
        PREFIXES[prefix](progress(40.0, 2.0, 6)),
        PREFIXES[prefix]("Some configs in yaml are useless for train", lv="WARNING"),
        PREFIXES[prefix]("Monitor flush failed at step 4: disk full", ts="2024-04-02 09:13:52,250", lv=level),
        "  detail on an unprefixed continuation line",
        PREFIXES[prefix](SINK % (1, 1, 5, 10, 1.9, 512, "1e-05", "False", "1.0")),
    ]
    records, events, _ = parse(lines)
    assert [r["step"] for r in records] == [4, 5]
    assert len(events) == 1
    event = events[0]
    assert event["kind"] == "error" and event["level"] == level and event["step"] == 4 and event["line"] == 4
    assert event["message"] == "Monitor flush failed at step 4: disk full\n  detail on an unprefixed continuation line"
    assert event["time"] == pytest.approx(local_ts("2024-04-02 09:13:52,250"))


def test_logged_traceback_v10_cloud_monitor() -> None:
    """v1.0-v1.5 log uncaught exceptions as one ERROR record (cloud_monitor.py:43 wrapper) + raw lines."""
    lines = [
        FILE(SINK % (1, 1, 4, 10, NAN, 512, "1e-05", "False", "1.0")),
        FILE(progress(40.0, 2.0, 6)),
        "[ERROR] 2024-04-02 09:13:55,000 [mindformers/tools/cloud_adapter/cloud_monitor.py:43] wrapper: "
        "Traceback (most recent call last):",
        '  File "/home/ma-user/mindformers/mindformers/core/callback/callback.py", line 390, in _check_nan',
        "ValueError: loss is nan, terminate training.",
    ]
    records, events, _ = parse(lines)
    assert len(records) == 1 and math.isnan(records[0]["loss"])
    assert len(events) == 1 and events[0]["kind"] == "error" and events[0]["step"] == 4
    assert events[0]["message"].splitlines() == [
        "Traceback (most recent call last):",
        '  File "/home/ma-user/mindformers/mindformers/core/callback/callback.py", line 390, in _check_nan',
        "ValueError: loss is nan, terminate training.",
    ]
    assert events[0]["time"] == pytest.approx(local_ts("2024-04-02 09:13:55,000"))


def test_mindspore_logger_error_lines_in_a_worker_log() -> None:
    lines = [
        PREFIXES["stdout_v16"](v18_line(1, 1, 3, 10, 2.5, avg=2.6)),
        PREFIXES["stdout_v16"](progress(30.0, 7.5, 60)),
        "[ERROR] RUNTIME_FRAMEWORK(88317,ffffa4786be0,python):2025-11-20-03:16:30.184.012 "
        "[mindspore/ccsrc/runtime/pipeline/async_rqueue.cc:227] WorkerLoop] Run task failed",
        "[ERROR] ME(88317:281473680449568,MainProcess):2025-11-20-03:16:31.431.52 [mindspore/common/api.py:1]"
        " compile failed",
        "[WARNING] ME(88317:281473680449568,MainProcess):2025-11-20-03:16:31.500.0 [mindspore/common/api.py:2] fine",
    ]
    _, events, _ = parse(lines)
    base = time.mktime(datetime.datetime(2025, 11, 20, 3, 16, 30).timetuple())
    assert [(e["kind"], e["level"], e["message"]) for e in events] == [
        ("error", "ERROR", "Run task failed"), ("error", "ERROR", "compile failed")
    ]
    assert events[0]["time"] == pytest.approx(base + 0.184012)
    assert events[1]["time"] == pytest.approx(base + 1.043152)  # ".431.52" is 43152 us, not 431.52 ms


def test_event_between_a_step_and_its_progress_line_keeps_line_order() -> None:
    lines = [
        FILE(SINK % (1, 1, 4, 10, 2.0, 512, "1e-05", "False", "1.0")),
        FILE("something broke", lv="ERROR"),
        FILE(progress(40.0, 2.0, 6)),
    ]
    records, events, _ = parse(lines)
    assert [(r["line"], e["line"]) for r, e in zip(records, events)] == [(1, 2)]
    assert records[0]["samples_per_s"] == 2.0  # the progress line after the event still amends its step


def test_ansi_colour_codes_are_ignored() -> None:
    line = "\x1b[32m" + PREFIXES["stdout_v10"](SINK % (1, 1, 4, 10, 2.0, 512, "1e-05", "False", "1.0")) + "\x1b[0m"
    records, _, _ = parse([line])
    assert records[0]["step"] == 4 and records[0]["loss_scale"] == 1.0


# -- timestamps are local time ---------------------------------------------------------------------------------------
@pytest.fixture
def shanghai_time(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TZ", "Asia/Shanghai")  # UTC+8, no DST
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_timestamps_are_local_time_as_unix_seconds(shanghai_time: None) -> None:
    lines = [
        PREFIXES["file_v10"](SINK % (1, 1, 1, 10, 2.0, 512, "1e-05", "False", "1.0"), ts="2024-04-02 09:13:51,110"),
        PREFIXES["stdout_v16"](SINK % (1, 1, 2, 10, 2.0, 512, "1e-05", "False", "1.0"), ts="2024-04-02 09:13:52,007"),
        "[ERROR] DEVICE(1,ab,python):2024-04-02-09:13:53.000.250 [x.cc:1] F] boom",
    ]
    records, events, _ = parse(lines)
    # 2024-04-02 09:13:51.110 in UTC+8 is 01:13:51.110 UTC.
    utc = datetime.datetime(2024, 4, 2, 1, 13, 51, 110000, tzinfo=datetime.timezone.utc).timestamp()
    assert records[0]["time"] == pytest.approx(utc, abs=1e-6)
    assert records[1]["time"] == pytest.approx(utc + 0.897, abs=1e-6)
    assert events[0]["time"] == pytest.approx(utc + 1.89025, abs=1e-6)  # ".000.250": 0 ms 250 us


# -- the sample logs ----------------------------------------------------------------------------------------------
def read_sample(name: str) -> List[str]:
    return (SAMPLES / name).read_text(encoding="utf-8").splitlines()


def test_sample_v13_sink_info_log() -> None:
    records, events, parser = parse(read_sample("mindformers_v1.3_sink_info.log"))
    assert parser.format is not None and parser.format.name == "mindformers"
    assert [r["step"] for r in records] == list(range(2, 41, 2))
    assert [r["epoch"] for r in records] == [1] * 10 + [2] * 10
    assert {r["segment"] for r in records} == {0}
    assert all(set(metrics(r)) == {"loss", "step_time_ms", "lr", "overflow", "loss_scale", "grad_norm",
                                   "samples_per_s"} for r in records)
    first, nan_step, last = records[0], records[5], records[-1]
    assert_metrics(first, {"loss": 10.986, "step_time_ms": 95873, "lr": 0.0, "overflow": 0, "loss_scale": 65536.0,
                           "grad_norm": 1.3901242, "samples_per_s": 0.01043})
    assert first["time"] == pytest.approx(local_ts("2024-08-12 10:18:15,163"))
    assert nan_step["step"] == 12
    assert_metrics(nan_step, {"loss": NAN, "step_time_ms": 518, "lr": 1e-05, "overflow": 1, "loss_scale": 65536.0,
                              "grad_norm": NAN, "samples_per_s": 1.9305})
    assert records[6]["loss_scale"] == 32768.0  # halved after the overflow
    assert sum(math.isnan(r["loss"]) for r in records) == 1
    assert_metrics(last, {"loss": 3.957, "step_time_ms": 519, "lr": 5e-06, "overflow": 0, "loss_scale": 32768.0,
                          "grad_norm": 0.73790497, "samples_per_s": 1.92678})
    assert last["time"] == pytest.approx(local_ts("2024-08-12 10:18:37,829"))
    assert [(e["kind"], e.get("step")) for e in events] == [
        ("start", None), ("checkpoint", 20), ("checkpoint_saved", 20), ("end", 40)
    ]
    assert events[2]["save_s"] == 2.871 and events[2]["what"] == "ckpt"
    assert parser.counts["field_errors"] == 0 and parser.counts["unmatched_metric_lines"] == 0


def test_sample_v18_nonsink_worker_log() -> None:
    records, events, parser = parse(read_sample("mindformers_v1.8_nonsink_worker_0.log"))
    assert parser.format is not None and parser.format.name == "mindformers"
    assert [r["step"] for r in records] == list(range(1, 21))
    assert [(r["epoch"], r["step"]) for r in records][11:13] == [(1, 12), (2, 13)]
    keys = {"loss", "loss_avg", "lm_loss", "load_balancing_loss", "mtp_loss", "step_time_ms", "lr", "overflow",
            "loss_scale", "grad_norm", "throughput_tflops", "samples_per_s"}
    assert all(set(metrics(r)) == keys for r in records)
    assert_metrics(records[0], {
        "loss": 15.507022, "loss_avg": 15.507022, "lm_loss": 11.729273, "load_balancing_loss": 0.012653,
        "mtp_loss": 12.550322, "step_time_ms": 14103, "lr": 4e-05, "overflow": 0, "loss_scale": 1.0,
        "grad_norm": 1.5607561, "throughput_tflops": 17.293, "samples_per_s": 0.14181,
    })
    assert records[0]["time"] == pytest.approx(local_ts("2025-11-20 03:15:54,221"))
    # step 7: NaN everywhere it is printed; the non-sink running mean stays NaN to the end of epoch 1
    nan_step = records[6]
    for key in ("loss", "loss_avg", "lm_loss", "mtp_loss", "grad_norm"):
        assert math.isnan(nan_step[key]), key
    assert nan_step["load_balancing_loss"] == 0.012653
    assert all(math.isnan(r["loss_avg"]) for r in records[6:12])
    assert not any(math.isnan(r["loss_avg"]) for r in records[12:])
    assert all(not math.isnan(r["loss"]) for i, r in enumerate(records) if i != 6)
    assert records[2]["samples_per_s"] == 1.0923  # the C++ warning between step 3 and its progress line
    assert records[-1]["loss"] == 6.276156 and records[-1]["loss_avg"] == 7.281318
    assert [e["kind"] for e in events] == ["start", "error"]
    error = events[1]
    assert error["level"] == "ERROR" and error["step"] == 20
    lines = error["message"].splitlines()
    assert lines[0] == "Run task failed, error msg:Call aclnnMatmul failed, detail:EZ9999: Inner Error!"
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "mindspore/ccsrc/plugin/device/ascend/kernel/opapi/aclnn_kernel_mod.h:212 Launch"
    assert parser.counts["field_errors"] == 0
    assert parser.counts["unmatched_metric_lines"] == 0  # TrainingStateMonitor / grouped-lr lines are known lines
