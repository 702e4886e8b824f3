"""JSON for records, events and series: non-finite numbers as the strings "NaN", "Infinity", "-Infinity".

The proto3 JSON convention (DESIGN.md): bare NaN is not JSON and crashes strict encoders (sse-starlette's
JSONServerSentEvent uses allow_nan=False), and dropping a NaN would hide the most important point.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, List

_NAMES = {math.inf: "Infinity", -math.inf: "-Infinity"}


def finite_or_name(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else _NAMES[value]
    return value


def jsonable(obj: Any) -> Any:
    """A copy of obj (dicts, lists, tuples, scalars) with every non-finite float replaced by its name."""
    if isinstance(obj, float):
        return finite_or_name(obj)
    if isinstance(obj, dict):  # records are flat: scalars are converted inline, without a call each
        return {
            key: finite_or_name(value) if isinstance(value, float) else jsonable(value) if isinstance(value, (dict, list, tuple)) else value
            for key, value in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        return [jsonable(value) for value in obj]
    return obj


def numbers(values: Iterable[float]) -> List[Any]:
    """A list of floats ready for JSON (the fast path for series columns)."""
    return [v if v - v == 0 else finite_or_name(v) for v in values]


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dumps(obj: Any) -> str:
    try:
        return _ENCODER.encode(obj)  # most objects hold finite numbers only: no copy is needed
    except ValueError:  # a non-finite number (allow_nan=False): encode a copy with the names
        return _ENCODER.encode(jsonable(obj))


#: The order keys appear in a record's JSON (reserved keys first, then metrics as the log had them).
RECORD_KEY_ORDER = ("seq", "source", "step", "epoch", "time", "segment", "line", "kind")


def ordered(record: dict) -> dict:
    out = {key: record[key] for key in RECORD_KEY_ORDER if key in record}
    out.update(record)  # keys already there keep their place; the others follow in the record's order
    return out
