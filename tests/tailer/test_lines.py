"""LineSplitter: however the bytes are chunked, the same lines with the same offsets come out."""

from __future__ import annotations

import random

import pytest

from mstail.tailer.lines import LineSplitter


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
