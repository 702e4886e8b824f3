"""Access control and security headers for every request: one small pure-ASGI middleware.

- Token (when the sidecar has one): `Authorization: Bearer TOKEN`, or `?token=TOKEN` (which also sets an
  HttpOnly, SameSite=Strict cookie so the page's own requests and its EventSource carry it), or that cookie.
  Compared in constant time (`hmac.compare_digest`). Anything else gets a clear 401, JSON for `/api/*` and
  `/metrics`, plain text otherwise. Every path is checked: page, assets, API, stream, metrics, health.
- Host check (when there is no token, i.e. loopback only): the `Host` header must name this machine, so a web
  page elsewhere cannot reach the sidecar through DNS rebinding.
- Other sites (when there is no token): a request a browser marks as coming from another site (`Sec-Fetch-Site`
  `cross-site` or `same-site`: another port of localhost is the same site, not the same origin) or whose `Origin`
  is not this server's own is refused (403) before any work, on every path but the page and its assets (a link to
  the page from elsewhere still opens it). CORS alone only hides the answer: the work would be done. An origin
  `--cors-origin` names is let through.
- Size: a query string over 16 KiB is refused (414) before anything parses it.
- Headers on every answer, 401s included: a strict Content-Security-Policy (scripts, styles, images and
  connections from this origin only, no inline script, no framing), `X-Content-Type-Options: nosniff`,
  `Referrer-Policy: no-referrer` (a token in the page URL never leaves in a Referer), `X-Frame-Options`.

It is pure ASGI (not Starlette's BaseHTTPMiddleware) so endless SSE responses stream through untouched.
"""

from __future__ import annotations

import hmac
import json
from typing import Awaitable, Callable, Iterable, List, Optional, Tuple
from urllib.parse import parse_qsl, urlsplit

from starlette.datastructures import Headers
from starlette.requests import cookie_parser

from mstail.web.access import is_loopback_host

Scope = dict
Message = dict
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS: List[Tuple[bytes, bytes]] = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]
QUERY_PARAM = "token"
MAX_QUERY_BYTES = 16 * 1024  # a longer query string is malformed, not work: 414 before any parsing
MAX_TOKEN_CHARS = 512
#: What a browser's `Sec-Fetch-Site` says of a request this server's own page made, or the user typed.
OWN_FETCH_SITES = frozenset({"same-origin", "none"})


def cookie_name(port: Optional[int]) -> str:
    """Cookies are not separated by port: each sidecar on a host has its own cookie name."""
    return f"mstail_token_{port}" if port else "mstail_token"


