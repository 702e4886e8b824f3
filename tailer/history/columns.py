"""The chart columns of every source in memory, and their copy in the state file.

Memory: the records of one source in one run segment share one step column and one time column (a `Frame`).
A metric with a value in every record of its segment since the first holds only its values, 8 bytes a point,
on the frame's steps and times (it is *aligned*); a metric that starts later or skips a record keeps its own
steps and times (24 bytes a point). A series that was aligned and misses a record gets its own copy when its
next value arrives, so a value that comes a line later (an amended record) keeps it aligned.

The state file (`StateDB`) keeps the same columns as pieces of array bytes, so a restart reads them back
without parsing one record's JSON; a piece of PACKED_POINTS or more (merged once more at most) is compressed
(`pack`: its bytes shuffled into planes, then zstd: 1-4 bytes a value where raw takes 8);
the shorter ones, which the merges of the next flushes rewrite, are kept raw. Each column is stored as a few pieces, `(start, points)`: a flush writes
the points added since the last one as a new piece, merged with the pieces before it while they are not
longer than it (a binary counter: a column of n points is at most log2(n) pieces and every point is rewritten
at most log2(n) times). Each series' min/max block summary (`series.Blocks`, what a zoomed-out chart reads) is
built at the flush and saved whole beside them, so the first query after a restart does not build it. A manifest (sources' facts, series in creation order, each column's length) carries the
`seq` up to which records are in the columns; the records after it are indexed again from their JSON at start.
Flushes are written in the same transaction as the items (`StateDB.commit`), so columns and items never
disagree on disk.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

import cramjam

from mstail.tailer.history.series import BLOCK, Blocks, Series, summary

#: records indexed since the last flush that trigger the next one: what a restart after a crash may index
#: again from JSON (about 0.3 s), and what a flush writes at least (so the write cost per record stays small)
FLUSH_RECORDS = 65_536
#: points of a piece at most (1 MiB of values): pieces are made one at a time as SQLite takes them, so a flush
#: never holds more than this of a column's bytes, and a merge never rewrites more
PIECE_POINTS = 131_072
#: points from which a piece is packed (`pack`): a merge takes pieces no longer than the points after them up to
#: PIECE_POINTS, so such a piece is rewritten once more at most, where the short ones are rewritten at every flush
PACKED_POINTS = 32_768

#: a piece's first byte: how the rest holds its 8-byte words (`pack`)
RAW, PLANES = 0, 1

FrameKey = Tuple[str, int]  # (source, segment)
SeriesKey = Tuple[str, str, int]  # (source, metric, segment)
ColumnKey = Tuple[str, int, Optional[str]]  # (source, segment, metric or None for the frame)
#: a piece of a column as the state file keeps it: (source, segment, metric or None for the frame, start,
#: steps, times, values, non-finite indexes) with None for what the column does not hold
Piece = Tuple[str, int, Optional[str], int, Optional[bytes], Optional[bytes], Optional[bytes], Optional[bytes]]


def pack(column: array, start: int, end: int) -> bytes:
    """`column[start:end]` (8-byte words) as the state file keeps it: raw under PACKED_POINTS; else its words'
    bytes in planes (every first byte, then every second, ...: the high bytes of neighbouring numbers are alike),
    zstd-compressed."""
    raw = column[start:end].tobytes()
    if end - start < PACKED_POINTS:
        return b"\0" + raw
    planes = b"".join(raw[byte::8] for byte in range(8))
    return bytes([PLANES]) + bytes(cramjam.zstd.compress(planes, level=1))


def unpack(blob: bytes) -> Any:
    """A piece's array bytes (a bytes-like object: `array.frombytes` takes it) from what `pack` made of them."""
    if not blob or blob[0] == RAW:
        return memoryview(blob)[1:]
    if blob[0] != PLANES:
        raise ValueError(f"a piece of an unknown kind {blob[0]}")
    planes = memoryview(cramjam.zstd.decompress(blob[1:]))
    if len(planes) % 8:
        raise ValueError(f"a piece of {len(planes)} bytes")
    n = len(planes) // 8
    words = bytearray(len(planes))
    for byte in range(8):
        words[byte::8] = planes[byte * n:(byte + 1) * n]
    return words


