"""The stream's JSON of the items stored, made with their stored JSON (`Store.add`'s `texts`, `ItemsMessage.texts`):
the stream's frames built from it are those of encoding the items in the stream, byte for byte."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Tuple

import pytest

from mstail.parsers import Item
from mstail.tailer.history.store import Store, prepare
from mstail.web.sse import encode_items


def _items(count: int) -> List[Item]:
    """Records as a parser gives them, with what the stream writes differently from the state file (NaN, infinities)
    or only by the json module (an int beyond 64 bits, a nested NaN, a value "NaN" beside a NaN, a value "null"), odd
    texts, amends between them, and an event."""
    odd: List[Dict[str, Any]] = [{"loss_avg": math.nan}, {"loss_scale": -math.inf, "grad_norm": math.inf},
                                 {"tokens": 1 << 70}, {"shape": [1, math.nan]}, {"note": "NaN", "loss_avg": math.nan}, {"note": "null"},
                                 {"time": None}, {"skipped": True, "overflow": False}, {"grad_norm": -0.0},
                                 {"lr": 3e-07, "big": 1.7976931348623157e308}, {"note": 'q"\\\n\t\x01é€😀'}]
    out: List[Item] = []
    for step in range(count):
        data: Dict[str, Any] = {"step": step, "epoch": 1, "time": 1_764_000_000.5 + step, "segment": 0,
                                "line": step + 7, "loss": 2.0 + 1 / (step + 3), "lr": 1e-4 * step}
        if step % 3 == 1:
            data.update(odd[step // 3 % len(odd)])
        out.append(Item("record", data))
        if step % 11 == 4:
            out.append(Item("amend", {"step": step, "segment": 0, "late": step / 7}))
        if step == 20:
            out.append(Item("event", {"step": step, "time": 1.0, "segment": 0, "kind": "warning", "message": "m"}))
    return out


def _frames(items: List[Item], prepared: bool, with_texts: bool) -> Tuple[List[bytes], List[Dict[str, Any]], Dict[int, str]]:
    """`items` stored a few a delivery: each delivery's stream frames (with the texts noted while storing, or encoded
    in the stream alone), the items stored, and the texts noted."""
    store = Store()
    store.add_source("rank_0", "")
    frames: List[bytes] = []
    stored: List[Dict[str, Any]] = []
    noted: Dict[int, str] = {}
    for start in range(0, len(items), 17):
        chunk = items[start:start + 17]
        delivered, texts = store.add("rank_0", list(map(prepare, chunk)) if prepared else chunk, prepared)
        frames.append(encode_items(delivered, texts if with_texts else None))
        stored += delivered
        noted.update(texts)
    return frames, stored, noted


@pytest.mark.parametrize("prepared", [True, False])
def test_frames_from_the_texts_noted_while_storing_equal_the_streams_own(prepared: bool) -> None:
    """Every delivery's frames are byte for byte those the stream makes by itself; the texts are used: every item's
    but those only the json module writes (`_items`), records with NaN or infinities among them."""
    items = _items(160)
    expected, _, _ = _frames(items, prepared, with_texts=False)
    frames, stored, noted = _frames(items, prepared, with_texts=True)
    assert frames == expected
    joined = b"".join(frames)
    assert b"event: records" in joined and b"event: amend" in joined and b'"NaN"' in joined and b"Infinity" in joined
    json_module_only = [item["seq"] for item in stored if item.get("tokens") == 1 << 70 or "shape" in item
                        or item.get("note") in ("NaN", "null")]
    assert json_module_only and sorted(noted) == sorted(set(item["seq"] for item in stored) - set(json_module_only))
