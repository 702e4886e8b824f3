"""The built-in `mindspore` (LossMonitor / TimeMonitor stdout) and `jsonl` formats, and per-file auto-detection."""

from __future__ import annotations

import datetime
import json
import math
import time

import pytest

from .support import NAN, READ_TIME, SAMPLES, assert_metrics, parse


# -- format strings, verbatim from MindSpore (log-formats.md section 3) ---------------------------------------------
LOSS_MONITOR = "epoch: %s step: %s, loss is %s"
TIME_MONITOR_1X = "epoch time: {:5.3f} ms, per step time: {:5.3f} ms"
TIME_MONITOR_2X = "{} epoch time: {:5.3f} ms, per step time: {:5.3f} ms"
DATA_TIME = " (data time: {:5.3f} ms)"
ME_LINE = "[%s] ME(%d:%d,%s):%s [%s:%d] %s"


def ms_clock(dt: datetime.datetime) -> str:
    """MindSpore's logger clock: strftime + the msecs digits split after three, not zero padded."""
    digits = str(round(dt.microsecond / 1000 * 1000))
    return dt.strftime("%Y-%m-%d-%H:%M:%S") + f".{digits[:3]}.{digits[3:]}"


def me(level: str, dt: datetime.datetime, msg: str) -> str:
    return ME_LINE % (level, 40211, 281473680449568, "MainProcess", ms_clock(dt), "mindspore/train/model.py", 1429, msg)


# -- LossMonitor ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "rendering,value",
    [
        ("2.3025851249694824", 2.3025851249694824),  # 1.x / 2.x scalar: Python float repr
        ("1.4536957", 1.4536957),  # 2.x tuple output: str(float32 ndarray)
        ("nan", NAN),  # 2.x tuple output prints NaN
        ("inf", float("inf")),
        ("Tensor(shape=[], dtype=Float32, value= 0.663754)", 0.663754),  # Tensor.__str__ == __repr__ versions
        ("Tensor(shape=[], dtype=Float32, value=0.5)", 0.5),
        ("Tensor(shape=[], dtype=Float32, value= nan)", NAN),
    ],
)
def test_loss_monitor_renderings(rendering: str, value: float) -> None:
    records, events, parser = parse([LOSS_MONITOR % (1, 7, rendering)])
    assert parser.format is not None and parser.format.name == "mindspore"
    assert events == [] and len(records) == 1
    assert records[0]["step"] == 7 and records[0]["epoch"] == 1 and records[0]["time"] == READ_TIME
    assert_metrics(records[0], {"loss": value})


def test_global_step_is_inferred_across_epochs() -> None:
    """LossMonitor prints the step within the epoch only; the epoch length is learnt from epoch 1."""
    lines = [LOSS_MONITOR % (e, s, "%.4f" % (1.0 / (e * 10 + s))) for e in (1, 2, 3) for s in (5, 10, 15, 20)]
    records, _, _ = parse(lines)
    assert [r["step"] for r in records] == list(range(5, 61, 5))
    assert [r["epoch"] for r in records] == [1] * 4 + [2] * 4 + [3] * 4
    assert {r["segment"] for r in records} == {0}


@pytest.mark.parametrize(
    "line,expected",
    [
        # per step time = epoch time / steps in the epoch (2 here): TimeMonitor also tells the epoch length
        (TIME_MONITOR_1X.format(433.798, 216.899), {"epoch_time_ms": 433.798, "step_time_ms": 216.899}),
        (TIME_MONITOR_2X.format("train".title(), 131.622, 65.811),
         {"epoch_time_ms": 131.622, "step_time_ms": 65.811}),
        (TIME_MONITOR_2X.format("", 131.622, 65.811), {"epoch_time_ms": 131.622, "step_time_ms": 65.811}),
        (TIME_MONITOR_2X.format("Train", 10.0, 5.0) + DATA_TIME.format(1.25),
         {"epoch_time_ms": 10.0, "step_time_ms": 5.0, "data_time_ms": 1.25}),
    ],
    ids=["1.x", "2.x Train", "2.x empty mode", "2.x data_time"],
)
def test_time_monitor_joins_the_epochs_last_step(line: str, expected: dict) -> None:
    lines = [LOSS_MONITOR % (1, 1, "0.5"), LOSS_MONITOR % (1, 2, "0.25"), line, LOSS_MONITOR % (2, 1, "0.125")]
    records, events, _ = parse(lines)
    assert [r["step"] for r in records] == [1, 2, 3], "TimeMonitor must not make a second record of a step"
    assert_metrics(records[0], {"loss": 0.5})
    assert_metrics(records[1], {"loss": 0.25, **expected})
    assert_metrics(records[2], {"loss": 0.125})
    assert events == []


