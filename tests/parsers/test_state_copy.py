"""`json_copy`, the parser state's deep copy, exactly what a JSON round trip gives, faster on plain values; and
`json_text`, the text a checkpoint keeps of the parser state (one per pass for every file read): what `json.dumps`
writes, as `json.loads` reads it back, orjson's speed where that is the same."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mstail.parsers.engine import ParserState, json_copy, json_text

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


@given(_VALUES)
def test_the_text_reads_back_as_json_dumps_would(value: Any) -> None:
    expected = json.loads(json.dumps(value))
    assert json.dumps(json.loads(json_text(value))) == json.dumps(expected)  # NaN != NaN: compared as written


@pytest.mark.parametrize("value", [
    {"last": {"loss": math.nan, "step": 3}},  # orjson would write null: a NaN must come back a NaN
    [1.5, [-math.inf, {"x": math.inf}]],
    {"big": 1 << 70},  # beyond 64 bits: orjson refuses, the json module writes it
    {1: "int key", False: "bool key"},
    {"lone": "\ud800"},
    {"none": None, "message": "a null pointer"},  # "null" in the text, and no NaN behind it
])
def test_the_text_of_what_orjson_cannot_write_as_is(value: Any) -> None:
    assert json.dumps(json.loads(json_text(value))) == json.dumps(json.loads(json.dumps(value)))


def test_the_text_refuses_what_json_refuses() -> None:
    for value in ({"parts": {1, 2}}, {"when": __import__("datetime").date(2026, 1, 1)}, {"x": object()}):
        with pytest.raises(TypeError):
            json_text(value)


def test_a_state_as_text_is_its_json() -> None:
    state = ParserState(format="mindformers", meta={"total_steps": 10}, segment=1, epoch_max={1: 8, 2: 3},
                        last={"step": 11, "loss": math.nan}, event_steps={"checkpoint": 8},
                        parts={"rank1": ParserState(spe_told=8)})
    restored = ParserState.from_json(json.loads(state.dumps()))
    assert json.dumps(restored.to_json()) == json.dumps(state.to_json())
    assert restored.epoch_max == {1: 8, 2: 3} and math.isnan(restored.last["loss"]) and restored.parts["rank1"].spe_told == 8
    # an InterleavedParser's parts are its parsers' states, not the main state's own
    assert "parts" not in json.loads(state.dumps(parts={}))
