"""The generic step-line reader (parsers/formats/generic.toml, `fallback = true`; `SourceParser._generic`): a corpus of
lines written from the print formats of real suites' published callbacks (the source is named above each group), the
lines it must leave alone, and the rule that it never takes a line a specific format has a rule for."""

from __future__ import annotations

import re
from mstail.parsers import SourceParser, format_table
from mstail.parsers.explain import Explainer
from mstail.parsers.interleave import InterleavedParser

from .support import FORMATS, SAMPLES, assert_metrics, parse, parse_file

# -- MindYOLO mindyolo/utils/trainer_factory.py (Trainer.train_step, Trainer.train), its logger
#    "%(asctime)s [%(levelname)s] %(message)s" (mindyolo/utils/logger.py) --------------------------------------------
YOLO_LOSS = ("2024-12-25 09:58:42,787 [INFO] Epoch 1/200, Step 100/3995, imgsize (640, 640), loss: 11.6707, "
             "lbox: 3.6262, lcls: 5.5689, dfl: 2.4756, cur_lr: 0.09920000284910202")
YOLO_TIME = "2024-12-25 09:58:42,790 [INFO] Epoch 1/200, Step 100/3995, step time: 5736.71 ms"
YOLO_NEXT = "2024-12-25 09:58:52,787 [INFO] Epoch 1/200, Step 200/3995, imgsize (640, 640), loss: 10.5, cur_lr: 0.098"
YOLO_EVAL = "2024-12-25 10:00:52,790 [INFO] Epoch 1/200, eval accuracy: 0.512, run_eval time: 30.123 s."
YOLO_EPOCH = "2024-12-25 10:00:52,801 [INFO] Epoch 1/200, epoch time: 5.20 min."
YOLO_SINK = "2024-12-25 10:10:00,000 [INFO] Epoch 2/200, Step 3995/3995, loss: 9.1234, lbox: 3.0001, cur_lr: 0.0971"
YOLO_OVERFLOW = ("2024-12-25 09:58:53,790 [WARNING] Epoch 1/200, Step 201/3995, accumulate: 2, this step grad overflow, "
                 "drop. Loss scale adjust to 1024.0")
YOLO_ARGS = ["2024-12-25 09:55:01,112 [INFO] Args:", "2024-12-25 09:55:01,112 [INFO] --> epochs: 200",
             "2024-12-25 09:55:01,113 [INFO] --> warmup_epochs: 3", "2024-12-25 09:55:01,113 [INFO] --> lr_init: 0.01"]
# -- MindCV mindcv/utils/callbacks.py (StateMonitor.on_train_step_end) ------------------------------------------------
MINDCV = "Epoch: [3/90], batch: [100/196], loss: 6.543210, lr: 0.099000, time: 12.345678s"
# -- MindOCR mindocr/utils/callbacks.py (EvalSaveCallback.on_train_step_end) -------------------------------------------
MINDOCR = ("epoch: [2/10] step: [50/500], loss: 0.512345, lr: 0.001000, per step time: 123.456 ms, "
           "fps per card: 12.34 img/s")
# -- MindSpore model zoo ResNet / MobileNetV2 callbacks (epoch_end: "epoch: [{:3d}/{:3d}], epoch time: {:5.3f}, steps:
#    {:5d}, per step time: {:5.3f}, avg loss: {:5.3f}, lr:[{:8.6f}]", times in ms) and MobileNetV2's train.py
#    ("epoch[{}/{}], iter[{}] cost: {:5.3f}, per step time: {:5.3f}, avg loss: {:5.3f}") -----------------------------
ZOO = ["epoch: [  1/ 90], epoch time: 123456.789, steps:  5004, per step time: 24.672, avg loss: 6.900, lr:[0.098889]",
       "epoch: [  2/ 90], epoch time: 120000.000, steps:  5004, per step time: 23.981, avg loss: 5.100, lr:[0.097778]"]
MOBILENET = ["epoch[1/200], iter[625] cost: 15234.567, per step time: 24.375, avg loss: 2.301",
             "epoch[2/200], iter[625] cost: 15000.000, per step time: 24.000, avg loss: 2.101"]
# -- the model-zoo style line in seconds, "key=value" pairs --------------------------------------------------
ZOO_S = ["epoch[1], epoch time: 301.50s, per step time: 0.0602s, loss=2.280000, lr=0.000970",
         "epoch[2], epoch time: 299.50s, per step time: 0.0598s, loss=2.080000, lr=0.000940"]
# -- hand-written training loops ----------------------------------------------------------------------------------
LOOP = ["step: 20, loss is 2.3025, lr: [0.01], grad norm: 1.25", "global_step=40 loss=2.1 lr=0.01 step_time=0.5s"]


