"""The server's connection limits: no client can take all file descriptors, hold a socket forever or flood stderr.

uvicorn alone has no cap on open connections and no deadline for a request that never completes:
`limit_concurrency` only answers 503 to a *request* once its open connections (idle ones included) or tasks
reach the limit - it closes nothing, so 1,100 idle sockets still take 1,100 descriptors and turn every real
request into a 503 - and `timeout_keep_alive` is armed only after a response, so a socket that never sends a
byte, or sends half a request line, stays open for good. `guarded_protocol(limits)` is uvicorn's h11 protocol
with both:

- at most `Limits.max_connections` open connections: one more closes the connection that has waited longest
  for a request (idle keep-alive, silent since connecting, or a request still incomplete); when every
  connection is busy serving a request, the newcomer gets a 503 with a JSON reason and is closed.
- a request line and headers must be complete within `Limits.header_timeout_s` of connecting or of the previous
  response, or the connection is closed: a deadline, not an idle timer, so a byte a second does not keep it.

`raise_fd_limit()` raises the soft RLIMIT_NOFILE to the hard limit and `connection_cap()` keeps the cap below it,
with room for the accept burst, the logs, the database and the webhooks. What still fails is said once a
minute with a count (`OncePerInterval`): asyncio's failed accept() (`AcceptErrorLog`, a loop exception handler:
CPython's accept loop logs a traceback per attempt, up to `backlog` per wake-up) and uvicorn's warnings about
malformed requests (`QuietClientWarnings`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Optional, cast

log = logging.getLogger("mstail.connections")

#: The listen queue, and so the most connections asyncio accepts in one wake-up before a protocol can evict.
BACKLOG = 128
#: Descriptors kept free under the limit: an accept burst (BACKLOG) plus logs, database, watches, webhooks.
RESERVED_FDS = BACKLOG + 128
_BUSY_BODY = b'{"detail": "mstail: every connection is busy serving a request (--max-connections); retry later"}'
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
    b"retry-after: 5\r\ncache-control: no-store\r\nconnection: close\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)


@dataclass
class Limits:
    """The caps one server runs with, and what they did (for /healthz)."""

    max_connections: int
    header_timeout_s: float
    evicted: int = 0
    timed_out: int = 0
    refused: int = 0

    def stats(self, open_connections: int) -> Dict[str, int]:
        return {"open": open_connections, "limit": self.max_connections, "evicted": self.evicted,
                "timed_out": self.timed_out, "refused": self.refused}


def guarded_protocol(limits: Limits) -> type:
    """uvicorn's h11 protocol class with the connection cap and the request deadline of `limits` (uvicorn.Config's
    `http=`). Its connections are uvicorn's `server_state.connections`, where graceful shutdown finds them too."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.waiting_since = 0.0
            self._deadline: Optional[asyncio.TimerHandle] = None

        @property
        def busy(self) -> bool:
            """A request is being served (its headers are in, the response is not complete)."""
            return self.cycle is not None and not self.cycle.response_complete

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._await_request()
            if len(self.connections) > limits.max_connections:
                self._make_room()

        def connection_lost(self, exc: Optional[Exception]) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._await_request()

        def _await_request(self) -> None:
            self.waiting_since = self.loop.time()
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(limits.header_timeout_s, self._expire)

        def _expire(self) -> None:
            self._deadline = None
            if not self.busy and not self.transport.is_closing():  # a busy one is re-armed by its response
                limits.timed_out += 1
                self.transport.close()

        def _make_room(self) -> None:
            live, oldest = 0, None
            for conn in cast(Iterable[GuardedH11Protocol], self.connections):  # http= is this class, ws="none"
                if conn.transport.is_closing():  # closed, not yet lost: it no longer counts
                    continue
                live += 1
                if conn is not self and not conn.busy and (oldest is None or conn.waiting_since < oldest.waiting_since):
                    oldest = conn
            if live <= limits.max_connections:
                return
            if oldest is not None:
                limits.evicted += 1
                oldest.transport.close()
            else:
                limits.refused += 1
                self.transport.write(BUSY_RESPONSE)
                self.transport.close()

    return GuardedH11Protocol


def raise_fd_limit() -> Optional[int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (soft is often 1,024 under a far higher hard limit).
    Returns the soft limit now in force; None where there is no such limit (no `resource` module) or it is unlimited."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        try:  # an unlimited hard limit is not a valid soft one everywhere (macOS): then stay where we are
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def connection_cap(wanted: int, fd_limit: Optional[int]) -> int:
    """`wanted` connections, or fewer so that they, an accept burst and mstail's own files fit under `fd_limit`."""
    if fd_limit is None:
        return wanted
    return max(1, min(wanted, max(fd_limit - RESERVED_FDS, fd_limit // 4)))


class OncePerInterval:
    """Lets one message per `interval_s` through for each key and counts the rest."""

    def __init__(self, interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s, self.clock = interval_s, clock
        self._last: Dict[str, float] = {}
        self._held: Dict[str, int] = {}

    def allow(self, key: str) -> Optional[int]:
        """None: stay quiet (counted). Else say it now; the number is how many were held back since the last time."""
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._held.pop(key, 0)


class AcceptErrorLog:
    """An event loop exception handler: a failed accept() (EMFILE, ENFILE, ENOBUFS, ENOMEM: asyncio retries after
    a second) is one line a minute with a count; anything else goes to `previous` (None: the loop's default)."""

    MESSAGE = "socket.accept() out of system resource"

    def __init__(self, previous: Optional[Callable[..., Any]] = None, limiter: Optional[OncePerInterval] = None) -> None:
        self.previous = previous
        self.limiter = limiter or OncePerInterval()

    def __call__(self, loop: asyncio.AbstractEventLoop, context: Dict[str, Any]) -> None:
        if context.get("message") != self.MESSAGE:
            if self.previous is not None:
                self.previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        held = self.limiter.allow(self.MESSAGE)
        if held is not None:
            more = f" ({held} more since the last message)" if held else ""
            log.warning("cannot accept connections: %s; asyncio retries every second; said at most once a minute%s",
                        context.get("exception") or "out of system resource", more)


class QuietClientWarnings(logging.Filter):
    """uvicorn warns once per malformed or upgrade request, so any client could write stderr full: one line a
    minute per message, the rest counted and said with the next one."""

    MESSAGES = ("Invalid HTTP request received.", "Unsupported upgrade request.")

    def __init__(self, limiter: Optional[OncePerInterval] = None) -> None:
        super().__init__()
        self.limiter = limiter or OncePerInterval()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message not in self.MESSAGES and not message.startswith("No supported WebSocket library"):
            return True
        held = self.limiter.allow(message[:40])
        if held is None:
            return False
        if held:
            record.msg, record.args = f"{message} ({held} more since the last one; said at most once a minute)", ()
        return True


def install_quiet_logs(loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
    """`AcceptErrorLog` on `loop` and `QuietClientWarnings` on uvicorn's error log; returns the undo."""
    previous = loop.get_exception_handler()
    loop.set_exception_handler(AcceptErrorLog(previous))
    quiet = QuietClientWarnings()
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addFilter(quiet)

    def undo() -> None:
        loop.set_exception_handler(previous)
        uvicorn_log.removeFilter(quiet)

    return undo