@dataclass
class Frame:
    """The records of one source in one segment that have a plottable step: their steps and wall times."""

    steps: array = field(default_factory=lambda: array("q"))
    times: array = field(default_factory=lambda: array("d"))

    def new_series(self) -> Series:
        """A series for a metric first seen at the frame's newest record: aligned on the frame when that record
        is its first, else with steps and times of its own."""
        if len(self.steps) == 1:
            return Series(steps=self.steps, times=self.times)
        return Series()

    def add(self, series: Series, row: int, value: float) -> None:
        """Append `value` at the frame's `row` to `series`, giving an aligned series that missed rows its own
        steps and times first."""
        values = series.values
        if series.steps is self.steps:
            n = len(values)
            if n == row:
                if not value - value == 0:
                    series.nonfinite.append(n)
                values.append(value)
                return
            series.steps, series.times = self.steps[:n], self.times[:n]
        series.append(self.steps[row], value, self.times[row])

    def extend(self, series: Series, row: int, values: array) -> None:
        """`add` of `values` at the frame's rows `row`, `row + 1`, ... at once (rows the frame holds already)."""
        n = len(series.values)
        if series.steps is self.steps and n != row:  # it missed rows: steps and times of its own from now on
            series.steps, series.times = self.steps[:n], self.times[:n]
        if series.steps is not self.steps:
            end = row + len(values)
            series.steps.extend(self.steps[row:end])
            series.times.extend(self.times[row:end])
        total = sum(values)
        if total - total != 0:  # a NaN or an infinity among them
            series.nonfinite.extend(n + i for i, value in enumerate(values) if value - value != 0)
        series.values.extend(values)


@dataclass
class _Saved:
    """What the state file holds of one column: its pieces (start, points) in order, and whether they hold
    steps and times (they do not for an aligned series)."""

    pieces: List[Tuple[int, int]] = field(default_factory=list)
    own_steps: bool = True

    @property
    def points(self) -> int:
        return self.pieces[-1][0] + self.pieces[-1][1] if self.pieces else 0


#: a piece to write: the column's key, its first and end point, and the arrays it is cut from (None for what the
#: column does not hold)
Cut = Tuple[ColumnKey, int, int, Optional[array], Optional[array], Optional[array], Optional[List[int]]]


@dataclass
class Flush:
    """One flush of the columns, written by `StateDB.commit` in the items' transaction, maybe in the state's writer
    thread while the loop goes on: its cuts refer to the live arrays, which only grow (a series that gets steps of
    its own gets new arrays), so the points below a cut's end stay as they were when it was made."""

    cuts: List[Cut]
    deletes: List[Tuple[str, int, Optional[str], int]]  # (source, segment, metric or None, start)
    blocks: List[Tuple[str, int, str, bytes, bytes]]  # (source, segment, metric, mins, maxs): summaries that grew
    manifest: Dict[str, Any]
    #: every column written from its start: what the state file held of them goes first (a rebuild's, or an
    #: earlier mstail's raw pieces, whose starts need not be these)
    whole: bool = False
    #: what the columns owed before it (saved_seq, pending, dirty_below, manifest_saved), owed again if not written
    owed: Tuple[int, int, bool, bool] = (0, 0, False, False)

    def pieces(self, frames: bool) -> Iterator[Piece]:
        """The pieces of the frames (or of the series) to write, each made when it is asked for (`pack`)."""
        for key, start, end, steps, times, values, bad in self.cuts:
            if (key[2] is None) != frames:
                continue
            nonfinite = None if bad is None else array("q", bad[bisect_left(bad, start):bisect_left(bad, end)])
            yield (*key, start, *(None if c is None else pack(c, start, end) for c in (steps, times, values)),
                   None if nonfinite is None else pack(nonfinite, 0, len(nonfinite)))  # type: ignore[misc]  # a starred tuple mypy cannot size


