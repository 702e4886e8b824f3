"""parsers/record.schema.json is the one definition of a record and an event: mstail.parsers.record reads its
constants from it, and every kind of record mstail emits is one it allows (`mstail parse` here; the server's
/api/records, /api/events, /api/series and SSE stream in tests/web/test_record_schema_live.py; the JSONL callback's
lines wherever tests/callback reads them, `nets.read_lines`). A record it does not allow fails the check."""

from __future__ import annotations

import json
import math
import typing
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
from jsonschema import Draft202012Validator

from mstail.parsers import record
from mstail.tailer.app.cli import main
from tests.conftest import ROOT
from tests.record_schema import SCHEMA, check_items, loads, problems

LOGS = sorted([*(ROOT / "sample_logs").glob("*.log"), *(ROOT / "sample_logs").glob("*.jsonl"),
               *(ROOT / "tests" / "real_logs").glob("*.log")])
JSON_TYPES = {int: "integer", float: "number", str: "string"}


def test_the_schema_is_json_schema_and_the_record_module_reads_its_constants_from_it() -> None:
    Draft202012Validator.check_schema(SCHEMA)
    reserved = SCHEMA["$defs"]["reserved"]
    assert record.KEY_ORDER == tuple(reserved["x-key-order"])
    assert record.RESERVED == set(reserved["properties"]) > set(record.KEY_ORDER)
    assert record.ESTIMATED in record.RESERVED - set(record.KEY_ORDER)
    assert list(record.NON_FINITE) == SCHEMA["$defs"]["nonFinite"]["enum"]
    assert [repr(value) for value in record.NON_FINITE.values()] == ["nan", "inf", "-inf"]
    assert record.MAX_NAME_CHARS == reserved["propertyNames"]["maxLength"]
    assert record.PART_KEY in record.UNSAFE_NAMES == set(reserved["propertyNames"]["not"]["enum"])


def test_the_typed_view_of_the_reserved_keys_is_the_schemas() -> None:
    hints = typing.get_type_hints(record.ReservedKeys)
    properties = SCHEMA["$defs"]["reserved"]["properties"]
    assert list(hints) == list(properties)  # same keys, same order
    assert {key: JSON_TYPES[hint] for key, hint in hints.items()} == {key: p["type"] for key, p in properties.items()}


@pytest.mark.parametrize("log", LOGS, ids=lambda path: path.name)
def test_every_row_mstail_parse_writes_is_a_record_or_an_event_of_the_schema(
        log: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSTAIL_FORMATS_DIR", str(tmp_path / "no-user-formats"))
    out = tmp_path / "out.jsonl"
    assert main(["parse", "--events", "-o", str(out), str(log)]) == 0
    rows = [loads(line) for line in out.read_text("utf-8").splitlines()]
    assert check_items(rows, f"mstail parse --events {log.name}") > 0
    assert any("kind" not in row for row in rows)  # records among them, not only events


def good_record() -> Dict[str, Any]:
    return {"source": "rank_0", "step": 3, "epoch": 1, "time": 1.7e9, "segment": 0, "line": 9, "estimated": "time",
            "loss": 2.5, "lr": 1e-4, "grad_norm": "NaN", "scale": "-Infinity", "aux": None, "count": 7}


BAD_RECORDS: List[Tuple[Any, str]] = [  # each with what the check must say
    ({**good_record(), "step": "3"}, "(at step)"),  # a reserved key of the wrong type
    ({**good_record(), "step": 3.5}, "(at step)"),
    ({**good_record(), "time": "now"}, "(at time)"),
    ({**good_record(), "segment": -1}, "(at segment)"),
    ({**good_record(), "estimated": "loss"}, "(at estimated)"),  # only reserved keys can be estimated
    ({**good_record(), "loss": "nan"}, "'loss' was unevaluated and invalid"),  # a name the contract does not use
    ({**good_record(), "loss": "2.5"}, "'loss' was unevaluated and invalid"),  # a number as text
    ({**good_record(), "overflow": True}, "'overflow' was unevaluated and invalid"),  # booleans are written as 0/1
    ({**good_record(), "loss": [2.5]}, "'loss' was unevaluated and invalid"),  # records are flat
    ({**good_record(), "loss": {"value": 2.5}}, "'loss' was unevaluated and invalid"),
    ({**good_record(), "__proto__": 1.0}, "'__proto__' should not be valid"),  # names metric_key never gives
    ({**good_record(), "_part": "rank3"}, "'_part' should not be valid"),
    ({**good_record(), "x" * 257: 1.0}, "is too long"),
    ({**good_record(), "": 1.0}, "'' should be non-empty"),
    ({key: value for key, value in good_record().items() if key != "step"}, "'step' is a required property"),
    ({"step": 3, "source": "rank_0", "loss": 2.5}, "reserved keys ['step', 'source'] not first in the order"),
    ({"loss": 2.5, "step": 3}, "reserved keys ['step'] not first"),  # a metric before a reserved key
    ({"kind": "", "message": "an event has a kind"}, "(at kind)"),
    ({"kind": "checkpoint", "path": ["a", "b"]}, "'path' was unevaluated and invalid"),  # an event is flat too
    ([good_record()], "is not of type 'object'"),
]


def test_a_good_record_and_event_pass() -> None:
    assert problems(good_record()) == []
    assert problems({"source": "rank_0", "step": 4, "time": 1.7e9, "kind": "checkpoint", "path": "/ckpt/4.ckpt",
                     "async": 1, "message": "saved"}) == []
    assert problems({"seq": 9, "source": "rank_0", "step": 4, "time": 1.7e9, "kind": "alert", "id": "a1",
                     "notify": True, "resolved_at": None}) == []


@pytest.mark.parametrize("bad, said", BAD_RECORDS)
def test_a_record_the_schema_does_not_allow_fails_the_check(bad: Any, said: str) -> None:
    with pytest.raises(AssertionError, match="hand-made: item 2 breaks the record schema") as failed:
        check_items([good_record(), bad], "hand-made")
    assert said in str(failed.value)


def test_bare_nan_is_not_json_a_record_may_carry() -> None:
    line = json.dumps(good_record()).replace('"NaN"', "NaN")
    assert math.isnan(json.loads(line)["grad_norm"])  # what a lenient reader would take
    with pytest.raises(ValueError, match="bare NaN"):
        loads(line)
