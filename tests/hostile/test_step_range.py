"""Every step an input can produce can be asked for: an event file's step is an int64, down to -2^63, and a real
mstail following one answers `/api/series` and `/api/heatmap` over the whole range, bounds included, while one
step past it either way is still a 4xx."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT
from tests.hostile.test_event_inputs import WRITER

LEAST, MOST = -(2**63), 2**63 - 1
STEPS = [LEAST, -5, 3, MOST]  # the writer logs 1/step: no 0


@pytest.mark.slow
def test_the_api_answers_for_every_int64_step(mstail_server: Any, tmp_path: Path) -> None:
    path = tmp_path / "events.out.tfevents.1700000000.host"
    parts = json.dumps([[step, "loss"] for step in STEPS]).encode()
    subprocess.run([sys.executable, "-c", WRITER, str(path)], input=parts, cwd=ROOT, check=True, timeout=30)
    server = mstail_server(path)
    server.wait_records(len(STEPS))

    def get(query: str) -> httpx.Response:
        return httpx.get(server.url + query, timeout=10, trust_env=False)

    whole = f"start={LEAST}&end={MOST}"
    assert get(f"/api/series?metric=loss&{whole}").json()["series"][0]["x"] == STEPS
    assert get(f"/api/series?metric=loss&start={LEAST}&end={LEAST}").json()["series"][0]["x"] == [LEAST]
    assert get(f"/api/series?metric=loss&end={LEAST}").json()["series"][0]["x"] == [LEAST]
    assert get(f"/api/series?metric=loss&aggregate=mean&{whole}").json()["aggregate"]["x"] == STEPS
    assert get(f"/api/heatmap?metric=loss&{whole}").json()["columns"][0] == LEAST
    for name in ("start", "end"):
        for value in (LEAST - 1, MOST + 1):
            for route in ("/api/series?metric=loss", "/api/heatmap?metric=loss"):
                assert get(f"{route}&{name}={value}").status_code == 422, (route, name, value)