def test_eval_time_monitor_is_not_a_training_step_time() -> None:
    lines = [
        LOSS_MONITOR % (1, 2, "0.25"),
        TIME_MONITOR_2X.format("Train", 20.0, 10.0),
        TIME_MONITOR_2X.format("Eval", 8.0, 4.0),
        "Eval result: epoch %d, metrics: %s" % (1, {"accuracy": 0.9}),
        LOSS_MONITOR % (2, 1, "0.125"),
    ]
    records, events, _ = parse(lines)
    # The eval numbers amend the epoch's last step (charted there, one record per step), and make an `eval` event.
    assert [(r["step"], r.get("step_time_ms")) for r in records] == [(2, 10.0), (3, None)]
    assert_metrics(records[0], {"loss": 0.25, "epoch_time_ms": 20.0, "step_time_ms": 10.0, "eval_accuracy": 0.9})
    assert [(e["kind"], e["step"], e["eval_accuracy"]) for e in events] == [("eval", 2, 0.9)]


def test_traceback_after_a_loss_monitor_line() -> None:
    lines = [
        me("WARNING", datetime.datetime(2026, 1, 20, 3, 15, 44, 908089), "deprecated callback methods"),
        LOSS_MONITOR % (3, 1, "nan"),
        "Traceback (most recent call last):",
        '  File "train.py", line 40, in <module>',
        "RuntimeError: In epoch: 3 step: 2, loss is NAN or INF, training process cannot continue, terminating "
        "training.",
    ]
    records, events, parser = parse(lines)
    assert parser.counts["unmatched_metric_lines"] == 0  # "loss is NAN" inside the traceback is not a step
    assert len(records) == 1 and math.isnan(records[0]["loss"])
    # A first line in epoch 3 with nothing known of the epoch length: its global step is a guess, and says so.
    assert [(e["kind"], e["step"], e["line"]) for e in events] == [("error", 3, 3)]
    assert parser.meta["steps_per_epoch"] == "guessed"
    assert events[0]["message"].endswith("terminating training.")


def test_mindspore_logger_error_becomes_an_event_with_its_clock() -> None:
    when = datetime.datetime(2026, 1, 20, 3, 15, 45, 43152)  # 43.152 ms prints as ".431.52"
    line = me("ERROR", when, "For 'Model.train', the dataset is empty")
    assert ".431.52 " in line
    records, events, _ = parse([LOSS_MONITOR % (1, 1, "0.5"), line, "  continued"], fmt="mindspore")
    assert len(records) == 1
    assert [(e["kind"], e["level"], e["message"]) for e in events] == [
        ("error", "ERROR", "For 'Model.train', the dataset is empty\n  continued")
    ]
    assert events[0]["time"] == pytest.approx(time.mktime(when.timetuple()) + 0.043152)


def test_sample_lossmonitor_log() -> None:
    records, events, parser = parse((SAMPLES / "mindspore_lossmonitor.log").read_text(encoding="utf-8").splitlines())
    assert parser.format is not None and parser.format.name == "mindspore"
    # The eval after epoch 2 amends step 16's record with its eval_* metrics (and makes an `eval` event).
    evals = [r for r in records if "eval_loss" in r]
    assert [(r["step"], r["epoch"], r["line"]) for r in evals] == [(16, 2, 19)]
    assert_metrics(evals[0], {"loss": 0.6569548, "epoch_time_ms": 490.616, "step_time_ms": 61.327,
                              "data_time_ms": 5.112, "eval_accuracy": 0.9375, "eval_loss": 0.3011})
    assert [(e["kind"], e["step"], e["eval_accuracy"], e["eval_loss"], e["line"]) for e in events] == [
        ("eval", 16, 0.9375, 0.3011, 22)
    ]
    assert events[0]["message"] == "Eval result: epoch 2, metrics: {'accuracy': 0.9375, 'loss': 0.3011}"
    assert [r["step"] for r in records] == list(range(1, 25))
    assert [r["epoch"] for r in records] == [1] * 8 + [2] * 8 + [3] * 8
    assert all(r["time"] == READ_TIME for r in records)  # print() lines carry no timestamp
    assert_metrics(records[0], {"loss": 2.1684804})
    assert_metrics(records[7], {"loss": 1.2321866, "epoch_time_ms": 1735.192, "step_time_ms": 216.899,
                                "data_time_ms": 4.112})
    assert_metrics(records[10], {"loss": NAN})
    assert_metrics(records[23], {"loss": 0.361621, "epoch_time_ms": 484.112, "step_time_ms": 60.514,
                                 "data_time_ms": 6.112})
    assert sum(1 for r in records if "epoch_time_ms" in r) == 3
    assert parser.counts["field_errors"] == 0 and parser.counts["unmatched_metric_lines"] == 0


