"""A stored item's JSON (`db._item_json`: orjson, or the json module where orjson would differ) reads back
(`db._loads`) as the json module's text does, for every value a record or event may hold: NaN and the
infinities (orjson writes them as null), None, integers beyond 64 bits, lone surrogates, nested events; and the
stream's JSON made on the way (`db.item_text`) is the stream's own."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mstail.parsers.record import json_bytes
from mstail.tailer.history.db import _dumps, _item_json, _loads, item_text

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(1 << 80), max_value=1 << 80),
                    st.floats(allow_nan=True, allow_infinity=True), st.text())
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                      max_leaves=8)
ITEMS = st.fixed_dictionaries({"seq": st.integers(1, 1 << 62), "source": st.text(min_size=1)},
                              optional={"step": st.integers(-(1 << 70), 1 << 70), "kind": st.sampled_from(["error", "alert"])}
                              ).flatmap(lambda base: st.dictionaries(st.text(), VALUES, max_size=6).map(lambda rest: {**rest, **base}))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@settings(max_examples=400, deadline=None)
@given(ITEMS)
def test_an_item_reads_back_as_the_json_modules_text_does(item: dict) -> None:
    assert _same(_loads(_item_json(item)), _loads(_dumps(item)))


def test_non_finite_numbers_keep_their_names_and_none_stays_null() -> None:
    item = {"seq": 1, "source": "s", "step": 3, "loss": math.nan, "grad_norm": math.inf, "lr": -math.inf, "eval": None}
    text = _item_json(item)
    assert json.loads(text)["eval"] is None and "NaN" in text and "-Infinity" in text
    back = _loads(text)
    assert math.isnan(back["loss"]) and back["grad_norm"] == math.inf and back["lr"] == -math.inf


def test_an_integer_beyond_64_bits_stays_exact() -> None:
    assert _loads(_item_json({"seq": 1, "source": "s", "step": 1 << 70}))["step"] == 1 << 70


@settings(max_examples=400, deadline=None)
@given(ITEMS)
def test_the_streams_json_made_with_the_stored_json_is_the_streams_own(item: dict) -> None:
    """`item_text`'s second text, where it gives one, is what the stream would send for the item (`json_bytes`), and
    the stored text beside it reads back as the json module's does (above)."""
    stored, streamed = item_text(item)
    assert stored == _item_json(item)
    if streamed is not None:
        assert streamed.encode() == json_bytes(item)


def test_non_finite_numbers_among_an_items_values_give_the_streams_json_too() -> None:
    """A record with NaN and infinities (a catch-up's records that come as dicts) gets the stream's text on the way
    and a stored text with the tokens; a value or key named "NaN" leaves both to the json module."""
    item = {"seq": 1, "source": "s", "step": 3, "loss": math.nan, "grad_norm": math.inf, "lr": -math.inf, "eval": None,
            "note": 'say "NaN"'}
    stored, streamed = item_text(item)
    assert streamed is not None and streamed.encode() == json_bytes(item)
    assert _same(_loads(stored), item) and '"NaN"' not in stored and "-Infinity" in stored
    for odd in ({**item, "note": "NaN"}, {**item, "NaN": 1.0}, {**item, "nested": [math.nan]}):
        stored, streamed = item_text(odd)
        assert streamed is None and stored == _dumps(odd)
