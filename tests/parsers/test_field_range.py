"""Values that fit no column are field errors: counted, the rest of the record kept, never raised (before, a step of
20 digits or a 400-digit number killed the sidecar's tailing with an OverflowError in the store)."""

from __future__ import annotations

import math

import pytest
from tests.parsers.support import FORMATS

from mstail.parsers import SourceParser
from mstail.parsers.kinds import to_float

PREFIX = "[INFO] 2024-08-12 10:18:15,163 [mindformers/core/callback/callback.py:314] print_output_info: "


def step_line(step: str, per_step_time: str = "514") -> str:
    return (f"{PREFIX}{{ Epoch:[  1/  2], step:[{step:>5}/   25], loss: 10.355, per_step_time: {per_step_time}ms, "
            "lr: 4.e-06, overflow cond: False, loss_scale: 65536.0, global_norm: [1.3445505]")


def test_a_step_beyond_64_bits_is_a_field_error_and_a_huge_value_is_left_out() -> None:
    parser = SourceParser(FORMATS)
    items = []
    for number, line in enumerate([step_line("99999999999999999999"), step_line("1", "9" * 400), step_line("2")], 1):
        items += parser.feed(line, number, 0.0)
    items += parser.flush(0.0, force=True)
    assert [(i.data["step"], i.data.get("step_time_ms")) for i in items] == [(1, None), (2, 514)]
    assert items[0].data["loss"] == 10.355 and parser.counts["field_errors"] == 2


def test_jsonl_ints_beyond_64_bits_are_field_errors() -> None:
    parser = SourceParser(FORMATS)
    items = parser.feed('{"step": 99999999999999999999, "loss": 1.0}', 1, 0.0)
    items += parser.feed('{"step": 1, "loss": 1' + "0" * 400 + ', "lr": 0.1}', 2, 0.0)
    assert [(i.data["step"], "loss" in i.data, i.data["lr"]) for i in items] == [(1, False, 0.1)]
    assert parser.counts["field_errors"] == 2


def test_a_written_infinity_is_a_value_not_an_error() -> None:
    parser = SourceParser(FORMATS)
    items = parser.feed('{"step": 1, "loss": "Infinity"}', 1, 0.0)
    assert items[0].data["loss"] == float("inf") and parser.counts["field_errors"] == 0


@pytest.mark.parametrize("text, expected", [
    (" [1.6582648]", 1.6582648), ("[ -2.5 ]", -2.5), ("[1e400]", math.inf), ("[None]", None), ("[]", None),
    ("[ n/a ]", None), ("[[1.5]]", ValueError), ("[1.5", ValueError), ("1.5]", ValueError), ("[1.5]x", ValueError),
])
def test_a_float_printed_as_a_one_element_array_reads_as_its_number(text: str, expected: object) -> None:
    """MindFormers prints global_norm as `[1.66]` (a shape-(1,) array): read at once, the value the full reading gives
    (a NULL word inside is no value, anything else that is no number a ValueError, a field error)."""
    if expected is ValueError:
        with pytest.raises(ValueError):
            to_float(text)
    else:
        assert to_float(text) == expected


def test_a_nan_in_brackets_reads_as_nan() -> None:
    assert math.isnan(to_float(" [nan]"))  # type: ignore[arg-type]
