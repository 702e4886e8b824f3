"""Event-file tags that are no metric names as they are, followed live by a real mstail: an empty tag is no metric
(counted in `dropped_values`), `__proto__` is kept as `metric___proto__`, a newline and an escape sequence are
written as `\\n` and `\\x1b`; the API, its stream's history and stderr never carry them raw."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.hostile.test_event_inputs import WRITER

TAGS = ["loss", "", "__proto__", "a\nb", "\x1b[2Jclear"]


@pytest.mark.slow
def test_odd_tags_become_safe_metric_names(mstail_server: Any, tmp_path: Path) -> None:
    path = tmp_path / "events.out.tfevents.1700000000.host"
    path.touch()
    server = mstail_server(path)
    parts = json.dumps([[step, tag] for step in (1, 2, 3) for tag in TAGS]).encode()
    subprocess.run([sys.executable, "-c", WRITER, str(path)], input=parts, cwd=ROOT, check=True, timeout=30)
    server.wait_records(3)
    source = server.get_json("/api/sources")[0]
    assert sorted(source["metrics"]) == sorted(["loss", "perplexity", "metric___proto__", "a\\nb", "\\x1b[2Jclear"])
    assert source["counters"]["dropped_values"] == 3, source["counters"]
    records = server.get_json("/api/records?after=0")
    assert [sorted(k for k in r if k not in ("seq", "source", "step", "time", "segment", "line")) for r in records] \
        == [sorted(source["metrics"])] * 3
    assert "\x1b" not in server.stderr
