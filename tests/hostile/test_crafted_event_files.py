"""Crafted event files cost CPU linear in their size with a small constant, hide no valid frame after them, and
never stop `mstail parse` or the sidecar: offline (the parse path, and a real `mstail parse`) and live (a real
`mstail` following a folder a writer process appends crafted frames to). Before: a shape of many huge dims cost
4.6 s for one 240 KB frame (a big-integer product), fake headers 18 s of CPU per MB (a megabyte of CRC per byte),
100 headers claiming bytes past the end hid every frame after them, and a tag that is not UTF-8 made `mstail parse`
exit with a traceback."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, List

import httpx
import pytest

from mstail.parsers.eventfile import EventFileParser
from mstail.parsers.eventschema import TensorBoardEvent
from mstail.tailer.inputs.frames import FrameSplitter, frame
from mstail.tailer.offline.reading import Chain, parse_chain
from tests.conftest import ROOT, wait_until

from .crafted_events import CRAFTED, MB, good, header, version

#: CPU per MB of crafted input the issue allows (50 ms), with a margin for a loaded machine: quadratic costs are
#: hundreds of times over it
CPU_MS_PER_MB = 2 * 50
GOOD_AFTER = range(1, 6)


def _parse(path: Path) -> tuple:
    """Records (step, loss) of the offline parse of one event file, and its splitter's counters."""
    chain = Chain(source="crafted", files=[path], text=False, events="tensorboard")
    items = list(parse_chain(chain, EventFileParser("tensorboard"), now=0.0))
    return [(item.data["step"], item.data.get("loss")) for item in items if item.kind == "record"]


def _warm(tmp_path: Path) -> None:
    """Build the search's tables (once per process, tens of ms) outside what is measured: a frame claiming more than
    64 KiB after garbage needs them all."""
    path = tmp_path / "warm"
    path.write_bytes(version() + CRAFTED["fake_headers"](1 << 16) + good(GOOD_AFTER) + CRAFTED["past_the_end"](0)
                     + good(GOOD_AFTER) + b"\x00" + header(70_000) + bytes(70_004) + good(GOOD_AFTER))
    _parse(path)


def _measured(path: str) -> None:
    """In a process of its own: the CPU (ms) and records of the offline parse of `path`, printed as JSON."""
    _warm(Path(path).parent)
    started = time.process_time()
    records = _parse(Path(path))
    print(json.dumps([(time.process_time() - started) * 1000, records]))


@pytest.mark.slow  # measures CPU in a fresh interpreter
@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_crafted_bytes_cost_cpu_linear_in_their_size_and_hide_no_frame_after_them(tmp_path: Path, name: str) -> None:
    path = tmp_path / "events.out.tfevents.1700000000.host"
    path.write_bytes(version() + CRAFTED[name](2 * MB) + good(GOOD_AFTER))
    size_mb = path.stat().st_size / MB
    # measured in a fresh process, as mstail runs: this one may have imported MindSpore, whose import switches
    # protobuf to its pure-Python code for the whole process (mstail's CLI switches it back, `cli.main`)
    env = {k: v for k, v in os.environ.items() if k != "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"}
    done = subprocess.run([sys.executable, "-c", "import sys; from tests.hostile.test_crafted_event_files import "
                           "_measured; _measured(sys.argv[1])", str(path)], cwd=ROOT, env=env, capture_output=True,
                          timeout=90, check=True)
    cpu_ms, records = json.loads(done.stdout.decode().splitlines()[-1])
    assert [step for step, _ in records][-5:] == list(GOOD_AFTER), records[-10:]
    assert cpu_ms / max(size_mb, 1.0) <= CPU_MS_PER_MB, f"{name}: {cpu_ms:.0f} ms of CPU for {size_mb:.2f} MB"


#: the live reader's slice of a file while it follows it (8 KiB; 64 KiB blocks while it catches up)
LIVE_SLICE = 8192
#: the same bound as offline's: the issue's 50 ms of CPU per MB, with the margin for a loaded machine; or, if more,
#: what a megabyte of real frames costs the splitter in the same slices, timed just after in the same process (a
#: busy neighbour on the core's other hyperthread slows the CPU clock too; quadratic costs are many times over both)
LIVE_CPU_MS_PER_MB = CPU_MS_PER_MB
#: inputs whose headers wait for bytes: fake headers claiming just under the frame limit, headers claiming past the
#: end, and a header claiming 100 MB (a big frame, passed over while watched) followed by random bytes
WAITING = {"fake_headers": CRAFTED["fake_headers"], "past_the_end": CRAFTED["past_the_end"],
           "big_claim_then_random": lambda size: header(100_000_000) + random.Random(31).randbytes(size)}
