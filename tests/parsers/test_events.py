"""Events and the engine features behind them: eval results (an `eval` event and `eval_*` metrics of the current
step, from a printed Python dict), checkpoint saves (one `checkpoint` per save, a `checkpoint_saved` completion),
MindSpore's epoch length told by TimeMonitor, `ignore` rules, `pairs`, `null` words, JSONL float steps, and the
commented example format in docs/ (loaded and run, so it cannot rot)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import List

import pytest

from mstail.parsers import SourceParser, load_format_file
from mstail.parsers.amends import settled
from mstail.parsers.loader import parse_format
from mstail.parsers.pyliteral import parse_pydict

from .support import NAN, READ_TIME, ROOT, SAMPLES, assert_metrics, parse
from .test_mindformers import PREFIXES, local_ts, progress, v18_line

EVAL_MF = "Eval result: %s, eval time is %f s."  # mindformers/core/callback/callback.py EvalCallBack
EVAL_MS = "Eval result: epoch %d, metrics: %s"  # mindspore/train/model.py (model.fit)
FINISH = "Finish saving {key} of epoch {epoch} step {step} using {cost_time:.3f} seconds"  # CheckpointMonitor
LOSS_MONITOR = "epoch: %s step: %s, loss is %s"
TIME_MONITOR_1X = "epoch time: {:5.3f} ms, per step time: {:5.3f} ms"
TIME_MONITOR_2X = "{} epoch time: {:5.3f} ms, per step time: {:5.3f} ms"
TIME_MONITOR_ZOO = "epoch time: {:5.3f} s, per step time: {:5.3f} s"  # model-zoo scripts' own copies
OUT = PREFIXES["stdout_v16"]


# -- the pydict reader ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text,expected",
    [
        ("{'PerplexityMetric': {'loss': 2.93, 'PPL': 18.7}}", {"loss": 2.93, "PPL": 18.7}),
        ("{'accuracy': 0.9375, 'loss': 0.3011}", {"accuracy": 0.9375, "loss": 0.3011}),
        ("{'PerplexityMetric': {'loss': np.float64(2.93), 'PPL': np.float32(18.7)}}", {"loss": 2.93, "PPL": 18.7}),
        ("{'loss': nan, 'PPL': inf, 'delta': -inf, 'n': 12}", {"loss": NAN, "PPL": math.inf, "delta": -math.inf,
                                                               "n": 12}),
        ("{'loss': Tensor(shape=[], dtype=Float32, value= 0.663754)}", {"loss": 0.663754}),
        ("{'loss': array(2.5, dtype=float32), 'acc': [0.75], 'hist': [1, 2, 3]}", {"loss": 2.5, "acc": 0.75}),
        ("{'ok': True, 'missing': None, 'name': 'llama', 'F1 score': 71.2, 'rouge-1': 0.42}",
         {"ok": 1, "missing": None, "F1_score": 71.2, "rouge_1": 0.42}),
        # two metrics with a `loss` leaf: those two are named by their path, the unique ones by their leaf
        ("{'Perplexity': {'loss': 2.9, 'PPL': 18.7}, 'Other': {'loss': 3.1}}",
         {"Perplexity_loss": 2.9, "PPL": 18.7, "Other_loss": 3.1}),
        ("{}", {}),
    ],
)
def test_pydict_reader(text: str, expected: dict) -> None:
    got = parse_pydict(text)
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert (math.isnan(got[key]) if isinstance(value, float) and math.isnan(value) else got[key] == value), key


@pytest.mark.parametrize("text", ["[1, 2]", "2.93", "{'a': 1", "__import__('os').system('false')",
                                  "{'a': __import__('os').system('false')}" + "x"])
def test_pydict_reader_refuses_what_is_not_a_dict(text: str) -> None:
    with pytest.raises(ValueError):
        parse_pydict(text)


def test_pydict_reader_never_calls_anything() -> None:
    assert parse_pydict("{'a': __import__('os').getcwd(), 'b': open('/etc/passwd')}") == {}


# -- MindFormers EvalCallBack -----------------------------------------------------------------------------------------
def test_mindformers_eval_is_an_event_and_metrics_of_the_current_step() -> None:
    result = {"PerplexityMetric": {"loss": 2.93, "PPL": 18.7}}
    lines = [
        OUT(v18_line(1, 1, 4, 10, 3.0, avg=3.1)),
        OUT(progress(40.0, 2.0, 6)),
        OUT(EVAL_MF % (result, 12.5), ts="2024-04-02 09:14:03,610"),
        OUT(v18_line(1, 1, 5, 10, 2.9, avg=3.0)),
        OUT(progress(50.0, 2.0, 5)),
    ]
    records, events, parser = parse(lines)
    # One record per step: the eval numbers amend step 4's record (charted at that step).
    assert [(r["step"], r["line"]) for r in records] == [(4, 1), (5, 4)]
    eval_record = records[0]
    assert eval_record["epoch"] == 1
    assert {k: eval_record[k] for k in ("eval_loss", "eval_PPL", "eval_time_s", "samples_per_s")} == {
        "eval_loss": 2.93, "eval_PPL": 18.7, "eval_time_s": 12.5, "samples_per_s": 2.0}
    assert len(events) == 1
    event = events[0]
    assert (event["kind"], event["step"], event["line"]) == ("eval", 4, 3)
    assert (event["eval_loss"], event["eval_PPL"], event["eval_time_s"]) == (2.93, 18.7, 12.5)
    assert event["message"] == "Eval result: {'PerplexityMetric': {'loss': 2.93, 'PPL': 18.7}}, eval time is " \
                               "12.500000 s."
    assert parser.counts["field_errors"] == 0 and parser.counts["unmatched_metric_lines"] == 0


def test_eval_while_a_step_waits_for_its_progress_line_joins_that_step() -> None:
    lines = [OUT(v18_line(1, 1, 4, 10, 3.0, avg=3.1)), OUT(EVAL_MF % ({"acc": 0.5}, 1.0)), OUT(progress(40.0, 2.0, 6))]
    records, events, _ = parse(lines)
    assert len(records) == 1 and records[0]["eval_acc"] == 0.5 and records[0]["samples_per_s"] == 2.0
    assert [(e["kind"], e["step"]) for e in events] == [("eval", 4)]


def test_eval_nan_and_bad_dicts() -> None:
    lines = [
        OUT(v18_line(1, 1, 4, 10, 3.0, avg=3.1)),
        OUT(progress(40.0, 2.0, 6)),
        OUT(EVAL_MF % ({"PerplexityMetric": {"loss": NAN, "PPL": NAN}}, 1.0)),  # str() prints bare nan
        OUT(EVAL_MF % ("{'PerplexityMetric': {'loss': 2.9", 1.0)),  # no closing braces: not an eval line
        OUT("Eval result: {'PerplexityMetric': <object at 0x7f>}, eval time is 1.000000 s."),
    ]
    records, events, parser = parse(lines)
    assert math.isnan(records[0]["eval_loss"]) and math.isnan(records[0]["eval_PPL"])
    assert [e["kind"] for e in events] == ["eval", "eval"]  # the unreadable dict is still an event ...
    assert set(events[1]) - {"kind", "time", "line", "step", "message"} == {"eval_time_s"}  # ... without numbers
    assert parser.counts["field_errors"] == 1


def test_eval_before_any_step_is_an_event_only() -> None:
    records, events, _ = parse([OUT(EVAL_MF % ({"acc": 0.5}, 1.0))], fmt="mindformers")
    assert records == [] and [(e["kind"], e.get("step"), e["eval_acc"]) for e in events] == [("eval", None, 0.5)]


# -- MindSpore model.fit eval ---------------------------------------------------------------------------------------
def test_mindspore_eval_result_joins_the_epochs_last_step() -> None:
    lines = [
        LOSS_MONITOR % (1, 1, "0.5"), LOSS_MONITOR % (1, 2, "0.25"),
        TIME_MONITOR_2X.format("Train", 20.0, 10.0),
        TIME_MONITOR_2X.format("Eval", 8.0, 4.0),
        EVAL_MS % (1, {"accuracy": 0.9375, "loss": 0.3011, "Top5": 0.99}),
        LOSS_MONITOR % (2, 1, "0.125"),
    ]
    records, events, parser = parse(lines)
    assert [(r["step"], r["epoch"]) for r in records] == [(1, 1), (2, 1), (3, 2)]
    assert_metrics(records[1], {"loss": 0.25, "epoch_time_ms": 20.0, "step_time_ms": 10.0,
                                "eval_accuracy": 0.9375, "eval_loss": 0.3011, "eval_Top5": 0.99})
    assert [(e["kind"], e["step"], e["eval_accuracy"]) for e in events] == [("eval", 2, 0.9375)]
    assert parser.counts["unmatched_metric_lines"] == 0


# -- checkpoints ---------------------------------------------------------------------------------------------------
SAVE = ["......Saving ckpt......", "global_batch_size: 8", "epoch_num: 1", "step_num: %d", "global_step: %d"]


def save_lines(step: int, ts: str) -> List[str]:
    return [OUT(line % step if "%d" in line else line, ts=ts) for line in SAVE]


def test_sync_checkpoint_is_one_marker_and_a_completion_with_its_duration() -> None:
    lines = [OUT(v18_line(1, 1, 6, 6, 2.0, avg=2.1)), OUT(progress(100.0, 2.0, 0))]
    lines += save_lines(6, "2024-04-02 09:14:00,000")
    lines += [OUT(FINISH.format(key="ckpt", epoch=1, step=6, cost_time=2.8712), ts="2024-04-02 09:14:02,871")]
    lines += [OUT(FINISH.format(key="network", epoch=1, step=6, cost_time=1.5))]
    _, events, parser = parse(lines)
    assert [(e["kind"], e["step"]) for e in events] == [("checkpoint", 6), ("checkpoint_saved", 6),
                                                        ("checkpoint_saved", 6)]
    assert sum(e["kind"] == "checkpoint" for e in events) == 1
    assert (events[1]["what"], events[1]["save_s"]) == ("ckpt", 2.871)
    assert (events[2]["what"], events[2]["save_s"]) == ("network", 1.5)
    assert events[1]["time"] == pytest.approx(local_ts("2024-04-02 09:14:02,871"))
    assert parser.counts["field_errors"] == 0


def test_async_checkpoint_completion_takes_the_step_of_its_save() -> None:
    """An async save prints its completion at a later step; its epoch/step are MindSpore's (sink mode: the sink
    count and the step within the sink), so the event takes the step of the save it completes."""
    lines = [OUT(v18_line(1, 1, 6, 20, 2.0)), OUT(progress(30.0, 2.0, 9))]
    lines += save_lines(6, "2024-04-02 09:14:00,000")
    lines += [OUT(v18_line(1, 1, 7, 20, 1.9)), OUT(progress(35.0, 2.0, 9)),
              OUT(FINISH.format(key="ckpt", epoch=3, step=2, cost_time=4.25))]
    records, events, _ = parse(lines)
    assert [r["step"] for r in records] == [6, 7]
    assert [(e["kind"], e["step"], e.get("save_s")) for e in events] == [("checkpoint", 6, None),
                                                                         ("checkpoint_saved", 6, 4.25)]


# -- MindSpore's epoch length from TimeMonitor ----------------------------------------------------------------------
def loss_monitor_run(
    steps_per_epoch: int, epochs: int, interval: int, time_monitor: str, step_ms: float = 61.327
) -> List[str]:
    """LossMonitor(per_print_times=interval) prints at global multiples of the interval the step within the epoch
    ((cur_step_num - 1) % batch_num + 1); TimeMonitor prints per step time = epoch time / batch_num."""
    lines = []
    for epoch in range(1, epochs + 1):
        for in_epoch in range(1, steps_per_epoch + 1):
            global_step = (epoch - 1) * steps_per_epoch + in_epoch
            if global_step % interval == 0:
                lines.append(LOSS_MONITOR % (epoch, in_epoch, "%.4f" % (1.0 / global_step)))
        epoch_ms = step_ms * steps_per_epoch
        if time_monitor == "ms":
            lines.append(TIME_MONITOR_2X.format("Train", epoch_ms, epoch_ms / steps_per_epoch))
        elif time_monitor == "ms 1.x":
            lines.append(TIME_MONITOR_1X.format(epoch_ms, epoch_ms / steps_per_epoch))
        elif time_monitor == "s":
            lines.append(TIME_MONITOR_ZOO.format(epoch_ms / 1000, epoch_ms / 1000 / steps_per_epoch))
    return lines


DRIFT_CASES = [(tm, spe, every) for tm in ("ms", "ms 1.x") for spe, every in [(23, 5), (1875, 100), (20, 5), (7, 1),
                                                                             (10, 3), (5000, 999)]]
DRIFT_CASES += [("s", 23, 5), ("s", 7, 1), ("s", 10, 3), ("s", 250, 7)]


@pytest.mark.parametrize("time_monitor,steps_per_epoch,interval", DRIFT_CASES)
def test_global_step_does_not_drift_when_the_interval_does_not_divide_the_epoch(
    steps_per_epoch: int, interval: int, time_monitor: str
) -> None:
    step_ms = 61.327 if time_monitor.startswith("ms") else 1327.5  # model-zoo "s" variants: slow steps
    lines = loss_monitor_run(steps_per_epoch, 4, interval, time_monitor, step_ms)
    records, _, parser = parse(lines)
    expected = [s for s in range(1, 4 * steps_per_epoch + 1) if s % interval == 0]
    assert [r["step"] for r in records] == expected
    assert [r["loss"] for r in records] == [float("%.4f" % (1.0 / s)) for s in expected]
    assert {r["segment"] for r in records} == {0}
    timed = [r for r in records if "epoch_time_ms" in r]
    assert len(timed) == 4 and timed[0]["epoch_time_ms"] == pytest.approx(step_ms * steps_per_epoch, abs=1)
    assert timed[0]["step_time_ms"] == pytest.approx(step_ms, abs=1)
    assert parser.counts["field_errors"] == 0


def test_a_too_coarse_time_monitor_does_not_set_the_epoch_length() -> None:
    """Seconds with three decimals cannot tell 1875 steps of 61 ms apart from 1874 or 1885: the epoch length is then
    learnt from the printed steps, as without TimeMonitor (exact when the epoch's last step is printed)."""
    lines = loss_monitor_run(1875, 3, 125, "s")  # 125 divides 1875: the last step of each epoch is printed
    assert "per step time: 0.061 s" in lines[15]
    records, _, _ = parse(lines)
    assert [r["step"] for r in records] == list(range(125, 3 * 1875 + 1, 125))


def test_time_monitor_told_length_beats_the_learnt_one() -> None:
    lines = [LOSS_MONITOR % (1, s, "0.5") for s in (5, 10, 15, 20)]  # 23 steps, every 5th printed
    lines += [TIME_MONITOR_2X.format("Train", 23 * 65.811, 65.811)]
    lines += [LOSS_MONITOR % (2, s, "0.5") for s in (2, 7)]
    records, _, _ = parse(lines)
    assert [r["step"] for r in records] == [5, 10, 15, 20, 25, 30]


def test_model_zoo_time_monitor_in_seconds_is_milliseconds() -> None:
    lines = [LOSS_MONITOR % (1, 1, "0.5"), LOSS_MONITOR % (1, 2, "0.25"), TIME_MONITOR_ZOO.format(1.005, 0.5025),
             LOSS_MONITOR % (2, 1, "0.125")]
    assert lines[2] == "epoch time: 1.005 s, per step time: 0.502 s"
    records, _, _ = parse(lines)
    assert_metrics(records[1], {"loss": 0.25, "epoch_time_ms": 1005.0, "step_time_ms": 502.0})
    assert records[2]["step"] == 3


def test_without_time_monitor_the_epoch_length_is_learnt_from_the_steps() -> None:
    """No TimeMonitor: the largest step seen in an earlier epoch is the epoch length (exact when every step or the
    last step of each epoch is printed)."""
    lines = [LOSS_MONITOR % (e, s, "0.5") for e in (1, 2, 3) for s in range(1, 8)]
    records, _, _ = parse(lines)
    assert [r["step"] for r in records] == list(range(1, 22))


# -- JSONL ------------------------------------------------------------------------------------------------------------
def test_jsonl_step_written_as_a_float() -> None:
    lines = [json.dumps({"step": 2.0, "epoch": 1.0, "loss": 0.5}), json.dumps({"step": 3.5, "loss": 0.25}),
             json.dumps({"step": 4, "loss": 0.125})]
    records, _, parser = parse(lines)
    assert parser.format is not None and parser.format.name == "jsonl"
    assert [(r["step"], type(r["step"]), r.get("epoch")) for r in records] == [(2, int, 1), (4, int, None)]
    assert type(records[0]["epoch"]) is int


# -- schema features through a user format ------------------------------------------------------------------------
USER_FORMAT = r"""
description = "a made-up trainer exercising ignore, pairs, null, record, same_step_as, epoch_length"
error_levels = ["ERROR"]

[[prefix]]
name = "level"
regex = '^(?P<level>[A-Z]+): (?P<message>.*)$'

[[rule]]
name = "step"
wait_for = ["epoch_done"]  # mstail 0.1's key: still accepted, no effect
regex = '^it (?P<epoch>\d+)/(?P<step_in_epoch>\d+) loss=(?P<loss>\S+) norm=(?P<grad_norm>\S+)(?P<_rest>.*)$'
fields.grad_norm = { type = "float", null = ["-", "NaN"] }
pairs = { group = "_rest", regex = ' (?P<name>\w+)=(?P<value>\S+)', names = 'aux_\w+', prefix = "" }

[[rule]]
name = "epoch_done"
kind = "attach"
epoch_length = ["epoch_s", "step_s"]
regex = '^epoch took (?P<epoch_s>\S+)s, (?P<step_s>\S+)s/it$'

[[rule]]
name = "val"
kind = "event"
event = "eval"
record = true
regex = '^val (?P<result>\{.*\})$'
fields.result = { type = "pydict", prefix = "val_" }

[[rule]]
name = "save"
kind = "event"
event = "checkpoint"
regex = '^saving$'

[[rule]]
name = "saved"
kind = "event"
event = "checkpoint_saved"
same_step_as = "checkpoint"
regex = '^saved in (?P<save_s>\S+)s$'

[[rule]]
name = "noise"
kind = "ignore"
regex = '^debug loss=|^known harmless'
"""


def user_parser() -> SourceParser:
    fmt = parse_format(USER_FORMAT, "user.toml", "user")
    return SourceParser([fmt])


def feed(parser: SourceParser, lines: List[str]):  # type: ignore[no-untyped-def]
    fed = []
    for number, line in enumerate(lines, 1):
        fed += parser.feed(line, number, READ_TIME)
    fed += parser.flush(READ_TIME, force=True)
    items = list(settled(fed))
    return [i.data for i in items if i.kind == "record"], [i.data for i in items if i.kind == "event"]


def test_user_format_features() -> None:
    parser = user_parser()
    lines = [
        "INFO: it 1/1 loss=2.0 norm=- aux_z=0.5 lr=0.1 aux_bad=x",
        "INFO: debug loss=1.99",  # ignored: not counted as an unmatched metric-looking line
        "INFO: it 1/4 loss=1.5 norm=NaN",
        "INFO: saving",
        "INFO: epoch took 9.0s, 1.5s/it",  # 6 steps per epoch, although only steps 1 and 4 were printed
        "INFO: saved in 3.5s",
        "INFO: val {'m': {'acc': 0.5}}",
        "INFO: it 2/2 loss=1.0 norm=nan",
        "ERROR: known harmless",  # ignored, even at an error level
        "ERROR: real trouble",
        "  detail",
    ]
    records, events = feed(parser, lines)
    assert [(r["step"], r["line"]) for r in records] == [(1, 1), (4, 3), (8, 8)]
    assert_metrics(records[0], {"loss": 2.0, "grad_norm": None, "aux_z": 0.5})  # aux_bad: a field error
    assert_metrics(records[1], {"loss": 1.5, "grad_norm": None, "epoch_s": 9.0, "step_s": 1.5, "val_acc": 0.5})
    assert math.isnan(records[2]["grad_norm"])
    assert [(e["kind"], e["step"]) for e in events] == [("checkpoint", 4), ("checkpoint_saved", 4), ("eval", 4),
                                                        ("error", 8)]
    assert events[3]["message"] == "real trouble\n  detail"
    assert parser.counts["field_errors"] == 1 and parser.counts["unmatched_metric_lines"] == 0


def test_ignore_rules_do_not_lock_detection_and_close_an_open_event() -> None:
    parser = user_parser()
    records, events = feed(parser, ["INFO: debug loss=1.0", "ERROR: real trouble", "INFO: debug loss=1.0",
                                    "  not part of the error"])
    assert records == [] and [e["message"] for e in events] == ["real trouble"]
    assert parser.format is None or parser.counts["records"] == 0


def test_pairs_names_filter_and_reserved_names() -> None:
    fmt = parse_format(
        "[[rule]]\nname = \"s\"\nregex = '^s (?P<step>\\d+)(?P<tail>.*)$'\n"
        "pairs = { group = \"tail\", regex = ' (?P<name>\\w+)=(?P<value>\\S+)', type = \"int\" }\n",
        "p.toml", "p",
    )
    parser = SourceParser([fmt])
    records, _ = feed(parser, ["s 1 a=1 time=5 step=9 b=2.0 a=3"])
    # the pairs group is no metric; reserved names are skipped; the first of a repeated name wins; "2.0" is int 2
    assert_metrics(records[0], {"a": 1, "b": 2})
    assert records[0]["step"] == 1 and records[0]["time"] == READ_TIME


# -- the commented example format in docs/ -------------------------------------------------------------------------
EXAMPLE = ROOT / "docs" / "example-format.toml"


def test_example_format_loads_and_parses_its_own_examples() -> None:
    fmt = load_format_file(EXAMPLE)
    assert fmt.name == "example" and fmt.description
    text = EXAMPLE.read_text(encoding="utf-8")
    # every schema key appears in the example (set, or shown in a comment: epoch_length needs step_in_epoch logs)
    for table in ("[[prefix]]", "[[rule]]", "[rule.fields]", "[rule.pairs]", "[rule.pairs.fields]"):
        assert table in text, table
    keys = ["name", "description", "priority", "error_levels", "jsonl", "regex", "time_format", "kind",
            "event", "multiline", "record", "same_step_as", "epoch_length", "type", "rename", "unit", "scale", "null",
            "prefix", "group", "names", "fallback", "lower"]
    for key in keys:
        assert re.search(r"(^|[\s{,#])" + key + r" = ", text, re.M), key
    lines = [line[len("#> "):] for line in text.splitlines() if line.startswith("#> ")]
    assert len(lines) >= 8, "the example's sample lines (#> ...) are missing"
    records, events = feed(SourceParser([fmt]), lines)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert_metrics(records[0], {"loss": 2.5, "step_time_ms": 512.0, "lr": 1e-4, "grad_norm": None, "aux_loss": 0.25,
                                "tokens_per_s": 1520.0})
    assert {"eval_loss": 2.25, "eval_accuracy": 0.5}.items() <= records[1].items()  # pydict rename acc -> accuracy
    assert math.isnan(records[2]["loss"])
    assert [e["kind"] for e in events] == ["start", "eval", "checkpoint", "checkpoint_saved", "error", "end"]
    assert events[3]["step"] == 2 and events[3]["save_s"] == 1.5
    assert events[4]["message"].splitlines()[0] == "Traceback (most recent call last):"


def test_example_format_as_a_user_file(tmp_path: Path) -> None:
    """Copied into the user folder, it loads next to the built-ins without replacing any of them."""
    from mstail.parsers import load_formats

    folder = tmp_path / "formats"
    folder.mkdir()
    (folder / "example.toml").write_text(EXAMPLE.read_text(encoding="utf-8"), encoding="utf-8")
    names = [f.name for f in load_formats(user_dir=folder)]
    assert names[0] == "example" and {"mindformers", "mindformers_pynative", "mindspore", "jsonl"} <= set(names)


# -- the graph-mode worker log with evals, async and sync saves, and a thread's exception ----------------------------
def test_sample_v19_eval_worker_log() -> None:
    records, events, parser = parse((SAMPLES / "mindformers_v1.9_eval_worker_0.log").read_text("utf-8").splitlines())
    assert parser.format is not None and parser.format.name == "mindformers"
    steps = records
    evals = [r for r in records if "eval_loss" in r]  # the eval numbers amend the step they follow
    assert [r["step"] for r in steps] == list(range(1, 13))
    assert [(r["step"], r["epoch"]) for r in evals] == [(4, 1), (8, 2)]
    assert {"eval_loss": 9.412, "eval_PPL": 12236.41, "eval_time_s": 12.5}.items() <= evals[0].items()
    assert {"eval_loss": 7.6518, "eval_PPL": 2106.28, "eval_time_s": 11.875}.items() <= evals[1].items()  # np.float64
    assert [(e["kind"], e.get("step")) for e in events] == [
        ("start", None), ("eval", 4), ("checkpoint", 6), ("checkpoint_saved", 6), ("eval", 8), ("error", 9),
        ("checkpoint", 12), ("checkpoint_saved", 12), ("end", 12),
    ]
    assert [e["save_s"] for e in events if e["kind"] == "checkpoint_saved"] == [3.214, 2.871]
    error = events[5]
    assert error["message"].splitlines()[0] == "Exception in thread Thread-5 (_report_loop):"
    assert error["message"].splitlines()[-1] == "ConnectionResetError: [Errno 104] Connection reset by peer"
    assert error["time"] == READ_TIME  # raw stderr lines carry no timestamp
    assert all(set(r) >= {"samples_per_s", "grad_norm", "throughput_tflops", "loss_avg"} for r in steps)
    assert parser.counts["field_errors"] == 0 and parser.counts["unmatched_metric_lines"] == 0