def test_mindyolo_loss_line_and_its_step_time_line_are_one_record() -> None:
    records, events, parser = parse([*YOLO_ARGS, YOLO_LOSS, YOLO_TIME, YOLO_OVERFLOW, YOLO_NEXT, YOLO_EVAL, YOLO_EPOCH,
                                     YOLO_SINK])
    assert parser.state.format is None  # the generic reader never locks a file
    assert [r["step"] for r in records] == [100, 200, 3995 + 3995] and not events
    assert_metrics(records[0], {"loss": 11.6707, "lbox": 3.6262, "lcls": 5.5689, "dfl": 2.4756,
                                "lr": 0.09920000284910202, "step_time_ms": 5736.71})
    # the epoch's eval and time join its last step (the WARNING line and the argument dump are no steps)
    assert_metrics(records[1], {"loss": 10.5, "lr": 0.098, "eval_accuracy": 0.512, "run_eval_time_s": 30.123,
                                "epoch_time_ms": 312000.0})
    assert records[0]["epoch"] == 1 and records[0]["time"] > 1.7e9 and parser.meta["total_steps"] == 200 * 3995
    assert parser.counts["amends"] == 3 and parser.counts["unmatched_metric_lines"] == 0


def test_suites_step_lines() -> None:
    records, _, _ = parse([MINDCV])
    assert records[0]["step"] == 2 * 196 + 100 and records[0]["epoch"] == 3
    assert_metrics(records[0], {"loss": 6.54321, "lr": 0.099, "time_s": 12.345678})
    records, _, _ = parse([MINDOCR])
    assert records[0]["step"] == 500 + 50
    assert_metrics(records[0], {"loss": 0.512345, "lr": 0.001, "step_time_ms": 123.456, "fps_per_card": 12.34})


def test_epoch_summaries_are_records_at_their_epoch_and_the_source_says_so() -> None:
    records, _, parser = parse(ZOO)
    assert [r["step"] for r in records] == [1, 2] and parser.meta["x_axis"] == "epoch"
    assert_metrics(records[0], {"epoch_time_ms": 123456.789, "step_time_ms": 24.672, "loss": 6.9, "lr": 0.098889})
    records, _, parser = parse(ZOO_S)
    assert [r["step"] for r in records] == [1, 2] and parser.meta["x_axis"] == "epoch"
    assert_metrics(records[1], {"epoch_time_ms": 299500.0, "step_time_ms": 59.8, "loss": 2.08, "lr": 0.00094})


def test_an_iteration_count_per_epoch_gives_global_steps() -> None:
    records, _, _ = parse(MOBILENET)  # iter[625] printed at each epoch's end: steps 625, 1250
    assert [r["step"] for r in records] == [625, 1250]
    assert_metrics(records[0], {"cost": 15234.567, "step_time_ms": 24.375, "loss": 2.301})


def test_hand_written_loops() -> None:
    records, _, _ = parse(LOOP)
    assert [r["step"] for r in records] == [20, 40]
    assert_metrics(records[0], {"loss": 2.3025, "lr": 0.01, "grad_norm": 1.25})
    assert_metrics(records[1], {"loss": 2.1, "lr": 0.01, "step_time_ms": 500.0})


NOT_STEPS = [
    *YOLO_ARGS,
    YOLO_OVERFLOW,
    "Namespace(batch_size=32, epoch=10, lr=0.1, step=5)",
    "epoch: 10",  # a YAML dump: a counter alone
    "  step: 20",
    "config: {'epoch': 10, 'lr': 0.01}",
    "2024-12-25 09:58:42,787 [INFO] Saving checkpoint at step 500 to /out/ckpt",
    "/usr/lib/python3/site-packages/x.py:12: UserWarning: step 5 loss: 2.3",
    "WARNING: epoch 3 lr: 0.1 is large",
    "Traceback (most recent call last): step 5, loss: 1",
    "[WARNING] ME(1:2,MainProcess):2026-01-20-03:15:44.908.089 [a.py:1] epoch: 1, loss: 2.0",
    "the warmup_steps: 100, max_epochs: 3",
    "steps: 100, lr: 0.1",
]


def test_config_dumps_warnings_and_counters_without_numbers_are_no_records() -> None:
    records, events, parser = parse(NOT_STEPS)
    assert records == [] and parser.counts["amends"] == 0, records


def test_lines_a_specific_format_owns_are_never_the_generic_readers() -> None:
    # TrainingStateMonitor (mindformers, kind ignore) and MindSpore's LossMonitor (mindspore, record): a counter and a
    # number each, but a built-in has a rule for them.
    tsm = "Epoch:[  1/  2], step:[    3/   25] local_norm/x: 0.1234"
    records, _, parser = parse([tsm])
    assert records == [] and parser.state.format is None
    records, _, parser = parse([YOLO_LOSS, "epoch: 1 step: 5, loss is 2.368", "epoch: 1 step: 10, loss is 2.1"])
    assert parser.state.format == "mindspore"  # the specific format's step line locks the file...
    assert len(records) == 3 and [r["loss"] for r in records[1:]] == [2.368, 2.1] and "lbox" in records[0]
    # ...and from then on it alone reads it: a generic-looking line is no longer a step
    records, _, parser = parse(["epoch: 1 step: 5, loss is 2.368", YOLO_NEXT])
    assert [r["step"] for r in records] == [5]
    for sample in ("mindformers_v1.3_sink_info.log", "mindformers_v1.8_nonsink_worker_0.log",
                   "mindformers_pynative_worker_0.log", "mindspore_lossmonitor.log", "megatron_mindspeed_llm.log"):
        records, _, parser = parse_file(SAMPLES / sample)
        assert parser.state.format != "generic" and all("lbox" not in r for r in records)


