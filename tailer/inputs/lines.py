"""Bytes -> complete lines with byte offsets; bounded, never raises on bad input.

A line is handed out only once its newline has arrived (a partial last line waits), so an offset always
points at the start of a line. Over-long lines are cut at `max_line_bytes` (the rest up to the newline is
skipped and counted) so a 100 MB line from a crashed dump neither stalls tailing nor grows memory. NUL bytes
(the zero-filled tail a crash leaves with delayed allocation, a sparse hole) are dropped before that limit
applies and counted, so the line a relaunch appends after megabytes of NULs still comes out whole.
"""

from __future__ import annotations

from typing import Callable, List, NamedTuple, Union

BOM = "\ufeff"


class Line(NamedTuple):
    text: str  # decoded, without the newline, `\r`, BOM or NUL bytes
    start: int  # byte offset of the line in its file
    end: int  # byte offset just past its newline
    number: int  # 1-based line number in its file


class Block(NamedTuple):
    """Whole lines handed out together (`LineSplitter.feed(data, blocks=True)`), for `parsers.blocks.feed_block`:
    valid UTF-8, none longer than the length limit, so each line's text is `decode(its bytes, its offset)`."""

    data: bytes  # the lines, each ending with b"\n"
    start: int  # byte offset of the first line in its file
    number: int  # 1-based number of the first line
    count: int  # type: ignore[assignment]  # how many lines (a field: it hides tuple.count)
    decode: Callable[[bytes, int], str]  # a line's text from its bytes and offset (the splitter's)

    @property
    def end(self) -> int:
        return self.start + len(self.data)


