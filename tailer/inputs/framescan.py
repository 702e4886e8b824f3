"""Where valid frames start in a stretch of event-file bytes, found for every offset at once (numpy), in time linear
in the bytes whatever they hold.

Looking for the next valid frame after damage means trying every offset: does a length with a valid checksum start
here, and do the data's checksum hold over the length it claims? Trying them one by one costs the claimed length at
each offset whose length checksum holds, and a crafted file can make every twelfth byte such an offset, each claiming
a megabyte: a megabyte of CRC per byte of garbage. Here the CRC of any stretch comes from two prefix CRCs (CRC-32C is
linear over GF(2): the CRC of bytes [a, b) is the prefix register at b xor the register at a advanced over b - a zero
bytes, and advancing over n zero bytes is a table look-up per byte of n), so each candidate costs the same whatever
it claims, and the candidates of a stretch are all checked in a handful of array operations.

`FrameScan(buffer, limit, base, previous, skip)` answers for one buffer (the splitter's, during one `feed`; `base`
its file offset, `previous` the scan of the file's last buffer while it waited for more bytes, whose registers and
classified offsets are kept, `skip` the bytes of the buffer it is not given, those `previous` says it will not read
again: a live file read 8 KiB at a time costs what the same bytes cost read at once, plus a few hundred
microseconds of array calls a read, and a read's bytes are all that is copied, however long a stretch waits):
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


#: bytes of a stretch whose prefix registers are computed from the register at its start (given by `google_crc32c`):
#: one unit of the second digit of a shift (`shift(..., level=1)` advances by whole regions)
_REGION = 256
_BYTE_OF_TOP = np.empty(256, dtype=np.uint32)
_BYTE_OF_TOP[_TABLE >> 24] = np.arange(256, dtype=np.uint32)  # the top byte of _TABLE[v] says v


def _back(registers: np.ndarray) -> np.ndarray:
    """Registers taken back over one zero byte (the inverse of advancing over it)."""
    byte = _BYTE_OF_TOP[registers >> 24]
    return ((registers ^ _TABLE[byte]) << 8) | byte


def _unwound_table() -> np.ndarray:
    """[k << 8 | v]: byte v's image in a register (`_TABLE[v]`) taken back over k + 1 zero bytes: advancing over a
    zero byte is invertible, so the register at offset m of a stretch is the one at its start xored with these images
    of the bytes before m (k their offset), all advanced over m zero bytes."""
    rows = [np.arange(256, dtype=np.uint32)]  # _TABLE[v] taken back over one zero byte: v
    for _ in range(_REGION - 1):
        rows.append(_back(rows[-1]))
    return np.stack(rows).reshape(-1)


def _init_back() -> np.ndarray:
    """[d]: CRC-32C's initial value taken back over d zero bytes (d < _REGION)."""
    values = [np.array([_INIT], dtype=np.uint32)]
    for _ in range(_REGION - 1):
        values.append(_back(values[-1]))
    return np.concatenate(values)


_UNWOUND: List[np.ndarray] = []  # built when first needed (256 KiB)
_INIT_BACK = _init_back()
#: [m]: where offset m of a stretch looks up its byte in _UNWOUND
_AT_IN_REGION = np.arange(_REGION, dtype=np.uint32) << 8
#: regions of prefix registers computed in one go (bounds the temporaries: about 13 bytes a byte, 64 KiB at a time)
_PIECE_REGIONS = 1 << 8


