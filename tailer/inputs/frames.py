"""Bytes -> the frames of an event file (TensorBoard `events.out.tfevents.*`, MindSpore `*.summary.*_MS`), with offsets.

Both writers append records in TFRecord framing: a little-endian u64 length, the masked CRC-32C of those 8 bytes,
the data, the masked CRC-32C of the data. `FrameSplitter` is the event-file twin of `lines.LineSplitter`: it takes
the bytes of one file as they grow and hands out each complete frame whose checksums hold, with its offsets, so the
follower, its rotation handling and the checkpoint (the offset of the next frame) work unchanged.

- A torn tail (a frame whose bytes have not all arrived) waits, without an error, for more bytes, unless a valid
  frame starts inside the bytes it claims: then it was no frame (a length written as garbage, or a writer killed
  mid-frame and relaunched) and counts as a bad one. So a header claiming bytes past the end of a finished file
  hides nothing after it, while a live writer's half-written frame still waits.
- A checksum that fails (the length's or the data's) is counted in `bad_frames`, and the reader looks for the
  first offset after the frame's first byte where a whole frame's length *and* data checksums both hold (a chance
  match of two CRC-32Cs is one in 2^64), counting the bytes passed over in `skipped_bytes`. Why not skip the bad
  frame by its length when the length's own checksum holds: the usual bad frame is a torn one (a writer killed
  mid-write) followed by what a relaunch appended, and its length then reaches into the good frames after it; the
  search finds them all. The search (`framescan.FrameScan`) checks every offset at once at a cost that does not
  depend on the lengths claimed: garbage, zero-filled tails and crafted headers claiming a megabyte at every offset
  all cost tens of milliseconds of CPU per MB (docs/performance.md). Checksums failing over more than a buffer's
  worth of data route the buffer's longer frames through the same search.
- A length beyond what protobuf allows a message (`MAX_EVENT_BYTES`) counts as a failed checksum: skipping it as a
  big frame would pass over everything a writer appends after it.
- A frame longer than `max_frame_bytes` (an image, a histogram: never a scalar) is passed over without being read
  into memory, counted in `big_frames`; memory stays bounded by that limit. Its bytes are watched as they pass (the
  last `max_frame_bytes` of them kept): a valid frame inside makes it a bad frame, read on from there.

`is_event_file(path)` says whether a path is an event file, by its name or, when the name says nothing, by its
first frame; it is the one place that decides it (discovery, the sidecar and `mstail parse` call it).
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path
from typing import TYPE_CHECKING, List, NamedTuple, Optional, Tuple, cast

import google_crc32c

from mstail.parsers.eventfile import MINDSPORE, TENSORBOARD

if TYPE_CHECKING:
    from mstail.tailer.inputs.framescan import FrameScan

#: The header: length (u64) and its masked CRC-32C (u32); the data's masked CRC-32C (u32) follows the data.
_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
HEADER_BYTES = _HEADER.size
FOOTER_BYTES = _FOOTER.size
#: protobuf refuses a message of 2 GiB or more: a length beyond it (2^63, 4 GiB, with a checksum that holds by chance
#: or by design) is no frame of an event, and is treated as a bad frame, never as a big one whose bytes are skipped
MAX_EVENT_BYTES = (1 << 31) - 1
#: frames this long or longer are checked by the `FrameScan` once checksums failing in one buffer added up to more
#: than the buffer: each then costs the same whatever length it claims
_SCAN_FROM = 4096

#: TensorBoard's and tensorboardX's file names; MindSpore's SummaryRecord writes `..._MS` beside `..._lineage`
#: (lineage records, no scalars) and `..._explain`.
_TENSORBOARD_NAME = re.compile(r"^events\.out\.tfevents\.")
_MINDSPORE_NAME = re.compile(r"^events\.out\.events\.summary\..*_MS$")
#: the writer's start time in a name (`events.out.tfevents.1700000000.host`): files of a folder are read in its order
_NAME_TIME = re.compile(r"\.(\d{9,12})(?:\.|$)")


def _masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC-32C: rotated right by 15 bits plus a constant, so a CRC of data holding CRCs differs."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class Frame(NamedTuple):
    """One complete, checksum-valid frame of an event file."""

    payload: bytes  # the frame's data: one serialized Event
    start: int  # byte offset of the frame (its header) in its file
    end: int  # byte offset just past its data checksum
    number: int  # 1-based number of the frame in its file

    @property
    def text(self) -> bytes:
        """What a source's parser is fed (a line's `text`): an event file's parser reads the payload."""
        return self.payload


