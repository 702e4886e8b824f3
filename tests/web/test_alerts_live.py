"""Alerts end to end: a real writer process, a real mstail, /api/alerts, the SSE `alert` event, a real webhook."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.tailer.test_webhooks import Receiver

from .sse_client import collect, stream_seqs


def test_a_nan_step_raises_an_alert_in_the_api_the_stream_and_a_webhook(tmp_path: Path, mstail_server, log_writer, wait_until) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "rank_0" / "info.log"
    good, hang, fail = Receiver("ok"), Receiver("hang"), Receiver("fail")
    try:
        log_writer.finish(log_writer(log, steps=5, interval_s=0))
        server = mstail_server(log, args=["--webhook", hang.url, "--webhook", fail.url, "--webhook", good.url])
        server.wait_records(5)
        assert server.get_json("/api/alerts") == {"active": [], "resolved": [], "count": 0, "enabled": True}
        writer = log_writer(log, steps=20, interval_s=0.05, start_step=6, nan_at=(10,))
        got = collect(f"{server.url}/api/stream", until=lambda g: any(m.get("event") == "event" and m.data["kind"] == "end" for m in g))
        log_writer.finish(writer)
        alerts = [m for m in got if m.get("event") == "alert"]
        assert len(alerts) >= 1
        first = alerts[0].data
        assert (first["rule"], first["step"], first["state"], first["source"]) == ("nonfinite", 10, "firing", "rank_0")
        assert int(alerts[0]["id"]) == first["seq"] and first["seq"] in stream_seqs(got)
        assert "NaN" in first["message"]
        table = server.get_json("/api/alerts")
        [alert] = table["active"] + table["resolved"]
        assert alert["id"] == first["id"] and alert["rule"] == "nonfinite"
        assert [e["seq"] for e in server.get_json("/api/events?kind=alert")][0] == first["seq"]
        # the webhook: delivered though the two other receivers hang / fail, and tailing was never held up
        wait_until(lambda: good.bodies, 5, message="the webhook body")
        assert good.bodies[0]["alert"]["rule"] == "nonfinite" and good.bodies[0]["alert"]["step"] == 10
        assert server.get_json("/api/sources")[0]["last_step"] == 25
        hooks = wait_until(lambda: [w for w in server.get_json("/healthz")["webhooks"] if w["sent"]], 5)
        assert len(hooks) == 1 and hooks[0]["target"] == good.url.replace("/hook", "/...")  # no path: tokens live there
        # replay: a client that reconnects from before the alert gets it again as an `alert` event
        again = collect(f"{server.url}/api/stream", headers={"Last-Event-ID": str(first["seq"] - 1)},
                        until=lambda g: any(m.get("event") == "alert" for m in g), timeout_s=5)
        assert [m.data["id"] for m in again if m.get("event") == "alert"][0] == first["id"]
    finally:
        for receiver in (good, hang, fail):
            receiver.close()


def test_a_hung_writer_raises_a_hang_alert_within_the_bound(tmp_path: Path, mstail_server, log_writer, wait_until) -> None:  # type: ignore[no-untyped-def]
    rules = tmp_path / "alerts.toml"
    rules.write_text("[hang]\nmin_s = 1.0\nk = 5.0\n")
    log = tmp_path / "rank_0" / "info.log"
    server = mstail_server(log, args=["--alerts", str(rules)])
    writer = log_writer(log, steps=1000, interval_s=0.05)
    server.wait_records(10)
    writer.send_signal(signal.SIGSTOP)  # the job hangs: alive, holding its log open, no more steps, no "Training Over!"
    stopped = time.monotonic()
    last = wait_until(lambda: server.get_json("/api/sources")[0]["last_step"], 5)
    hang = wait_until(lambda: [a for a in server.get_json("/api/alerts")["active"] if a["rule"] == "hang"], 6,
                      message="a hang alert")[0]
    took = time.monotonic() - stopped
    assert hang["step"] >= last - 1 and hang["severity"] == "critical"
    assert took < 1.0 + 2.0 + 1.0  # bound max(1 s, 5 x ~0.1 s) + the 1 s safety timer + slack
    writer.send_signal(signal.SIGCONT)
    writer.kill()
    writer.wait(5)
