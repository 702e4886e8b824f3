"""Hostile folders of runs against a real `mstail`: a file whose name is no UTF-8 appearing in a followed log's
folder (the watcher must not take the sidecar down)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Dict

import pytest

from tests.conftest import spawn_writer

pytestmark = pytest.mark.slow

STEPS = 6


def test_a_file_named_in_no_utf8_beside_a_followed_log_stops_nothing(mstail_server: Any, tmp_path: Path,
                                                                      wait_until: Any) -> None:
    log = tmp_path / "train.log"
    log.touch()
    server = mstail_server(log)
    Path(os.fsdecode(os.fsencode(tmp_path) + b"/notes\xff.txt")).write_text("a file event on a name no UTF-8\n")
    writer = spawn_writer(log, steps=5, interval_s=0.05)
    assert writer.wait(timeout=30) == 0
    server.wait_records(5, timeout=15)
    time.sleep(0.5)  # the watcher's next batch, which names the file
    assert server.proc.poll() is None, server.stderr
    assert server.get_json("/healthz")["tailing_failures"] == 0
