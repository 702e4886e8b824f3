"""JSON for records, events and series: non-finite numbers as the strings "NaN", "Infinity", "-Infinity".

The proto3 JSON convention (DESIGN.md): bare NaN is not JSON and crashes strict encoders (sse-starlette's
JSONServerSentEvent uses allow_nan=False), and dropping a NaN would hide the most important point.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, List

import orjson

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


def dumps_owned(obj: dict) -> str:
    """`dumps(obj)` for a flat dict the caller throws away after (a row of `mstail parse`), byte for byte, about
    three times faster: orjson when every value is a str, int, bool, None or float. orjson writes a float as `repr`
    does when it is 0 or 1e-4 <= |x| < 1e16 (`repr` writes 1e-05 and 1e+16 where orjson writes 0.00001 and 1e16):
    other floats, and non-finite ones, are replaced in `obj` by their written form (`orjson.Fragment`, the names),
    so no copy is made. Anything else, and what orjson refuses (an int beyond 64 bits, a lone surrogate), goes to
    `dumps` with the values as they were."""
    fragment = orjson.Fragment
    replaced = None
    for key, value in obj.items():
        cls = value.__class__
        if cls is float:
            if not (1e-4 <= value < 1e16 or -1e16 < value <= -1e-4 or value == 0):
                if replaced is None:
                    replaced = []
                replaced.append((key, value))
                obj[key] = fragment(repr(value)) if value - value == 0 else finite_or_name(value)  # same keys
        elif cls is not str and cls is not int and value is not None and cls is not bool:
            break
    else:
        try:
            return orjson.dumps(obj).decode()
        except TypeError:
            pass
    for key, value in replaced or ():  # what orjson cannot write: the standard encoder, on the values as they were
        obj[key] = value
    return dumps(obj)


#: The order keys appear in a record's JSON (reserved keys first, then metrics as the log had them).
RECORD_KEY_ORDER = ("seq", "source", "step", "epoch", "time", "segment", "line", "kind")


def ordered(record: dict) -> dict:
    out = {key: record[key] for key in RECORD_KEY_ORDER if key in record}
    out.update(record)  # keys already there keep their place; the others follow in the record's order
    return out