# -- JSONL ----------------------------------------------------------------------------------------------------------
def test_jsonl_records_and_non_finite_strings() -> None:
    lines = [
        json.dumps({"step": 1, "epoch": 1, "time": 1764672000.5, "loss": 2.5, "lr": 0.0002, "overflow": False}),
        json.dumps({"step": 2, "epoch": 1, "time": 1764672001.5, "loss": "NaN", "grad_norm": "Infinity",
                    "loss_scale": "-Infinity"}),
        json.dumps({"step": 3, "loss": float("nan"), "grad_norm": float("inf")}),  # json.dumps's own bare NaN
        json.dumps({"step": 4, "loss": None, "note": "text is not a metric", "nested": {"a": 1}, "list": [1, 2]}),
    ]
    records, events, parser = parse(lines)
    assert parser.format is not None and parser.format.name == "jsonl"
    assert events == []
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert records[0]["epoch"] == 1 and records[0]["time"] == 1764672000.5
    assert_metrics(records[0], {"loss": 2.5, "lr": 0.0002, "overflow": 0})
    assert_metrics(records[1], {"loss": NAN, "grad_norm": float("inf"), "loss_scale": float("-inf")})
    assert_metrics(records[2], {"loss": NAN, "grad_norm": float("inf")})
    assert records[2]["time"] == READ_TIME  # no time in the object: read time
    assert_metrics(records[3], {"loss": None})
    assert [r["line"] for r in records] == [1, 2, 3, 4]


def test_jsonl_reserved_keys_are_ours_and_kind_makes_events() -> None:
    lines = [
        json.dumps({"kind": "start", "time": 1764672000.0, "message": "training started"}),
        json.dumps({"step": 5, "seq": 99, "source": "evil", "segment": 7, "line": 1234, "loss": 1.0}),
        "not JSON: a stray print()",
        "[1, 2, 3]",
        json.dumps({"kind": "checkpoint", "time": 1764672003.2, "step": 5, "message": "saved net-5_1.ckpt"}),
        json.dumps({"step": 4, "loss": 1.5}),
    ]
    records, events, _ = parse(lines)
    assert [(r["step"], r["segment"], r["line"]) for r in records] == [(5, 0, 2), (4, 1, 6)]
    assert "seq" not in records[0] and "source" not in records[0]
    assert [(e["kind"], e.get("step"), e["message"], e["line"]) for e in events] == [
        ("start", None, "training started", 1), ("checkpoint", 5, "saved net-5_1.ckpt", 5),
        ("resume", 4, "resumed at step 4 (the step before was 5)", 6),  # a step going back: a new segment
    ]


def test_sample_metrics_jsonl() -> None:
    records, events, parser = parse((SAMPLES / "metrics.jsonl").read_text(encoding="utf-8").splitlines())
    assert parser.format is not None and parser.format.name == "jsonl"
    assert [r["step"] for r in records] == list(range(1, 13))
    assert_metrics(records[4], {"loss": NAN, "lr": 0.0002, "grad_norm": float("inf"), "loss_scale": 65536.0,
                                "overflow": 1, "step_time_ms": 512.0, "samples_per_s": 62.5})
    assert records[5]["grad_norm"] == float("-inf") and records[5]["loss_scale"] == 32768.0
    assert records[8]["grad_norm"] is None
    assert records[0]["time"] == 1764672000.512 and records[0]["loss"] == 2.206242
    assert [(e["kind"], e.get("step")) for e in events] == [("start", None), ("checkpoint", 6), ("end", 12)]


