"""Graceful shutdown under load: a real mstail with 50 open SSE streams while a training writes live.

Ctrl-C (SIGINT) must end the process within 2 s, every stream must end cleanly (the chunked body is
terminated, no reset, no half message), and each client, reconnecting with its Last-Event-ID to the mstail
started again on the same port, must get exactly the steps it had not seen: none lost, none twice.
"""

from __future__ import annotations

import http.client
import re
import signal
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from .sse_client import collect

CLIENTS = 50
STEPS = 100
EXIT_WITHIN_S = 2.0


class StreamClient(threading.Thread):
    """Reads one /api/stream to its end with http.client; remembers how the stream ended."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.connected = threading.Event()
        self.body = b""
        self.ending: Optional[str] = None  # "clean" or the exception

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
        try:
            conn.request("GET", "/api/stream?after=0")
            response = conn.getresponse()
            assert response.status == 200
            self.body = response.read1(65536)
            self.connected.set()
            chunks = [self.body]
            while True:
                chunk = response.read1(65536)  # b"" only after the terminating chunk: a clean end
                if not chunk:
                    break
                chunks.append(chunk)
            self.body = b"".join(chunks)
            self.ending = "clean"
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.ending = repr(exc)
            self.connected.set()
        finally:
            conn.close()

    def messages(self) -> List[Dict[str, str]]:
        text = self.body.decode("utf-8")
        out = []
        for block in text.split("\n\n"):
            fields: Dict[str, str] = {}
            for line in block.splitlines():
                name, _, value = line.partition(": ")
                if name and not name.startswith(":"):
                    fields[name] = value
            if fields:
                out.append(fields)
        return out

    def steps_and_last_id(self) -> Tuple[List[int], int]:
        import json

        steps, last_id = [], 0
        for message in self.messages():
            if message.get("event") == "records":
                steps += [r["step"] for r in json.loads(message["data"])]
            if "id" in message:
                last_id = int(message["id"])
        return steps, last_id


@pytest.mark.timeout(90)
def test_ctrl_c_with_50_open_streams_ends_them_cleanly_and_clients_resume(tmp_path: Path, mstail_server, log_writer, wait_until) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "rank_0" / "info.log"
    log_writer.finish(log_writer(log, steps=20, interval_s=0))
    server = mstail_server(log)
    server.wait_records(20)
    port = int(server.url.rsplit(":", 1)[1])

    clients = [StreamClient(port) for _ in range(CLIENTS)]
    for client in clients:
        client.start()
    for client in clients:
        assert client.connected.wait(10), "a stream did not open"
    wait_until(lambda: server.get_json("/healthz")["clients"] == CLIENTS, 10, message=f"{CLIENTS} open streams")

    # Training goes on at ~33 steps/s; shut down in the middle of it.
    writer = log_writer(log, steps=STEPS - 20, interval_s=0.03, start_step=21)
    wait_until(lambda: server.get_json("/healthz")["last_seq"] > 40, 10, message="live steps flowing")
    began = time.monotonic()
    server.proc.send_signal(signal.SIGINT)
    code = server.proc.wait(timeout=10)
    took = time.monotonic() - began
    assert code == 0 and took <= EXIT_WITHIN_S, f"exit {code} after {took:.2f} s"
    assert "Traceback" not in server.stderr, server.stderr

    for client in clients:
        client.join(10)
    endings = [c.ending for c in clients]
    assert endings == ["clean"] * CLIENTS, endings
    seen = []
    for client in clients:
        text = client.body.decode("utf-8")
        assert text.endswith("\n\n") or text.endswith("\r\n\r\n"), text[-200:]  # no half message
        steps, last_id = client.steps_and_last_id()
        assert steps == list(range(1, len(steps) + 1)), "a gap or duplicate before the shutdown"
        seen.append((steps, last_id))

    # The training finishes while mstail is down; mstail comes back on the same port, clients resume.
    log_writer.finish(writer)
    again = mstail_server(log, args=("--port", str(port)))
    assert again.url.endswith(f":{port}")
    again.wait_records(STEPS)
    for steps, last_id in seen:
        got = collect(
            f"{again.url}/api/stream",
            headers={"Last-Event-ID": str(last_id)},
            until=lambda g: any(m.get("event") == "event" and m.data["kind"] == "end" for m in g),
        )
        assert not any(m.get("event") == "reset" for m in got)
        resumed = [r["step"] for m in got if m.get("event") == "records" for r in m.data]
        assert steps + resumed == list(range(1, STEPS + 1)), (len(steps), resumed[:3])


def test_sigterm_takes_the_clean_path_of_ctrl_c(tmp_path: Path, mstail_server, log_writer) -> None:  # type: ignore[no-untyped-def]
    # Before: SIGTERM (systemd, kill, a scheduler) ended mstail with 143 through uvicorn, before its last pass
    # was committed and the state closed.
    log = tmp_path / "rank_0" / "info.log"
    log_writer.finish(log_writer(log, steps=30, interval_s=0))
    server = mstail_server(log)
    server.wait_records(30)
    last_seq = server.get_json("/healthz")["last_seq"]
    began = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    code = server.proc.wait(timeout=10)
    assert code == 0 and time.monotonic() - began <= EXIT_WITHIN_S, f"exit {code}"
    assert "Traceback" not in server.stderr, server.stderr
    [state] = re.findall(r"history kept in (.+) \(--no-state", server.stderr)
    assert Path(f"{state}.lock").read_text().startswith("clean ")  # `Store.close` ran to its end
    again = mstail_server(log)  # the same state: everything committed, nothing read twice
    again.wait_records(30)
    assert again.get_json("/healthz")["last_seq"] == last_seq
