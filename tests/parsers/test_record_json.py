"""The JSON lines of `mstail parse` (`mstail.parsers.record.dumps_owned`: orjson with fallbacks) are byte for byte what
the standard library encoding (`dumps`) writes: floats as `repr` writes them (1e-05, 1e+16, 65536.0), non-finite
numbers as their names, strings with the same escapes, key order kept; what orjson cannot write goes to `dumps`."""

from __future__ import annotations

import math
import random
import struct
from typing import Any, Dict

import pytest

from mstail.parsers.record import KEY_ORDER, dumps, dumps_owned, ordered

EDGES = [
    0.0, -0.0, 1e-4, -1e-4, 0.00009999999999999999, 1e-05, 7.579544029403025e-05, 1.5e-07, 5e-324,
    9999999999999998.0, 1e16, -1e16, 1.2345e16, 1.7976931348623157e308, 65536.0, 0.1, 2.0 ** 53,
    math.nan, math.inf, -math.inf, True, False, None, 0, -1, 2 ** 63 - 1, -(2 ** 63), 2 ** 64 - 1, 2 ** 64, -(2 ** 70),
    "", "rank_0", "ünïcødé ✓ 🚀", "\x00\x01\x1f\x7f\"\\/\b\f\n\r\t", "\u2028\u2029\ufeff", "\ud800 lone surrogate",
    [1.0, math.nan], {"nested": 1e-7},
]


def same(record: Dict[str, Any]) -> None:
    try:
        expected = dumps(record)
    except Exception as exc:  # noqa: BLE001 - then dumps_owned must refuse it the same way
        with pytest.raises(type(exc)):
            dumps_owned(dict(record))
        return
    assert dumps_owned(dict(record)) == expected, record  # it may change its own copy: odd floats written in place


def test_dumps_owned_is_dumps_byte_for_byte() -> None:
    for value in EDGES:
        same({"source": "rank_0", "step": 1, "value": value})
        same({"value": value, "lr": 1.5e-07, "loss": 2.5})  # an odd float before and after
    rng = random.Random(7)
    for _ in range(20000):
        record: Dict[str, Any] = {"source": "rank_0", "step": rng.randrange(10 ** 6)}
        for key in range(rng.randrange(1, 12)):
            pick = rng.random()
            if pick < 0.3:
                value: Any = struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0]  # any double, NaN included
            elif pick < 0.7:
                value = rng.choice((1, -1)) * rng.random() * 10 ** rng.randint(-9, 18)
            else:
                value = rng.choice(EDGES)
            record[f"m{key}"] = value
        same(record)


@pytest.mark.parametrize("seed", range(20))
def test_ordered_with_a_source_is_ordered_of_the_source_put_first(seed: int) -> None:
    """`ordered(record, source)` (a row of `mstail parse`, made in one copy) is `ordered({"source": source,
    **record})` key for key, in order: records and events with any of the reserved keys, in any order, a `source`
    or `seq` of their own included."""
    rng = random.Random(seed)
    for _ in range(500):
        keys = rng.sample(KEY_ORDER + ("message", "loss", "lr", "perplexity"), rng.randint(0, 12))
        record = {key: rng.choice((1, 2.5, "x", None)) for key in keys}
        source = rng.choice(("run/rank_0", "a"))
        assert list(ordered(dict(record), source).items()) == list(ordered({"source": source, **record}).items())
