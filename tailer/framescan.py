"""Where valid frames start in a stretch of event-file bytes, found for every offset at once (numpy), in time linear
in the bytes whatever they hold.

Looking for the next valid frame after damage means trying every offset: does a length with a valid checksum start
here, and do the data's checksum hold over the length it claims? Trying them one by one costs the claimed length at
each offset whose length checksum holds, and a crafted file can make every twelfth byte such an offset, each claiming
a megabyte: a megabyte of CRC per byte of garbage. Here the CRC of any stretch comes from two prefix CRCs (CRC-32C is
linear over GF(2): the CRC of bytes [a, b) is the prefix register at b xor the register at a advanced over b - a zero
bytes, and advancing over n zero bytes is a table look-up per byte of n), so each candidate costs the same whatever
it claims, and the candidates of a stretch are all checked in a handful of array operations.

`FrameScan(buffer, limit, base, prefix)` answers for one buffer (the splitter's, during one `feed`; `base` its
file offset, `prefix` the registers kept from the file's last buffer while it waited for more bytes):
`first_valid(start)`, the first offset from `start` where a whole frame of at most `limit` bytes has both checksums holding, and
`first_waiting(start)`, the first offset where a frame's length checksum holds but its bytes run past the buffer.
Offsets are classified in windows that grow as the queries (always from a later offset) move on, so a buffer costs
one pass however many times it is asked.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import List, Optional

import google_crc32c
import numpy as np

_POLY = 0x82F63B78  # CRC-32C, reflected
_INIT = 0xFFFFFFFF
_BLOCK = 256  # bytes per block of prefix registers: a block's offset within it is one byte of a shift
#: the first window of offsets classified; each next one is twice the last
_MIN_WINDOW = 1 << 14
#: the first stretch of prefix registers computed; each extension at least doubles what there is
_MIN_PREFIX = 1 << 16


def _byte_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ _POLY, table >> 1).astype(np.uint32)
    return table


_TABLE = _byte_table()


def _pair_table() -> np.ndarray:
    """[v]: a register holding the 16-bit v advanced over two zero bytes: two bytes of input a look-up."""
    values = np.arange(1 << 16, dtype=np.uint32)
    for _ in range(2):
        values = (values >> 8) ^ _TABLE[values & 0xFF]
    return values


_PAIRS: List[np.ndarray] = []  # built when first needed (256 KiB)


def _apply(linear: np.ndarray, x: np.ndarray) -> np.ndarray:
    """A GF(2)-linear map of 32-bit registers (as the images of each byte of the input: shape (4, 256)) on `x`."""
    return linear[0][x & 0xFF] ^ linear[1][(x >> 8) & 0xFF] ^ linear[2][(x >> 16) & 0xFF] ^ linear[3][x >> 24]


def _zero_byte() -> np.ndarray:
    """The map that advances a register over one zero byte."""
    basis = np.arange(256, dtype=np.uint32)[None, :] << (np.arange(4, dtype=np.uint32)[:, None] * 8)
    return (basis >> 8) ^ _TABLE[basis & 0xFF]


#: _SHIFTS[t][d]: the map advancing a register over d * 256**t zero bytes (built as needed: 1 MiB per level)
_SHIFTS: List[np.ndarray] = []


def _shift_level(level: int) -> np.ndarray:
    while len(_SHIFTS) <= level:
        if not _SHIFTS:
            step = _zero_byte()
            maps = [np.arange(256, dtype=np.uint32)[None, :] << (np.arange(4, dtype=np.uint32)[:, None] * 8)]
        else:
            below = _SHIFTS[-1]
            step = _apply(below[255], below[1])  # 256**t zero bytes: 255 then 1 of the level below
            maps = [below[0]]
        for _ in range(255):
            maps.append(_apply(step, maps[-1]))
        _SHIFTS.append(np.stack(maps))
    return _SHIFTS[level]


def shift(x: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Registers `x` advanced over `n` zero bytes each (elementwise)."""
    top = int(n.max()) if n.size else 0
    level = 0
    while top >> (8 * level):
        maps = _shift_level(level).reshape(-1)  # [digit, byte of x, its value] flat: one index per look-up
        base = ((n >> (8 * level)) & 0xFF).astype(np.uint32) << 10
        x = (maps.take(base | (x & 0xFF)) ^ maps.take(base | 0x100 | ((x >> 8) & 0xFF))
             ^ maps.take(base | 0x200 | ((x >> 16) & 0xFF)) ^ maps.take(base | 0x300 | (x >> 24)))
        level += 1
    return x


def masked(crc: np.ndarray) -> np.ndarray:
    """TFRecord's mask of CRC-32Cs (`frames._masked_crc`), elementwise (uint32: the shift and the sum wrap)."""
    return ((crc >> 15) | (crc << 17)) + np.uint32(0xA282EAD8)


