"""The record: what every part of mstail agrees on, owned here and nowhere else.

A record is one step of one source: a flat JSON object whose reserved keys (`RESERVED`) come first in
`KEY_ORDER`, followed by its metrics in the order the log had them. An event is the same shape with a `kind`
(and usually a `message`). Non-finite numbers travel as the strings in `NON_FINITE` (the proto3 JSON convention:
bare NaN is not JSON, it crashes strict encoders such as sse-starlette's, and dropping it would hide the most
important point). All this is written once, as data, in record.schema.json beside this module: the constants below
are read from it, the page reads it (web/static/util.js), and the tests validate every kind of output against it.

A record is emitted at its step line; a line that belongs to it but comes later (TimeMonitor, MindFormers' progress
line, eval results) amends it: the amend adds metrics the record lacks, never changes one it has, so one step of one
source is one record, live and offline (mstail.parsers.amends).

A metric's name is made safe once, where an input's text becomes a record's key (`metric_key`): a JSONL key, an
event file's tag, a pair's or a printed dict's key in a log line; a format file's field names are checked with it
when the file is loaded.

Between a parser and the tailer a record travels as an `Item`; a launcher-tagged rank's items carry their part
id under `PART_KEY` (mstail.parsers.interleave), which the tailer turns into a source of its own.
"""

from __future__ import annotations

import json
import math
from importlib import resources
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, TypedDict

import orjson

#: The record's definition (JSON Schema 2020-12), shared with the page and the tests: read once, here.
SCHEMA: Dict[str, Any] = json.loads((resources.files(__package__) / "record.schema.json").read_text("utf-8"))
_RESERVED_SCHEMA = SCHEMA["$defs"]["reserved"]

#: The order reserved keys appear in a record's JSON; metrics follow in the order the log had them.
KEY_ORDER = tuple(_RESERVED_SCHEMA["x-key-order"])
_AFTER_SOURCE = KEY_ORDER[2:]

#: A record's or an event's reserved keys the log did not print, space-separated: "step" (a global step resting on a
#: guessed epoch length) and "time" (the moment the sidecar read a line that has no time; `mstail parse` gives none).
ESTIMATED = "estimated"

#: Keys every record or event may carry; a format, a JSONL writer or a derived series cannot use them as metrics.
RESERVED = frozenset(_RESERVED_SCHEMA["properties"])

#: Non-finite floats by the names they travel under in JSON (records, events, series, SSE, SQLite).
NON_FINITE = {name: float(name) for name in SCHEMA["$defs"]["nonFinite"]["enum"]}

#: An item's data key naming its launcher-tagged part ("rank3"); never stored: the tailer makes it a source id.
PART_KEY = "_part"

#: A record or an event's data: reserved keys and metrics (numbers, NON_FINITE floats, None for "no value").
Record = Dict[str, Any]


class ReservedKeys(TypedDict, total=False):
    """The reserved keys of a record or an event and their types (record.schema.json's `reserved`): the typed view
    of a `Record` for code that wants one. Any of them may be absent; metrics are the record's other keys."""

    seq: int
    source: str
    step: int
    epoch: int
    time: float
    segment: int
    line: int
    kind: str
    message: str
    estimated: str


_NAMES_SCHEMA = _RESERVED_SCHEMA["propertyNames"]
#: The most characters a metric name may have: a longer one (a writer's bug, a hostile input) is no name, it would be
#: a key in every record, series and answer.
MAX_NAME_CHARS: int = _NAMES_SCHEMA["maxLength"]
#: Names no metric keeps as they are, kept with `UNSAFE_PREFIX` before them: `__proto__` (a JavaScript object given
#: that key by assignment takes it as its prototype), `PART_KEY` (it names a launcher-tagged part).
UNSAFE_NAMES = frozenset(_NAMES_SCHEMA["not"]["enum"])
UNSAFE_PREFIX = "metric_"
#: What `metric_key` writes for a control character: `\\n`, `\\t`, `\\r`, `\\xHH` (C0, DEL, C1), and the line separators
#: JavaScript and many viewers break lines at (`\\u2028`, `\\u2029`).
_NAME_ESCAPES = {**{code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))},
                 0x0A: "\\n", 0x09: "\\t", 0x0D: "\\r", 0x2028: "\\u2028", 0x2029: "\\u2029"}
