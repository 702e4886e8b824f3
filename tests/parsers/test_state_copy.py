"""`json_copy`, the parser state's deep copy (a checkpoint takes two per pass for every file read): exactly what a
JSON round trip gives, faster on plain values."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mstail.parsers.engine import json_copy

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5),
                     st.floats(allow_nan=True, allow_infinity=True))
_KEYS = st.one_of(st.text(max_size=4), st.integers(-3, 3), st.booleans())
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.tuples(inner, inner), st.dictionaries(_KEYS, inner, max_size=4)), max_leaves=20)


@given(_VALUES)
def test_a_copy_is_what_a_json_round_trip_gives(value: Any) -> None:
    expected = json.loads(json.dumps(value))
    copied = json_copy(value)
    assert json.dumps(copied) == json.dumps(expected)  # NaN != NaN: compared as written
    assert type(copied) is type(expected)


def test_the_copy_shares_nothing_and_refuses_what_json_refuses() -> None:
    state = {"last": {"loss": math.nan, "step": 3}, "epochs": [[1, 2]]}
    copied = json_copy(state)
    copied["last"]["step"] = 4
    copied["epochs"][0].append(5)
    assert state == {"last": {"loss": state["last"]["loss"], "step": 3}, "epochs": [[1, 2]]}
    with pytest.raises(TypeError):
        json_copy({"parts": {1, 2}})
