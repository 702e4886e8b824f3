"""The composition root: tailer + store + hub + web app under one uvicorn server, in one event loop.

This is the only module of `tailer` that imports `web` (DESIGN.md's dependency direction).
"""

from __future__ import annotations

import asyncio
import errno
import socket
import webbrowser
from typing import Callable, Optional, Sequence

import uvicorn

from mstail.parsers import Format

from .config import Config
from .hub import Hub
from .tailer import Tailer
from .db import StateDB, open_state
from .store import Store
from .webhooks import Webhooks


class ServeError(Exception):
    """A user-facing reason serving cannot start (port in use, bad address)."""


def bind(host: str, port: int) -> socket.socket:
    """Bind the listening socket before anything else, so a busy port is one clear error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ServeError(
                f"port {port} on {host} is in use (another mstail?); pick another with --port N, or --port 0 for any free port"
            ) from None
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


async def serve(
    config: Config,
    formats: Sequence[Format],
    sock: socket.socket,
    on_started: Optional[Callable[[], None]] = None,
    state: Optional[StateDB] = None,
) -> None:
    """Tail and serve until Ctrl-C / SIGTERM; exits within `config.shutdown_timeout_s` + a little.
    `state` is the history database (default: `open_state(config, formats)`)."""
    from mstail.web import create_app  # the composition root is the one place tailer may import web
    from mstail.web.sse import quiet_dropped_clients

    store, hub = Store(state if state is not None else open_state(config, formats)), Hub()
    tailer = Tailer(config, formats, store, hub)
    tailer.resume(store.load(on_item=tailer.alerts.replay if tailer.alerts is not None else None))
    app = create_app(
        store,
        hub,
        health=lambda: {"passes": tailer.passes, **_alert_health(tailer, webhooks)},
        token=config.token,
        check_host=config.token is None,  # loopback without a token: only loopback Host headers (DNS rebinding)
        cors_origins=config.cors_origins,
        send_timeout_s=config.send_timeout_s,
        alerts=tailer.alerts,
    )
    webhooks = Webhooks(config.webhooks)
    tailer.alert_listeners.append(webhooks.submit)
    quiet_dropped_clients()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=config.shutdown_timeout_s,
        )
    )
    stop = asyncio.Event()
    webhooks.start()
    tailing = asyncio.create_task(tailer.run(stop))
    announce = asyncio.create_task(_when_started(server, sock, config, on_started))
    try:
        await server.serve(sockets=[sock])
    finally:
        stop.set()
        announce.cancel()
        await tailing
        await webhooks.stop()
        store.close()


def _alert_health(tailer: Tailer, webhooks: Webhooks) -> dict:
    active = tailer.alerts.table()["count"] if tailer.alerts is not None else None
    return {"alerts_active": active, "webhooks": webhooks.stats()}


async def _when_started(server: uvicorn.Server, sock: socket.socket, config: Config, on_started: Optional[Callable[[], None]]) -> None:
    while not server.started:
        await asyncio.sleep(0.02)
    if on_started is not None:
        on_started()
    if config.open_browser:
        await asyncio.to_thread(webbrowser.open, url_of(sock) + (f"/?token={config.token}" if config.token else ""))
