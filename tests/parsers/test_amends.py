"""`Settler` (how `mstail parse` joins amends to their records over a file pushed in pieces) against `fold_amends`
(the same join over the whole list at once, which keeps an amend with no record where a `Settler` drops it): the same items, in line order, however the stream is cut, for any mix
of records, amends and events of launcher-tagged parts; and, past `MAX_HELD`, every item still out once, in order."""

from __future__ import annotations

import copy
from typing import List, Optional, Tuple

from hypothesis import given, settings
from hypothesis import strategies as st

from mstail.parsers import amends
from mstail.parsers.amends import Settler, fold_amends
from mstail.parsers.record import PART_KEY, Item

_PARTS = (None, "rank1", "rank2")
_items = st.lists(st.tuples(st.sampled_from(("record", "amend", "event")), st.sampled_from(_PARTS)), max_size=60)


def _stream(spec: List[Tuple[str, Optional[str]]]) -> List[Item]:
    """Items as a parser gives them: each record's step counts up in its part, an amend adds a value of its own."""
    out: List[Item] = []
    for number, (kind, part) in enumerate(spec):
        data: dict = {"step": number} if kind == "record" else {"kind": "checkpoint"} if kind == "event" else \
            {"step": -1, "segment": 0, f"v{number}": number}
        if part is not None:
            data[PART_KEY] = part
        out.append(Item(kind, data))
    return out


def _pushed(items: List[Item], cuts: List[int]) -> List[Item]:
    settler, out, start = Settler(), [], 0
    for cut in sorted(cuts) + [len(items)]:
        out += settler.push(items[start:cut])
        start = max(start, cut)
    return out + settler.finish()


@settings(max_examples=400, deadline=None)
@given(_items, st.lists(st.integers(0, 60), max_size=6))
def test_settler_pushed_in_pieces_is_the_fold_of_the_whole(spec, cuts) -> None:
    items = _stream(spec)
    folded = [item for item in fold_amends(copy.deepcopy(items)) if item.kind != "amend"]  # no record: dropped
    assert _pushed(copy.deepcopy(items), cuts) == folded


@settings(max_examples=200, deadline=None)
@given(_items, st.lists(st.integers(0, 60), max_size=6), st.integers(1, 4))
def test_settler_past_its_limit_writes_every_item_once_in_order(spec, cuts, limit) -> None:
    items = _stream(spec)
    kept = amends.MAX_HELD
    amends.MAX_HELD = limit  # a record held with more items than this after it is written as it is
    try:
        out = _pushed(copy.deepcopy(items), cuts)
    finally:
        amends.MAX_HELD = kept
    assert [(item.kind, item.data.get("step")) for item in out] == \
        [(item.kind, item.data.get("step")) for item in items if item.kind != "amend"]
