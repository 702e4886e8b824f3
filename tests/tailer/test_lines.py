"""LineSplitter: however the bytes are chunked, the same lines with the same offsets come out."""

from __future__ import annotations

import random

import pytest

from mstail.tailer.inputs.lines import BOM, Block, LineSplitter


def reference(data: bytes, max_line_bytes: int):  # type: ignore[no-untyped-def]
    out, start = [], 0
    for raw in data.split(b"\n")[:-1]:
        end = start + len(raw) + 1
        text = raw[:max_line_bytes].decode("utf-8", errors="replace")
        out.append((text, start, end))
        start = end
    return out


@pytest.mark.parametrize("seed", range(30))
def test_any_chunking_gives_the_reference_lines(seed: int) -> None:
    rng = random.Random(seed)
    words = [b"loss=1.5", "é中😀".encode(), b"", b"x" * 70, b"step 12", b"\xff"]
    lines = [b" ".join(rng.choice(words) for _ in range(rng.randint(0, 12))) for _ in range(rng.randint(1, 60))]
    data = b"\n".join(lines) + (b"\n" if rng.random() < 0.7 else b"")
    max_line_bytes = rng.choice([16, 64, 1 << 20])
    splitter = LineSplitter(max_line_bytes=max_line_bytes)
    got, pos = [], 0
    while pos < len(data):
        step = rng.choice([1, 2, 3, 7, 50, 4096])
        got += splitter.feed(data[pos : pos + step])
        pos += step
    assert [(line.text, line.start, line.end) for line in got] == reference(data, max_line_bytes)
    assert [line.number for line in got] == list(range(1, len(got) + 1))
    assert splitter.offset == (got[-1].end if got else 0)


@pytest.mark.parametrize("seed", range(20))
def test_nul_bytes_are_counted_alike_in_blocks_and_lines_decoded_or_not(seed: int) -> None:
    """The catch-up and `mstail parse` read blocks and decode only the lines that may matter: every NUL byte is
    counted all the same, once, as line by line (a line with 3 NUL bytes once counted 0 there)."""
    rng = random.Random(seed)
    words = [b"loss=1.5", b"\x00", b"\x00\x00\x00", b"\r", "é".encode(), b"step 12"]
    lines = [b" ".join(rng.choice(words) for _ in range(rng.randint(0, 8))) for _ in range(rng.randint(1, 60))]
    data = b"\n".join(lines) + b"\n"
    counts = []
    for blocks, decoded in ((False, True), (True, False), (True, True)):
        splitter = LineSplitter()
        pos = 0
        while pos < len(data):
            step = rng.choice([5, 64, 4096])
            for out in splitter.feed(data[pos : pos + step], blocks=blocks):
                if decoded and not hasattr(out, "text"):  # a Block: its lines' texts, as feed_block takes them
                    at = 0
                    while at < len(out.data):
                        end = out.data.index(b"\n", at)
                        out.decode(out.data[at:end], out.start + at)
                        at = end + 1
            pos += step
        counts.append(splitter.nul_bytes)
    assert counts == [data.count(b"\x00")] * 3


@pytest.mark.parametrize("seed", range(30))
def test_a_blocks_lines_decode_to_the_texts_line_by_line_gives(seed: int) -> None:
    """`Block.decode` gives each line of a block the text `feed` gives it line by line: a BOM at the file's start
    dropped, a `\\r` redraw shown as its last, NUL bytes dropped (a block with neither is decoded the plain way)."""
    rng = random.Random(seed)
    words = [b"loss=1.5", "é中😀".encode(), b"", b"step 12", BOM.encode()]
    if seed % 2:  # else a plain block: no NUL, no `\r`
        words += [b"\x00", b"\r"]
    lines = [b" ".join(rng.choice(words) for _ in range(rng.randint(0, 8))) for _ in range(rng.randint(1, 60))]
    data = (BOM.encode() if rng.random() < 0.5 else b"") + b"\n".join(lines) + b"\n"
    expected = [line.text for line in LineSplitter().feed(data)]
    splitter, got, blocks, pos = LineSplitter(), [], 0, 0
    while pos < len(data):
        step = rng.choice([5, 64, 4096])
        for out in splitter.feed(data[pos : pos + step], blocks=True):
            if isinstance(out, Block):
                blocks += 1
                at = 0
                while at < len(out.data):
                    end = out.data.index(b"\n", at)
                    got.append(out.decode(out.data[at:end], out.start + at))
                    at = end + 1
            else:
                got.append(out.text)
        pos += step
    assert got == expected
    assert blocks > 0
