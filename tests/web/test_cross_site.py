"""Requests from other web sites and greedy clients, against a real mstail on 127.0.0.1 (raw httpx requests).

Without a token, a request a browser marks as coming from another site (`Sec-Fetch-Site: cross-site` or
`same-site`, or an `Origin` that is not the server's own) is refused before any work on every path but the page
and its assets: CORS alone only hides the answer, any page the user visits could keep the server busy. The page's
own requests (`same-origin`, `none`, no such header: curl, Prometheus) pass, and with a token nothing changes.
The expensive routes have a bound per client: past it, `429` with `Retry-After` at once, never a queue.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from typing import Dict, Iterator, List, Tuple
from urllib.parse import urlsplit

import httpx
import pytest

from mstail.web.limits import EXPENSIVE_PATHS, PER_CLIENT

from ..conftest import MstailServer
from .test_security import TOKEN, _serve

pytestmark = pytest.mark.slow

WORK_PATHS = ["/api/sources", "/api/series?metric=loss", "/api/series?metric=loss&aggregate=mean",
              "/api/heatmap?metric=loss", "/api/records?after=0", "/api/events", "/api/alerts", "/api/stream",
              "/healthz", "/metrics", "/no-such-page"]
PAGE_PATHS = ["/", "/static/app.js", "/static/vendor/echarts-5.6.0-mstail.min.js"]
EVIL = "http://evil.example"


def _other_sites(port: int) -> List[Dict[str, str]]:
    """What a browser sends with a request another site's page made (fetch, <img>, <script>, a form, a link)."""
    return [
        {"Origin": EVIL, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"},  # the reported attack
        {"Origin": EVIL, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors"},
        {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"},  # <img>: no Origin
        {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors"},  # a page on another port of localhost
        {"Origin": f"http://127.0.0.1:{port + 1}", "Sec-Fetch-Site": "same-site"},
        {"Origin": f"http://127.0.0.1:{port + 1}"},  # an older browser: no Sec-Fetch-*
        {"Origin": f"http://localhost:{port}"},  # another origin than the Host the request names
        {"Origin": f"https://127.0.0.1:{port}"},
        {"Origin": "null", "Sec-Fetch-Site": "cross-site"},  # a sandboxed frame, a file:// page
        {"Origin": "http://127.0.0.1:99999"},
        {"Origin": EVIL},
        {"Sec-Fetch-Site": "something-new"},
    ]


def _own(port: int) -> List[Dict[str, str]]:
    """What the page's own requests and a user typing the URL send, and what a script or Prometheus sends."""
    return [
        {"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"},
        {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty"},
        {"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate"},
        {"Origin": f"http://127.0.0.1:{port}"},
        {},
    ]


def _get(server: MstailServer, path: str, headers: Dict[str, str]) -> httpx.Response:
    """One request; an event stream's status and headers only."""
    with httpx.Client(base_url=server.url, timeout=10, trust_env=False) as client:
        with client.stream("GET", path, headers=headers) as response:
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                response.read()
            return response


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MstailServer]:
    with _serve(tmp_path_factory, ()) as server:
        server.wait_records(5)
        yield server


@pytest.mark.parametrize("path", WORK_PATHS)
def test_requests_from_other_sites_are_refused_without_a_token(open_server: MstailServer, path: str) -> None:
    port = urlsplit(open_server.url).port
    for headers in _other_sites(port):
        response = _get(open_server, path, headers)
        assert response.status_code == 403, (path, headers, response.status_code)
        assert "another web site" in response.text and "--token" in response.text
        if path.startswith("/api/") or path == "/metrics":
            assert response.headers["content-type"] == "application/json"
            assert json.loads(response.text)["detail"].startswith("mstail: ")
        assert response.headers["x-content-type-options"] == "nosniff"  # a refusal has the security headers too
        assert not any(name.startswith("access-control-") for name in response.headers)


@pytest.mark.parametrize("path", WORK_PATHS)
def test_the_page_and_plain_clients_are_served(open_server: MstailServer, path: str) -> None:
    port = urlsplit(open_server.url).port
    for headers in _own(port):
        assert _get(open_server, path, headers).status_code == (404 if "no-such" in path else 200), (path, headers)
    for host in (f"localhost:{port}", f"[::1]:{port}"):  # the page opened by another loopback name: its own origin
        origin = "http://" + host
        status = _get(open_server, path, {"Host": host, "Origin": origin, "Sec-Fetch-Site": "same-origin"}).status_code
        assert status == (404 if "no-such" in path else 200), (path, host)


@pytest.mark.parametrize("path", PAGE_PATHS)
def test_the_page_opens_from_a_link_on_another_site(open_server: MstailServer, path: str) -> None:
    port = urlsplit(open_server.url).port
    for headers in _other_sites(port):
        assert _get(open_server, path, headers).status_code == 200, (path, headers)


def test_with_a_token_other_sites_change_nothing(tmp_path_factory: pytest.TempPathFactory) -> None:
    with _serve(tmp_path_factory, ("--token", TOKEN)) as server:
        port = urlsplit(server.url).port
        bearer = {"Authorization": "Bearer " + TOKEN}
        for path in WORK_PATHS:
            for headers in _other_sites(port):
                expected = 404 if "no-such" in path else 200
                assert _get(server, path, {**headers, **bearer}).status_code == expected, (path, headers)
                assert _get(server, path, headers).status_code == 401, (path, headers)


def test_an_origin_named_by_cors_origin_may_call_without_a_token(tmp_path_factory: pytest.TempPathFactory) -> None:
    trusted = "http://grafana.example:3000"
    with _serve(tmp_path_factory, ("--cors-origin", trusted)) as server:
        allowed = {"Origin": trusted, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors"}
        response = _get(server, "/api/sources", allowed)
        assert response.status_code == 200 and response.headers["access-control-allow-origin"] == trusted
        assert _get(server, "/api/sources", {**allowed, "Origin": EVIL}).status_code == 403
        assert _get(server, "/api/sources", {"Sec-Fetch-Site": "cross-site"}).status_code == 403  # no Origin: not it


# -- the bound on expensive requests per client ----------------------------------------------------------------
def _burst(server: MstailServer, paths: List[str]) -> List[Tuple[int, Dict[str, str], bytes]]:
    """`paths` asked at once, each on a connection of its own, by one client: the server is stopped (SIGSTOP)
    while they are sent, so it finds them all waiting when it goes on, a burst in one go whatever the machine's
    load. (status, headers, body) each."""
    parts = urlsplit(server.url)
    socks = []
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        for path in paths:
            sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
            socks.append(sock)
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n\r\n".encode())
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    answers = []
    for sock in socks:
        with sock:
            data = b"".join(iter(lambda: sock.recv(65536), b""))  # read here, before the next one
        head, _, body = data.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
        answers.append((int(status_line.split()[1]), headers, body))
    return answers


@pytest.mark.timeout(90)
def test_expensive_requests_past_the_bound_per_client_get_429_at_once(open_server: MstailServer) -> None:
    assert {"/api/series", "/api/heatmap", "/api/records", "/api/events"} <= EXPENSIVE_PATHS
    # heatmaps are computed in a worker thread (their distinct columns: none is answered from the heatmap cache),
    # series on the event loop, one after another
    heatmaps = [f"/api/heatmap?metric=loss&columns={columns}" for columns in range(1, PER_CLIENT + 6)]
    series = [f"/api/series?metric=loss&points={points}" for points in range(1, PER_CLIENT + 6)]
    for paths in (heatmaps, series):
        _assert_bounded(_burst(open_server, paths))
    # None was queued: every request has its answer now, and the next ones are served in full.
    assert all(status == 200 for status, _, _ in _burst(open_server, heatmaps[:PER_CLIENT]))
    for path in ("/api/series?metric=loss", "/api/records?after=0", "/api/events?limit=10", heatmaps[-1]):
        assert _get(open_server, path, {}).status_code == 200, path


def _assert_bounded(answers: List[Tuple[int, Dict[str, str], bytes]]) -> None:
    statuses = [status for status, _, _ in answers]
    assert set(statuses) == {200, 429} and statuses.count(200) >= PER_CLIENT, statuses
    for status, headers, body in answers:
        if status == 429:
            assert headers["retry-after"] == "1" and headers["content-type"] == "application/json", headers
            assert "retry after" in json.loads(body)["detail"]
            assert headers["x-content-type-options"] == "nosniff"  # the security headers, as on every answer