class SecurityMiddleware:
    """Wraps the app. `token`: required on every request when set; without one, requests from other sites are
    refused but from `allowed_origins` (`--cors-origin`). `check_host`: refuse a `Host` header that is not a
    loopback name (for a loopback-only sidecar without a token)."""

    def __init__(self, app: ASGIApp, token: Optional[str] = None, check_host: bool = False,
                 allowed_origins: Iterable[str] = ()) -> None:
        self.app = app
        self.token = token.encode("utf-8") if token else None
        self.check_host = check_host
        self.allowed_origins = frozenset(allowed_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if "\x00" in scope.get("path", ""):
            # No file or route has a NUL in its name; older Starlette's StaticFiles answers it with a 500.
            await _refuse(scope, send, 400, "a NUL byte in the path")
            return
        if len(scope.get("query_string", b"")) > MAX_QUERY_BYTES:
            await _refuse(scope, send, 414, f"query string longer than {MAX_QUERY_BYTES} bytes")
            return
        if self.check_host and not _loopback_host_header(headers.get("host")):
            await _refuse(scope, send, 403, "this mstail listens on loopback only and answers requests for "
                          "localhost / 127.0.0.1 only (bind another address with --host and a --token)")
            return
        if self.token is None and not _is_page(scope) and self._from_another_site(scope, headers):
            await _refuse(scope, send, 403, "a request from another web site is refused: this mstail has no "
                          "token, so only its own page may call it (give --token, or --cors-origin ORIGIN for a "
                          "site you trust)")
            return
        set_cookie: Optional[bytes] = None
        if self.token is not None:
            given, from_query = _offered_token(scope, headers)
            if given is None:
                await _refuse(scope, send, 401, "a token is required: open the URL mstail printed "
                              "(http://HOST:PORT/?token=...) or send 'Authorization: Bearer TOKEN'")
                return
            if not hmac.compare_digest(given.encode("utf-8"), self.token):
                await _refuse(scope, send, 401, "wrong token")
                return
            if from_query:
                port = (scope.get("server") or (None, None))[1]
                set_cookie = (f"{cookie_name(port)}={given}; Path=/; HttpOnly; SameSite=Strict").encode("latin-1")
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = _with_security_headers(message.get("headers", ()), set_cookie)
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _from_another_site(self, scope: Scope, headers: Headers) -> bool:
        """A browser's request another site made: by its `Origin` (not this server's own nor an allowed one), or,
        when it sends none (a no-cors GET: an image, a script tag), by its `Sec-Fetch-Site`."""
        origin = headers.get("origin")
        if origin is not None:
            if origin in self.allowed_origins:
                return False
            if not _same_origin(origin, headers.get("host"), scope.get("scheme", "http")):
                return True
        site = headers.get("sec-fetch-site")
        return site is not None and site not in OWN_FETCH_SITES


def _is_page(scope: Scope) -> bool:
    """The page and its assets: opened from a link on any site; they do no work."""
    path = scope.get("path", "")
    return path == "/" or path.startswith("/static/")


def _same_origin(origin: str, host: Optional[str], scheme: str) -> bool:
    """Does `origin` (`http://localhost:6150`; `null` from a sandbox or a file) name this server as `host` does?"""
    if not host:
        return False
    scheme = {"ws": "http", "wss": "https"}.get(scheme, scheme)  # a WebSocket's Origin is its page's
    default = 443 if scheme == "https" else 80
    try:
        theirs = urlsplit(origin)
        ours = urlsplit(f"//{host.strip()}")
        return (theirs.scheme == scheme and theirs.hostname is not None and theirs.hostname == ours.hostname
                and (theirs.port or default) == (ours.port or default))
    except ValueError:  # a port that is no number, or out of range
        return False


def _with_security_headers(headers: Iterable[Tuple[bytes, bytes]], set_cookie: Optional[bytes]) -> List[Tuple[bytes, bytes]]:
    out = list(headers)
    present = {name.lower() for name, _ in out}
    out += [(name, value) for name, value in SECURITY_HEADERS if name not in present]
    if set_cookie is not None:
        out.append((b"set-cookie", set_cookie))
    return out


def _offered_token(scope: Scope, headers: Headers) -> Tuple[Optional[str], bool]:
    """The token the request carries and whether it came in the query string: header, then query, then cookie."""
    auth = headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()[:MAX_TOKEN_CHARS], False
    query = scope.get("query_string", b"")
    if b"token=" in query:
        for name, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
            if name == QUERY_PARAM:
                return value[:MAX_TOKEN_CHARS], True
    cookies = cookie_parser(headers.get("cookie", ""))
    port = (scope.get("server") or (None, None))[1]
    cookie = cookies.get(cookie_name(port))
    if cookie:
        return cookie[:MAX_TOKEN_CHARS], False
    return None, False


def _loopback_host_header(host: Optional[str]) -> bool:
    if not host:
        return True  # HTTP/1.0 without Host: nothing a browser sends
    host = host.strip()
    if host.startswith("["):
        name = host[1 : host.find("]")] if "]" in host else host
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return is_loopback_host(name)


async def _refuse(scope: Scope, send: Send, status: int, reason: str) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    path = scope.get("path", "")
    accept = Headers(scope=scope).get("accept", "")
    if path.startswith("/api/") or path == "/metrics" or "application/json" in accept:
        body, ctype = json.dumps({"detail": f"mstail: {reason}"}).encode(), b"application/json"
    else:
        body, ctype = f"mstail: {reason}\n".encode(), b"text/plain; charset=utf-8"
    headers = [(b"content-type", ctype), (b"content-length", str(len(body)).encode()), (b"cache-control", b"no-store")]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="mstail"'))
    await send({"type": "http.response.start", "status": status, "headers": _with_security_headers(headers, None)})
    await send({"type": "http.response.body", "body": body})
