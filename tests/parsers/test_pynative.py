"""The built-in `mindformers_pynative` format (MindFormers PyNative trainer, `LossCallback`, r1.9 / r2.0 / master)
against lines built from the exact format strings in shared/research/log-formats.md section 5, in both MindFormers
logger envelopes; plus its events, the lines it deliberately ignores, and the sample logs."""

from __future__ import annotations

import math
from typing import List, Optional, Sequence

import pytest

from .support import NAN, READ_TIME, SAMPLES, assert_metrics, parse
from .test_mindformers import PREFIXES, TS, local_ts

NA_LOSS = "loss: N/A (non-last PP stage, refer to last stage for real loss)"


def pynative_line(
    step: int, max_steps: int, loss: Optional[float], step_time: int, *, version: str = "master",
    consumed: object = "absent", gbs: object = "absent", lb: Optional[float] = None, indexer: Optional[float] = None,
    mtp: Sequence[float] = (), lr: Optional[float] = None, grad_norm: Optional[float] = None,
    throughput: Optional[float] = None,
) -> str:
    """LossCallback._print_log as each release writes it (parts joined by ", " inside "{ " ... " }").

    version: "r1.9" / "r2.0" / "master" (mindspore-ai: fixed widths, "grad_norm: NaN" for None) or "lab"
    (mindspore-lab master@f52743ca: f"loss: {loss:.6f}", f"per_step_time: {t}ms", optional f"lr: {lr:.6e}").
    """
    if version == "lab":
        parts = [f"step:[{step:5d}/{max_steps:5d}]", f"loss: {loss:.6f}", f"per_step_time: {step_time}ms"]
        if lr is not None:
            parts.append(f"lr: {lr:.6e}")
        return "{ " + ", ".join(parts) + " }"
    parts = [f"step:[{step:5d}/{max_steps:5d}]"]
    if consumed != "absent":  # master only
        parts += [f"consumed_samples: {consumed}", f"global_batch_size: {gbs}"]
    parts.append(NA_LOSS if loss is None else f"loss: {loss:10.6f}")
    parts.append(f"per_step_time: {step_time:6d}ms")
    if lb is not None:
        parts.append(f"load_balancing_loss: {lb:10.6f}")
    if indexer is not None:
        parts.append(f"indexer_loss: {indexer:10.6f}")
    if mtp:
        parts.append(", ".join(f"mtp_{str(i + 1)}_loss: {v:10.6f}" for i, v in enumerate(mtp)))
    if lr is not None:
        parts.append(f"lr: {lr:10.6e}")
    parts.append(f"grad_norm: {grad_norm:10.6f}" if grad_norm is not None else "grad_norm: NaN")
    if throughput is not None:
        parts.append(f"throughput: {throughput:6.2f}T")
    return f"{{ {', '.join(parts)} }}"