LIVE_ATTACKS = {**CRAFTED, **WAITING}


def _fed_in_slices(path: Path, size: int) -> tuple:
    """The frames of `path` fed to a `FrameSplitter` `size` bytes at a time, and the bytes fed when each came out."""
    splitter, data, frames, fed = FrameSplitter(), path.read_bytes(), [], []
    for start in range(0, len(data), size):
        out = splitter.feed(data[start:start + size])
        frames += out
        fed += [min(start + size, len(data))] * len(out)
    return frames, fed


def _cpu_ms_in_slices(path: Path) -> tuple:
    started = time.process_time()
    frames, _ = _fed_in_slices(path, LIVE_SLICE)
    return (time.process_time() - started) * 1000, frames


def _measured_in_slices(path: str) -> None:
    """In a process of its own: the CPU (ms) of feeding `path` to the splitter in the live reader's slices, the
    frames it gave, and the CPU per MB (ms) of feeding a megabyte of real frames the same way, printed as JSON."""
    _warm(Path(path).parent)
    _fed_in_slices(Path(path).parent / "warm", LIVE_SLICE)
    cpu_ms, frames = _cpu_ms_in_slices(Path(path))
    real = Path(path).parent / "real"
    real.write_bytes(version() + good(range(1, MB // len(good([1])))))
    print(json.dumps([cpu_ms, len(frames), _cpu_ms_in_slices(real)[0] / (real.stat().st_size / MB)]))


@pytest.mark.slow  # measures CPU in a fresh interpreter
@pytest.mark.parametrize("name", sorted(LIVE_ATTACKS))
def test_waiting_headers_fed_in_live_slices_cost_cpu_linear_in_their_size(tmp_path: Path, name: str) -> None:
    """Bytes a header claims wait for more as a live file grows: each read's bytes are searched once, not the whole
    waiting stretch again (it was: 834 ms of CPU per MB of fake headers, growing with their size), nor copied again
    (80-117 ms per MB then, above the issue's 50); and every valid frame still comes out of the read that
    completes it."""
    path = tmp_path / "events.out.tfevents.1700000000.host"
    path.write_bytes(version() + LIVE_ATTACKS[name](2 * MB) + good(GOOD_AFTER))
    size_mb = path.stat().st_size / MB
    env = {k: v for k, v in os.environ.items() if k != "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"}
    done = subprocess.run([sys.executable, "-c", "import sys; from tests.hostile.test_crafted_event_files import "
                           "_measured_in_slices; _measured_in_slices(sys.argv[1])", str(path)], cwd=ROOT, env=env,
                          capture_output=True, timeout=90, check=True)
    cpu_ms, count, real_ms_per_mb = json.loads(done.stdout.decode().splitlines()[-1])
    assert cpu_ms / max(size_mb, 1.0) <= max(LIVE_CPU_MS_PER_MB, real_ms_per_mb), \
        f"{name}: {cpu_ms:.0f} ms of CPU for {size_mb:.2f} MB (real frames: {real_ms_per_mb:.0f} ms per MB)"
    live, fed = _fed_in_slices(path, LIVE_SLICE)
    assert live == _fed_in_slices(path, 1 << 30)[0] and count == len(live)  # live equals offline
    assert [got.payload for got in live[-len(GOOD_AFTER):]] == [
        got.payload for got in FrameSplitter().feed(version() + good(GOOD_AFTER))[1:]]
    assert all(read_end - LIVE_SLICE < got.end <= read_end for got, read_end in zip(live, fed))  # out of its read


def test_garbage_is_counted_as_it_is_passed_over() -> None:
    splitter = FrameSplitter()
    data = version() + CRAFTED["fake_headers"](1 << 16) + good(GOOD_AFTER) + CRAFTED["past_the_end_big"](0) + good([6])
    frames = splitter.feed(data)
    assert len(frames) == 1 + 5 + 1
    assert splitter.bad_frames == 2 and splitter.big_frames == 0
    assert splitter.skipped_bytes == len(CRAFTED["fake_headers"](1 << 16)) + len(CRAFTED["past_the_end_big"](0))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["past_the_end", "past_the_end_big"])
def test_mstail_parse_reads_the_frames_after_headers_claiming_past_the_end(tmp_path: Path, name: str) -> None:
    path = tmp_path / "events.out.tfevents.1700000000.host"
    path.write_bytes(version() + good([1]) + CRAFTED[name](0) + good(range(2, 7)))
    done = subprocess.run([sys.executable, "-m", "mstail", "parse", str(path)], cwd=ROOT, capture_output=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert [line.count(b'"step"') for line in done.stdout.splitlines()] == [1] * 6, done.stdout


def _event_with_tags(step: int, tags: List[bytes]) -> bytes:
    """A TensorBoard event of one scalar per tag, tags as raw bytes (not UTF-8 ones too)."""
    event = TensorBoardEvent(wall_time=1700000000.0 + step, step=step)
    for index, _ in enumerate(tags):
        value = event.summary.value.add()
        value.tag, value.simple_value = f"T{index:03d}", float(step + index)
    data = event.SerializeToString()
    for index, tag in enumerate(tags):  # same length: no lengths to fix
        data = data.replace(f"T{index:03d}".encode(), tag.ljust(4, b"_")[:4], 1)
    return frame(data)


def _utf8_file(path: Path, steps: int = 5) -> None:
    path.write_bytes(version() + b"".join(_event_with_tags(step, [b"loss", b"a\xff\xfe_", b"lr__"])
                                          for step in range(1, steps + 1)))


@pytest.mark.slow
def test_a_tag_that_is_not_utf8_is_left_out_and_the_rest_of_its_event_kept(tmp_path: Path) -> None:
    bad = tmp_path / "bad" / "events.out.tfevents.1700000000.host"
    other = tmp_path / "other" / "events.out.tfevents.1700000001.host"
    bad.parent.mkdir()
    other.parent.mkdir()
    _utf8_file(bad)
    other.write_bytes(version() + good(range(1, 4)))
    for args in ([str(bad), str(other)], [str(tmp_path)]):  # files, and a folder
        done = subprocess.run([sys.executable, "-m", "mstail", "parse", "--to", "jsonl", *args], cwd=ROOT,
                              capture_output=True, timeout=60)
        assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr
        lines = done.stdout.decode().splitlines()
        assert len(lines) == 5 + 3, lines
        assert sum('"lr__":' in line and '"loss":' in line for line in lines) == 5, lines


@pytest.mark.slow
def test_live_equals_offline_on_a_file_with_tags_that_are_not_utf8(tmp_path: Path, mstail_server: Any) -> None:
    folder = tmp_path / "tb"
    folder.mkdir()
    path = folder / "events.out.tfevents.1700000000.host"
    path.touch()
    server = mstail_server(path, args=["--no-alerts"])
    _utf8_file(tmp_path / "whole", steps=40)
    data = (tmp_path / "whole").read_bytes()
    with open(path, "ab") as out:
        for start in range(0, len(data), 97):  # appended in pieces: frames cut anywhere
            out.write(data[start:start + 97])
            out.flush()
            time.sleep(0.005)
    server.wait_records(40)
    live = server.get_json("/api/records?after=0&limit=100")
    offline = subprocess.run([sys.executable, "-m", "mstail", "parse", str(path)], cwd=ROOT, capture_output=True,
                             timeout=60)
    keys = ("step", "loss", "lr__", "perplexity")
    assert [tuple(r.get(k) for k in keys) for r in live] == [
        tuple(json.loads(line).get(k) for k in keys) for line in offline.stdout.splitlines()]
    assert server.get_json("/api/sources")[0]["counters"]["dropped_values"] == 40


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_live_crafted_frames_keep_healthz_up_and_the_frames_after_them_read(tmp_path: Path, mstail_server: Any) -> None:
    """A writer appends good frames, a 480 KB frame of huge dims, 1 MB of fake headers, 100 headers claiming past
    the end, then good frames; /healthz answers 200 all along and every good frame is read."""
    folder = tmp_path / "tb"
    folder.mkdir()
    path = folder / "events.out.tfevents.1700000000.host"
    path.touch()
    server = mstail_server(path, args=["--no-alerts"])
    statuses: List[int] = []
    stop = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            while not stop.is_set():
                statuses.append(client.get("/healthz").status_code)
                time.sleep(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        subprocess.run([sys.executable, "-m", "tests.hostile.crafted_events", str(path), "version", "good:1:3",
                        f"shapes:{480_000}", "good:4:4", f"fake_headers:{MB}", "good:5:5", "past_the_end:0",
                        "good:6:10"], cwd=ROOT, check=True, timeout=60)
        server.wait_records(10, timeout=30)
        records = server.get_json("/api/records?after=0&limit=100")
        wait_until(lambda: len(statuses) > 20, 10, message="health polled")
    finally:
        stop.set()
        poller.join()
    assert [record["step"] for record in records] == list(range(1, 11))
    assert statuses and set(statuses) == {200}, statuses
    counters = server.get_json("/api/sources")[0]["counters"]
    assert counters["bad_frames"] >= 2, counters
