"""Where valid frames start in a stretch of event-file bytes, found for every offset at once (numpy), in time linear
in the bytes whatever they hold.

Looking for the next valid frame after damage means trying every offset: does a length with a valid checksum start
here, and do the data's checksum hold over the length it claims? Trying them one by one costs the claimed length at
each offset whose length checksum holds, and a crafted file can make every twelfth byte such an offset, each claiming
a megabyte: a megabyte of CRC per byte of garbage. Here the CRC of any stretch comes from two prefix CRCs (CRC-32C is
linear over GF(2): the CRC of bytes [a, b) is the prefix register at b xor the register at a advanced over b - a zero
bytes, and advancing over n zero bytes is a table look-up per byte of n), so each candidate costs the same whatever
it claims, and the candidates of a stretch are all checked in a handful of array operations.

`FrameScan(buffer, limit, base, previous)` answers for one buffer (the splitter's, during one `feed`; `base` its
file offset, `previous` the scan of the file's last buffer while it waited for more bytes, whose registers and
classified offsets are kept: a live file read 8 KiB at a time costs what the same bytes cost read at once):
`first_valid(start)`, the first offset from `start` where a whole frame of at most `limit` bytes has both checksums holding, and
`first_waiting(start)`, the first offset where a frame's length checksum holds but its bytes run past the buffer.
Offsets are classified in windows that grow as the queries (always from a later offset) move on, so a buffer costs
one pass however many times it is asked.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections import deque
from typing import Deque, List, Optional, Tuple

import google_crc32c
import numpy as np

_POLY = 0x82F63B78  # CRC-32C, reflected
_INIT = 0xFFFFFFFF
_BLOCK = 32  # bytes per block of prefix registers: a block's offset within it is one byte of a shift
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
        self._store = np.empty((_BLOCK // 2, 0), dtype=np.uint32)  # grown by doubling, `inner` a view of it
        self._column = 0  # the store's column of block `first`
        self.inner = self._store  # [i, k]: the register at byte 2i of block first + k
        self._carry = 0  # the CRC at block `end`'s start

    def attach(self, buffer: bytes, base: int) -> "_Prefix":
        """Use with `buffer`, the file's bytes from offset `base` on (the same file's, from no earlier than the last
        buffer's start): the blocks known from base's on are kept, from the first one whose bytes were not all there
        computed again; anything else, and all is computed from `base`."""
        keep = (base - self.origin) // _BLOCK
        if self.end > self.first and self.first <= keep < self.whole and self.origin + self.whole * _BLOCK >= base:
            if self.whole < self.end:
                self._carry = int(self.inner[0, self.whole - self.first]) ^ _INIT
            self._column += keep - self.first
            self.inner = self._store[:, self._column:self._column + self.whole - keep]
            self.first, self.end = keep, self.whole
        else:
            self.__init__(base)  # type: ignore[misc]  # started afresh in place
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
            self._store = self.inner = np.empty((_BLOCK // 2, 0), dtype=np.uint32)
            self._column = 0
            skip = self.origin - self.base  # origin is base unless blocks were kept, and then none is empty
            self._carry = google_crc32c.value(self.buffer[skip:skip + first * _BLOCK])
        if end <= self.end:
            return
        size = self.base + len(self.buffer) - self.origin  # bytes from origin to the buffer's end
        end = min(size // _BLOCK + 1, max(end, self.end + max(self.end - self.first, _MIN_PREFIX // _BLOCK)))
        start = self.origin + self.end * _BLOCK - self.base
        data = self.buffer[start:start + (end - self.end) * _BLOCK]
        crc, extend, registers = self._carry, google_crc32c.extend, []
        for at in range(0, (end - self.end) * _BLOCK, _BLOCK):  # a C call a block: the loop's cost is the calls
            registers.append(crc)
            crc = extend(crc, data[at:at + _BLOCK])
        starts = np.array(registers, dtype=np.uint32) ^ np.uint32(_INIT)
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
        self._append(inner)
        self.end = end
        self.whole = min(end, size // _BLOCK)


    def _append(self, columns: np.ndarray) -> None:
        """The known registers and `columns` after them; the store grows by doubling, so appending costs what is
        appended, not what is kept (a stretch waiting for bytes grows by a read's worth at a time)."""
        kept, count = self.end - self.first, columns.shape[1]
        if self._column + kept + count > self._store.shape[1]:
            store = np.empty((_BLOCK // 2, 2 * (kept + count)), dtype=np.uint32)
            store[:, :kept] = self._store[:, self._column:self._column + kept]
            self._store, self._column = store, 0
        self._store[:, self._column + kept:self._column + kept + count] = columns
        self.inner = self._store[:, self._column:self._column + kept + count]


class FrameScan:
    """The offsets of one buffer where frames start (see the module's doc). `limit`: the longest frame data taken."""

    def __init__(self, buffer: bytes, limit: int, base: int = 0, previous: Optional["FrameScan"] = None) -> None:
        """`base`: the file offset of the buffer's start; `previous`: the scan of the file's last buffer (from no
        later an offset), whose prefix registers and classified offsets are kept: only the bytes that arrived since
        are classified, and a frame that waited for its bytes is checked once they are all there."""
        self.buffer = buffer
        self.limit = limit
        self.base = base
        size = len(buffer)
        self._last = size - 12  # the last offset a whole header fits at
        self._lo = self._hi = 0  # offsets [lo, hi) classified
        self._valid: List[int] = []  # the offsets found in [lo, hi), in order
        self._waiting = _Waiting()  # the frames starting in [lo, hi) whose bytes run past the buffer
        u8 = np.frombuffer(buffer, dtype=np.uint8)
        self._u8 = u8
        self._lengths: np.ndarray = np.ndarray((max(0, size - 7),), dtype="<u8", buffer=buffer, strides=(1,))
        self._words: np.ndarray = np.ndarray((max(0, size - 3),), dtype="<u4", buffer=buffer, strides=(1,))
        kept = previous is not None and previous.limit == limit and base >= previous.base
        self.prefix: _Prefix = (previous.prefix if kept else _Prefix(base)).attach(buffer, base)  # type: ignore[union-attr]  # kept: a previous
        if kept:
            self._keep(previous, base - previous.base)  # type: ignore[arg-type,union-attr]  # as above

    def _keep(self, previous: "FrameScan", moved: int) -> None:
        """Take over what `previous` classified (its offsets `moved` bytes later in this buffer); check the frames
        that waited for bytes now all there."""
        self._lo, self._hi = max(0, previous._lo - moved), max(0, previous._hi - moved)
        self._valid = previous._valid[bisect_left(previous._valid, moved):]
        if moved:
            self._valid = [offset - moved for offset in self._valid]
        self._waiting = previous._waiting
        self._waiting.drop_before(self.base)
        arrived, ends = self._waiting.arrived(self.base + len(self.buffer))
        if arrived.size:
            valid = self._data_holds(arrived - self.base, ends - arrived - 16).tolist()
            self._valid = sorted(self._valid + valid) if valid else self._valid

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
        found = self._waiting.first(self.base + start)
        return None if found is None else found - self.base

    def _from(self, start: int) -> None:
        if not self._lo <= start <= self._hi:  # a query outside what is classified: classify from it
            self._lo = self._hi = start
            self._valid, self._waiting = [], _Waiting()

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
        self._waiting.add(offsets[~whole] + self.base, ends[~whole] + self.base)
        self._valid += self._data_holds(offsets[whole], lengths[whole]).tolist()

    def _data_holds(self, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Those of `offsets` (frames of `lengths` bytes of data, all in the buffer) whose data checksum holds."""
        if not offsets.size:
            return offsets
        a = offsets + 12
        b = a + lengths
        before, after = np.split(self.prefix.at(np.concatenate([a, b]) + self.base), 2)  # one look-up: one pass
        crc = shift(before ^ _INIT, lengths.astype(np.uint64)) ^ after ^ _INIT
        return offsets[masked(crc) == self._words[b]]


class _Waiting:
    """Frames whose bytes run past the buffer (file offsets), in chunks of one classification each, a chunk sorted by
    where its frames end, the chunks in a heap by their first end: the frames the bytes of a read complete are found
    at a cost of their number, whatever waits (a stretch a megabyte long waits, read by read, as a live file grows)."""

    def __init__(self) -> None:
        self._chunks: Deque[List[np.ndarray]] = deque()  # [offsets, ends], in the order of the offsets
        self._heap: List[Tuple[int, int, List[np.ndarray]]] = []  # (a chunk's first end, serial, the chunk)
        self._serial = 0

    def add(self, offsets: np.ndarray, ends: np.ndarray) -> None:
        if offsets.size:
            order = np.argsort(ends, kind="stable")
            chunk = [offsets[order], ends[order]]
            self._chunks.append(chunk)
            self._push(chunk)

    def _push(self, chunk: List[np.ndarray]) -> None:
        heapq.heappush(self._heap, (int(chunk[1][0]), self._serial, chunk))
        self._serial += 1

    def arrived(self, end: int) -> Tuple[np.ndarray, np.ndarray]:
        """The offsets and ends of the frames ending by `end`, taken out."""
        offsets, ends = [np.empty(0, dtype=np.int64)], [np.empty(0, dtype=np.int64)]
        while self._heap and self._heap[0][0] <= end:
            chunk = heapq.heappop(self._heap)[2]
            cut = int(np.searchsorted(chunk[1], end, side="right"))
            offsets.append(chunk[0][:cut])
            ends.append(chunk[1][:cut])
            chunk[0], chunk[1] = chunk[0][cut:], chunk[1][cut:]
            if chunk[1].size:
                self._push(chunk)
        return np.concatenate(offsets), np.concatenate(ends)

    def drop_before(self, offset: int) -> None:
        """Forget the frames starting before `offset` (passed over: queries are from later and later offsets)."""
        while self._chunks:
            chunk = self._chunks[0]
            if chunk[0].size and chunk[0].max() >= offset:
                if chunk[0].min() < offset:
                    kept = chunk[0] >= offset
                    chunk[0], chunk[1] = chunk[0][kept], chunk[1][kept]  # its heap entry's end may now be early
                return
            chunk[0] = chunk[1] = np.empty(0, dtype=np.int64)
            self._chunks.popleft()

    def first(self, start: int) -> Optional[int]:
        """The first offset from `start` of a frame waiting (the chunks hold stretches of offsets in order)."""
        self.drop_before(start)
        return int(self._chunks[0][0].min()) if self._chunks else None


def _first(offsets: List[int], start: int) -> Optional[int]:
    at = bisect_left(offsets, start)
    return offsets[at] if at < len(offsets) else None