def _unshifted(data: bytes, crc: int, count: int) -> Tuple[np.ndarray, int]:
    """[r * _REGION + m]: the register at offset m of each of `count` regions of `data` (zeros past its end), not yet
    advanced over the m zero bytes (`_unwound_table`), the CRC before `data` `crc`; and the CRC after it. A C call a
    region, then a handful of array operations for all of them."""
    extend, starts = google_crc32c.extend, []
    for at in range(0, count * _REGION, _REGION):
        starts.append(crc)
        crc = extend(crc, data[at:at + _REGION])
    padded = np.zeros((count, _REGION), dtype=np.uint8)
    padded.reshape(-1)[:len(data)] = np.frombuffer(data, dtype=np.uint8)
    if not _UNWOUND:
        _UNWOUND.append(_unwound_table())
    images = _UNWOUND[0].take(padded | _AT_IN_REGION)
    unshifted = np.bitwise_xor.accumulate(images, axis=1)  # [r, m]: of the bytes up to m
    unshifted ^= images  # of those before m
    unshifted ^= (np.array(starts, dtype=np.uint32) ^ np.uint32(_INIT))[:, None]
    return unshifted.reshape(-1), crc


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


#: [lane]: where byte `lane` of a register looks up its image among a map's (a level of _SHIFTS flattened)
_LANES = (np.arange(4, dtype=np.uint32) << 8).reshape(4, 1)