def _header_tables() -> np.ndarray:
    """CRC-32C of 8 bytes is affine in them: tables[k][v] = what byte k being v adds (xor) to the CRC of zeros."""
    zero = google_crc32c.value(bytes(8))
    tables = np.empty((8, 256), dtype=np.uint32)
    for k in range(8):
        for v in range(256):
            tables[k, v] = google_crc32c.value(bytes(k) + bytes((v,)) + bytes(7 - k)) ^ zero
    return tables


_HEADER_TABLES: List[np.ndarray] = []
_HEADER_ZERO = google_crc32c.value(bytes(8))
#: lengths up to this have their masked checksums in a table (4 bytes each: 4 MiB for the default 1 MiB frame limit)
_TABLED_LENGTHS = 1 << 22
#: (limit, the masked checksum of each length up to it)
_BY_LENGTH: List[tuple] = []


def _header_checksums(limit: int, lengths: np.ndarray, u8: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The masked checksum each of `lengths` (at most `limit`, stored at `offsets` of `u8`) should have."""
    if not _HEADER_TABLES:
        _HEADER_TABLES.append(_header_tables())
    tables = _HEADER_TABLES[0]
    if limit <= _TABLED_LENGTHS:
        if not _BY_LENGTH or _BY_LENGTH[0][0] != limit:
            every = np.arange(limit + 1, dtype=np.uint32)
            crc = np.full(limit + 1, _HEADER_ZERO, dtype=np.uint32)
            for k in range(3):
                crc ^= tables[k][(every >> (8 * k)) & 0xFF]
            _BY_LENGTH[:] = [(limit, masked(crc))]
        return _BY_LENGTH[0][1][lengths]
    crc = np.full(offsets.size, _HEADER_ZERO, dtype=np.uint32)
    for k in range(max(1, (limit.bit_length() + 7) // 8)):  # the bytes above are zero in a length of at most `limit`
        crc ^= tables[k][u8[offsets + k]]
    return masked(crc)


class _Prefix:
    """Prefix registers of a file's bytes (the register after the bytes from `origin` to an offset, CRC-32C's initial
    value in at `origin`), at any file offsets asked, computed for the blocks asked about and kept: block starts by
    `google_crc32c` (C speed), the even offsets within blocks for all blocks at once, two bytes of each block a step;
    an odd offset is one byte more. Kept from one buffer of the file to the next (`attach`): a stretch that waits for
    more bytes (claims reaching past them) is not computed again each time they grow."""

    def __init__(self, origin: int) -> None:
        self.origin = origin
        self.first = self.end = 0  # blocks [first, end) known; block k: the file's bytes from origin + k * _BLOCK
        self.whole = 0  # blocks whose bytes were all there (the one after may be known with bytes missing)
        self.inner = np.empty((_BLOCK // 2, 0), dtype=np.uint32)  # [i, k]: the register at byte 2i of block first + k
        self._carry = 0  # the CRC at block `end`'s start

    def attach(self, buffer: bytes, base: int) -> "_Prefix":
        """Use with `buffer`, the file's bytes from offset `base` on (the same file's, from no earlier than the last
        buffer's start): the blocks known from base's on are kept, from the first one whose bytes were not all there
        computed again; anything else, and all is computed from `base`."""
        keep = (base - self.origin) // _BLOCK
        if self.end > self.first and self.first <= keep < self.whole and self.origin + self.whole * _BLOCK >= base:
            if self.whole < self.end:
                self._carry = int(self.inner[0, self.whole - self.first]) ^ _INIT
            self.inner = self.inner[:, keep - self.first:self.whole - self.first]
            self.first, self.end = keep, self.whole
        else:
            self.__init__(base)  # type: ignore[misc]
        self.buffer, self.base = buffer, base
        self.bytes = np.frombuffer(buffer, dtype=np.uint8)
        return self

    def at(self, offsets: np.ndarray) -> np.ndarray:
        """The registers at these file offsets (each at least 1 past the buffer's start)."""
        if not offsets.size:
            return np.empty(0, dtype=np.uint32)
        relative = offsets - self.origin
        blocks = relative // _BLOCK
        self._cover(int(blocks.min()), int(blocks.max()) + 1)
        registers = self.inner[(relative % _BLOCK) >> 1, blocks - self.first]
        odd = np.flatnonzero(relative & 1)  # one byte more than the even offset before it
        register = registers[odd]
        registers[odd] = (register >> 8) ^ _TABLE[(register ^ self.bytes[offsets[odd] - 1 - self.base]) & 0xFF]
        return registers

    def _cover(self, first: int, end: int) -> None:
        if first < self.first or self.end == self.first:
            self.first = self.end = first
            self.inner = np.empty((_BLOCK // 2, 0), dtype=np.uint32)
            skip = self.origin - self.base  # origin is base unless blocks were kept, and then none is empty
            self._carry = google_crc32c.value(self.buffer[skip:skip + first * _BLOCK])
        if end <= self.end:
            return
        size = self.base + len(self.buffer) - self.origin  # bytes from origin to the buffer's end
        end = min(size // _BLOCK + 1, max(end, self.end + max(self.end - self.first, _MIN_PREFIX // _BLOCK)))
        start = self.origin + self.end * _BLOCK - self.base
        data = self.buffer[start:start + (end - self.end) * _BLOCK]
        crc = self._carry
        starts = np.empty(end - self.end, dtype=np.uint32)
        for index in range(end - self.end):
            starts[index] = crc ^ _INIT
            crc = google_crc32c.extend(crc, data[index * _BLOCK:(index + 1) * _BLOCK])
        self._carry = crc
        count = end - self.end
        rows = np.zeros(count * _BLOCK, dtype=np.uint8)
        rows[:len(data)] = np.frombuffer(data, dtype=np.uint8)
        # [i]: bytes 2i and 2i + 1 of each block, contiguous
        columns = np.ascontiguousarray(rows.view("<u2").reshape(count, _BLOCK // 2).T)
        if not _PAIRS:
            _PAIRS.append(_pair_table())
        pairs = _PAIRS[0]
        inner = np.empty((_BLOCK // 2, count), dtype=np.uint32)
        inner[0] = starts
        index, looked_up = np.empty(count, dtype=np.uint32), np.empty(count, dtype=np.uint32)
        for i in range(_BLOCK // 2 - 1):  # two bytes of every block a step, into preallocated rows: no temporaries
            np.bitwise_and(inner[i], 0xFFFF, out=index)
            np.bitwise_xor(index, columns[i], out=index)
            np.take(pairs, index, out=looked_up)
            np.right_shift(inner[i], 16, out=inner[i + 1])
            np.bitwise_xor(inner[i + 1], looked_up, out=inner[i + 1])
        self.inner = np.concatenate([self.inner, inner], axis=1)
        self.end = end
        self.whole = min(end, size // _BLOCK)


class FrameScan:
    """The offsets of one buffer where frames start (see the module's doc). `limit`: the longest frame data taken."""

    def __init__(self, buffer: bytes, limit: int, base: int = 0, prefix: Optional[_Prefix] = None) -> None:
        """`base`: the file offset of the buffer's start; `prefix`: the registers kept from the file's last buffer."""
        self.buffer = buffer
        self.limit = limit
        self.base = base
        size = len(buffer)
        self._last = size - 12  # the last offset a whole header fits at
        self.prefix = (prefix or _Prefix(base)).attach(buffer, base)
        self._lo = self._hi = 0  # offsets [lo, hi) classified
        self._valid: List[int] = []  # the offsets found in [lo, hi), in order
        self._waiting: List[int] = []
        u8 = np.frombuffer(buffer, dtype=np.uint8)
        self._u8 = u8
        self._lengths = np.ndarray((max(0, size - 7),), dtype="<u8", buffer=buffer, strides=(1,))
        self._words = np.ndarray((max(0, size - 3),), dtype="<u4", buffer=buffer, strides=(1,))

    def first_valid(self, start: int) -> Optional[int]:
        """The first offset from `start` where a whole frame whose two checksums hold starts, else None."""
        self._from(start)
        while True:
            found = _first(self._valid, start)
            if found is not None or self._hi > self._last:
                return found
            self._classify(self._hi, self._hi + max(_MIN_WINDOW, self._hi - self._lo))

    def first_waiting(self, start: int) -> Optional[int]:
        """The first offset from `start` where a length with a valid checksum claims bytes past the buffer's end
        (asked after `first_valid(start)` found none: every offset is classified by then)."""
        self._from(start)
        while self._hi <= self._last:
            self._classify(self._hi, self._hi + max(_MIN_WINDOW, self._hi - self._lo))
        return _first(self._waiting, start)

    def _from(self, start: int) -> None:
        if not self._lo <= start <= self._hi:  # a query past what is classified: classify from it
            self._lo = self._hi = start
            self._valid, self._waiting = [], []

    def _classify(self, lo: int, hi: int) -> None:
        hi = min(hi, self._last + 1)
        self._hi = max(self._hi, hi)
        if hi <= lo:
            return
        lengths = self._lengths[lo:hi]
        offsets = np.flatnonzero(lengths <= self.limit)
        if not offsets.size:
            return
        expected = _header_checksums(self.limit, lengths[offsets], self._u8, offsets + lo)
        holds = expected == self._words[offsets + (lo + 8)]
        offsets = offsets[holds]
        lengths = lengths[offsets].astype(np.int64)
        offsets = offsets + lo
        ends = offsets + 12 + lengths + 4
        whole = ends <= len(self.buffer)
        self._waiting += offsets[~whole].tolist()
        offsets, lengths = offsets[whole], lengths[whole]
        if offsets.size:
            a = offsets + 12
            b = a + lengths
            before, after = self.prefix.at(a + self.base), self.prefix.at(b + self.base)
            crc = shift(before ^ _INIT, lengths.astype(np.uint64)) ^ after ^ _INIT
            offsets = offsets[masked(crc) == self._words[b]]
        self._valid += offsets.tolist()


def _first(offsets: List[int], start: int) -> Optional[int]:
    at = bisect_left(offsets, start)
    return offsets[at] if at < len(offsets) else None
