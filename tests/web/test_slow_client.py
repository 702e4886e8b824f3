"""A client that stops reading is dropped after `--send-timeout`; the others go on live, unaffected."""

from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path

import pytest

from .sse_client import collect, stream_seqs


@pytest.mark.timeout(60)
def test_a_client_that_stopped_reading_is_dropped_and_others_go_on(tmp_path: Path, mstail_server, log_writer, wait_until) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "rank_0" / "info.log"
    log_writer.finish(log_writer(log, steps=12000, interval_s=0))  # ~3 MB of history to replay: more than socket buffers hold
    server = mstail_server(log, args=("--send-timeout", "1"))
    server.wait_records(12000, timeout=30)
    host, port = server.url.split("//", 1)[1].split(":")

    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a tiny window, and nothing is ever read
    try:
        stalled.connect((host, int(port)))
        stalled.sendall(f"GET /api/stream?after=0 HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        wait_until(lambda: server.get_json("/healthz")["clients"] == 1, 10, message="the stalled client connected")
        began = time.monotonic()

        # Meanwhile a reading client gets live steps as usual (from the seq before the writer starts: a step is
        # published at its line, possibly before this client has connected).
        before = server.get_json("/healthz")["last_seq"]
        writer = log_writer(log, steps=20, interval_s=0.05, start_step=12001)
        got = collect(f"{server.url}/api/stream?after={before}", until=lambda g: any(
            m.get("event") == "event" and m.data["kind"] == "end" for m in g))
        log_writer.finish(writer)
        records = [r["step"] for m in got if m.get("event") == "records" for r in m.data]
        assert records == list(range(12001, 12021))
        assert stream_seqs(got)

        wait_until(lambda: server.get_json("/healthz")["clients"] == 0, 15, message="the stalled client dropped")
        dropped_after = time.monotonic() - began
        assert dropped_after < 15
    finally:
        stalled.close()
    assert server.get_json("/healthz")["clients"] == 0
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with no_proxy.open(server.url + "/metrics", timeout=5) as response:
        exposition = response.read().decode()
    assert "mstail_sse_clients_dropped_total 1.0" in exposition
    assert "mstail_sse_clients 0.0" in exposition
    assert "ERROR" not in server.stderr, server.stderr
