"""Bytes -> the frames of an event file (TensorBoard `events.out.tfevents.*`, MindSpore `*.summary.*_MS`), with offsets.

Both writers append records in TFRecord framing: a little-endian u64 length, the masked CRC-32C of those 8 bytes,
the data, the masked CRC-32C of the data. `FrameSplitter` is the event-file twin of `lines.LineSplitter`: it takes
the bytes of one file as they grow and hands out each complete frame whose checksums hold, with its offsets, so the
follower, its rotation handling and the checkpoint (the offset of the next frame) work unchanged.

- A torn tail (a frame whose bytes have not all arrived) waits, without an error, for more bytes.
- A checksum that fails (the length's or the data's) is counted in `bad_frames`, and the reader looks for the
  first offset after the frame's first byte where a whole frame's length *and* data checksums both hold (a chance
  match of two CRC-32Cs is one in 2^64), counting the bytes passed over in `skipped_bytes`. Why not skip the bad
  frame by its length when the length's own checksum holds: the usual bad frame is a torn one (a writer killed
  mid-write) followed by what a relaunch appended, and its length then reaches into the good frames after it; the
  search finds them all. It runs at C speed (`_resync`): megabytes of garbage or of NUL bytes (a crash's
  zero-filled tail) are passed in milliseconds.
- A length beyond what protobuf allows a message (`MAX_EVENT_BYTES`) counts as a failed checksum: skipping it as a
  big frame would pass over everything a writer appends after it.
- A frame longer than `max_frame_bytes` (an image, a histogram: never a scalar) is passed over without being read
  into memory, counted in `big_frames`; memory stays bounded by that limit.

`is_event_file(path)` says whether a path is an event file, by its name or, when the name says nothing, by its
first frame; it is the one place that decides it (discovery, the sidecar and `mstail parse` call it).
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path
from typing import List, NamedTuple, Optional, Tuple

import google_crc32c

from mstail.parsers.eventfile import MINDSPORE, TENSORBOARD

#: The header: length (u64) and its masked CRC-32C (u32); the data's masked CRC-32C (u32) follows the data.
_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
HEADER_BYTES = _HEADER.size
FOOTER_BYTES = _FOOTER.size
_NO_HEADER = bytes(HEADER_BYTES)  # twelve zero bytes: the masked CRC of a zero length is not zero
#: protobuf refuses a message of 2 GiB or more: a length beyond it (2^63, 4 GiB, with a checksum that holds by chance
#: or by design) is no frame of an event, and is treated as a bad frame, never as a big one whose bytes are skipped
MAX_EVENT_BYTES = (1 << 31) - 1

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
        if self._skip:
            taken = min(self._skip, len(data))
            self._skip -= taken
            self._buffer_start += taken
            data = data[taken:]
        self._buffer += data
        frames: List[Frame] = []
        # One immutable copy per feed: each slice of it is then a single copy (a bytearray slice would be two).
        buffer, pos, limit = bytes(self._buffer), 0, self.max_line_bytes
        while len(buffer) - pos >= HEADER_BYTES:
            if self._lost:
                pos = self._resync(pos)
                if self._lost:
                    break  # no valid frame starts in what there is: wait for more bytes
            length, length_crc = _HEADER.unpack_from(buffer, pos)
            if _masked_crc(buffer[pos:pos + 8]) != length_crc or length > MAX_EVENT_BYTES:
                self.bad_frames += 1
                self.skipped_bytes += 1
                self._lost = True
                pos += 1
                continue
            end = pos + HEADER_BYTES + length + FOOTER_BYTES
            if length > limit:
                self.big_frames += 1
                if end > len(buffer):  # pass the rest over as it comes, without holding it
                    self._skip = end - len(buffer)
                    self._buffer_start += len(buffer)
                    pos = len(buffer)
                    break
                pos = end
                continue
            if end > len(buffer):
                break  # a torn tail: the frame's bytes are still coming
            payload = buffer[pos + HEADER_BYTES:end - FOOTER_BYTES]
            if _masked_crc(payload) != _FOOTER.unpack_from(buffer, end - FOOTER_BYTES)[0]:
                self.bad_frames += 1
                self.skipped_bytes += 1
                self._lost = True  # the next valid frame may start anywhere after this one's first byte
                pos += 1
                continue
            start = self._buffer_start + pos
            frames.append(Frame(payload, start, start + end - pos, self.next_number))
            self.next_number += 1
            pos = end
        if pos:
            consumed = min(pos, len(buffer))
            del self._buffer[:consumed]
            if not self._skip:
                self._buffer_start += consumed
        return frames

    def _resync(self, pos: int) -> int:
        """The first offset from `pos` where a whole frame's two checksums hold (clears `_lost`), else where the
        search stopped for want of bytes; the bytes passed over are counted in `skipped_bytes`. The search runs at
        C speed (`bytes.find`, `lstrip`) over what cannot be a header: a frame we take has a length of at most
        `max_line_bytes`, so its length's high bytes are zero, and twelve zero bytes (a crash's zero-filled tail)
        are never a header; the checksums are computed only where such zeros are."""
        buffer, start = bytes(self._buffer), pos
        high = 8 - (self.max_line_bytes.bit_length() + 7) // 8  # the length's bytes that are zero in any frame taken
        zeros = b"\x00" * high
        while len(buffer) - pos >= HEADER_BYTES:
            if buffer[pos:pos + HEADER_BYTES] == _NO_HEADER:
                first = len(buffer) - len(buffer[pos:].lstrip(b"\x00"))  # the first non-zero byte
                pos = max(pos + 1, first - HEADER_BYTES + 1)  # a header may begin with zeros before it
                continue
            if high:
                found = buffer.find(zeros, pos + 8 - high)
                if found < 0:  # no candidate whose length is all here: the next one ends past what there is
                    pos = max(pos, len(buffer) - 7)
                    break
                pos = found - (8 - high)
                if len(buffer) - pos < HEADER_BYTES:
                    break
            length, length_crc = _HEADER.unpack_from(buffer, pos)
            if length <= self.max_line_bytes and _masked_crc(buffer[pos:pos + 8]) == length_crc:
                end = pos + HEADER_BYTES + length + FOOTER_BYTES
                if end > len(buffer):
                    break  # a candidate whose bytes are still coming: decided when they are here
                payload = buffer[pos + HEADER_BYTES:end - FOOTER_BYTES]
                if _masked_crc(payload) == _FOOTER.unpack_from(buffer, end - FOOTER_BYTES)[0]:
                    self._lost = False
                    break
            pos += 1
        self.skipped_bytes += pos - start
        return pos


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
