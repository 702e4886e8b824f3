"""The built-in `megatron` format (Megatron-LM / MindSpeed-LLM `training_log`) against lines built from the format
strings of Megatron-LM's megatron/training/training.py (training_log, evaluate_and_print_results) and
megatron/training/checkpointing.py (save_checkpoint), auto-detected among all built-ins; plus the sample log."""

from __future__ import annotations

import math
import time
from typing import Optional

from .support import NAN, SAMPLES, assert_metrics, parse, parse_file, same


def training_log(iteration: int, *, total: int = 1000, date: Optional[str] = "2025-04-13 23:41:20",
                 lr_format: str = "{:.6E}", losses: Optional[dict] = None, grad_norm: Optional[float] = 2.345,
                 throughput: Optional[float] = None, skipped: int = 0, nan: int = 0, extra: str = "") -> str:
    """One iteration line, assembled as training_log does (core 0.8+ prints the date first; older releases and
    Megatron-DeepSpeed print no date and `learning rate: {:.3E}`)."""
    s = f" [{date}]" if date else ""
    s += ' iteration {:8d}/{:8d} |'.format(iteration, total)
    s += ' consumed samples: {:12d} |'.format(64 * iteration)
    s += ' elapsed time per iteration (ms): {:.1f} |'.format(1234.5)
    if throughput is not None:
        s += f' throughput per GPU (TFLOP/s/GPU): {throughput:.1f} |'
    s += " learning rate: " + lr_format.format(1e-05) + " |"
    s += ' global batch size: {:5d} |'.format(64)
    for key, avg in (losses if losses is not None else {"lm loss": 9.876543}).items():
        s += ' {}: {:.6E} |'.format(key, avg)
    s += extra
    s += ' loss scale: {:.1f} |'.format(1.0)
    if grad_norm is not None:
        s += ' grad norm: {:.3f} |'.format(grad_norm)
    s += ' number of skipped iterations: {:3d} |'.format(skipped)
    s += ' number of nan iterations: {:3d} |'.format(nan)
    return s


BASE = {"consumed_samples": 640, "step_time_ms": 1234.5, "lr": 1e-05, "global_batch_size": 64, "loss": 9.876543,
        "loss_scale": 1.0, "grad_norm": 2.345, "skipped_iterations": 0, "nan_iterations": 0}


def test_the_issue_line_is_a_record_with_canonical_names() -> None:
    line = (" iteration       10/    1000 | consumed samples: 640 | elapsed time per iteration (ms): 1234.5 | learning "
            "rate: 1.000000E-05 | global batch size: 64 | lm loss: 9.876543E+00 | loss scale: 1.0 | grad norm: 2.345 | "
            "number of skipped iterations: 0 | number of nan iterations: 0 |")
    records, events, parser = parse([line])
    assert parser.state.format == "megatron" and not events
    assert records[0]["step"] == 10 and parser.meta["total_steps"] == 1000
    assert_metrics(records[0], BASE)


def test_dated_line_takes_its_time_and_every_optional_field() -> None:
    line = training_log(10, throughput=152.3, losses={"lm loss": 9.876543, "mtp_1 loss": 9.9, "load_balancing_loss": 0.01},
                        extra=" num zeros: 71.0 | params norm: 250.125 |")
    records, _, parser = parse([line])
    assert parser.state.format == "megatron"
    assert records[0]["time"] == time.mktime(time.strptime("2025-04-13 23:41:20", "%Y-%m-%d %H:%M:%S"))
    assert_metrics(records[0], {**BASE, "throughput_tflops": 152.3, "mtp_1_loss": 9.9, "load_balancing_loss": 0.01,
                                "num_zeros": 71.0, "params_norm": 250.125})


def test_older_releases_without_date_and_with_three_decimals() -> None:
    records, _, parser = parse([training_log(10, date=None, lr_format="{:.3E}")])
    assert parser.state.format == "megatron"
    assert_metrics(records[0], BASE)


