"""The record's schema (parsers/record.schema.json) as every test applies it: `check_items` fails on an item (a
record or an event, as `mstail parse`, the server or the JSONL callback wrote it) the schema does not allow, or
whose reserved keys are out of their order (`x-key-order`), naming the item and what is wrong with it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterable, List

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "parsers" / "record.schema.json"
SCHEMA: Dict[str, Any] = json.loads(SCHEMA_PATH.read_text("utf-8"))
VALIDATOR = Draft202012Validator(SCHEMA)
#: The schema's two branches, told apart by `kind` as its `oneOf` does: their errors name the key that is wrong.
BRANCHES = {kind: Draft202012Validator({"$defs": SCHEMA["$defs"], "$ref": f"#/$defs/{kind}"})
            for kind in ("record", "event")}
KEY_ORDER: List[str] = SCHEMA["$defs"]["reserved"]["x-key-order"]
METRIC = Draft202012Validator({"$defs": SCHEMA["$defs"], "$ref": "#/$defs/metric"})
#: A series' columns of metric values (/api/series: each as the record held it, or bucketed).
SERIES_VALUES = ("min", "max", "last", "smooth")


def loads(text: str) -> Any:
    """A JSON text as strict JSON: a bare NaN or Infinity (which Python's json reads as a float) raises."""

    def refuse(token: str) -> None:
        raise ValueError(f"bare {token} in {text[:200]!r}")

    return json.loads(text, parse_constant=refuse)


def problems(item: Any, ordered: bool = True) -> List[str]:
    """What the schema and (when `ordered`) the key order say is wrong with `item` (empty: nothing)."""
    branch = BRANCHES["event" if isinstance(item, dict) and "kind" in item else "record"]
    error = best_match(branch.iter_errors(item)) or best_match(VALIDATOR.iter_errors(item))
    found = [] if error is None else [f"{error.message} (at {'/'.join(map(str, error.absolute_path)) or 'top'})"]
    if ordered and isinstance(item, dict):
        first = [key for key in item if key in KEY_ORDER]
        leading = list(item)[:len(first)]
        if first != leading or first != sorted(first, key=KEY_ORDER.index):
            found.append(f"reserved keys {first} not first in the order {KEY_ORDER}")
    return found


def check_items(items: Iterable[Any], where: str, ordered: bool = True) -> int:
    """Assert every item is a record or an event the schema allows, its reserved keys in order unless not
    `ordered` (a JSONL writer's lines: mstail reads them in any order); returns how many were checked."""
    count = 0
    for count, item in enumerate(items, 1):
        found = problems(item, ordered)
        assert not found, f"{where}: item {count} breaks the record schema: {'; '.join(found)}\n{item!r}"
    return count


def check_metric_values(series: Dict[str, Any], where: str) -> int:
    """Assert every value of a series (/api/series) is a metric value of the schema; returns how many."""
    columns = [series[key] for key in SERIES_VALUES if key in series] + [series["nonfinite"]["value"]]
    assert columns[0], f"{where}: a series without values: {series!r}"
    count = 0
    for column in columns:
        for value in column:
            error = best_match(METRIC.iter_errors(value))
            assert error is None, f"{where}: {value!r} of {series.get('source')} is no metric value: {error.message}"
            count += 1
    return count