class FrameSplitter:
    """Accumulates bytes read from one event file and splits them into `Frame`s; the same shape as `LineSplitter`
    (`feed`, `offset`, `next_number`, `pending_bytes` and the follower's counters).

    Args:
        start: byte offset of the first byte that will be fed (where reading starts); default 0.
        max_line_bytes: frames longer than this are passed over unread (`big_frames`); default 1 MiB.
        first_number: the number of the frame at `start`; default 1.
    """

    def __init__(self, start: int = 0, max_line_bytes: int = 1 << 20, first_number: int = 1) -> None:
        self.max_line_bytes = max_line_bytes
        self._buffer = bytearray()
        self._buffer_start = start  # file offset of _buffer[0]
        self._skip = 0  # bytes of a big frame still to pass over, not buffered
        self._lost = False  # looking for the next valid frame after a checksum failed
        self._big_start = 0  # file offset of the big frame being passed over
        self._watch = b""  # its last bytes passed (at most a frame's): where a valid frame may start
        self._scan: Optional[FrameScan] = None  # the frame search of the buffer, kept while it waits for more bytes
        self._watch_scan: Optional[FrameScan] = None  # the frame search of `_watch`, kept as it slides on
        self.next_number = first_number
        self.bad_frames = 0  # checksums that failed (each a place where the search for the next valid frame began)
        self.skipped_bytes = 0  # bytes passed over while looking for the next valid frame
        self.big_frames = 0
        # LineSplitter's counters, which the follower adds up for every file: nothing in a frame is cut or decoded.
        self.cut_lines = self.replaced_lines = self.nul_bytes = 0

    @property
    def offset(self) -> int:
        """File offset where the next complete frame starts (the resume point of a checkpoint)."""
        return self._buffer_start + (self._skip if self._skip and not self._buffer else 0)

    @property
    def pending_bytes(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes, blocks: bool = False) -> List[Frame]:
        """The complete, valid frames `data` finishes, in order (`blocks` is the line splitter's option: no meaning
        here)."""
        frames: List[Frame] = []
        if self._skip and data:
            data = self._pass_big(data)
        self._buffer += data
        while self._split(frames):
            pass
        return frames

    def _split(self, frames: List[Frame]) -> bool:
        """Take the buffer's frames into `frames`; True when a big frame turned out to hold valid frames and the
        buffer is to be split again from the first of them."""
        if self._lost and self._scan is not None and len(self._buffer) >= HEADER_BYTES and self._search_on():
            return False
        # One immutable copy per feed: each slice of it is then a single copy (a bytearray slice would be two).
        buffer, pos, limit = bytes(self._buffer), 0, self.max_line_bytes
        scan: Optional[FrameScan] = None  # built when first needed, then asked from later and later offsets
        wasted = 0  # data checksummed in vain (frames whose data checksum failed)
        big: Optional[bytes] = None  # what follows the first byte of a big frame met
        while len(buffer) - pos >= HEADER_BYTES:
            if self._lost:
                scan = scan or _scan(buffer, limit, self._buffer_start, self._scan)
                pos = self._resync(scan, pos)
                if self._lost:
                    break  # no valid frame starts in what there is: wait for more bytes
            length, length_crc = _HEADER.unpack_from(buffer, pos)
            if _masked_crc(buffer[pos:pos + 8]) != length_crc or length > MAX_EVENT_BYTES:
                pos = self._bad(pos, pos + 1)
                continue
            end = pos + HEADER_BYTES + length + FOOTER_BYTES
            if length > limit:  # passed over as it comes, without holding it, watched for valid frames inside
                self.big_frames += 1
                self._skip, self._big_start, big = end - pos - 1, self._buffer_start + pos, buffer[pos + 1:]
                pos = len(buffer)
                break
            if end > len(buffer):
                scan = scan or _scan(buffer, limit, self._buffer_start, self._scan)
                found = scan.first_valid(pos + 1)
                if found is None:
                    break  # a torn tail: the frame's bytes are still coming
                pos = self._bad(pos, found, lost=False)  # frames start inside it: it claimed bytes it does not have
                continue
            if length >= _SCAN_FROM and wasted > len(buffer):  # crafted lengths: each checked at a constant cost
                scan = scan or _scan(buffer, limit, self._buffer_start, self._scan)
                valid = scan.first_valid(pos) == pos
            else:
                data_crc = _FOOTER.unpack_from(buffer, end - FOOTER_BYTES)[0]
                valid = _masked_crc(buffer[pos + HEADER_BYTES:end - FOOTER_BYTES]) == data_crc
                wasted += 0 if valid else length
            if not valid:
                pos = self._bad(pos, pos + 1)  # the next valid frame may start anywhere after this one's first byte
                continue
            start = self._buffer_start + pos
            payload = buffer[pos + HEADER_BYTES:end - FOOTER_BYTES]
            frames.append(Frame(payload, start, start + end - pos, self.next_number))
            self.next_number += 1
            pos = end
        del self._buffer[:pos]
        self._buffer_start += pos
        # what waits for more bytes (claims past them) is kept for the next feed, not searched again
        self._scan = scan if scan is not None and self._buffer and big is None else None
        if big is None:
            return False
        self._buffer_start = self._big_start + 1
        self._buffer = bytearray(self._pass_big(big))
        return bool(self._buffer)

    def _bad(self, pos: int, to: int, lost: bool = True) -> int:
        """A frame at `pos` that is none: counted, its bytes up to `to` passed over (`lost`: and the next valid
        frame looked for from there)."""
        self.bad_frames += 1
        self.skipped_bytes += to - pos
        self._lost = lost
        return to

    def _search_on(self) -> bool:
        """Still looking for a valid frame, the search of the buffer kept while it waited for more bytes: it goes on
        over the bytes it has not read (those that arrived, and a few before), copying them alone, not the whole
        buffer (a stretch of headers claiming a megabyte each waits a megabyte long). True when no valid frame starts
        yet (the buffer then starts where the search waits); else the buffer starts at the valid frame found, to be
        split as usual."""
        scan = cast("FrameScan", self._scan)
        skip = scan.untouched(self._buffer_start)
        scan = _scan(bytes(self._buffer[skip:]), self.max_line_bytes, self._buffer_start, scan, skip)
        pos = self._resync(scan, 0)
        del self._buffer[:pos]
        self._buffer_start += pos
        self._scan = scan if self._lost and self._buffer else None
        return self._lost

    def _resync(self, scan: FrameScan, pos: int) -> int:
        """The first offset from `pos` where a whole valid frame starts (clears `_lost`); else the first where a
        frame whose length checksum holds is still coming in, else the last bytes a header may start in: the bytes
        passed over are counted in `skipped_bytes`. A frame claiming bytes past the buffer that has a valid frame
        starting inside it is passed over."""
        found = scan.first_valid(pos)
        if found is not None:
            self._lost = False
        else:
            found = scan.first_waiting(pos)
            if found is None:
                found = max(pos, scan.size - HEADER_BYTES + 1)
        self.skipped_bytes += found - pos
        return found

    def _pass_big(self, data: bytes) -> bytes:
        """Pass over the big frame's bytes in `data`; what follows it, to be split. Its bytes are watched (the last
        `max_line_bytes` of them kept): a valid frame starting inside it makes it a bad frame, and splitting goes on
        from that frame (a length with a valid checksum written as garbage must not swallow what follows)."""
        taken = data[:self._skip]
        window = self._watch + taken
        window_start = self._buffer_start - len(self._watch)
        found = None
        if len(window) >= HEADER_BYTES + FOOTER_BYTES:
            self._watch_scan = _scan(window, self.max_line_bytes, window_start, self._watch_scan)
            found = self._watch_scan.first_valid(0)
        if found is not None:
            self.big_frames -= 1
            self._bad(self._big_start, window_start + found, lost=False)
            self._skip, self._watch, self._watch_scan, self._buffer_start = 0, b"", None, window_start + found
            return window[found:] + data[len(taken):]
        self._skip -= len(taken)
        self._buffer_start += len(taken)
        self._watch = window[-(self.max_line_bytes + HEADER_BYTES + FOOTER_BYTES):] if self._skip else b""
        self._watch_scan = self._watch_scan if self._skip else None
        return data[len(taken):]


