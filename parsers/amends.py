"""A record and the values later lines add to it ("amend" items), joined wherever both are in hand.

A parser emits a step's record at its own line, so the sidecar publishes it at once; a line that belongs to that
step but comes later (MindSpore's TimeMonitor at the epoch end, MindFormers' progress line, eval results) yields an
amend for the parser's last record. Whoever still holds that record joins the two, so the rest of mstail sees one
record: the tailer for the items of one read pass (`fold_amends`), `mstail parse` for a whole file (`settled`). An
amend whose record already left (published, stored) is applied by the store (`Store.add`) and streamed as an
`amend` message the page applies. Either way the final history is the same: the record with the amend's values.
"""

from __future__ import annotations

from typing import Dict, Iterable, Iterator, List, Optional

from .record import PART_KEY, Item, Record

#: The keys of an amend that say which record it is for, not what it adds.
TARGET_KEYS = ("step", "segment", PART_KEY)

#: `settled` holds at most this many items waiting for a record to be final; beyond, the oldest record is written
#: as it is (a later amend of it is then dropped). Never reached by a real log: between two step lines of one rank
#: there are a few lines, and the launcher-tagged ranks of one file interleave line by line.
MAX_HELD = 100_000


def merge(record: Record, amend: Record) -> None:
    """Add the amend's values that the record lacks (the record's own values are never changed)."""
    for key, value in amend.items():
        if key not in record and key not in TARGET_KEYS:
            record[key] = value


def fold_amends(items: List[Item]) -> List[Item]:
    """`items` (one pass of one source, in order) with each amend whose record is among them joined to it. An
    amend is always for its part's latest record, which is the latest record of that part before it here."""
    latest: Dict[Optional[str], Record] = {}
    out: List[Item] = []
    for item in items:
        part = item.data.get(PART_KEY)
        if item.kind == "record":
            latest[part] = item.data
        elif item.kind == "amend" and part in latest:
            merge(latest[part], item.data)
            continue
        out.append(item)
    return out


def settled(items: Iterable[Item]) -> Iterator[Item]:
    """The items of a whole file with every amend joined to its record, in line order: a record is held (with
    the items after it) until no later line can amend it, i.e. until its part's next record or the end."""
    held: List[Item] = []  # from the oldest record still open, in line order
    open_records: Dict[Optional[str], Item] = {}  # part -> its latest record

    def is_open(item: Item) -> bool:
        return item.kind == "record" and open_records.get(item.data.get(PART_KEY)) is item

    for item in items:
        part = item.data.get(PART_KEY)
        if item.kind == "amend":
            record = open_records.get(part)
            if record is not None:
                merge(record.data, item.data)
            continue
        if item.kind == "record":
            open_records[part] = item
        held.append(item)
        if len(held) > MAX_HELD and is_open(held[0]):
            del open_records[held[0].data.get(PART_KEY)]
        final = 0  # the items before the oldest open record are final
        while final < len(held) and not is_open(held[final]):
            final += 1
        if final:
            yield from held[:final]
            del held[:final]
    yield from held