def test_a_skipped_or_nan_iteration_has_no_loss_but_its_counts() -> None:
    lines = [training_log(1, losses={}, grad_norm=None, skipped=1), training_log(2, losses={}, grad_norm=NAN, nan=1)]
    records, _, _ = parse(lines)
    assert [r["step"] for r in records] == [1, 2]
    assert "loss" not in records[0] and records[0]["skipped_iterations"] == 1 and "grad_norm" not in records[0]
    assert "loss" not in records[1] and records[1]["nan_iterations"] == 1 and same(records[1]["grad_norm"], NAN)


def test_mindspeed_mm_loss_names() -> None:
    # MindSpeed-MM's trainer: " loss: {:.6E} |", " aux loss: {:.6E} |", " tokens per gpu per second (tgs): {:.3f} |"
    line = training_log(5, losses={"loss": 2.345, "aux loss": 0.0125}, extra=" tokens per gpu per second (tgs): 2817.250 |")
    records, _, _ = parse([line])
    assert records[0]["loss"] == 2.345 and records[0]["aux_loss"] == 0.0125
    assert records[0]["tokens_per_s_per_device"] == 2817.25


def test_validation_checkpoints_and_known_lines() -> None:
    body = " validation loss at iteration 20 on validation set | lm loss value: 2.345678E+00 | lm loss PPL: 1.043991E+01 | "
    lines = [
        training_log(20),
        "-" * len(body),
        body,
        "-" * len(body),
        "saving checkpoint at iteration      20 to /ckpt in torch_dist format",
        "  successfully saved checkpoint from iteration      20 to /ckpt [ t 1/8, p 1/1 ]",
        "(min, max) time across ranks (ms):",
        "    forward-backward ...............................: (1102.33, 1110.87)",
        "[Rank 0] (after 20 iterations) memory (MB) | allocated: 1464.3 | max allocated: 1464.3 | reserved: 1576.0 | max reserved: 1576.0",
        " test loss at iteration 20 | lm loss value: 2.500000E+00 | lm loss PPL: 1.218249E+01 | ",
        "[after training is done] datetime: 2025-04-13 23:55:00 ",
    ]
    records, events, parser = parse(lines)
    assert len(records) == 1 and records[0]["eval_loss"] == 2.345678 and records[0]["eval_ppl"] == 10.43991
    assert [(e["kind"], e["step"]) for e in events] == [
        ("eval", 20), ("checkpoint", 20), ("checkpoint_saved", 20), ("eval", 20), ("end", 20)]
    assert events[3]["eval_loss"] == 2.5
    assert parser.counts["unmatched_metric_lines"] == 0


def test_sample_log() -> None:
    records, events, parser = parse_file(SAMPLES / "megatron_mindspeed_llm.log")
    assert parser.state.format == "megatron"
    assert [r["step"] for r in records] == list(range(1, 13))
    assert [r for r in records if "loss" not in r] == [records[0], records[6]]  # skipped (1) and NaN (7) iterations
    assert same(records[6]["grad_norm"], NAN) and records[6]["nan_iterations"] == 1
    assert records[1]["mtp_1_loss"] == 10.1 and records[1]["throughput_tflops"] == 152.5
    assert [r["step"] for r in records if "eval_loss" in r] == [6, 12]
    assert math.isclose(records[11]["eval_ppl"], math.exp(6.6), rel_tol=1e-6)
    assert [(e["kind"], e["step"]) for e in events if e["kind"] != "start"] == [
        ("eval", 6), ("checkpoint", 6), ("checkpoint_saved", 6), ("eval", 12), ("checkpoint", 12),
        ("checkpoint_saved", 12), ("end", 12)]
    assert parser.counts["unmatched_metric_lines"] == 0 and parser.counts["field_errors"] == 0


def test_a_last_pair_without_its_bar_is_read_and_a_pair_not_read_is_counted() -> None:
    # lr was missing from every record, and "0 unmatched metric-looking lines" was said
    records, _, parser = parse(["iteration 12/150 | loss: 2.31 | lr: 1.0e-04",
                                "iteration 13/150 | loss: 2.30 | lr: 1.0e-04 | tokens=4096 |"])
    assert parser.format is not None and parser.format.name == "megatron"
    assert [(r["step"], r["loss"], r["lr"]) for r in records] == [(12, 2.31, 1e-4), (13, 2.3, 1e-4)]
    assert parser.counts["unmatched_metric_lines"] == 1  # the line whose `tokens=4096` no rule reads