def _scan(buffer: bytes, limit: int, base: int = 0, previous: Optional[FrameScan] = None,
          skip: int = 0) -> "FrameScan":
    from mstail.tailer.inputs.framescan import FrameScan  # numpy: only once damage or a torn frame is met

    return FrameScan(buffer, limit, base, previous, skip)


def frame(payload: bytes) -> bytes:
    """`payload` in TFRecord framing (for tests and benches that write event files byte by byte)."""
    header = struct.pack("<Q", len(payload))
    return header + struct.pack("<I", _masked_crc(header)) + payload + struct.pack("<I", _masked_crc(payload))


def event_file_kind(name: str) -> Optional[str]:
    """The kind of event file a file name says (`TENSORBOARD`, `MINDSPORE`), else None."""
    if _TENSORBOARD_NAME.match(name):
        return TENSORBOARD
    if _MINDSPORE_NAME.match(name):
        return MINDSPORE
    return None


def _first_frame_valid(path: Path) -> bool:
    """Whether a file starts with a whole, checksum-valid frame holding a version event (`brain.Event:N`,
    `MindSpore.Event:N`): what every event writer writes first."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(HEADER_BYTES + 64 + FOOTER_BYTES)
    except OSError:
        return False
    if len(head) < HEADER_BYTES or _masked_crc(head[:8]) != _HEADER.unpack_from(head)[1]:
        return False  # no frame header (a text log): said without the splitter, whose damage scan imports numpy
    frames = FrameSplitter(max_line_bytes=64).feed(head)
    return bool(frames) and (b"brain.Event:" in frames[0].payload or b"MindSpore.Event:" in frames[0].payload)


def is_event_file(path: Path, sniff: bool = True) -> bool:
    """Whether `path` is read as an event file: its name says so (`events.out.tfevents.*`, MindSpore's
    `events.out.events.summary.*_MS`) or, with `sniff` (default True) and a name that says nothing, its first
    frame is a valid version event. One `open` and a read of 76 bytes at most; a file that cannot be read is not."""
    if event_file_kind(path.name) is not None:
        return True
    if not sniff or path.name.startswith("events.out."):  # a lineage or explain summary: no scalars
        return False
    return _first_frame_valid(path)


def name_order(path: Path) -> Tuple[int, str]:
    """Sort key of a folder's event files: the writer's start time in the name, then the name."""
    found = _NAME_TIME.search(path.name)
    return (int(found.group(1)) if found else 0, path.name)


def event_files_in(folder: Path) -> List[Path]:
    """The event files a name says are such (`event_file_kind`) in `folder`, oldest first by `name_order`."""
    try:
        names = [entry.name for entry in os.scandir(folder) if event_file_kind(entry.name) and entry.is_file()]
    except OSError:
        return []
    return sorted((folder / name for name in names), key=name_order)


def event_source(path: Path) -> Tuple[Path, Optional[str]]:
    """What a followed path stands for: (its folder, the kind its name says) for an event file named as such, (the
    path, "") for one known by its content, (the path, None) for any other file (a text log)."""
    kind = event_file_kind(path.name)
    if kind is not None:
        return path.parent, kind
    return (path, "") if path.is_file() and is_event_file(path) else (path, None)