# -- detection ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name,fmt",
    [
        ("mindformers_v1.3_sink_info.log", "mindformers"),
        ("mindformers_v1.8_nonsink_worker_0.log", "mindformers"),
        ("mindspore_lossmonitor.log", "mindspore"),
        ("metrics.jsonl", "jsonl"),
        ("mindformers_v1.9_eval_worker_0.log", "mindformers"),
        ("mindformers_pynative_worker_0.log", "mindformers_pynative"),
        ("mindformers_pynative_r2.0_pp_stage0_info.log", "mindformers_pynative"),
    ],
)
def test_each_sample_detects_its_format(name: str, fmt: str) -> None:
    _, _, parser = parse((SAMPLES / name).read_text(encoding="utf-8").splitlines())
    assert parser.format is not None and parser.format.name == fmt


def test_detection_waits_for_a_record_line_in_a_mixed_file() -> None:
    """MindSpore logger lines match the prefixes of both text formats: only a record line decides."""
    ms_warning = me("WARNING", datetime.datetime(2026, 1, 20, 3, 15, 44, 908089), "deprecated")
    cpp_warning = ("[WARNING] DEVICE(56203,ffffa4786be0,python):2026-07-14-06:49:02.340.398 [mindspore/ccsrc/a.cc:48]"
                   " Init] low memory")
    mf_info = "2026-01-20 03:20:02,718 - mindformers/home/u/output/log[mindformers/trainer/trainer.py:1] - INFO - hi"
    mf_step = ("2026-01-20 03:20:03,000 - mindformers/home/u/output/log[mindformers/core/callback/callback.py:616] - "
               "INFO - { Epoch:[  1/  1], step:[    1/   10], loss: 2.000000, per_step_time: 512ms, lr: 1e-05, "
               "overflow cond: False, loss_scale: 1.0, global_norm: [1.0]")
    config_dump = "{'adapter_id': None,"

    _, _, parser = parse([ms_warning, cpp_warning, config_dump, mf_info])
    assert parser.format is None  # nothing decided yet

    records, _, parser = parse([ms_warning, cpp_warning, config_dump, mf_info, mf_step])
    assert parser.format is not None and parser.format.name == "mindformers"
    assert [r["step"] for r in records] == [1]

    records, _, parser = parse([ms_warning, cpp_warning, "print from the script", LOSS_MONITOR % (1, 1, "0.5")])
    assert parser.format is not None and parser.format.name == "mindspore"
    assert [r["step"] for r in records] == [1]

    records, _, parser = parse([config_dump, json.dumps({"step": 1, "loss": 0.5})])
    assert parser.format is not None and parser.format.name == "jsonl"
    assert [r["step"] for r in records] == [1]


def test_an_error_before_detection_is_still_an_event() -> None:
    ms_error = me("ERROR", datetime.datetime(2026, 1, 20, 3, 15, 44, 908089), "device init failed")
    records, events, parser = parse([ms_error, "Traceback (most recent call last):", "RuntimeError: x"])
    assert records == [] and parser.format is None
    assert [e["kind"] for e in events] == ["error"]
    assert events[0]["message"] == "device init failed\nTraceback (most recent call last):\nRuntimeError: x"


def test_locked_format_ignores_other_formats_records() -> None:
    """Once a file is MindSpore LossMonitor output, a JSON line in it is not a step (and vice versa)."""
    records, _, _ = parse([LOSS_MONITOR % (1, 1, "0.5"), json.dumps({"step": 99, "loss": 1.0})])
    assert [r["step"] for r in records] == [1]
    records, _, _ = parse([json.dumps({"step": 1, "loss": 1.0}), LOSS_MONITOR % (1, 99, "0.5")])
    assert [r["step"] for r in records] == [1]


def test_a_file_no_format_knows_counts_its_metric_looking_lines() -> None:
    """`mstail parse` tells the user their format misses lines; that matters most when nothing was detected."""
    # Lines with a step counter ("Iter 5 loss: 2.3") are the generic reader's records now (test_generic.py): these
    # have none.
    records, events, parser = parse(["loss: 2.3", "mean loss is nan", "saving model"])
    assert records == [] and events == [] and parser.format is None
    assert parser.counts["unmatched_metric_lines"] == 2
