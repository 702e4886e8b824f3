"""Security against a real mstail: token on every path, security headers, CORS, Host check, path traversal,
bounded inputs. Raw HTTP through http.client so paths reach the server exactly as written (no client-side
normalisation of `..` or percent-escapes).

Everything listens on 127.0.0.1. Binding elsewhere is covered by the loopback classification and the CLI's
token rule (`with_token`), tested as units: a test must not open a port on other interfaces.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple
from urllib.parse import urlsplit

import pytest

from mstail.parsers.record import MAX_NAME_CHARS
from mstail.web.access import is_loopback_host, new_token
from mstail.tailer.app.cli import with_token
from mstail.tailer.config import Config

from ..conftest import ROOT, MstailServer, finish_writer, spawn_writer, start_mstail

TOKEN = "test-token-0123456789abcdefABCDEF"
STEPS = 5
ALL_PATHS = ["/", "/static/app.js", "/static/app.css", "/static/vendor/echarts-5.6.0-mstail.min.js", "/static/favicon.svg",
             "/static/record.schema.json",
             "/api/sources", "/api/series?metric=loss", "/api/records?after=0", "/api/events", "/api/stream",
             "/healthz", "/no-such-page", "/static/no-such-file.js"]


Response = Tuple[int, Dict[str, str], bytes]


def request(server: MstailServer, path: str, headers: Optional[Dict[str, str]] = None, method: str = "GET") -> Response:
    """One raw request; for an event stream only the status and headers are read."""
    parts = urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    try:
        conn.putrequest(method, path, skip_host="Host" in (headers or {}), skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        conn.endheaders()
        response = conn.getresponse()
        got = {k.lower(): v for k, v in response.getheaders()}
        cookies = response.msg.get_all("set-cookie") or []
        if cookies:
            got["set-cookie"] = "\n".join(cookies)
        body = b"" if got.get("content-type", "").startswith("text/event-stream") else response.read()
        return response.status, got, body
    finally:
        conn.close()


@contextlib.contextmanager
def _serve(tmp_path_factory: pytest.TempPathFactory, args: Tuple[str, ...]) -> Iterator[MstailServer]:
    folder = tmp_path_factory.mktemp("security")
    log = folder / "rank_0" / "info.log"
    finish_writer(spawn_writer(log, steps=STEPS, interval_s=0))
    server = start_mstail([log], folder / "mstail", args=args)
    try:
        yield server
    finally:
        code = server.stop()
        assert code is not None, "mstail did not exit on SIGINT"
        assert "Traceback" not in server.stderr, server.stderr


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MstailServer]:
    """A real mstail on 127.0.0.1 with `--token`."""
    with _serve(tmp_path_factory, ("--token", TOKEN)) as server:
        yield server


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MstailServer]:
    """A real mstail on 127.0.0.1 without a token (the default), with its history loaded."""
    with _serve(tmp_path_factory, ()) as server:
        server.wait_records(STEPS)
        yield server


# -- what counts as loopback, and the CLI's token rule ----------------------------------------------------
@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "127.255.255.254", "::1", "[::1]", "localhost",
                                  "LOCALHOST", "localhost.", "app.localhost", "::ffff:127.0.0.1"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback_host(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.0.0.5", "192.168.1.10", "8.8.8.8", "fe80::1",
                                  "example.com", "localhost.example.com", "128.0.0.1", "::ffff:10.0.0.1", "1.2.3.4.5"])
def test_non_loopback_hosts(host: str) -> None:
    assert not is_loopback_host(host)


def test_a_non_loopback_host_gets_a_generated_token_and_loopback_does_not() -> None:
    for host in ("0.0.0.0", "::", "10.1.2.3", "node-7.cluster"):
        config, generated = with_token(Config(logs=("x.log",), host=host))
        assert generated and config.token and len(config.token) >= 32, host
    other, _ = with_token(Config(logs=("x.log",), host="0.0.0.0"))
    assert other.token != config.token  # random each time
    given, generated = with_token(Config(logs=("x.log",), host="0.0.0.0", token=TOKEN))
    assert (given.token, generated) == (TOKEN, False)
    local, generated = with_token(Config(logs=("x.log",), host="127.0.0.1"))
    assert (local.token, generated) == (None, False)
    assert len({new_token() for _ in range(100)}) == 100


@pytest.mark.slow  # a real mstail
@pytest.mark.parametrize("token", ["short", "has space in the token 1234", "semi;colon-in-the-token-1234", "x" * 513])
def test_a_malformed_token_is_one_clear_error(tmp_path: Path, token: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "mstail", "--log", str(tmp_path / "x.log"), "--port", "0", "--token", token],
                          cwd=str(ROOT), capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.startswith("mstail: --token needs") and proc.stderr.count("\n") == 1, proc.stderr


# -- the token ----------------------------------------------------------------------------------------------
@pytest.mark.slow  # a real mstail
@pytest.mark.parametrize("path", ALL_PATHS)
def test_every_path_answers_401_without_the_token(guarded: MstailServer, path: str) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong-" + TOKEN}, {"Authorization": "Bearer " + TOKEN.upper()},
                    {"Authorization": "Basic " + TOKEN}, {"Authorization": TOKEN}, {"Cookie": "mstail_token=" + TOKEN}):
        status, got, body = request(guarded, path, headers)
        assert status == 401, (path, headers, status)
        assert got["www-authenticate"] == 'Bearer realm="mstail"'
        assert TOKEN.encode() not in body and TOKEN.upper().encode() not in body
        if path.startswith("/api/"):
            assert got["content-type"] == "application/json"
            assert json.loads(body)["detail"].startswith("mstail: ")
        else:
            assert got["content-type"].startswith("text/plain") and body.startswith(b"mstail: ")
    status, _, _ = request(guarded, path.split("?")[0] + "?token=wrong-" + TOKEN)
    assert status == 401


@pytest.mark.slow  # a real mstail
@pytest.mark.parametrize("path", ALL_PATHS)
def test_every_path_works_with_the_bearer_token(guarded: MstailServer, path: str) -> None:
    for scheme in ("Bearer", "bearer"):
        status, got, _ = request(guarded, path, {"Authorization": f"{scheme} {TOKEN}"})
        assert status == (404 if "no-such" in path else 200), (path, status)
        assert "set-cookie" not in got


@pytest.mark.slow  # a real mstail
def test_the_token_in_the_url_sets_a_strict_httponly_cookie_that_then_suffices(guarded: MstailServer) -> None:
    status, got, body = request(guarded, "/?token=" + TOKEN)
    assert status == 200 and b"<title>mstail</title>" in body
    port = urlsplit(guarded.url).port
    cookie = got["set-cookie"]
    assert cookie.startswith(f"mstail_token_{port}={TOKEN};")
    attributes = {a.strip().lower() for a in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/"} <= attributes
    jar = {"Cookie": f"mstail_token_{port}={TOKEN}"}
    for path in ("/static/app.js", "/api/sources", "/api/stream?after=0", "/healthz"):
        assert request(guarded, path, jar)[0] == 200, path
    # Another port's cookie (another mstail on the same host) is not this one's.
    assert request(guarded, "/api/sources", {"Cookie": f"mstail_token_{port + 1}={TOKEN}"})[0] == 401


# -- Host header, headers, CORS -----------------------------------------------------------------------------
@pytest.mark.slow  # a real mstail
def test_a_loopback_only_server_refuses_foreign_host_headers(open_server: MstailServer) -> None:
    port = urlsplit(open_server.url).port
    for host in ("evil.example", f"evil.example:{port}", "10.0.0.1", f"[fe80::1]:{port}", "127.0.0.1.evil.example"):
        status, got, body = request(open_server, "/api/sources", {"Host": host})
        assert status == 403, host
        assert "loopback only" in json.loads(body)["detail"]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "localhost"):
        assert request(open_server, "/api/sources", {"Host": host})[0] == 200, host


@pytest.mark.slow  # a real mstail
@pytest.mark.parametrize("path", ["/", "/static/app.js", "/api/sources", "/api/stream", "/healthz", "/no-such-page"])
def test_security_headers_on_every_answer(open_server: MstailServer, guarded: MstailServer, path: str) -> None:
    for server, headers in ((open_server, {}), (guarded, {}), (guarded, {"Authorization": "Bearer " + TOKEN})):
        _, got, _ = request(server, path, headers)
        csp = {d.split()[0]: d.split()[1:] for d in got["content-security-policy"].split(";") if d.strip()}
        assert csp["default-src"] == ["'none'"]
        assert csp["script-src"] == ["'self'"]  # no inline script, no eval, no remote origin
        assert csp["style-src"] == ["'self'"]
        assert csp["connect-src"] == ["'self'"]
        assert csp["frame-ancestors"] == ["'none'"] and csp["base-uri"] == ["'none'"]
        assert not any("http" in v or "*" in v for values in csp.values() for v in values)
        assert got["x-content-type-options"] == "nosniff"
        assert got["referrer-policy"] == "no-referrer"
        assert got["x-frame-options"] == "DENY"


@pytest.mark.slow  # a real mstail
def test_cors_is_closed_unless_configured(open_server: MstailServer, tmp_path_factory: pytest.TempPathFactory) -> None:
    origin = {"Origin": "http://evil.example"}
    _, got, _ = request(open_server, "/api/sources", origin)
    assert not any(k.startswith("access-control-") for k in got)
    status, got, _ = request(open_server, "/api/sources", {**origin, "Access-Control-Request-Method": "GET"}, "OPTIONS")
    assert status >= 400 and not any(k.startswith("access-control-") for k in got)

    with _serve(tmp_path_factory, ("--cors-origin", "http://grafana.example:3000", "--token", TOKEN)) as server:
        allowed = {"Origin": "http://grafana.example:3000"}
        _, got, _ = request(server, "/api/sources", {**allowed, "Authorization": "Bearer " + TOKEN})
        assert got["access-control-allow-origin"] == "http://grafana.example:3000"
        status, got, _ = request(server, "/api/sources", {**allowed, "Access-Control-Request-Method": "GET",
                                                          "Access-Control-Request-Headers": "authorization"}, "OPTIONS")
        assert status == 200 and "authorization" in got["access-control-allow-headers"].lower()
        _, got, _ = request(server, "/api/sources", {**origin, "Authorization": "Bearer " + TOKEN})
        assert "access-control-allow-origin" not in got
        assert request(server, "/api/sources", allowed)[0] == 401  # CORS opens reading, not the token check


# -- path traversal -------------------------------------------------------------------------------------------
TRAVERSALS = [
    "/static/../app.py", "/static/../../pyproject.toml", "/static/%2e%2e/app.py", "/static/%2e%2e/%2e%2e/pyproject.toml",
    "/static/..%2fapp.py", "/static/..%2f..%2fpyproject.toml", "/static/%2e%2e%2f%2e%2e%2fpyproject.toml",
    "/static/vendor/../../api.py", "/static/vendor/%2e%2e/%2e%2e/api.py", "/static/..%5capp.py", "/static/..\\app.py",
    "/static/....//app.py", "/static//etc/passwd", "/static/%2fetc%2fpasswd", "/static/../../../../../../etc/passwd",
    "/static/%252e%252e/app.py", "/static/%c0%ae%c0%ae/app.py", "/static/app.js%00.html", "/static/app.js/..%00/../app.py",
    "/../pyproject.toml", "/%2e%2e/pyproject.toml", "/static", "/static/", "/static/vendor/", "/static/.",
    "/static/..", "//etc/passwd", "/api/../../etc/passwd", "/static/index.html/../../app.py",
]


@pytest.mark.slow  # a real mstail
@pytest.mark.parametrize("path", TRAVERSALS)
def test_no_path_escapes_the_static_folder(open_server: MstailServer, path: str) -> None:
    status, _, body = request(open_server, path)
    assert status in (400, 404, 405, 307), (path, status)
    for secret in (b"root:", b"def create_app", b"[project]", b"import ", b"class SecurityMiddleware"):
        assert secret not in body, (path, secret)


@pytest.mark.slow  # a real mstail
def test_no_query_names_a_file_to_read(open_server: MstailServer) -> None:
    for path in ("/api/series?metric=../../../../etc/passwd", "/api/series?metric=loss&source=/etc/passwd",
                 "/api/sources?path=/etc/passwd", "/api/events?kind=/etc/passwd", "/?file=/etc/passwd",
                 "/static/app.js?path=../../pyproject.toml"):
        status, _, body = request(open_server, path)
        assert status == 200, path
        assert b"root:" not in body and b"[project]" not in body, path


# -- bounded inputs -------------------------------------------------------------------------------------------
BAD_QUERIES = [
    # (parameter, path): each must be refused with a 4xx before any work
    ("points", "/api/series?metric=loss&points=0"),
    ("points", "/api/series?metric=loss&points=20001"),
    ("points", "/api/series?metric=loss&points=-5"),
    ("points", "/api/series?metric=loss&points=abc"),
    ("points", "/api/series?metric=loss&points=" + "9" * 40),
    ("points", "/api/series?metric=loss&points=1e9"),
    ("metric", "/api/series"),
    ("metric", "/api/series?metric=" + "m" * (MAX_NAME_CHARS + 1)),
    ("start", "/api/series?metric=loss&start=" + "9" * 30),
    ("start", "/api/series?metric=loss&start=x"),
    ("end", "/api/series?metric=loss&end=-" + "9" * 30),
    ("end", "/api/series?metric=loss&end=1.5"),
    ("source", "/api/series?metric=loss" + "&source=r" * 1025),
    ("source", "/api/series?metric=loss&source=" + "s" * 1001),
    ("after", "/api/records?after=-1"),
    ("after", "/api/records?after=" + "9" * 40),
    ("after", "/api/records?after=NaN"),
    ("limit", "/api/records?limit=0"),
    ("limit", "/api/records?limit=10001"),
    ("limit", "/api/records?limit=" + "9" * 5000),
    ("kind", "/api/events?kind=" + "k" * 51),
    ("stream after", "/api/stream?after=-1"),
    ("stream after", "/api/stream?after=" + "9" * 20),
    ("stream after", "/api/stream?after=x"),
    ("query size", "/api/series?metric=loss&x=" + "y" * 17000),
    ("query size", "/api/records?" + "&".join(["after=1"] * 3000)),
]


@pytest.mark.slow  # a real mstail
@pytest.mark.parametrize("name,path", BAD_QUERIES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(BAD_QUERIES)])
def test_oversized_or_malformed_parameters_get_4xx(open_server: MstailServer, name: str, path: str) -> None:
    status, got, body = request(open_server, path)
    assert 400 <= status < 500, (name, status, body[:200])
    assert got["content-type"].startswith("application/json") and len(body) < 64 * 1024


@pytest.mark.slow  # a real mstail
@pytest.mark.parametrize("value", ["9" * 5000, "9" * 20, "\u00b2", "12a", "-3", " ", "1 2"])
def test_malformed_last_event_id_gets_400(open_server: MstailServer, value: str) -> None:
    status, _, _ = request(open_server, "/api/stream", {"Last-Event-ID": value.encode("utf-8").decode("latin-1")})
    assert status == 400 if value.strip() else status == 200, (value, status)


@pytest.mark.slow  # a real mstail
def test_the_largest_valid_values_still_answer(open_server: MstailServer) -> None:
    for path in ("/api/series?metric=loss&points=20000&start=-9223372036854775808&end=9223372036854775807",
                 "/api/series?metric=loss&aggregate=mean&start=-9223372036854775808&end=-9223372036854775808",
                 "/api/heatmap?metric=loss&start=-9223372036854775808&end=9223372036854775807",
                 "/api/records?after=9223372036854775807&limit=10000", "/api/records?after=0&limit=10000"):
        assert request(open_server, path)[0] == 200, path
