"""A real mstail follows event files while real writers (tensorboardX, MindSpore 2.10) write them in other processes:
every scalar exactly once, bit-exact, live; torn tails wait, a corrupted frame is skipped and said once, a restart
mid-file loses and repeats nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from mstail.tailer.inputs.frames import FrameSplitter

from .conftest import ROOT
from .mswrite import values as ms_values
from .tbwrite import GLOBAL_BATCH, values

pytestmark = pytest.mark.timeout(90)
STEPS = 20


def served(server: Any, count: int) -> List[Dict[str, Any]]:
    """The records the server holds (their amends applied), in seq order."""
    return server.get_json(f"/api/records?after=0&limit={count + 50}")


def expected_tensorboard(step: int) -> Dict[str, Any]:
    return {"step": step, **values(step), "consumed_samples": step * GLOBAL_BATCH}


def test_tensorboardx_writing_two_files_is_one_live_source_every_scalar_once(tmp_path: Path, mstail_server,
                                                                            wait_until) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "tensorboard" / "rank_0"
    folder.mkdir(parents=True)
    server = mstail_server(folder / "events.out.tfevents.*", args=["--no-alerts"])
    writer = subprocess.Popen([sys.executable, "-m", "tests.eventfiles.tbwrite", str(folder), "1", str(STEPS),
                               "--pause", "0.05", "--new-file-at", str(STEPS // 2 + 1)], cwd=ROOT)
    try:
        # Live: records show while the writer still runs (it writes for more than 2.5 s).
        seen_live = wait_until(lambda: writer.poll() is None and 0 < len(served(server, STEPS)) < STEPS, timeout=30,
                               interval=0.02, message="records while the writer runs")
        assert seen_live
        assert writer.wait(timeout=60) == 0
    finally:
        if writer.poll() is None:
            writer.kill()
    wait_until(lambda: len(served(server, STEPS)) >= STEPS and served(server, STEPS)[-1].get("grad_norm") is not None,
               timeout=15, message="every step")
    records = served(server, STEPS)
    assert len(list(folder.iterdir())) == 2
    assert [{key: r[key] for key in expected_tensorboard(1)} for r in records] == [
        expected_tensorboard(step) for step in range(1, STEPS + 1)]
    [source] = server.get_json("/api/sources")
    assert source["id"] == "rank_0" and source["format"] == "tensorboard" and source["records"] == STEPS
    assert {"loss", "lr", "grad_norm", "global_batch_size", "consumed_samples"} <= set(source["metrics"])
    # `mstail parse` of the finished folder gives the records the sidecar stored, value for value.
    done = subprocess.run([sys.executable, "-m", "mstail", "parse", str(folder / "events.out.tfevents.*")], cwd=ROOT,
                          capture_output=True, timeout=60, check=True)
    offline = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert [{k: v for k, v in row.items() if k != "line"} for row in offline] == [
        {k: v for k, v in record.items() if k != "seq"} for record in records]


def test_torn_tails_a_corrupted_frame_and_a_restart_mid_file(tmp_path: Path, event_file: Path, mstail_server,
                                                              wait_until) -> None:  # type: ignore[no-untyped-def]
    """The bytes of a real tensorboardX file appended in pieces that cut frames, one frame's data damaged, and the
    sidecar stopped and restarted (same state) in the middle."""
    data = bytearray(event_file.read_bytes())
    frames = FrameSplitter().feed(bytes(data))
    damaged = frames[25]  # step 4's `learning-rate` (frames: the version, then 8 per step)
    data[damaged.end - 6] ^= 0xFF
    path = tmp_path / "run" / "events.out.tfevents.1700000000.host"
    path.parent.mkdir()
    state = ["--state-dir", str(tmp_path / "state"), "--no-alerts"]
    server = mstail_server(path, args=state)

    def append(until: int) -> None:
        with open(path, "ab") as handle:
            handle.write(bytes(data[path.stat().st_size if path.exists() else 0:until]))

    append(frames[9].start + 5)  # step 1 whole, then a torn frame of step 2
    wait_until(lambda: len(served(server, 12)) == 1, timeout=10, message="step 1")
    time.sleep(0.5)
    assert len(served(server, 12)) == 1  # the torn frame waits
    append(frames[50].end - 3)  # through the damaged frame, then another torn one
    wait_until(lambda: len(served(server, 12)) == 7, timeout=10, message="steps 2-7")
    assert server.stop() == 0  # mid-file, a torn frame pending
    assert server.stderr.count("failed its checksum") == 1  # said once
    append(frames[70].start)
    server = mstail_server(path, args=state)
    append(len(data))
    wait_until(lambda: len(served(server, 12)) == 12 and served(server, 12)[-1].get("grad_norm") is not None,
               timeout=15, message="every step after the restart")
    records = served(server, 12)
    expected = [expected_tensorboard(step) for step in range(1, 13)]
    lost_key = "lr"
    del expected[3][lost_key]
    assert [{key: r[key] for key in want} for r, want in zip(records, expected)] == expected
    assert lost_key not in records[3] and len(records) == 12
    [source] = server.get_json("/api/sources")
    assert source["counters"]["bad_frames"] == 1 and source["records"] == 12


@pytest.mark.mindspore
def test_mindspore_summary_record_and_summary_collector_while_they_write(tmp_path: Path, mstail_server,
                                                                          wait_until) -> None:  # type: ignore[no-untyped-def]
    record_folder, collector_folder = tmp_path / "summary" / "record", tmp_path / "summary" / "collector"
    server = mstail_server(tmp_path / "summary" / "*" / "events.out.events.summary.*_MS", args=["--no-alerts"])
    steps = 10
    writer = subprocess.Popen([sys.executable, "-m", "tests.eventfiles.mswrite", str(record_folder),
                               str(collector_folder), str(steps), "0.15"], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: writer.poll() is None and 0 < len(served(server, 100)) < steps, timeout=40, interval=0.02,
                   message="SummaryRecord's steps while it writes")
        out, _ = writer.communicate(timeout=60)
        assert writer.returncode == 0
    finally:
        if writer.poll() is None:
            writer.kill()
    losses = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    assert len(losses) == 10  # 2 epochs of 5 steps
    wait_until(lambda: sum(s["records"] for s in server.get_json("/api/sources")) == steps + 10, timeout=15,
               message="every step of both")
    by_source: Dict[str, List[Dict[str, Any]]] = {}
    for record in served(server, steps + 10):
        by_source.setdefault(record["source"], []).append(record)
    assert [{"step": r["step"], "loss": r["loss"], "lr": r["lr"]} for r in by_source["record"]] == [
        {"step": step, **ms_values(step)} for step in range(1, steps + 1)]
    assert [{"step": r["step"], "loss": r["loss"]} for r in by_source["collector"]] == losses
    assert {s["format"] for s in server.get_json("/api/sources")} == {"mindspore-summary"}


def test_an_event_file_known_by_its_content_only(tmp_path: Path, event_file: Path, mstail_server,
                                                 wait_until) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "run" / "metrics.bin"
    path.parent.mkdir()
    path.write_bytes(event_file.read_bytes())
    server = mstail_server(path, args=["--no-alerts"])
    wait_until(lambda: len(served(server, 12)) == 12, timeout=15, message="the 12 steps")
    assert [r["loss"] for r in served(server, 12)] == [values(step)["loss"] for step in range(1, 13)]
    [source] = server.get_json("/api/sources")
    assert source["format"] == "tensorboard" and source["path"] == str(path)