def test_sample_log() -> None:
    records, events, parser = parse_file(SAMPLES / "mindyolo_train.log")
    assert [r["step"] for r in records] == [2, 4, 6, 8, 10, 12] and not events
    assert all("step_time_ms" in r and "loss" in r and "lr" in r for r in records)
    assert [r.get("eval_accuracy") for r in records] == [None, None, 0.4, None, None, 0.5]
    assert [r.get("epoch_time_ms") for r in records] == [None, None, 75600.0, None, None, 75600.0]


def test_explain_says_when_the_generic_reader_took_a_line() -> None:
    explainer = Explainer(InterleavedParser(lambda: SourceParser(FORMATS)))
    shown = [explainer.explain("log", n, line, 0.0) for n, line in enumerate([YOLO_LOSS, YOLO_TIME, "epoch: 10"], 1)]
    assert "generic/step_line (GENERIC READER: record)" in shown[0]
    assert "generic/step_line (GENERIC READER: amend of the last record)" in shown[1] and "step_time_ms=5736.71" in shown[1]
    assert shown[2] is not None and "GENERIC READER: nothing" in shown[2]


def test_the_pairs_see_at_most_4_KiB() -> None:
    """tests/parsers/test_regex_bounds.py times the pairs regex on 4 KiB (GENERIC_PAIRS_CHARS): its rule's group must
    never hand it more."""
    from .test_regex_bounds import GENERIC_PAIRS_CHARS

    rule = {r.name: r for r in format_table(FORMATS)["generic"].rules}["step_line"]
    found = rule.regex.search("step: 5, " + "loss: 1.5, " * 100_000)
    assert found is not None and len(found["_pairs"]) == GENERIC_PAIRS_CHARS
    assert re.search(r"\(\?P<_pairs>\.\{0,(\d+)\}\)", rule.regex.pattern).group(1) == str(GENERIC_PAIRS_CHARS)


def test_forced_generic_format_reads_the_same() -> None:
    records, _, _ = parse([YOLO_LOSS, YOLO_TIME], fmt="generic")
    assert len(records) == 1 and records[0]["step_time_ms"] == 5736.71


def test_a_pair_name_over_256_characters_is_no_metric() -> None:
    """Pair names are normalised (`loader._NOT_WORD`) only up to MAX_PAIR_NAME characters: a runaway name is skipped."""
    from mstail.parsers.loader import MAX_PAIR_NAME, parse_format

    fmt = parse_format("[[rule]]\nregex = 'step (?P<step>\\d+)(?P<_rest>.*)'\n[rule.pairs]\ngroup = \"_rest\"\n"
                       "regex = ' (?P<name>[^=]+)=(?P<value>\\d+)'\n", "mine.toml", "mine")
    long_name = "a b" * (MAX_PAIR_NAME // 3 + 1)
    items = SourceParser([fmt]).feed(f"step 1 ok now=1 {long_name}=2", 1, 0.0)
    assert [(i.kind, {k: v for k, v in i.data.items() if k not in ("time", "estimated", "line", "segment")}) for i in items] == [
        ("record", {"step": 1, "ok_now": 1.0})]


# -- counters in parentheses, an epoch counted from 0 (a PyTorch-style print: "Epoch:[{}/{}]({}/{})") --------------
PAREN = ["Epoch:[0/19](100/24681) loss:8.600 lr:0.00019998 epoch_Time:97.9min:",
         "Epoch:[0/19](200/24681) loss:8.400 lr:0.00019996 epoch_Time:98.1min:",
         "Epoch:[1/19](100/24681) loss:7.900 lr:0.00019990 epoch_Time:97.2min:"]


def test_a_step_counter_in_parentheses_after_an_epoch_counted_from_0() -> None:
    records, _, parser = parse(PAREN)  # every record was at step 0 ("no step counter")
    assert [(r["step"], r["epoch"]) for r in records] == [(100, 0), (200, 0), (24781, 1)]
    assert_metrics(records[0], {"loss": 8.6, "lr": 0.00019998, "epoch_time_ms": 97.9 * 60000})
    assert parser.meta.get("x_axis") is None and parser.meta["total_steps"] == 19 * 24681


def test_bracketed_and_parenthesised_step_counters() -> None:
    records, _, parser = parse(["step (30/100) loss=2.0", "Epoch:[0] (10) loss: 6.9", "Epoch:[0] (20) loss: 6.8",
                                "Epoch:[1] (10) loss: 6.7", "iter[40/100] loss: 1.5"])
    assert [r["step"] for r in records] == [30, 10, 20, 30, 40]
    assert [r["segment"] for r in records] == [0, 1, 1, 1, 1]
