"""Crafted event-file bytes, for the hostile-input tests and the bench (tests/bench/crafted_events.py).

Each `CRAFTED[name](size)` gives about `size` bytes of one attack, to be put between good frames (`version()`,
`good(steps)`): a tensor shape of many huge dims, frames of many 10-byte varints, deeply nested unknown fields,
fake 12-byte headers whose length checksum holds (each claiming about a megabyte), zero-filled stretches, and headers
claiming bytes past the end of the file (100 of them: 1.2 KB, whatever `size`).

As a writer process: `python -m tests.hostile.crafted_events FILE PART...` appends to FILE, flushing each part on its
own and pausing 0.2 s between parts (a part: `version`, `good:FIRST:LAST` one loss per step, or `NAME:SIZE` an attack).
"""

from __future__ import annotations

import struct
import sys
import time
from typing import Callable, Dict, Iterable

from mstail.parsers.eventschema import TensorBoardEvent
from mstail.tailer.inputs.frames import _masked_crc, frame

MB = 1 << 20


def varint(number: int) -> bytes:
    out = bytearray()
    while True:
        low, number = number & 0x7F, number >> 7
        out.append(low | (0x80 if number else 0))
        if not number:
            return bytes(out)


def field(number: int, wire: int, payload: bytes) -> bytes:
    """A protobuf field: `payload` as it is for a varint (wire 0) or fixed (1, 5) field, length-prefixed for wire 2."""
    return varint(number << 3 | wire) + (varint(len(payload)) + payload if wire == 2 else payload)


def version() -> bytes:
    return frame(TensorBoardEvent(wall_time=1.0, file_version="brain.Event:2").SerializeToString())


def good(steps: Iterable[int], tag: str = "loss") -> bytes:
    """One frame a step: `tag` = 1/step (a float32 of it)."""
    out = []
    for step in steps:
        event = TensorBoardEvent(wall_time=1700000000.0 + step, step=step)
        value = event.summary.value.add()
        value.tag, value.simple_value = tag, 1.0 / step
        out.append(frame(event.SerializeToString()))
    return b"".join(out)


def header(length: int) -> bytes:
    """A frame header claiming `length` bytes, its length checksum valid; no data follows."""
    packed = struct.pack("<Q", length)
    return packed + struct.pack("<I", _masked_crc(packed))


def _shapes(size: int) -> bytes:
    """Frames of up to 480 KB: a tensor whose shape has a dim of 2^62 every 13 bytes (their product a huge integer)."""
    each = min(size, 480_000)
    dims = b"".join(field(2, 2, field(1, 0, varint(1 << 62))) for _ in range(each // 13))
    tensor = field(1, 0, varint(1)) + field(2, 2, dims) + field(5, 2, struct.pack("<f", 1.0))
    event = field(2, 0, varint(7)) + field(5, 2, field(1, 2, field(1, 2, b"x") + field(8, 2, tensor)))
    return frame(event) * max(1, size // each)


def _varints(size: int) -> bytes:
    """Frames of 100 KB of 10-byte varints (a step field repeated)."""
    each = 100_000
    return frame(field(2, 0, b"\xff" * 9 + b"\x01") * (each // 11)) * max(1, size // each)


def _nesting(size: int) -> bytes:
    """Frames of 50 KB: unknown length-delimited fields nested as deep as the bytes allow."""
    each, inner = 50_000, b""
    while len(inner) < each:
        inner = field(15, 2, inner)
    return frame(field(2, 0, varint(3)) + inner) * max(1, size // each)


def _fake_headers(size: int) -> bytes:
    """Fake headers back to back, each claiming just under 1 MiB (the default frame limit), checksums valid."""
    return b"\x00" + b"".join(header(MB - 100 - index % 7) for index in range(size // 12))


def _zeros(size: int) -> bytes:
    return bytes(size)


def _past_the_end(size: int) -> bytes:
    """100 headers claiming a megabyte more or less (under the frame limit): 1.2 KB, whatever `size`."""
    return b"".join(header(10**6 + index) for index in range(100))


def _past_the_end_big(size: int) -> bytes:
    """100 headers claiming 100 MB each (over the frame limit: passed over unread)."""
    return b"".join(header(10**8 + index) for index in range(100))


CRAFTED: Dict[str, Callable[[int], bytes]] = {
    "shapes": _shapes, "varints": _varints, "nesting": _nesting, "fake_headers": _fake_headers, "zeros": _zeros,
    "past_the_end": _past_the_end, "past_the_end_big": _past_the_end_big,
}


def part(spec: str) -> bytes:
    name, _, rest = spec.partition(":")
    if name == "version":
        return version()
    if name == "good":
        first, last = map(int, rest.split(":"))
        return good(range(first, last + 1))
    return CRAFTED[name](int(rest))


def main(path: str, *specs: str) -> None:
    with open(path, "ab") as out:
        for spec in specs:
            out.write(part(spec))
            out.flush()
            time.sleep(0.2)


if __name__ == "__main__":
    main(*sys.argv[1:])