# (id, message, step, exact metrics)
VARIANTS = [
    (
        "r1.9",
        pynative_line(100, 1200, 6.494543, 5166, version="r1.9", lr=2.991807e-04, grad_norm=1.601172, throughput=156.99),
        100,
        {"loss": 6.494543, "step_time_ms": 5166, "lr": 2.991807e-04, "grad_norm": 1.601172, "throughput_tflops": 156.99},
    ),
    (
        "r1.9, no lr scheduler, grad_norm None",
        pynative_line(7, 20, 10.5, 95873, version="r1.9", throughput=0.01),
        7,
        {"loss": 10.5, "step_time_ms": 95873, "grad_norm": None, "throughput_tflops": 0.01},
    ),
    (
        "r2.0 MoE + DSA + 2 MTP layers",
        pynative_line(100, 1200, 6.494543, 5166, version="r2.0", lb=1.021813, indexer=0.241317,
                      mtp=(6.740981, 6.8125), lr=2.991807e-04, grad_norm=1.601172, throughput=156.99),
        100,
        {"loss": 6.494543, "step_time_ms": 5166, "load_balancing_loss": 1.021813, "indexer_loss": 0.241317,
         "mtp_1_loss": 6.740981, "mtp_2_loss": 6.8125, "lr": 2.991807e-04, "grad_norm": 1.601172,
         "throughput_tflops": 156.99},
    ),
    (
        "master (log-formats.md example)",
        pynative_line(100, 1200, 6.494543, 5166, consumed=51200, gbs=512, lb=1.021813, mtp=(6.740981,),
                      lr=2.991807e-04, grad_norm=1.601172, throughput=156.99),
        100,
        {"consumed_samples": 51200, "global_batch_size": 512, "loss": 6.494543, "step_time_ms": 5166,
         "load_balancing_loss": 1.021813, "mtp_1_loss": 6.740981, "lr": 2.991807e-04, "grad_norm": 1.601172,
         "throughput_tflops": 156.99},
    ),
    (
        "master, non-last PP stage",
        pynative_line(100, 1200, None, 5166, consumed=None, gbs=None),
        100,
        {"consumed_samples": None, "global_batch_size": None, "loss": None, "step_time_ms": 5166, "grad_norm": None},
    ),
    (
        "r2.0, non-last PP stage",
        pynative_line(3, 1200, None, 812, version="r2.0"),
        3,
        {"loss": None, "step_time_ms": 812, "grad_norm": None},
    ),
    (
        "master, NaN loss and NaN grad norm",
        pynative_line(5, 1200, NAN, 5166, consumed=2560, gbs=512, lr=1e-4, grad_norm=NAN, throughput=150.0),
        5,
        {"consumed_samples": 2560, "global_batch_size": 512, "loss": NAN, "step_time_ms": 5166, "lr": 1e-4,
         "grad_norm": NAN, "throughput_tflops": 150.0},
    ),
    (
        "negative and wide numbers",
        pynative_line(123456, 200000, -0.25, 1234567, version="r1.9", lr=0.0, grad_norm=12345.678901,
                      throughput=1234.5),
        123456,
        {"loss": -0.25, "step_time_ms": 1234567, "lr": 0.0, "grad_norm": 12345.678901, "throughput_tflops": 1234.5},
    ),
    (
        "mindspore-lab master",
        pynative_line(12, 100, 2.3456789, 512, version="lab", lr=1.5e-05),
        12,
        {"loss": 2.345679, "step_time_ms": 512, "lr": 1.5e-05},
    ),
    (
        "mindspore-lab master, no lr",
        pynative_line(12, 100, 2.5, 512, version="lab"),
        12,
        {"loss": 2.5, "step_time_ms": 512},
    ),
]


@pytest.mark.parametrize("prefix", ["file_v10", "stdout_v16", "stdout_v16_space"])
@pytest.mark.parametrize("message,step,expected", [v[1:] for v in VARIANTS], ids=[v[0] for v in VARIANTS])
def test_step_line_variants(prefix: str, message: str, step: int, expected: dict) -> None:
    records, events, parser = parse([PREFIXES[prefix](message)])
    assert parser.format is not None and parser.format.name == "mindformers_pynative"
    assert events == [] and len(records) == 1
    record = records[0]
    assert record["step"] == step and "epoch" not in record
    assert record["time"] == pytest.approx(local_ts(TS), abs=1e-6)
    assert record["line"] == 1 and record["segment"] == 0
    assert_metrics(record, expected)
    assert parser.counts["field_errors"] == 0 and parser.counts["unmatched_metric_lines"] == 0


@pytest.mark.parametrize("message,step,expected", [v[1:] for v in VARIANTS], ids=[v[0] for v in VARIANTS])
def test_step_line_without_prefix(message: str, step: int, expected: dict) -> None:
    records, _, parser = parse([message], fmt="mindformers_pynative")
    assert len(records) == 1 and records[0]["step"] == step and records[0]["time"] == READ_TIME
    assert_metrics(records[0], expected)
    assert parser.meta["total_steps"] == int(message.split("/")[1].split("]")[0])


def test_non_last_stage_loss_is_null_not_missing() -> None:
    records, _, _ = parse([PREFIXES["stdout_v16"](pynative_line(4, 10, None, 500, consumed=None, gbs=None))])
    assert "loss" in records[0] and records[0]["loss"] is None
    assert records[0]["consumed_samples"] is None and records[0]["global_batch_size"] is None


def test_grad_norm_none_is_null_but_a_real_nan_is_nan() -> None:
    """LossCallback prints "grad_norm: NaN" for None; a NaN norm prints f"{nan:10.6f}" == "       nan"."""
    none_line = pynative_line(1, 10, 2.0, 500, version="r1.9")
    nan_line = pynative_line(2, 10, 2.0, 500, version="r1.9", grad_norm=NAN)
    assert "grad_norm: NaN" in none_line and "grad_norm:        nan" in nan_line
    records, _, _ = parse([PREFIXES["file_v10"](none_line), PREFIXES["file_v10"](nan_line)])
    assert records[0]["grad_norm"] is None
    assert math.isnan(records[1]["grad_norm"])