_KEYS_KEPT = 4096  # names `metric_key` keeps at hand


class Item(NamedTuple):
    """One parser output: kind "record" (a step), "event" (its data has a "kind" key) or "amend" (values a later line
    adds to the last record: its "step", "segment" and the new metrics; see mstail.parsers.amends)."""

    kind: str
    data: Record


class _MetricKeys(Dict[str, Optional[str]]):
    """Names met -> their keys (an input repeats its few names in every record): a hit costs one dict look-up."""

    def __missing__(self, name: str) -> Optional[str]:
        key = _safe_name(name)
        if len(self) >= _KEYS_KEPT:
            self.clear()  # an input inventing names: the cache stays bounded
        self[name] = key
        return key


#: `metric_key(name)`: the record key a metric name from an input is kept under, or None for no name: empty, only
#: spaces, or longer than `MAX_NAME_CHARS`. Control characters and line separators are written as `\\n`, `\\x1b`,
#: `\\u2028` (a name never breaks a line of a terminal, stderr or CSV), a lone surrogate (no UTF-8, JSON or SQLite
#: takes it) as `\\ud800`; `UNSAFE_NAMES` get `UNSAFE_PREFIX`. A key given is its own key (`metric_key(k) == k`).
#: Reserved keys are the caller's to refuse or rename (a JSONL record's own, an event file's `tag_` names).
metric_key: Callable[[str], Optional[str]] = _MetricKeys().__getitem__


def _safe_name(name: str) -> Optional[str]:
    if len(name) > MAX_NAME_CHARS:
        return None
    if not name.isprintable():
        name = name.encode("utf-8", "backslashreplace").decode("utf-8").translate(_NAME_ESCAPES)
    if len(name) > MAX_NAME_CHARS or not name.strip():
        return None
    return UNSAFE_PREFIX + name if name in UNSAFE_NAMES else name


_NAMES = {math.inf: "Infinity", -math.inf: "-Infinity"}


def finite_or_name(value: Any) -> Any:
    """`value`, or its name in `NON_FINITE` when it is a non-finite float."""
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
    """Compact JSON, non-finite floats written by name."""
    try:
        return _ENCODER.encode(obj)  # most objects hold finite numbers only: no copy is needed
    except ValueError:  # a non-finite number (allow_nan=False): encode a copy with the names
        return _ENCODER.encode(jsonable(obj))


def orjson_exact(obj: Any) -> Optional[bytes]:
    """orjson's JSON of `obj` (about 8 times faster than the json module) when it holds the same values as the
    json module's text, else None: orjson writes NaN and the infinities as null, so its text is kept only when every
    `null` in it is accounted for by a None at the top of `obj` (a record's or a source entry's empty fields; a "null"
    inside a string counts too, and sends such a text the slow way), and it refuses an int beyond 64 bits, a lone
    surrogate or a key that is not a string."""
    try:
        data = orjson.dumps(obj)
    except orjson.JSONEncodeError:
        return None
    if b"null" not in data or (isinstance(obj, dict) and data.count(b"null") == [*obj.values()].count(None)):
        return data
    return None


def json_bytes(obj: Any) -> bytes:
    """`dumps(obj)`'s values (non-finite floats by name) as UTF-8 JSON, by orjson where it can (`orjson_exact`, or on
    a copy with the names put in: its floats may be written shorter, `7e-6` for `7e-06`, the same number); what
    orjson refuses goes to `dumps`."""
    data = orjson_exact(obj)
    if data is not None:
        return data
    try:
        return orjson.dumps(jsonable(obj))
    except orjson.JSONEncodeError:
        return dumps(obj).encode("utf-8")


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


def ordered(record: dict, source: Optional[str] = None) -> dict:
    """A copy of `record` with its reserved keys first, in `KEY_ORDER`; with `source`, that of
    `{"source": source, **record}`, made without the second copy (a row of `mstail parse`)."""
    if source is not None and "source" not in record and "seq" not in record:
        out = {"source": source}
        for key in _AFTER_SOURCE:
            if key in record:
                out[key] = record[key]
        out.update(record)
        return out
    if source is not None:
        record = {"source": source, **record}
    out = {key: record[key] for key in KEY_ORDER if key in record}
    out.update(record)  # keys already there keep their place; the others follow in the record's order
    return out
