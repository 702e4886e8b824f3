"""A record and the values later lines add to it ("amend" items), joined wherever both are in hand.

A parser emits a step's record at its own line, so the sidecar publishes it at once; a line that belongs to that
step but comes later (MindSpore's TimeMonitor at the epoch end, MindFormers' progress line, eval results) yields an
amend for the parser's last record. Whoever still holds that record joins the two, so the rest of mstail sees one
record: the tailer for the items of one read pass (`fold_amends`), `mstail parse` for a whole file (a `Settler`, one
per piece of a file split across processes; `settled` for items already in memory). An
amend whose record already left (published, stored) is applied by the store (`Store.add`) and streamed as an
`amend` message the page applies. Either way the final history is the same: the record with the amend's values.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional

from .record import PART_KEY, Item, Record

#: The keys of an amend that say which record it is for, not what it adds.
TARGET_KEYS = ("step", "segment", PART_KEY)

#: A `Settler` holds at most this many items waiting for a record to be final; beyond, the oldest record is written
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


class Settler:
    """Joins each amend to its record over a stream of items pushed in order (a whole file, in pieces): a record is
    held, with the items after it, until no later line can amend it — its part's next record — or `finish()`."""

    def __init__(self) -> None:
        self.held: List[Item] = []  # from the oldest record still open, in line order
        self._open: Dict[Optional[str], Item] = {}  # part -> its latest record

    def push(self, items: Iterable[Item]) -> List[Item]:
        """The items that became final with these (amends joined to their records and left out)."""
        held, out, open_ = self.held, [], self._open
        for item in items:
            kind = item.kind
            if kind == "amend":
                record = open_.get(item.data.get(PART_KEY))
                if record is not None:
                    merge(record.data, item.data)
                continue
            if kind == "record":
                open_[item.data.get(PART_KEY)] = item  # its part's record before is final now: look again below
            elif not held:
                out.append(item)  # no record open: final at once
                continue
            held.append(item)
            if len(held) > MAX_HELD and self._is_open(held[0]):
                del open_[held[0].data.get(PART_KEY)]
            elif kind != "record":
                continue  # held[0] is still the oldest open record (only a record closes one)
            final = 0  # the items before the oldest open record are final
            while final < len(held) and not self._is_open(held[final]):
                final += 1
            if final:
                out += held[:final]
                del held[:final]
        return out

    def finish(self) -> List[Item]:
        """Everything still held (the end of the input: no later line comes)."""
        out, self.held = self.held, []
        self._open.clear()
        return out

    def _is_open(self, item: Item) -> bool:
        return item.kind == "record" and self._open.get(item.data.get(PART_KEY)) is item


def settled(items: Iterable[Item]) -> List[Item]:
    """The items of a whole input held in memory, every amend joined to its record, in line order."""
    settler = Settler()
    return settler.push(items) + settler.finish()
