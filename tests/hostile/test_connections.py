"""Hostile clients against a real mstail: a flood of idle sockets, requests that never complete, too many streams.

Each test starts a real mstail process on loopback (tests/conftest.py) and bounds every wait. The flood test
runs the server under an open-file limit of 1,024 (its hard limit too, so mstail cannot raise it), as on a
machine where that is all there is.
"""

from __future__ import annotations

import logging
import resource
import socket
import time
from pathlib import Path
from typing import List, Optional, Tuple

import httpx
import pytest

from mstail.tailer.app.connections import AcceptErrorLog, OncePerInterval

from tests.web.sse_client import collect

pytestmark = pytest.mark.slow

TOKEN = "hostile-test-token-0123456789"
FLOOD = 1100
CHILD_FD_LIMIT = 1024


def _fd_limit_1024() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (CHILD_FD_LIMIT, CHILD_FD_LIMIT))


@pytest.fixture
def enough_fds() -> None:
    """This test process holds FLOOD sockets itself: its soft limit goes up, and its hard limit too when that is
    lower (root may raise it: CI runs as root), back down at the end."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = FLOOD + 512
    raised = hard if hard == resource.RLIM_INFINITY or hard >= wanted else wanted
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), raised))
    except (ValueError, OSError):
        pytest.skip(f"the hard open-file limit ({hard}) is below the {wanted} this test needs and cannot be raised")
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _address(url: str) -> Tuple[str, int]:
    host, port = url.split("//", 1)[1].split(":")
    return host, int(port)


def _timed_healthz(url: str) -> Tuple[int, float, dict]:
    began = time.monotonic()
    response = httpx.get(url + "/healthz", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5, trust_env=False)
    return response.status_code, time.monotonic() - began, response.json()


def _closed_after(sock: socket.socket, began: float, limit_s: float) -> Optional[float]:
    """Seconds from `began` until the server closed `sock` (EOF or reset), reading whatever it sent; None if it
    was still open after `limit_s`."""
    sock.settimeout(0.1)
    while time.monotonic() - began < limit_s:
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - began
        except socket.timeout:
            continue
        except ConnectionResetError:
            return time.monotonic() - began
    return None


def test_idle_connections_beyond_the_fd_limit_cannot_lock_out_an_authenticated_client(  # type: ignore[no-untyped-def]
        tmp_path: Path, mstail_server, log_writer, wait_until, enough_fds) -> None:
    log = tmp_path / "rank_0" / "info.log"
    log_writer.finish(log_writer(log, steps=5, interval_s=0))
    server = mstail_server(log, args=["--token", TOKEN], preexec_fn=_fd_limit_1024)
    wait_until(lambda: _timed_healthz(server.url)[2]["sources"] == 1, 10, message="the log followed")
    idle: List[socket.socket] = []
    try:
        _flood(_address(server.url), FLOOD, idle)
        answers = [_timed_healthz(server.url) for _ in range(3)]
        for status, took, _ in answers:
            # locked out, a request would wait for the flood's header deadline (10 s; httpx gives up at 5): 3 s
            # tells that apart from a busy 2-core machine (1.05 s was seen once with the whole suite running)
            assert status == 200 and took < 3.0, answers
        facts = answers[-1][2]
        assert facts["sources"] == 1
        connections = facts["connections"]
        assert connections["limit"] < CHILD_FD_LIMIT  # lowered to fit the limit the process really has
        assert connections["open"] <= connections["limit"]
        assert connections["evicted"] >= FLOOD - connections["limit"]
    finally:
        for sock in idle:
            sock.close()
    assert server.proc.poll() is None
    stderr = server.stderr_path.stat().st_size
    assert stderr < 10_000, server.stderr[:3000]
    assert "Traceback" not in server.stderr


def test_at_a_tiny_fd_limit_failed_accepts_are_said_once_and_the_server_still_answers(  # type: ignore[no-untyped-def]
        tmp_path: Path, mstail_server, log_writer, wait_until, enough_fds) -> None:
    log = tmp_path / "rank_0" / "info.log"
    log_writer.finish(log_writer(log, steps=5, interval_s=0))
    limit = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))  # noqa: E731 - room for mstail's own files only
    server = mstail_server(log, args=["--token", TOKEN], preexec_fn=limit)
    idle: List[socket.socket] = []
    try:
        _flood(_address(server.url), 400, idle)  # bursts of up to 128 accepts outrun the evictions: EMFILE
        status, _, facts = wait_until(lambda: _timed_healthz(server.url), 10, message="/healthz")
        assert status == 200 and facts["connections"]["limit"] == 16
    finally:
        for sock in idle:
            sock.close()
    said = server.stderr
    assert said.count("cannot accept connections") <= 1 and len(said) < 2_000, said[:3000]
    assert "Traceback" not in said


def _flood(address: Tuple[str, int], count: int, into: List[socket.socket]) -> None:
    """Open `count` idle connections (kept in `into`, which the caller closes); 60 s at most."""
    began = time.monotonic()
    while len(into) < count and time.monotonic() - began < 60:
        sock = socket.socket()
        sock.settimeout(5)
        try:
            sock.connect(address)
        except OSError:
            sock.close()
            continue
        into.append(sock)
    assert len(into) == count, f"only {len(into)} connections opened in 60 s"


def test_requests_that_never_complete_are_closed_at_the_header_deadline(  # type: ignore[no-untyped-def]
        tmp_path: Path, mstail_server, log_writer) -> None:
    log = tmp_path / "rank_0" / "info.log"
    log_writer.finish(log_writer(log, steps=5, interval_s=0))
    server = mstail_server(log, args=["--header-timeout", "2"])
    server.wait_records(5)
    address = _address(server.url)
    request = f"GET /healthz HTTP/1.1\r\nHost: {address[0]}:{address[1]}\r\n\r\n".encode()
    half, silent, kept = socket.socket(), socket.socket(), socket.socket()
    try:
        for sock in (half, silent, kept):
            sock.connect(address)
        began = time.monotonic()
        half.sendall(b"GET /healthz HT")  # half a request line, then nothing
        kept.sendall(request)  # one whole request (answered), then half of the next: keep-alive does not cover it
        kept.settimeout(5)
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")
        kept.sendall(b"GET /api/sour")
        kept_began = time.monotonic()
        # a slow loris: a byte every half second never completes its headers, and is closed at the same deadline
        loris = socket.socket()
        loris.connect(address)
        loris_began = time.monotonic()
        loris.settimeout(0.5)
        drip_closed: Optional[float] = None
        for byte in request:
            try:
                loris.sendall(bytes([byte]))
                if loris.recv(1) == b"":
                    drip_closed = time.monotonic() - loris_began
                    break
            except socket.timeout:
                continue
            except (BrokenPipeError, ConnectionResetError):
                drip_closed = time.monotonic() - loris_began
                break
            if time.monotonic() - loris_began > 8:
                break
        loris.close()
        closed = {
            "half": _closed_after(half, began, 8),
            "silent": _closed_after(silent, began, 8),
            "kept": _closed_after(kept, kept_began, 8),
            "loris": drip_closed,
        }
        for _name, after in closed.items():
            assert after is not None and 1.5 < after < 4.0, closed
    finally:
        for sock in (half, silent, kept):
            sock.close()
    facts = server.get_json("/healthz")
    assert facts["connections"]["timed_out"] >= 4
    assert "Traceback" not in server.stderr and "ERROR" not in server.stderr, server.stderr


def test_malformed_requests_cannot_write_stderr_full(tmp_path: Path, mstail_server, log_writer) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "rank_0" / "info.log"
    log_writer.finish(log_writer(log, steps=5, interval_s=0))
    server = mstail_server(log)
    server.wait_records(5)
    address = _address(server.url)
    before = server.stderr_path.stat().st_size
    for n in range(300):  # uvicorn warns once per malformed request and twice per upgrade request
        with socket.create_connection(address, timeout=5) as sock:
            sock.sendall(b"NOT HTTP AT ALL\r\n\r\n" if n % 2 else
                         b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
            sock.settimeout(5)
            sock.recv(65536)
    grew = server.stderr_path.stat().st_size - before
    assert grew < 1_000, server.stderr[-3000:]
    assert server.get_json("/healthz")["status"] == "ok"


def _open_stream(address: Tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address, timeout=5)
    sock.sendall(f"GET /api/stream HTTP/1.1\r\nHost: {address[0]}:{address[1]}\r\n\r\n".encode())
    assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    return sock


def _read_until(sock: socket.socket, wanted: bytes, timeout_s: float) -> bytes:
    got = b""
    deadline = time.monotonic() + timeout_s
    sock.settimeout(0.2)
    while wanted not in got and time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        if not chunk:
            break
        got += chunk
    return got


def test_streams_beyond_max_streams_get_a_503_and_the_open_ones_go_on(  # type: ignore[no-untyped-def]
        tmp_path: Path, mstail_server, log_writer, wait_until) -> None:
    log = tmp_path / "rank_0" / "info.log"
    log_writer.finish(log_writer(log, steps=5, interval_s=0))
    server = mstail_server(log, args=["--max-streams", "3"])
    server.wait_records(5)
    address = _address(server.url)
    streams = [_open_stream(address) for _ in range(3)]
    try:
        wait_until(lambda: server.get_json("/healthz")["streams"]["open"] == 3, 5, message="3 open streams")
        refused = httpx.get(server.url + "/api/stream", timeout=5, trust_env=False)
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "5"
        assert "--max-streams" in refused.json()["detail"]
        log_writer.finish(log_writer(log, steps=3, interval_s=0, start_step=6))
        for sock in streams:
            assert b"event: records" in _read_until(sock, b"event: records", 10)
        streams.pop().close()
        wait_until(lambda: server.get_json("/healthz")["streams"]["open"] == 2, 5, message="the closed stream gone")
        again = collect(server.url + "/api/stream", until=lambda got: True, timeout_s=5)
        assert again and again[0].get("retry") == "2000"
        assert server.get_json("/healthz")["streams"]["refused"] == 1
    finally:
        for sock in streams:
            sock.close()


def test_failed_accepts_are_one_line_a_minute_with_a_count(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    passed: List[dict] = []

    class Loop:
        def default_exception_handler(self, context: dict) -> None:
            passed.append(context)

    handler = AcceptErrorLog(limiter=OncePerInterval(60.0, clock=lambda: now[0]))
    failure = {"message": AcceptErrorLog.MESSAGE, "exception": OSError(24, "Too many open files")}
    with caplog.at_level(logging.WARNING, logger="mstail.connections"):
        for _ in range(5000):
            handler(Loop(), failure)  # type: ignore[arg-type]
        now[0] = 61.0
        handler(Loop(), failure)  # type: ignore[arg-type]
        handler(Loop(), {"message": "something else"})  # type: ignore[arg-type]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "Too many open files" in lines[0] and "4999 more" in lines[1]
    assert passed == [{"message": "something else"}]