def test_a_later_separate_loss_is_kept_under_its_own_name() -> None:
    """A `<name>_loss: v` part this format does not name yet (after the MTP losses) becomes a metric of that name,
    as does any other `name: number` part, without losing the line."""
    line = pynative_line(9, 10, 2.0, 500, version="r2.0", mtp=(2.5,), lr=1e-4, grad_norm=1.0)
    line = line.replace("mtp_1_loss:   2.500000", "mtp_1_loss:   2.500000, z_loss:   0.010000, router_entropy: 3.5")
    records, _, parser = parse([PREFIXES["file_v10"](line)])
    assert_metrics(records[0], {"loss": 2.0, "step_time_ms": 500, "mtp_1_loss": 2.5, "z_loss": 0.01,
                                "router_entropy": 3.5, "lr": 1e-4, "grad_norm": 1.0})
    assert parser.counts["field_errors"] == 0 and parser.counts["unmatched_metric_lines"] == 0


@pytest.mark.parametrize("where,extra,counted", [
    ("throughput", {"tokens_per_s": 1234.5, "other": 2.0}, 0),  # after the last field: kept
    ("lr", {"tokens_per_s": 1234.5, "other": 2.0}, 0),  # between lr and grad_norm: kept, grad_norm still read
    ("throughput", {}, 1),  # a number it cannot read: counted, the step kept
])
def test_parts_after_the_named_fields_are_kept_or_counted(where: str, extra: dict, counted: int) -> None:
    line = pynative_line(9, 10, 2.0, 500, version="r1.9", lr=1e-4, grad_norm=1.0, throughput=156.99)
    part = ", tokens_per_s: 1234.5, other: 2" if extra else ", data_time: 1.5 ms"
    anchor = "T }" if where == "throughput" else "e-04"
    assert anchor in line
    records, _, parser = parse([PREFIXES["file_v10"](line.replace(anchor, anchor[:-2] + part + anchor[-2:]
                                                                  if where == "throughput" else anchor + part))])
    assert_metrics(records[0], {"loss": 2.0, "step_time_ms": 500, "lr": 1e-4, "grad_norm": 1.0,
                                "throughput_tflops": 156.99, **extra})
    assert parser.counts["field_errors"] == 0 and parser.counts["unmatched_metric_lines"] == counted


def test_training_state_and_max_logits_monitors_are_not_steps() -> None:
    """pynative/tools/monitor.py: f"{{ {', '.join(f'{k}: {v}')} }}" per record; max-logits "step:[%5d/%5d] %s: %s"."""
    monitor = [
        "{ micro_step: 1, local_loss: 6.512345 }",
        "{ micro_step: 1 }",
        "{ local_norm: model.layers.0.self_attn.q_proj.weight:   0.035967 }",
        "{ device_loss: 6.494543 }",
        "{ device_norm: model.layers.0.mlp.w1.weight:   1.250000 }",
        '{ "step": 100, "micro_step": 8 }',
        "step:[%5d/%5d] %s: %s" % (100, 1200, "max_attention_logit/model.layers.0.self_attn", "[12.5, 13.25]"),
        "step:[%5d/%5d] %s: %s" % (100, 1200, "max_attention_logit/max", "13.25"),
    ]
    step = PREFIXES["stdout_v16"](pynative_line(100, 1200, 6.5, 5166, version="r1.9", grad_norm=1.0))
    records, events, parser = parse([step] + [PREFIXES["stdout_v16"](m) for m in monitor])
    assert [r["step"] for r in records] == [100] and events == []
    assert parser.counts["unmatched_metric_lines"] == 0
    _, _, alone = parse([PREFIXES["stdout_v16"](m) for m in monitor])
    assert alone.format is None and alone.counts["records"] == 0


def test_graph_mode_lines_still_detect_the_graph_format() -> None:
    graph = ("{ Epoch:[  1/  1], step:[    1/   10], loss: 2.000000, per_step_time: 512ms, lr: 1e-05, "
             "overflow cond: False, loss_scale: 1.0, global_norm: [1.0]")
    _, _, parser = parse([PREFIXES["stdout_v16"](graph)])
    assert parser.format is not None and parser.format.name == "mindformers"
    _, _, parser = parse([PREFIXES["stdout_v16"](pynative_line(1, 10, 2.0, 500))])
    assert parser.format is not None and parser.format.name == "mindformers_pynative"


# -- events -----------------------------------------------------------------------------------------------------------
CKPT = "Checkpoint saved at step {} to {} (async={}, remove_redundancy={})"  # checkpoint_callback.py


