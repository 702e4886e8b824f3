"""Fuzzing event files: any bytes, cut anywhere, give the records the whole file gives (live equals offline), and no
event file or folder of them makes `mstail parse` fail with a traceback. The files are built from valid frames of
events with random steps, values and tags (tags that are not UTF-8, empty or huge among them), damaged and torn
frames, random bytes, zero runs and headers whose length checksum holds claiming any length."""

from __future__ import annotations

import io
import struct
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import List, Tuple

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mstail.parsers.amends import fold_amends
from mstail.parsers.eventfile import EventFileParser
from mstail.tailer.app import cli
from mstail.tailer.inputs.frames import FrameSplitter, frame

from .crafted_events import field, header, varint, version

#: frames over this are big ones (passed over unread); small, so that claims over and under it are both cheap to craft
LIMIT = 600


@st.composite
def _events(draw: st.DrawFn) -> bytes:
    """An Event's bytes (TensorBoard's and MindSpore's share the fields used): a step, any wall time, scalar values
    with tags of any bytes (as `simple_value`, field 2, and as MindSpore's `scalar_value`, field 3), and a version
    string of any bytes now and then."""
    step = draw(st.integers(-(1 << 63), (1 << 63) - 1))
    wall_time = draw(st.floats(width=64))
    scalar_field = draw(st.sampled_from([2, 3]))
    values = b"".join(
        field(1, 2, field(1, 2, tag) + field(scalar_field, 5, struct.pack("<f", value)))
        for tag, value in draw(st.lists(st.tuples(st.one_of(st.sampled_from([b"loss", b"lr", b"loss vs samples"]),
                                                              st.binary(max_size=6)),
                                                    st.floats(width=32, allow_nan=True)), max_size=4)))
    version = field(3, 2, draw(st.binary(max_size=20))) if draw(st.integers(0, 9)) == 0 else b""
    return (field(1, 1, struct.pack("<d", wall_time)) + field(2, 0, varint(step & ((1 << 64) - 1))) + version
            + field(5, 2, values))


@st.composite
def _parts(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["event", "event", "event", "damaged", "torn", "garbage", "zeros", "claim"]))
    if kind == "garbage":
        return draw(st.binary(max_size=64))
    if kind == "zeros":
        return bytes(draw(st.integers(1, 64)))
    if kind == "claim":
        return header(draw(st.one_of(st.integers(0, 2 * LIMIT), st.integers(0, (1 << 31) - 1), st.integers(0, (1 << 64) - 1))))
    data = frame(draw(_events()))
    if kind == "damaged":
        at = draw(st.integers(0, len(data) - 1))
        return data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1:]
    if kind == "torn":
        return data[:draw(st.integers(1, len(data) - 1))]
    return data


_files = st.lists(_parts(), max_size=25).map(lambda parts: version() + b"".join(parts))


def _records(pieces: List[bytes]) -> List[Tuple]:
    """The records the pieces give, fed as a follower feeds them (the parser flushed after each piece, as after each
    read pass), their amends applied."""
    splitter, parser, items = FrameSplitter(max_line_bytes=LIMIT), EventFileParser(), []
    for piece in pieces:
        for got in splitter.feed(piece):
            items += parser.feed(got.payload, got.number, 0.0)
        items += parser.flush(0.0)
    return [tuple(sorted((key, repr(value)) for key, value in item.data.items()))
            for item in fold_amends(items) if item.kind == "record"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_files, cuts=st.lists(st.integers(0, 4000), max_size=12))
def test_any_event_file_cut_anywhere_gives_the_records_of_the_whole(data: bytes, cuts: List[int]) -> None:
    bounds = sorted({0, len(data), *(cut % (len(data) + 1) for cut in cuts)})
    pieces = [data[start:end] for start, end in zip(bounds, bounds[1:])]
    assert _records(pieces) == _records([data])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(files=st.lists(_files, min_size=1, max_size=3), as_folder=st.booleans())
def test_mstail_parse_of_any_event_files_or_folder_of_them_exits_cleanly(tmp_path: Path, files: List[bytes],
                                                                        as_folder: bool) -> None:
    folder = tmp_path / f"runs{len(list(tmp_path.iterdir()))}"
    paths = []
    for index, data in enumerate(files):
        name = (f"events.out.tfevents.{1700000000 + index}.host", f"events.out.events.summary.{1700000000 + index}.host_MS",
                f"noname{index}.bin")[index % 3]  # TensorBoard's name, MindSpore's, none (known by its first frame)
        path = folder / f"run{index}" / name
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
        paths.append(str(path))
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main(["parse", *([str(folder)] if as_folder else paths), "-o", str(folder / "out.jsonl")])
    assert code == 0, err.getvalue()
    assert "Traceback" not in err.getvalue()
