"""Global steps of MindSpore's LossMonitor(N), which prints only the epoch and the step within it (issue 15).

The lines are made by the arithmetic of MindSpore 2.10's LossMonitor and TimeMonitor (mindspore/train/callback/
_loss_monitor.py, _time_monitor.py): a line when at least N steps passed since the last one, the step within the
epoch `(cur_step_num - 1) % batch_num + 1`; TimeMonitor at each epoch end, per-step time = epoch time / batch_num.
In dataset-sink mode the callbacks run once per sink of `sink_size` steps, which is then the "epoch" they report.
The real runs are in tests/callback/test_live_equals_offline.py.
"""

from __future__ import annotations

from typing import List, Tuple

import pytest

from .support import parse

LOSS_MONITOR = "epoch: %s step: %s, loss is %s"
TIME_MONITOR = "Train epoch time: {:5.3f} ms, per step time: {:5.3f} ms"


def loss_monitor_run(steps_per_epoch: int, epochs: int, every: int, time_monitor: bool,
                     sink_size: int = 0) -> Tuple[List[str], List[int]]:
    """The stdout of a run, and the global step of each LossMonitor line in it."""
    if sink_size:  # one callback per sink, which is the "epoch" the callbacks report
        epochs, batch_num, calls, advance = epochs * steps_per_epoch // sink_size, sink_size, 1, sink_size
    else:
        batch_num, calls, advance = steps_per_epoch, steps_per_epoch, 1
    lines, truth, last_print, cur = [], [], 0, 0
    for epoch in range(1, epochs + 1):
        for _ in range(calls):
            cur += advance
            if cur - last_print >= every:
                last_print = cur
                lines.append(LOSS_MONITOR % (epoch, (cur - 1) % batch_num + 1, round(3.0 - cur / 1000, 4)))
                truth.append(cur)
        if time_monitor:
            lines.append(TIME_MONITOR.format(65.811 * batch_num, 65.811))
    return lines, truth


@pytest.mark.parametrize("steps_per_epoch, every", [(20, 1), (20, 5), (20, 7), (22, 5), (10, 10), (7, 3), (20, 19)])
@pytest.mark.parametrize("time_monitor", [False, True])
def test_every_printed_step_gets_its_global_step(steps_per_epoch: int, every: int, time_monitor: bool) -> None:
    lines, truth = loss_monitor_run(steps_per_epoch, 4, every, time_monitor)
    records, _, parser = parse(lines)
    assert [r["step"] for r in records] == truth
    assert parser.meta.get("steps_per_epoch") in (steps_per_epoch, None)  # None: one epoch's lines never said it
    assert {r["segment"] for r in records} == {0}


def test_issue_case_loss_monitor_7_with_20_steps_an_epoch() -> None:
    lines, truth = loss_monitor_run(20, 3, 7, time_monitor=False)
    records, _, parser = parse(lines)
    assert truth == [7, 14, 21, 28, 35, 42, 49, 56]
    assert [r["step"] for r in records] == truth  # was [7, 14, 15, 22, 29, 32, 39, 46]
    assert parser.meta["steps_per_epoch"] == 20


def test_printing_less_than_once_an_epoch_is_exact_with_time_monitor() -> None:
    lines, truth = loss_monitor_run(20, 6, 25, time_monitor=True)
    records, _, parser = parse(lines)
    assert [r["step"] for r in records] == truth
    assert parser.meta["steps_per_epoch"] == 20


def test_printing_less_than_once_an_epoch_without_time_monitor_says_its_steps_are_guessed() -> None:
    # Epoch length 20 printing every 25 steps gives the same lines as length 15 printing every 20 (e2 s5, e3 s10,
    # ...): no parser can know. The steps are a guess and the source says so.
    lines, _ = loss_monitor_run(20, 6, 25, time_monitor=False)
    records, _, parser = parse(lines)
    assert len(records) == 4 and parser.meta["steps_per_epoch"] == "guessed"
    steps = [r["step"] for r in records]
    assert steps == sorted(steps) and {r["segment"] for r in records} == {0}
    # ... and so does each record whose step is a guess
    assert all(r["estimated"].split() == ["step", "time"] for r in records)


@pytest.mark.parametrize("every", [1, 10, 20])
def test_dataset_sink_mode(every: int) -> None:
    lines, truth = loss_monitor_run(40, 2, every, time_monitor=True, sink_size=10)
    records, _, _ = parse(lines)
    assert [r["step"] for r in records] == truth


def test_a_relaunch_in_the_same_log_is_a_new_segment_with_exact_steps() -> None:
    first, truth = loss_monitor_run(20, 2, 7, time_monitor=False)
    again, _ = loss_monitor_run(20, 1, 7, time_monitor=False)
    records, events, _ = parse(first + again)
    assert [r["step"] for r in records] == truth + [7, 14]
    assert [r["segment"] for r in records] == [0] * len(truth) + [1, 1]
    # The log says nothing of the relaunch: a resume event all the same, at the step it resumed from.
    assert [(e["kind"], e["step"], e["from_step"], e["line"]) for e in events] == [("resume", 7, 35, len(first) + 1)]


@pytest.mark.parametrize("time_monitor", [False, True])
@pytest.mark.parametrize("every", [1, 5])
def test_a_run_appended_to_the_same_log_learns_its_own_epoch_length(time_monitor: bool, every: int) -> None:
    # `python train.py >> train.log` twice, with another epoch length: 2 x 60 steps, then 3 x 25.
    first, first_truth = loss_monitor_run(60, 2, every, time_monitor)
    second, second_truth = loss_monitor_run(25, 3, every, time_monitor)
    records, events, parser = parse(first + second)
    assert [r["step"] for r in records] == first_truth + second_truth  # was 1..25, 61..85, 121..145 for run 2
    assert [r["segment"] for r in records] == [0] * len(first_truth) + [1] * len(second_truth)
    assert [e["kind"] for e in events] == ["resume"]
    assert parser.meta["steps_per_epoch"] == 25
    assert not any("step" in r.get("estimated", "") for r in records)  # every step exact


def test_a_resume_at_a_later_epoch_guesses_with_the_run_before_until_told() -> None:
    first, _ = loss_monitor_run(20, 3, 5, time_monitor=True)
    resumed = [LOSS_MONITOR % (3, s, 1.0) for s in (5, 10, 15, 20)] + [TIME_MONITOR.format(65.811 * 20, 65.811)]
    resumed += [LOSS_MONITOR % (4, s, 1.0) for s in (5, 10)]
    records, _, _ = parse(first + resumed)
    again = [r for r in records if r["segment"] == 1]
    assert [r["step"] for r in again] == [45, 50, 55, 60, 65, 70]
    assert [r.get("estimated", "").split().count("step") for r in again] == [1, 1, 1, 1, 0, 0]