def test_checkpoint_epoch_end_and_end_events() -> None:
    log = PREFIXES["file_v10"]
    lines = [
        log(pynative_line(1, 4, 2.0, 500, version="r1.9", grad_norm=1.0)),
        log(pynative_line(2, 4, 1.5, 500, version="r1.9", grad_norm=1.0)),
        log(CKPT.format(2, "/home/ma-user/work/output/checkpoint", False, False), ts="2024-04-02 09:13:52,000"),
        log("Epoch %s finished. Time: %.2fs" % (1, 12.34)),
        log(pynative_line(3, 4, 1.25, 500, version="r1.9", grad_norm=1.0)),
        log(pynative_line(4, 4, 1.0, 500, version="r1.9", grad_norm=1.0)),
        log(CKPT.format(4, "/out/ckpt dir", True, True)),
        log("Training completed. Final checkpoint saved.", ts="2024-04-02 09:13:59,000"),
    ]
    records, events, parser = parse(lines)
    # "Epoch N finished" amends the epoch's last step (already emitted): one record per step.
    assert [(r["step"], r["line"]) for r in records] == [(1, 1), (2, 2), (3, 5), (4, 6)]
    assert records[1]["epoch_time_ms"] == 12340.0 and records[1]["loss"] == 1.5
    assert [(e["kind"], e["step"], e["line"]) for e in events] == [("checkpoint", 2, 3), ("checkpoint", 4, 7),
                                                                    ("end", 4, 8)]
    assert (events[0]["path"], events[0]["async"]) == ("/home/ma-user/work/output/checkpoint", 0)
    assert (events[1]["path"], events[1]["async"]) == ("/out/ckpt dir", 1)
    assert events[0]["time"] == pytest.approx(local_ts("2024-04-02 09:13:52,000"))
    assert events[2]["message"] == "Training completed. Final checkpoint saved."
    assert parser.counts["field_errors"] == 0


def test_error_saving_checkpoint_is_an_error_event() -> None:
    lines = [
        PREFIXES["stdout_v16"](pynative_line(10, 20, 2.0, 500)),
        PREFIXES["stdout_v16"]("Error saving checkpoint: [Errno 28] No space left on device", lv="ERROR"),
    ]
    _, events, _ = parse(lines)
    assert [(e["kind"], e["step"], e["level"]) for e in events] == [("error", 10, "ERROR")]


THREAD_EXCEPTION = [
    "Exception in thread Thread-3 (_save_worker):",
    "Traceback (most recent call last):",
    '  File "/usr/local/python3.10/lib/python3.10/threading.py", line 1016, in _bootstrap_inner',
    "    self.run()",
    '  File "/usr/local/python3.10/lib/python3.10/threading.py", line 953, in run',
    "    self._target(*self._args, **self._kwargs)",
    "OSError: [Errno 28] No space left on device",
]
NUMPY_WARNING = [
    "/usr/local/python3.10/lib/python3.10/site-packages/numpy/core/getlimits.py:499: UserWarning: The value of the "
    "smallest subnormal for <class 'numpy.float64'> type is zero.",
    "  setattr(self, word, getattr(machar, word).flat[0])",
]


@pytest.mark.parametrize("fmt", ["mindformers_pynative", "mindformers", "mindspore"])
def test_thread_exception_block_is_one_error_event(fmt: str) -> None:
    step = {
        "mindformers_pynative": lambda n: PREFIXES["stdout_v16"](pynative_line(n, 10, 2.0, 500)),
        "mindformers": lambda n: PREFIXES["stdout_v16"](
            "{ Epoch:[  1/  1], step:[%5d/   10], loss: 2.000000, per_step_time: 512ms, lr: 1e-05, overflow cond: "
            "False, loss_scale: 1.0" % n),
        "mindspore": lambda n: "epoch: 1 step: %d, loss is 2.0" % n,
    }[fmt]
    records, events, parser = parse([step(3)] + THREAD_EXCEPTION + NUMPY_WARNING + [step(4)])
    assert parser.format is not None and parser.format.name == fmt
    assert len(records) == 2
    assert [(e["kind"], e["step"], e["line"]) for e in events] == [("error", 3, 2)]
    assert events[0]["message"] == "\n".join(THREAD_EXCEPTION)  # the warning pair after it is not part of it
    assert parser.counts["unmatched_metric_lines"] == 0


@pytest.mark.parametrize("fmt", ["mindformers_pynative", "mindformers", "mindspore"])
def test_python_warning_pairs_are_not_records_or_events(fmt: str) -> None:
    warning = ["/home/user/train.py:42: UserWarning: loss is 2.5 but the scaler says 0.5", "  warnings.warn(msg)",
               "/usr/lib/python3/dist-packages/numpy/_core/fromnumeric.py:3860: RuntimeWarning: Mean of empty slice.",
               "  return _methods._mean(a, axis=axis, dtype=dtype, out=out, **kwargs)"]
    records, events, parser = parse(warning, fmt=fmt)
    assert records == [] and events == []
    assert parser.counts["unmatched_metric_lines"] == 0


