"""Every item a real server sends is a record or an event parsers/record.schema.json allows: the SSE stream's records,
events, amends and alerts, /api/records, /api/events, and every value of /api/series (a metric value of the
schema). The server follows every sample log and real log (NaN and infinite losses, nulls, checkpoints, evals,
errors, ends, alerts) and a log written after it was read (an amend: TimeMonitor's line after its step's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest

from mstail.tailer.app.cli import main
from tests.parsers.test_record_schema import LOGS
from tests.conftest import wait_until
from tests.record_schema import check_items, check_metric_values, loads
from tests.web.sse_client import collect

PAGE = 1000  # items per /api/records or /api/events answer


def records_parsed(tmp_path: Path) -> int:
    """How many records `mstail parse` makes of LOGS: the server holds as many once it has read them."""
    count = 0
    for log in LOGS:
        out = tmp_path / f"{log.name}.jsonl"
        assert main(["parse", "-o", str(out), str(log)]) == 0
        count += len(out.read_text("utf-8").splitlines())
    return count


def every_page(server: Any, path: str) -> List[Dict[str, Any]]:
    """All items of /api/records or /api/events, a page at a time (`after` the last seq)."""
    items: List[Dict[str, Any]] = []
    while True:
        page = server.get_json(f"{path}?after={items[-1]['seq'] if items else 0}&limit={PAGE}")
        items += page
        if len(page) < PAGE:
            return items


def test_every_item_the_server_sends_is_a_record_or_an_event_of_the_schema(
        tmp_path: Path, mstail_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSTAIL_FORMATS_DIR", str(tmp_path / "no-user-formats"))
    live = tmp_path / "live" / "train.log"  # a LossMonitor step, then TimeMonitor's line after it was stored: an amend
    live.parent.mkdir()
    live.write_text("".join(f"epoch: 1 step: {s}, loss is {3 - s / 10:.4f}\n" for s in range(1, 4)), encoding="utf-8")
    expected = records_parsed(tmp_path) + 3
    server = mstail_server(*LOGS, live)
    server.wait_records(expected)
    with open(live, "a", encoding="utf-8") as out:
        out.write("Train epoch time: 300.000 ms, per step time: 100.000 ms\n")
    wait_until(lambda: server.get_json("/api/events?kind=amend"), 15, message="the amend of step 3")
    sources = server.get_json("/api/sources")

    records = every_page(server, "/api/records")
    events = every_page(server, "/api/events") + server.get_json("/api/events?kind=amend")
    assert check_items(records, "/api/records") >= expected
    assert check_items(events, "/api/events") > 0
    last_seq = max(item["seq"] for item in records + events)

    got = collect(f"{server.url}/api/stream?after=0",
                  until=lambda got: any(m.get("id") == str(last_seq) for m in got), timeout_s=30)
    streamed = [item for m in got if m.get("event") == "records" for item in loads(m["data"])]
    streamed += [loads(m["data"]) for m in got if m.get("event") in ("event", "amend", "alert")]
    check_items(streamed, "the SSE stream")
    kinds = {item.get("kind") for item in streamed}
    assert {None, "amend", "alert", "checkpoint", "eval", "error", "end"} <= kinds, kinds  # every kind was checked

    metrics = sorted({name for source in sources for name in source["metrics"]})
    assert "loss" in metrics and "step_time_ms" in metrics
    for metric in metrics:
        for series in server.get_json(f"/api/series?metric={metric}")["series"]:
            check_metric_values(series, f"/api/series?metric={metric}")
