"""The built-in `trainer` format: the dicts a Hugging Face-style Trainer prints at each logging step
(transformers trainer_callback.py ProgressCallback.on_log: `self.training_bar.write(str(logs))`; MindNLP's
mindnlp/engine/callbacks.py is the same code), written here with `str()` of real dicts as those callbacks do; plus the
sample log, split as `mstail parse` splits it (tqdm's `\\r` redraws around the dicts)."""

from __future__ import annotations

from .support import NAN, SAMPLES, assert_metrics, parse, parse_file, same


def test_logging_steps_are_numbered_with_canonical_names() -> None:
    lines = [str({"loss": 2.3042, "grad_norm": 1.2451, "learning_rate": 5e-05, "epoch": 0.1}),
             str({"loss": 2.1, "grad_norm": float("nan"), "learning_rate": 4.5e-05, "epoch": 0.2})]
    records, events, parser = parse(lines)
    assert parser.state.format == "trainer" and not events
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["estimated"].split() == ["step", "time"] for r in records)  # a count of logging steps, not the step
    assert_metrics(records[0], {"loss": 2.3042, "grad_norm": 1.2451, "lr": 5e-05, "epoch_progress": 0.1})
    assert same(records[1]["grad_norm"], NAN) and "epoch" not in records[1]


def test_scalar_reprs_eval_and_the_final_summary() -> None:
    lines = [
        "{'loss': np.float64(2.5), 'grad_norm': tensor(1.25, device='npu:0'), 'learning_rate': 1e-05, 'epoch': 0.5}",
        str({"eval_loss": 2.05, "eval_runtime": 1.2345, "eval_samples_per_second": 81.0, "epoch": 0.5}),
        str({"train_runtime": 50.1, "train_samples_per_second": 31.9, "train_steps_per_second": 2.0, "train_loss": 2.2,
             "epoch": 1.0}),
    ]
    records, events, _ = parse(lines)
    assert_metrics(records[0], {"loss": 2.5, "grad_norm": 1.25, "lr": 1e-05, "epoch_progress": 0.5,
                                "eval_loss": 2.05, "eval_runtime": 1.2345, "eval_samples_per_second": 81.0})
    assert [(e["kind"], e["step"]) for e in events] == [("eval", 1), ("end", 1)]
    assert events[1]["train_loss"] == 2.2 and events[1]["train_runtime"] == 50.1


def test_ms_swift_dicts_say_their_global_step() -> None:
    # ms-swift adds these keys to the logs it prints: strings are not metrics, 'global_step/max_steps' is the step.
    line = str({"loss": 1.2, "grad_norm": 0.5, "learning_rate": 1e-05, "memory(GiB)": 12.5, "train_speed(iter/s)": 0.5,
                "epoch": 0.3, "global_step/max_steps": "30/100", "percentage": "30.00%", "elapsed_time": "1m"})
    records, _, parser = parse([line])
    assert records[0]["step"] == 30 and parser.meta["total_steps"] == 100 and records[0]["estimated"] == "time"
    assert_metrics(records[0], {"loss": 1.2, "grad_norm": 0.5, "lr": 1e-05, "memory_GiB": 12.5,
                                "train_speed_iter_s": 0.5, "epoch_progress": 0.3})


def test_a_dict_without_loss_is_not_a_step() -> None:
    records, _, _ = parse([str({"learning_rate": 1e-05, "epoch": 0.5}), "{'a': 1}"])
    assert records == []


def test_sample_log() -> None:
    records, events, parser = parse_file(SAMPLES / "hf_trainer_stdout.log")  # split as `mstail parse` splits it
    assert parser.state.format == "trainer"
    assert [r["step"] for r in records] == list(range(1, 11))
    assert [r["loss"] for r in records] == [round(2.4 - 0.1 * k, 4) for k in range(1, 11)]
    assert same(records[5]["grad_norm"], NAN) and records[4]["eval_loss"] == 2.05
    assert [(e["kind"], e["step"]) for e in events] == [("eval", 5), ("end", 10)]
    assert parser.counts["unmatched_metric_lines"] == 0