class Columns:
    """Frames and series of every source, and what of them the state file holds. Event loop only, as the
    `Store` that owns it."""

    def __init__(self) -> None:
        self.frames: Dict[FrameKey, Frame] = {}
        self.series: Dict[SeriesKey, Series] = {}  # in creation order
        self._saved: Dict[ColumnKey, _Saved] = {}
        self._saved_blocks: Dict[SeriesKey, int] = {}  # blocks of each series' summary in the state file
        self.saved_seq = 0  # every record up to this seq is in the state file's columns (or a flush being written)
        self.pending = 0  # records indexed since the last flush
        self.dirty_below = False  # a record at or below `saved_seq` changed (an amend): flush at the next commit
        self.manifest_saved = False  # a state with items but no manifest is an earlier mstail's (see `Store.load`)

    def clear(self) -> None:
        self.frames.clear()
        self.series.clear()
        self._saved.clear()
        self._saved_blocks.clear()
        self.saved_seq = self.pending = 0
        self.dirty_below = self.manifest_saved = False

    def due(self) -> bool:
        return self.pending >= FLUSH_RECORDS or self.dirty_below or not self.manifest_saved

    def flush(self, seq: int, sources: Dict[str, Dict[str, Any]]) -> Flush:
        """What to write so that the state file holds every column as it is now, for records up to `seq`;
        `sources`: each source's facts for the manifest. It is taken as written from now on (it may be written in
        the state's writer thread while the loop goes on); call `flushed` with whether it was."""
        cuts: List[Cut] = []
        deletes: List[Tuple[str, int, Optional[str], int]] = []
        for (source, segment), frame in self.frames.items():
            self._cut((source, segment, None), frame.steps, frame.times, None, None, cuts, deletes)
        layout = []
        blocks = []
        for (source, metric, segment), series in self.series.items():
            aligned = series.steps is self.frames[(source, segment)].steps
            self._cut((source, segment, metric), None if aligned else series.steps,
                      None if aligned else series.times, series.values, series.nonfinite, cuts, deletes)
            layout.append([source, metric, segment, aligned, len(series.values)])
            summed = summary(series)
            if len(summed.mins) != self._saved_blocks.get((source, metric, segment), 0):
                blocks.append((source, segment, metric, summed.mins.tobytes(), summed.maxs.tobytes()))
        manifest = {
            "packed": 1,  # the pieces as `pack` makes them (none: an earlier mstail's raw bytes)
            "seq": seq,
            "sources": sources,
            "frames": [[source, segment, len(frame.steps)] for (source, segment), frame in self.frames.items()],
            "series": layout,
        }
        owed = (self.saved_seq, self.pending, self.dirty_below, self.manifest_saved)
        whole = not self._saved
        # taken as written from now on: an amend of a record it holds, made while it is written, flushes again
        self.saved_seq, self.pending, self.dirty_below, self.manifest_saved = seq, 0, False, True
        return Flush(cuts, deletes, blocks, manifest, owed=owed, whole=whole)

    def flushed(self, flush: Flush, written: bool = True) -> None:
        """`flush` is on disk (`written`): remember its pieces; or it is not: what it took is owed again (the pieces
        it would have written are cut again by the next flush)."""
        if not written:
            saved_seq, pending, dirty_below, manifest_saved = flush.owed
            self.saved_seq, self.pending = saved_seq, self.pending + pending
            self.dirty_below, self.manifest_saved = self.dirty_below or dirty_below, manifest_saved
            return
        for source, segment, metric, start in flush.deletes:
            saved = self._saved[(source, segment, metric)]
            saved.pieces = [p for p in saved.pieces if p[0] != start]
        for key, start, end, steps, _times, _values, _bad in flush.cuts:
            saved = self._saved.setdefault(key, _Saved())
            saved.pieces.append((start, end - start))
            saved.own_steps = steps is not None
        for source, segment, metric, mins, _maxs in flush.blocks:
            self._saved_blocks[(source, metric, segment)] = len(mins) // 8

    def _cut(self, key: ColumnKey, steps: Optional[array], times: Optional[array], values: Optional[array],
             bad: Optional[List[int]], cuts: List[Cut], deletes: List[Tuple[str, int, Optional[str], int]]) -> None:
        """The pieces (and the pieces they replace) that bring one column's copy up to date."""
        n = len(values) if values is not None else len(steps)  # type: ignore[arg-type]  # a frame has steps
        saved = self._saved.get(key)
        if saved is not None and saved.own_steps != (steps is not None):
            # an aligned series that got its own steps: its pieces lack them, so it is written again whole
            deletes += [(*key, start) for start, _ in saved.pieces]
            saved = None
        if saved is not None and saved.points == n:
            return
        pieces = list(saved.pieces) if saved is not None else []
        start = pieces[-1][0] + pieces[-1][1] if pieces else 0
        while pieces and pieces[-1][1] <= n - start and n - pieces[-1][0] <= PIECE_POINTS:
            start = pieces.pop()[0]
            deletes.append((*key, start))
        for first in range(start, n, PIECE_POINTS):
            cuts.append((key, first, min(first + PIECE_POINTS, n), steps, times, values, bad))

    def restore(self, manifest: Dict[str, Any], pieces: Iterable[Piece],
                blocks: Iterable[Tuple[str, int, str, bytes, bytes]]) -> Optional[str]:
        """Rebuild the columns from the state file's `manifest`, `pieces` (ordered by source, segment, metric,
        start) and block summaries; returns why they cannot be used (and leaves the columns empty), or None."""
        columns: Dict[ColumnKey, List[Optional[array]]] = {}
        saved: Dict[ColumnKey, _Saved] = {}
        packed = manifest.get("packed") == 1
        for source, segment, metric, start, *blobs in pieces:
            if packed:
                try:
                    blobs = [None if blob is None else unpack(blob) for blob in blobs]
                except (ValueError, cramjam.DecompressionError) as exc:
                    return f"column {(source, segment, metric)} has a piece that does not unpack ({exc})"
            key = (source, segment, metric)
            column = columns.get(key)
            if column is None:
                column = columns[key] = [None if blob is None else array(code) for blob, code in zip(blobs, "qddq")]
                saved[key] = _Saved(own_steps=blobs[0] is not None)
            have = saved[key].points
            if start != have:
                return f"column {key} has a gap at point {have}"
            for target, blob in zip(column, blobs):
                if (target is None) != (blob is None):
                    return f"column {key} mixes pieces with and without steps"
                if target is not None and blob is not None:
                    if len(blob) % target.itemsize:
                        return f"column {key} has a piece of {len(blob)} bytes"
                    target.frombytes(blob)
            points = len(column[2] if metric is not None else column[0])  # type: ignore[arg-type]  # made above
            saved[key].pieces.append((start, points - start))
        frames: Dict[FrameKey, Frame] = {}
        for source, segment, length in manifest["frames"]:
            steps, times, _values, _bad = columns.get((source, segment, None)) or [array("q"), array("d"), None, None]
            if steps is None or times is None or len(steps) != length or len(times) != length:
                return f"the frame of {source} (segment {segment}) does not hold {length} records"
            frames[(source, segment)] = Frame(steps, times)
        series: Dict[SeriesKey, Series] = {}
        for source, metric, segment, aligned, length in manifest["series"]:
            frame = frames.get((source, segment))
            steps, times, values, bad = columns.get((source, segment, metric)) or [None, None, None, None]
            if frame is None or values is None or len(values) != length or (steps is None) != aligned:
                return f"the column of {metric!r} of {source} (segment {segment}) does not hold {length} points"
            if aligned:
                steps, times = frame.steps, frame.times
                if len(steps) < length:
                    return f"the column of {metric!r} of {source} is longer than its frame"
            elif len(steps) != length or len(times) != length:  # type: ignore[arg-type]  # its own: not aligned
                return f"the column of {metric!r} of {source} (segment {segment}) has steps missing"
            series[(source, metric, segment)] = Series(steps=steps, values=values, times=times,  # type: ignore[arg-type]  # see the elif
                                                       nonfinite=bad.tolist())  # type: ignore[union-attr]  # a metric's has one
        saved_blocks: Dict[SeriesKey, int] = {}
        for source, segment, metric, mins, maxs in blocks:
            owner = series.get((source, metric, segment))
            if owner is None or len(mins) != len(maxs) or len(mins) % 8 or len(mins) // 8 > len(owner) // BLOCK:
                return f"the block summary of {metric!r} of {source} (segment {segment}) does not fit its column"
            owner.blocks = Blocks(array("d", mins), array("d", maxs))
            saved_blocks[(source, metric, segment)] = len(mins) // 8
        self.frames.update(frames)
        self.series.update(series)  # in place: the store holds this dict
        self._saved_blocks = saved_blocks
        self._saved = saved
        self.saved_seq = manifest["seq"]
        self.manifest_saved = True
        if not packed:  # an earlier mstail's raw pieces: saved again whole, packed, at the next commit
            self._saved, self._saved_blocks, self.manifest_saved = {}, {}, False
        return None