def test_mindspore_error_records_in_a_pynative_worker_log() -> None:
    """msrun worker logs: MindSpore [ERROR] ME(...) and C++ [ERROR] DEVICE(...) records, the C++ one with its
    `- C++ Call Stack:` block on unprefixed lines: one error event each."""
    lines = [
        PREFIXES["stdout_v16"](pynative_line(8, 10, 2.0, 500)),
        "[ERROR] ME(88317:281473680449568,MainProcess):2026-07-14-06:49:01.431.52 [mindspore/common/api.py:1] "
        "compile failed",
        "[ERROR] DEVICE(56203,ffffa4786be0,python):2026-07-14-06:49:02.340.398 "
        "[mindspore/ccsrc/plugin/device/ascend/hal/device/ascend_memory_adapter.cc:48] Initialize] Malloc device "
        "memory failed",
        "",
        "----------------------------------------------------",
        "- C++ Call Stack: (For framework developers)",
        "----------------------------------------------------",
        "mindspore/ccsrc/plugin/device/ascend/hal/device/ascend_memory_adapter.cc:48 Initialize",
        "[WARNING] DEVICE(56203,ffffa4786be0,python):2026-07-14-06:49:02.341.000 [x.cc:1] F] fine",
    ]
    _, events, _ = parse(lines)
    assert [(e["kind"], e["level"], e["step"]) for e in events] == [("error", "ERROR", 8), ("error", "ERROR", 8)]
    assert events[0]["message"] == "compile failed"
    assert events[1]["message"].splitlines()[0] == "Malloc device memory failed"
    assert events[1]["message"].splitlines()[-1] == lines[-2]


# -- sample logs ------------------------------------------------------------------------------------------------------
def read_sample(name: str) -> List[str]:
    return (SAMPLES / name).read_text(encoding="utf-8").splitlines()


def test_sample_pynative_worker_log() -> None:
    records, events, parser = parse(read_sample("mindformers_pynative_worker_0.log"))
    assert parser.format is not None and parser.format.name == "mindformers_pynative"
    assert [r["step"] for r in records] == list(range(1, 13))
    keys = {"consumed_samples", "global_batch_size", "loss", "step_time_ms", "load_balancing_loss", "mtp_1_loss",
            "mtp_2_loss", "lr", "grad_norm", "throughput_tflops"}
    assert all(set(r) - {"step", "time", "segment", "line"} == keys for r in records)
    assert_metrics(records[0], {
        "consumed_samples": 512, "global_batch_size": 512, "loss": 11.916584, "step_time_ms": 95873,
        "load_balancing_loss": 1.136518, "mtp_1_loss": 11.973107, "mtp_2_loss": 12.021322, "lr": 2.5e-05,
        "grad_norm": 6.103215, "throughput_tflops": 8.46,
    })
    assert records[0]["time"] == pytest.approx(local_ts("2026-07-14 06:50:41,512"))
    nan_step = records[6]
    assert nan_step["step"] == 7 and math.isnan(nan_step["loss"]) and math.isnan(nan_step["grad_norm"])
    assert sum(math.isnan(r["loss"]) for r in records) == 1
    assert records[-1]["consumed_samples"] == 6144 and records[-1]["loss"] == 6.494543
    assert [(e["kind"], e["step"]) for e in events] == [("checkpoint", 6), ("error", 9), ("checkpoint", 12),
                                                         ("end", 12)]
    assert events[1]["message"].startswith("Exception in thread Thread-3 (_monitor_loop):\nTraceback")
    assert parser.counts["field_errors"] == 0 and parser.counts["unmatched_metric_lines"] == 0


def test_sample_pynative_non_last_stage_info_log() -> None:
    records, events, parser = parse(read_sample("mindformers_pynative_r2.0_pp_stage0_info.log"))
    assert parser.format is not None and parser.format.name == "mindformers_pynative"
    assert [r["step"] for r in records] == list(range(1, 7))
    for record in records:
        assert_metrics(record, {"loss": None, "step_time_ms": record["step_time_ms"], "grad_norm": None})
    assert [e["kind"] for e in events] == ["checkpoint", "end"]
    assert parser.counts["field_errors"] == 0 and parser.counts["unmatched_metric_lines"] == 0
