"""Metric names are made safe once, where an input's text becomes a record's key (`record.metric_key`): a JSONL key,
an event file's tag; a format file's field names are checked with it at load (the names a text log's own words
give, its pairs and printed dicts, are letters, digits and `_` already: loader._NOT_WORD, pyliteral).
Empty or blank names are no metric, control characters and line separators are escaped, `__proto__` (and `_part`)
get a prefix, and what is a name already stays as it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mstail.parsers import FormatError, load_format_file
from mstail.parsers.eventfile import EventFileParser
from mstail.parsers.record import MAX_NAME_CHARS, metric_key

from .support import metrics, parse

LONG = "x" * MAX_NAME_CHARS
#: (name in the input, its key: None = no metric)
ODD = [
    ("loss", "loss"),
    ("", None),
    ("   ", None),
    ("a\nb", "a\\nb"),
    ("\x1b[31mred", "\\x1b[31mred"),
    ("tab\there\r", "tab\\there\\r"),
    ("line\u2028sep", "line\\u2028sep"),
    ("\x85next", "\\x85next"),
    ("__proto__", "metric___proto__"),
    ("_part", "metric__part"),
    ("constructor", "constructor"),
    ("<img src=x onerror=alert(1)>", "<img src=x onerror=alert(1)>"),
    ("损失/训练 λ", "损失/训练 λ"),
    (LONG, LONG),
    (LONG + "x", None),
]


@pytest.mark.parametrize("name,key", ODD, ids=[repr(n)[:24] for n, _ in ODD])
def test_metric_key(name: str, key: str) -> None:
    assert metric_key(name) == key
    if key is not None:
        assert metric_key(key) == key  # a key is its own key: sanitising twice changes nothing


def test_a_lone_surrogate_is_escaped() -> None:
    assert metric_key("bad\ud800") == "bad\\ud800"
    assert metric_key("a\n" * (MAX_NAME_CHARS // 2)) is None  # escaped, it is too long


def _expected(*skip: str) -> dict:
    return {key: float(i) for i, (name, key) in enumerate(ODD) if key is not None and name not in skip}


def test_jsonl_keys_become_safe_metric_names() -> None:
    line = json.dumps({"step": 1, **{name: float(i) for i, (name, _) in enumerate(ODD)}})
    (record,), _, _ = parse([line], "jsonl")
    assert metrics(record) == _expected()
    assert "_part" not in record  # a JSONL key never names a part (a source of its own)


def test_event_file_tags_become_safe_metric_names() -> None:
    from mstail.parsers.eventschema import TensorBoardEvent

    event = TensorBoardEvent(wall_time=1700000000.0, step=3)
    for i, (name, _) in enumerate(ODD):
        value = event.summary.value.add()
        value.tag, value.simple_value = name, float(i)
    parser = EventFileParser()
    [(kind, record)] = parser.feed(event.SerializeToString(), 1, 0.0) + parser.flush(0.0, force=True)
    assert kind == "record"
    # `_part`, a reserved-looking tag, keeps the event files' own `tag_` name; the others as any input's
    part = float(ODD.index(("_part", "metric__part")))
    assert metrics(record) == {**_expected("_part", LONG + "x"), "tag__part": part}
    assert parser.counts["dropped_values"] == 3  # "", "   " and the name too long


@pytest.mark.parametrize("rename", ["__proto__", "a\\nb", "\\u001b[31m", " ", "x" * (MAX_NAME_CHARS + 1)])
def test_a_format_files_field_name_that_is_no_safe_metric_name_fails_at_load(tmp_path: Path, rename: str) -> None:
    path = tmp_path / "odd.toml"
    path.write_text("[[rule]]\nname = \"step_line\"\nregex = 'step (?P<step>\\d+) loss (?P<loss>\\S+)'\n"
                    f"fields.loss = {{ type = \"float\", rename = \"{rename}\" }}\n", encoding="utf-8")
    with pytest.raises(FormatError, match="cannot be a metric name"):
        load_format_file(path)

