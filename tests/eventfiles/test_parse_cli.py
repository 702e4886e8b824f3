"""`mstail parse` of event files: a folder's files are one source, read oldest first, the records those a live
sidecar stores; a MindSpore summary file beside them is a source of its own kind."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, write_tensorboard
from .tbwrite import GLOBAL_BATCH, values

pytestmark = pytest.mark.slow  # writer and mstail processes


def test_parse_a_folder_of_two_event_files_and_a_summary_file(tmp_path: Path) -> None:
    folder = tmp_path / "tensorboard" / "rank_0"
    files = write_tensorboard(folder, 1, 6, "--new-file-at", "4")
    assert len(files) == 2
    summary = tmp_path / "summary" / "events.out.events.summary.1700000000.0.host_MS"
    summary.parent.mkdir()
    shutil.copy(ROOT / "tests" / "eventfiles" / "data" / "summary_record_3_steps_MS", summary)
    done = subprocess.run([sys.executable, "-m", "mstail", "parse", str(files[-1]), str(summary)], cwd=ROOT,
                          capture_output=True, timeout=60, check=True)
    rows = [json.loads(line) for line in done.stdout.decode().splitlines()]
    tensorboard = [row for row in rows if row["source"] == "rank_0"]
    assert [{key: row[key] for key in ("step", "loss", "lr", "grad_norm", "consumed_samples")} for row in tensorboard] == [
        {"step": step, **{k: values(step)[k] for k in ("loss", "lr", "grad_norm")}, "consumed_samples": step * GLOBAL_BATCH}
        for step in range(1, 7)]
    assert [(row["source"], row["step"], row["loss"], row["lr"]) for row in rows if row["source"] != "rank_0"] == [
        ("summary", 1, 0.10000000149011612, 9.999999747378752e-05), ("summary", 2, 0.20000000298023224, 9.999999747378752e-05),
        ("summary", 3, 0.30000001192092896, 9.999999747378752e-05)]
    assert "rank_0: tensorboard" in done.stderr.decode() and "summary: mindspore-summary" in done.stderr.decode()