def _shifted(maps: np.ndarray, base: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Registers `x` mapped by the maps of a flattened level of _SHIFTS at `base` (digit << 10, shaped as `x` or as
    its last axis): the four bytes of each register looked up in one call, their images xored."""
    x = np.ascontiguousarray(x, dtype=np.uint32)
    lanes = x.reshape(-1).view(np.uint8).reshape(-1, 4).T  # [lane, i]: byte `lane` of register i (little-endian)
    base = base.reshape(-1) if base.shape == x.shape else np.broadcast_to(base, x.shape).reshape(-1)
    images = maps.take((base | _LANES) | lanes)
    return (images[0] ^ images[1] ^ images[2] ^ images[3]).reshape(x.shape)


def shift(x: np.ndarray, n: np.ndarray, level: int = 0) -> np.ndarray:
    """Registers `x` advanced over `n` times 256**level zero bytes each (elementwise)."""
    top = int(n.max()) if n.size else 0
    digits = np.ascontiguousarray(n, dtype="<u8").view(np.uint8).reshape(n.shape + (8,))
    digit = 0
    while top >> (8 * digit):
        maps = _shift_level(level + digit).reshape(-1)  # [digit, byte of x, its value] flat: one index per look-up
        x = _shifted(maps, digits[..., digit].astype(np.uint32) << 10, x)
        digit += 1
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
    value in at `origin`), at any file offsets asked, computed for the regions (`_REGION` bytes) asked about and kept:
    region starts by `google_crc32c` (C speed), every offset of all regions at once as its register before it is
    advanced over the bytes since its region's start (`_unshifted`), which a look-up does for the offsets asked. Kept
    from one buffer of the file to the next (`attach`): a stretch that waits for more bytes (claims reaching past
    them) is not computed again each time they grow, and a read's worth of new bytes costs a few array operations."""

    def __init__(self, origin: int) -> None:
        self.origin = origin
        self.first = self.end = 0  # regions [first, end) known; region k: the file's bytes from origin + k * _REGION
        self.whole = 0  # regions whose bytes were all there (the one after may be known with bytes missing)
        self._store = np.empty(0, dtype=np.uint32)  # grown by doubling, `unshifted` a view of it
        self._column = 0  # the store's index of region `first`'s start
        self.unshifted = self._store  # [m]: offset origin + first * _REGION + m, see `_unshifted`
        self._carry = 0  # the CRC at region `end`'s start

    def keeps(self, base: int) -> bool:
        """Whether `attach` at `base` keeps regions (else all is computed again from `base`)."""
        keep = (base - self.origin) // _REGION
        return self.end > self.first and self.first <= keep < self.whole and self.origin + self.whole * _REGION >= base

    def attach(self, buffer: bytes, base: int, skip: int = 0) -> "_Prefix":
        """Use with the file's bytes from offset `base` on (the same file's, from no earlier than the last buffer's
        start), of which `buffer` holds those from `base + skip` (`skip` no further than the first region whose bytes
        were not all there, and 0 unless `keeps(base)`): the regions known from base's on are kept, from the first one
        whose bytes were not all there computed again; anything else, and all is computed from `base`."""
        keep = (base - self.origin) // _REGION
        if self.keeps(base):
            if self.whole < self.end:
                self._carry = int(self.unshifted[(self.whole - self.first) * _REGION]) ^ _INIT
            self._column += (keep - self.first) * _REGION
            self.unshifted = self._store[self._column:self._column + (self.whole - keep) * _REGION]
            self.first, self.end = keep, self.whole
        else:
            self.__init__(base)  # type: ignore[misc]  # started afresh in place
        self.buffer, self.base = buffer, base + skip  # the file offset of buffer[0]
        return self

    def crcs(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """The CRC-32C of the file's bytes from each of `starts` to the offset in `ends` (all in the buffer). With
        the registers (r) at both ends as kept (u, not advanced over the d bytes since their region's start),
        the CRC is d(end)'s advance of [(u(start) ^ the initial value taken back over d(start)) advanced over the
        regions between, ^ u(end)], ^ the initial value: r(start) ^ the initial value advanced over the length,
        ^ r(end), ^ the initial value; three look-ups a CRC, one call each for all of them."""
        relative = np.concatenate([starts, ends]) - self.origin
        self.cover(int(relative.min()) + self.origin, int(relative.max()) + self.origin)
        unshifted = self.unshifted[relative - self.first * _REGION]
        region, into = relative >> 8, relative & (_REGION - 1)  # a region is 256 bytes
        count = starts.size
        crc = shift(unshifted[:count] ^ _INIT_BACK[into[:count]], region[count:] - region[:count], level=1)
        crc ^= unshifted[count:]
        return _shifted(_shift_level(0).reshape(-1), into[count:].astype(np.uint32) << 10, crc) ^ np.uint32(_INIT)

    def cover(self, start: int, end: int) -> None:
        """Have the registers of the file offsets from `start` to `end` (in the buffer) at hand."""
        self._cover((start - self.origin) // _REGION, (end - self.origin) // _REGION + 1)

    def _cover(self, first: int, end: int) -> None:
        if first < self.first or self.end == self.first:
            self.first = self.end = first
            self._store = self.unshifted = np.empty(0, dtype=np.uint32)
            self._column = 0
            skip = self.origin - self.base  # origin is base unless regions were kept, and then none is empty
            self._carry = google_crc32c.value(self.buffer[skip:skip + first * _REGION])
        if end <= self.end:
            return
        size = self.base + len(self.buffer) - self.origin  # bytes from origin to the buffer's end
        end = min(size // _REGION + 1, max(end, self.end + max(self.end - self.first, _MIN_PREFIX // _REGION)))
        while self.end < end:  # in pieces: the temporaries stay small
            count = min(_PIECE_REGIONS, end - self.end)
            start = self.origin + self.end * _REGION - self.base
            unshifted, self._carry = _unshifted(self.buffer[start:start + count * _REGION], self._carry, count)
            self._append(unshifted)
            self.end += count
        self.whole = min(end, size // _REGION)

    def _append(self, values: np.ndarray) -> None:
        """The known registers and `values` after them; the store grows by doubling, so appending costs what is
        appended, not what is kept (a stretch waiting for bytes grows by a read's worth at a time)."""
        kept, count = self.unshifted.size, values.size
        if self._column + kept + count > self._store.size:
            store = np.empty(2 * (kept + count), dtype=np.uint32)
            store[:kept] = self.unshifted
            self._store, self._column = store, 0
        self._store[self._column + kept:self._column + kept + count] = values
        self.unshifted = self._store[self._column:self._column + kept + count]


class FrameScan:
    """The offsets of one buffer where frames start (see the module's doc). `limit`: the longest frame data taken."""

    def __init__(self, buffer: bytes, limit: int, base: int = 0, previous: Optional["FrameScan"] = None,
                 skip: int = 0) -> None:
        """`base`: the file offset of the buffer's start; `previous`: the scan of the file's last buffer (from no
        later an offset), whose prefix registers and classified offsets are kept: only the bytes that arrived since
        are classified, and a frame that waited for its bytes is checked once they are all there. `skip`: `buffer`
        holds the buffer's bytes from that one on, at most `previous.untouched(base)` (what a scan going on from
        `previous` never reads), and such a scan is asked from offset 0 only."""
        self.limit = limit
        self.base = base
        self.skip = skip
        self.size = size = skip + len(buffer)
        self._last = size - 12  # the last offset a whole header fits at
        self._lo = self._hi = 0  # offsets [lo, hi) classified
        self._valid: List[int] = []  # the offsets found in [lo, hi), in order
        self._waiting = _Waiting()  # the frames starting in [lo, hi) whose bytes run past the buffer
        # the buffer's bytes from `skip` on: indexed by offset - skip
        self._u8 = np.frombuffer(buffer, dtype=np.uint8)
        self._lengths: np.ndarray = np.ndarray((max(0, len(buffer) - 7),), dtype="<u8", buffer=buffer, strides=(1,))
        self._words: np.ndarray = np.ndarray((max(0, len(buffer) - 3),), dtype="<u4", buffer=buffer, strides=(1,))
        kept = previous is not None and previous.limit == limit and base >= previous.base
        self.prefix: _Prefix = (previous.prefix if kept else _Prefix(base)).attach(  # type: ignore[union-attr]  # kept: a previous
            buffer, base, skip)
        if kept:
            self._keep(previous, base - previous.base)  # type: ignore[arg-type,union-attr]  # as above

    def untouched(self, base: int) -> int:
        """How many bytes from `base` (the file offset of this file's next buffer, no earlier than this one's) a scan
        going on from this one never reads, asked from the buffer's start: the offsets classified here, up to the
        first region of prefix registers whose bytes were not all there (none when those would all be computed
        again). The bytes arrived since, and a few before, are then all it copies, however long the stretch that
        waits for them."""
        if self._lo > base - self.base:
            return 0
        behind = not self.prefix.keeps(base) or self.prefix.origin + self.prefix.whole * _REGION < self.base + self._hi
        if behind and self._waiting.first(base) is not None:
            # the frames waiting need the registers from base on: computed now, once, from the bytes here
            self.prefix.cover(base, self.base + self.size)
        if not self.prefix.keeps(base):
            return 0
        return max(0, min(self._hi + self.base, self.prefix.origin + self.prefix.whole * _REGION) - base)

    def _keep(self, previous: "FrameScan", moved: int) -> None:
        """Take over what `previous` classified (its offsets `moved` bytes later in this buffer); check the frames
        that waited for bytes now all there."""
        self._lo, self._hi = max(0, previous._lo - moved), max(0, previous._hi - moved)
        self._valid = previous._valid[bisect_left(previous._valid, moved):]
        if moved:
            self._valid = [offset - moved for offset in self._valid]
        self._waiting = previous._waiting
        self._waiting.drop_before(self.base)
        arrived, ends = self._waiting.arrived(self.base + self.size)
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
        lengths = self._lengths[lo - self.skip:hi - self.skip]
        offsets = np.flatnonzero(lengths <= self.limit)
        if not offsets.size:
            return
        lengths = lengths[offsets]
        holds = _header_checksums(self.limit, lengths, self._u8, offsets + (lo - self.skip)) == self._words[
            offsets + (lo + 8 - self.skip)]
        offsets, lengths = offsets[holds] + lo, lengths[holds].astype(np.int64)
        ends = offsets + (lengths + 16)
        whole = ends <= self.size
        coming = ~whole
        self._waiting.add(offsets[coming] + self.base, ends[coming] + self.base)
        self._valid += self._data_holds(offsets[whole], lengths[whole]).tolist()

    def _data_holds(self, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Those of `offsets` (frames of `lengths` bytes of data, all in the buffer) whose data checksum holds."""
        if not offsets.size:
            return offsets
        a = offsets + (12 + self.base)
        b = a + lengths
        crc = self.prefix.crcs(a, b)
        return offsets[masked(crc) == self._words[b - (self.base + self.skip)]]


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
