"""A catch-up child's records sent as their JSON (`store.pack`) and stored from it (`Store.add`'s `texts`): the items,
the stored JSON and the stream's frames are those of sending the records as dicts and encoding them in the parent."""

from __future__ import annotations

import math
import pickle
from typing import Any, Dict, List, Tuple

import pytest

from mstail.parsers import Item
from mstail.tailer import store as store_module
from mstail.tailer.catchup import Batch
from mstail.tailer.store import Store, prepare
from mstail.web.sse import encode_items

#: source ids whose part of a stored item's JSON orjson writes (plain, escaped, non-ASCII) and one it cannot vouch for
SOURCES = ["rank_0", 'run "a"\\b', "ранг/λ\u2028", "nullable/rank_1"]


def _records(count: int) -> List[Item]:
    """Records as a parser gives them, with what must not travel as text (a NaN, an infinity, an int beyond 64 bits,
    a list, "null" and "[" inside strings) and what must travel and come back exactly (None, bools, -0.0, big and
    tiny floats, ints at 64 bits, escapes), amends between them, and an event."""
    out: List[Item] = []
    odd: List[Dict[str, Any]] = [{"loss_avg": math.nan}, {"loss_scale": -math.inf}, {"tokens": 1 << 70},
                                 {"shape": [1, 2]}, {"note": "null"}, {"note": "a[b"}, {"note": "{"}]
    even: List[Dict[str, Any]] = [{"time": None}, {"skipped": True, "overflow": False}, {"grad_norm": -0.0},
                                  {"lr": 3e-07, "big": 1.7976931348623157e308}, {"tokens": (1 << 63) - 1},
                                  {"tokens": -(1 << 63)}, {"note": 'q"\\\n\t\x01é€😀'}]
    for step in range(count):
        data: Dict[str, Any] = {"step": step, "epoch": 1, "time": 1_764_000_000.5 + step, "segment": 0,
                                "line": step + 7, "loss": 2.0 + 1 / (step + 3), "lr": 1e-4 * step}
        if step % 5 == 1:
            data.update(odd[step // 5 % len(odd)])
        elif step % 5 == 3:
            data.update(even[step // 5 % len(even)])
        out.append(Item("record", data))
        if step % 11 == 4:
            out.append(Item("amend", {"step": step, "segment": 0, "late": step / 7}))
        if step == 20:
            out.append(Item("event", {"step": step, "time": 1.0, "segment": 0, "kind": "warning", "message": "m"}))
    return out


def _received(items: List[Item]) -> Batch:
    """`items` prepared, sent and received as a child's batch (pickled as the pipe pickles it)."""
    return pickle.loads(pickle.dumps(Batch(list(map(prepare, items)), None, len(items))))


def test_records_travel_as_their_json_and_come_back_as_they_left() -> None:
    """Unpacked items equal the prepared ones, value types included (repr); a text travels only for records whose
    orjson JSON holds exactly their values (no NaN, no infinity, no int beyond 64 bits, scalars only)."""
    items = _records(120)
    prepared = list(map(prepare, items))
    received = _received(items)
    assert [repr(item) for item in received.items] == [repr(item) for item in prepared]
    assert len(received.texts) == len(prepared)
    for item, text in zip(prepared, received.texts):
        data = item.data
        plain = item.kind == "record" and not any(
            (isinstance(v, float) and not math.isfinite(v)) or (isinstance(v, int) and abs(v) >= 1 << 64)
            or isinstance(v, list) or (isinstance(v, str) and any(c in v for c in "[{") or v == "null")
            for v in data.values())
        assert (text is not None) == plain, data


def _store(items: List[Item], source: str, with_texts: bool) -> Tuple[Store, List[bytes]]:
    """`items` received from a child and stored a few batches a delivery, with or without their texts; the store and
    the stream's frames of each delivery."""
    store, frames = Store(), []
    store.add_source(source, "")
    received = _received(items)
    sent: Dict[int, str] = {}
    for start in range(0, len(received.items), 17):  # deliveries of a few batches each
        chunk = slice(start, start + 17)
        stored = store.add(source, received.items[chunk], True, received.texts[chunk] if with_texts else None, sent)
        frames.append(encode_items(stored, sent))
    return store, frames


@pytest.mark.parametrize("source", SOURCES)
def test_stored_json_and_stream_frames_made_from_the_texts_equal_those_encoded_here(
        source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows queued for the state file (byte for byte), the stream's frames (byte for byte, with each delivery's
    texts, `ItemsMessage.texts`), the history read back and the chart columns are those of encoding every stored item
    in the parent; and the texts are used: the parent encodes only the records that came as dicts (and the amends)."""
    items = _records(150)
    encoded, frames = _store(items, source, with_texts=False)
    calls: List[int] = []
    item_text = store_module.item_text
    monkeypatch.setattr(store_module, "item_text", lambda data: (calls.append(1), item_text(data))[1])
    from_texts, joined = _store(items, source, with_texts=True)
    assert from_texts.db._unsaved == encoded.db._unsaved
    assert joined == frames
    assert b"event: records" in b"".join(frames) and b"event: amend" in b"".join(frames)
    texts = [text for text in _received(items).texts if text is not None]
    if "null" in source:  # no text can be vouched for: every item encoded here, as before
        assert len(calls) == len(encoded.db._unsaved)
    else:
        assert len(calls) == len(encoded.db._unsaved) - len(texts)
    for store in (encoded, from_texts):
        store.commit()
    assert from_texts.items_after(0, 1 << 20) == encoded.items_after(0, 1 << 20)
    assert from_texts.series("loss") == encoded.series("loss") and from_texts.series("late") == encoded.series("late")


def test_texts_that_do_not_match_the_items_are_refused() -> None:
    """A delivery whose texts are not one per item (a misaligned batch would store one record's JSON for another) is
    refused before anything is stored."""
    store = Store()
    store.add_source("rank_0", "")
    received = _received(_records(5))
    with pytest.raises(ValueError):
        store.add("rank_0", received.items, True, received.texts[1:])
    assert store.last_seq == 0 and store.items_after(0, 100) == []