class LineSplitter:
    """Accumulates bytes read from one file and splits them into `Line`s.

    Args:
        start: byte offset of the first byte that will be fed (where reading starts); default 0.
        max_line_bytes: longer lines are cut to this length and counted in `cut_lines`; default 1 MiB.
    """

    def __init__(self, start: int = 0, max_line_bytes: int = 1 << 20, first_number: int = 1) -> None:
        self.max_line_bytes = max_line_bytes
        self._buffer = bytearray()
        self._buffer_start = start  # file offset of _buffer[0]
        self._skipping = False  # inside the cut-off tail of an over-long line
        self._consumed = 0  # bytes of the current line seen so far (kept or skipped)
        self.next_number = first_number
        self.cut_lines = 0
        self.replaced_lines = 0  # lines with invalid UTF-8 (decoded with U+FFFD)
        self.nul_bytes = 0  # NUL bytes dropped from lines

    @property
    def offset(self) -> int:
        """File offset where the next complete line starts (resume point for a checkpoint)."""
        return self._buffer_start

    @property
    def pending_bytes(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes, blocks: bool = False) -> List[Union[Line, Block]]:
        """The complete lines `data` finishes, in order. With `blocks` (default False), the whole lines of `data`
        come out as one `Block` when they are valid UTF-8 and none can be over the length limit (`data` is not
        longer than it), else line by line as without."""
        lines: List[Union[Line, Block]] = []
        pos, size = 0, len(data)
        # The line in progress (buffered, or the cut-off tail of a long one) is finished byte-carefully ...
        while pos < size and (self._buffer or self._skipping or self._consumed):
            pos = self._feed_piece(data, pos, lines)
        # ... then whole lines go straight from the chunk (the hot path: one split, no per-byte work) ...
        last_newline = data.rfind(b"\n", pos)
        whole = data[pos:last_newline + 1] if blocks and 0 <= last_newline and size <= self.max_line_bytes else b""
        if whole and _valid_utf8(whole):
            count = whole.count(b"\n")
            # counted here, not as lines are decoded: the fast path decodes only the lines that may matter
            nuls = whole.count(b"\x00") if b"\x00" in whole else 0  # `in` is a memchr, `count` a slower pass
            self.nul_bytes += nuls
            # A block of valid UTF-8 with no NUL and no `\r` (a log's usual block) has nothing `_text` would change in
            # a line but a BOM at the file's start: its lines are decoded without `_text`'s checks.
            decode = self._text if nuls or b"\r" in whole else _plain_text
            lines.append(Block(whole, self._buffer_start, self.next_number, count, decode))
            self.next_number += count
            self._buffer_start += len(whole)
            pos = last_newline + 1
        elif last_newline >= pos:
            start = self._buffer_start
            for raw in data[pos:last_newline].split(b"\n"):
                end = start + len(raw) + 1
                if len(raw) > self.max_line_bytes and b"\x00" in raw:
                    raw = self._without_nul(raw)
                if len(raw) > self.max_line_bytes:
                    raw = raw[: self.max_line_bytes]
                    self.cut_lines += 1
                lines.append(self._line(raw, start, end))
                start = end
            self._buffer_start = start
            pos = last_newline + 1
        # ... and an unfinished last line waits in the buffer for its newline.
        while pos < size:
            pos = self._feed_piece(data, pos, lines)
        return lines

    def _feed_piece(self, data: bytes, pos: int, lines: List[Union[Line, Block]]) -> int:
        """Consume data[pos:] up to and including the next newline (or to the end); returns the new pos."""
        newline = data.find(b"\n", pos)
        chunk_end = len(data) if newline < 0 else newline
        if not self._skipping:
            room = self.max_line_bytes - len(self._buffer)
            piece = data[pos:chunk_end]
            if b"\x00" in piece:
                piece = self._without_nul(piece)
            if len(piece) > room:
                piece = piece[: max(room, 0)]
                self._skipping = True
                self.cut_lines += 1
            self._buffer += piece
        # Cut-off bytes are not kept, but they count toward the offset of the next line.
        self._consumed += chunk_end - pos
        if newline < 0:
            return len(data)
        end = self._buffer_start + self._consumed + 1
        lines.append(self._line(bytes(self._buffer), self._buffer_start, end))
        self._buffer.clear()
        self._buffer_start = end
        self._consumed = 0
        self._skipping = False
        return newline + 1

    def _without_nul(self, raw: bytes) -> bytes:
        kept = raw.replace(b"\x00", b"")
        self.nul_bytes += len(raw) - len(kept)
        return kept

    def _line(self, raw: bytes, start: int, end: int) -> Line:
        line = Line(self.decode(raw, start), start, end, self.next_number)
        self.next_number += 1
        return line

    def decode(self, raw: bytes, start: int) -> str:
        """The text of a line as `feed` hands it out, from its bytes (without the newline, within the length
        limit) and its file offset `start`; counts it in `replaced_lines` / `nul_bytes` as `feed` does."""
        if b"\x00" in raw:
            self.nul_bytes += raw.count(b"\x00")
        return self._text(raw, start)

    def _text(self, raw: bytes, start: int) -> str:
        """`decode` but for counting NUL bytes: a `Block`'s lines', counted when the block was cut."""
        text = raw.decode("utf-8", errors="replace")
        if "\ufffd" in text and b"\xef\xbf\xbd" not in raw:
            self.replaced_lines += 1
        if text.endswith("\r"):
            text = text[:-1]
        if "\r" in text:
            # A `\r` progress bar redraws the line: what a terminal would show is the last redraw.
            text = text.rsplit("\r", 1)[1]
        if "\x00" in text:
            text = text.replace("\x00", "")
        if start == 0 and text.startswith(BOM):
            text = text[1:]
        return text


def _plain_text(raw: bytes, start: int) -> str:
    """`LineSplitter._text` of a line of valid UTF-8 with no NUL and no `\\r`: its text (a BOM at the file's start
    dropped)."""
    if start:
        return raw.decode()
    text = raw.decode()
    return text[1:] if text.startswith(BOM) else text


def _valid_utf8(data: bytes) -> bool:
    if data.isascii():
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
