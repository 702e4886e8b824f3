"""One contract for NaN, +Infinity and -Infinity in every output: `mstail parse` JSONL and CSV, `/api/records`,
`/api/series`, the SSE stream, the SQLite state and `/metrics` all say which of the three a value was, and none
of them turns one into a missing value. (Before, `/api/records` wrote all three as null.)"""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

from tests.conftest import _NO_PROXY, ROOT
from tests.web.sse_client import collect

pytestmark = pytest.mark.slow

LOSSES = {1: 2.5, 2: "Infinity", 3: "-Infinity", 4: 1.5, 5: "NaN"}  # the newest is NaN: /metrics shows it
NAMES = {2: "Infinity", 3: "-Infinity", 5: "NaN"}


def write_log(path: Path) -> None:
    path.write_text("".join(json.dumps({"step": step, "time": 1.7e9 + step, "loss": loss}) + "\n"
                            for step, loss in LOSSES.items()), encoding="utf-8")


def by_step(rows: List[Dict[str, Any]]) -> Dict[int, Any]:
    return {int(row["step"]): row["loss"] for row in rows if "kind" not in row}


def test_nan_and_infinities_are_named_the_same_in_every_output(tmp_path: Path, mstail_server: Any) -> None:
    log = tmp_path / "metrics.jsonl"
    write_log(log)
    expected = {step: NAMES.get(step, loss) for step, loss in LOSSES.items()}

    parsed = subprocess.run([sys.executable, "-m", "mstail", "parse", str(log)], capture_output=True, text=True,
                            timeout=60, cwd=str(ROOT))
    assert parsed.returncode == 0, parsed.stderr
    assert by_step([json.loads(line) for line in parsed.stdout.splitlines()]) == expected
    csv = subprocess.run([sys.executable, "-m", "mstail", "parse", str(log), "--to", "csv"], capture_output=True,
                         text=True, timeout=60, cwd=str(ROOT))
    header, *rows = csv.stdout.splitlines()
    column = header.split(",").index("loss")
    assert [row.split(",")[column] for row in rows] == [str(v) for v in expected.values()]

    server = mstail_server(tmp_path / "none.log", args=("--jsonl", str(log)))
    server.wait_records(len(LOSSES))
    assert by_step(server.get_json("/api/records")) == expected

    (series,) = server.get_json("/api/series?metric=loss")["series"]
    assert dict(zip(series["nonfinite"]["x"], series["nonfinite"]["value"])) == NAMES
    assert dict(zip(series["x"], series["last"])) == expected

    def stream_records(got: List[Any]) -> List[Dict[str, Any]]:
        return [record for message in got if message.get("event") == "records" for record in message.data]

    got = collect(f"{server.url}/api/stream?after=0", until=lambda g: len(stream_records(g)) >= len(LOSSES))
    assert by_step(stream_records(got)) == expected

    state = Path(server.stderr.split("history kept in ")[1].split(" (--no-state")[0])
    with sqlite3.connect(state) as db:  # json.loads reads the state's own NaN/Infinity tokens back as floats
        stored = by_step([json.loads(data) for (data,) in db.execute("SELECT data FROM items ORDER BY seq")])
    assert stored[2] == math.inf and stored[3] == -math.inf and math.isnan(stored[5])

    with _NO_PROXY.open(server.url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    (loss,) = [line for line in text.splitlines() if line.startswith("mstail_metric{") and 'metric="loss"' in line]
    assert loss.split()[-1] == "NaN"  # the exposition format's own name for it
