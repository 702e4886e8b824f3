"""The composition root: tailer + store + hub + web app under one uvicorn server, in one event loop.

This is the only module of `tailer` that imports `web` (ARCHITECTURE.md, Layout: the dependency direction).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import importlib
import logging
import signal
import socket
import threading
import time
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence

from mstail.parsers import Format

from mstail.tailer.outbound.alertmanager import Alertmanager
from mstail.tailer.alerts.engine import AlertEngine
from mstail.tailer.config import Config
from mstail.tailer.app.connections import BACKLOG, Limits, connection_cap, guarded_protocol, install_quiet_logs, raise_fd_limit
from mstail.tailer.live.hub import Hub
from mstail.tailer.app.pageurl import open_page, page_url
from mstail.tailer.live.sidecar import Tailer
from mstail.tailer.history.db import StateDB, open_state
from mstail.tailer.outbound.remotewrite import RemoteWrite
from mstail.tailer.history.store import Store
from mstail.tailer.outbound.webhooks import Webhooks

if TYPE_CHECKING:
    import uvicorn

    from mstail.web.sse import StreamLimit


log = logging.getLogger("mstail.serve")


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
    sock.listen(BACKLOG)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    """The URL a browser here opens (loopback when bound to all addresses: `pageurl.page_url`)."""
    return page_url(*sock.getsockname()[:2])


async def serve(
    config: Config,
    formats: Sequence[Format],
    sock: socket.socket,
    on_started: Optional[Callable[[], None]] = None,
    state: Optional[StateDB] = None,
) -> Optional[socket.socket]:
    """Tail and serve until Ctrl-C / SIGTERM; exits within `config.shutdown_timeout_s` + a little.
    `state` is the history database (default: `open_state(config, formats)`). Returns None, or a copy of `sock`
    to serve on again over a fresh state when the state failed its integrity check after its history was served
    (`_restore_then_tail`: everything read from it is dropped; the pages' streams, cut, reconnect, and reload where
    they were beyond the new history)."""
    store, hub = Store(state if state is not None else open_state(config, formats)), Hub()
    store.db.write_behind(asyncio.get_running_loop())  # commits in a thread of their own: never the loop's wait
    imports = WebImports() if store.db.reopened else None  # a restart: the web's imports beside the history's load
    tailer = Tailer(config, formats, store, hub)
    if store.db.checking:  # (a file that exists: a new one is sound)
        log.info("checking the state %s whole (the machine restarted, or the file changed, since mstail last wrote "
                 "it): its history is served meanwhile, new lines are read once it passes", store.db.path)
    tailer.resume(store.load(beside_check=True))
    store.db.start_check()  # after the load's reads: the check's read of the whole file would have queued them
    if imports is not None:
        imports.wait()  # before `read_ahead`, which may fork
    tailer.read_ahead()  # a big history's catch-up child starts now, not after the server's imports

    import uvicorn
    from mstail.web import create_app  # the composition root is the one place tailer may import web
    from mstail.web.sse import limit_streams, quiet_dropped_clients

    limits = Limits(_connection_cap(config.max_connections), config.header_timeout_s)
    restoring: Dict[str, int] = {}  # the alert replay's progress while it runs (/healthz)
    app = create_app(
        store,
        hub,
        health=lambda: {**tailer.health(), **_alert_health(tailer, webhooks), "restoring_alerts": restoring or None,
                        "remote_write": remote.stats() if remote is not None else None,
                        "alertmanager": alertmanager.stats() if alertmanager is not None else None,
                        "state_check": STATE_CHECKING if store.db.checking else None,
                        "connections": limits.stats(len(server.server_state.connections)), "streams": streams.stats()},
        token=config.token,
        check_host=config.token is None,  # loopback without a token: only loopback Host headers (DNS rebinding)
        cors_origins=config.cors_origins,
        send_timeout_s=config.send_timeout_s,
        alerts=tailer.alerts,
    )
    streams: StreamLimit = limit_streams(app, config.max_streams)
    webhooks: Webhooks = Webhooks(config.webhooks, timeout_s=config.webhook_timeout_s)
    tailer.alert_listeners.append(webhooks.submit)
    remote: Optional[RemoteWrite] = RemoteWrite(config.remote_write, store, config.node) if config.remote_write else None
    alertmanager: Optional[Alertmanager] = _alertmanager(config, tailer, store, sock)
    quiet_dropped_clients()
    server: uvicorn.Server = uvicorn.Server(
        uvicorn.Config(
            app,
            http=guarded_protocol(limits),  # h11 with a connection cap and a request deadline (.connections)
            ws="none",
            backlog=BACKLOG,
            timeout_keep_alive=config.keep_alive_s,  # type: ignore[arg-type]  # a float works; int is only its hint
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=config.shutdown_timeout_s,  # type: ignore[arg-type]  # as above
        )
    )
    restore_logs = install_quiet_logs(asyncio.get_running_loop())
    stop = asyncio.Event()
    again: List[socket.socket] = []  # the socket to serve on again over a fresh state (the state failed its check)

    def start_over() -> None:
        again.append(sock.dup())  # before uvicorn closes `sock`: the same port, no moment without a listener
        server.should_exit = True

    webhooks.start()
    if remote is not None:
        remote.start()
    if alertmanager is not None:
        alertmanager.start()
    tailing = asyncio.create_task(_restore_then_tail(store, tailer, stop, restoring, start_over))
    warming = asyncio.create_task(store.keep_folds_warm(stop))  # the page's first folds ready before it asks
    freezing = asyncio.create_task(_freeze_when_grown(HeapFreezer(lambda: (len(store.sources), store.series_count)),
                                                      stop))
    announce = asyncio.create_task(_when_started(server, sock, config, on_started))
    terminate = _sigterm_as_sigint()

    async def shut_down() -> None:
        stop.set()
        announce.cancel()
        await tailing
        await warming
        await freezing
        await webhooks.stop()
        if remote is not None:
            await remote.stop()
        if alertmanager is not None:
            await alertmanager.stop()
        gc.unfreeze()  # exit finalizes what is left as it would have unfrozen
        if again:
            store.db.close()  # the fresh state, empty: nothing of the history read from the damaged one goes into it
        else:
            store.close()  # the last commit and the state's clean close (its mark: no integrity check next time)

    try:
        await server.serve(sockets=[sock])
    finally:
        # uvicorn raises the Ctrl-C it caught again once it has stopped, and asyncio.run answers it by cancelling
        # this task: the shutdown, awaited without a shield, was cut at its first await (the last pass neither waited
        # for nor committed, the state left for the garbage collector to close). A second Ctrl-C still ends at once.
        ending = asyncio.ensure_future(shut_down())
        try:
            await asyncio.shield(ending)
        except asyncio.CancelledError:
            await ending
            raise
        finally:
            restore_logs()
            terminate()
    return again[0] if again else None


class WebImports:
    """The web part's modules (uvicorn, FastAPI and pydantic, the app's routes: about 0.3 s of CPU, more from a cold
    disk) imported in a thread of its own while a restart loads its history: the state's integrity check and SQLite's
    reads leave the GIL meanwhile, which the imports take. `wait` before anything forks (a catch-up child forked
    while another thread imports could inherit a module's import lock, held for good, and hang on it). An import
    that fails here is left to `serve`'s own, which raises it where it always did."""

    MODULES = ("uvicorn", "mstail.web.app", "mstail.web.sse")

    def __init__(self) -> None:
        self._thread = threading.Thread(target=self._import, name="mstail-web-imports", daemon=True)
        self._thread.start()

    @classmethod
    def _import(cls) -> None:
        with contextlib.suppress(Exception):
            for name in cls.MODULES:
                importlib.import_module(name)

    def wait(self) -> None:
        """Until the imports are done (or failed)."""
        self._thread.join()


#: how often the server looks whether its long-lived state grew (`HeapFreezer`)
FREEZE_CHECK_S = 1.0


class HeapFreezer:
    """Keeps the garbage collector's full collections short: the objects that live as long as the server (imports,
    the app, the sources' followers, parsers, chart series and alert state) are moved out of its reach (`gc.freeze`)
    whenever they grew, so a full collection walks only what came since. Python runs one when a quarter more objects
    survived than it walked last time; with a thousand files that was every 5-10 s, 100-900 ms with the GIL held:
    every pass and stream waited (the many-files bench's p99). A frozen object that dies by its reference count is
    still freed; one in a reference cycle is not, so the freeze follows a full collection (of what is not frozen yet:
    short after the first) and happens only when the long-lived state grew (new sources or series), not with the
    steady churn of passes; at shutdown everything is unfrozen.

    Args:
        size: what measures the long-lived state (a value that changes when it grew).
    """

    def __init__(self, size: Callable[[], object]) -> None:
        self._size = size
        self._frozen: object = None  # the size at the last freeze (None: never frozen)

    def check(self) -> bool:
        """Freeze when the size changed since the last freeze (the first call always does); True when it froze."""
        size = self._size()
        if size == self._frozen:
            return False
        self._frozen = size
        gc.collect()  # no dead cycle frozen for good
        gc.freeze()
        return True


async def _freeze_when_grown(freezer: HeapFreezer, stop: asyncio.Event) -> None:
    # The first check waits its turn too: its full collection (30 ms of a restart's heap) would otherwise run before
    # the server listens, on the way to the history; nothing is gained by freezing the heap before it is built.
    while True:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), FREEZE_CHECK_S)
        if stop.is_set():
            return
        freezer.check()


REPLAY_SLICE_S = 0.002  # the alert replay's turn on the event loop: requests wait at most about this per step
_SAY_REPLAY = 100_000  # stored items from which the alert replay is said on stderr


#: /healthz's `state_check` (and the page's banner) while the state's integrity check runs
STATE_CHECKING = ("the history's file is being checked (it is not as mstail last left it in this boot of the machine): "
                  "shown meanwhile, new lines are read once it passes")


async def _restore_then_tail(store: Store, tailer: Tailer, stop: asyncio.Event, progress: Dict[str, int],
                             start_over: Callable[[], None] = lambda: None) -> None:
    """Wait for the state's integrity check when the history was loaded beside it (`Store.load`), then give the
    alert rules back their state (a restart with a state), then tail. A state that fails the check is set aside
    (said) and `start_over` called: nothing read from it is kept, nothing is written before the check passed. The
    alert state saved with the history is taken back and only the items stored after it are replayed; a state
    without one (an older mstail's, or rules changed since) is replayed whole. A replay feeds the engine a batch at
    a time, so the server answers meanwhile (/healthz shows `restoring_alerts`); tailing waits for it because the
    rules must see the old records before the new ones. From then on the rules' state is saved with the history."""
    if store.db.checking:
        tailer.running = True  # starting: not "tailing has stopped" on /healthz while the check runs
        checked = asyncio.ensure_future(asyncio.to_thread(store.db.wait_for_check))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait([checked, stopping], return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if stop.is_set() or store.db.verify() is not None:  # not checked: `close` cancels it, and marks nothing
            if not stop.is_set():
                start_over()
                await stop.wait()
            await tailer.run(stop)  # returns at once, the catch-up children stopped
            return
    alerts = tailer.alerts
    if alerts is not None and store.last_seq:
        tailer.running = True  # starting: not "tailing has stopped" on /healthz while the replay runs
        after = _restored_alerts(store, alerts)
        progress.update(items=0, of=store.last_seq - after)
        if store.last_seq - after >= _SAY_REPLAY:
            log.info("restoring the alert rules' state from %d stored items; new lines are read after it",
                     store.last_seq - after)
        turn_ends = time.monotonic() + REPLAY_SLICE_S
        for batch in store.db.all_items(after, batch=200):
            for item in batch:
                alerts.replay(item)
            progress["items"] += len(batch)
            if time.monotonic() >= turn_ends:
                await asyncio.sleep(0)
                turn_ends = time.monotonic() + REPLAY_SLICE_S
                if stop.is_set():
                    await tailer.run(stop)  # returns at once; the rules' state is incomplete, so not saved
                    return
        progress.clear()
    if alerts is not None:
        store.save_alerts(alerts.snapshot)
    await tailer.run(stop)  # returns at once when stopped meanwhile


def _restored_alerts(store: Store, alerts: AlertEngine) -> int:
    """Take back the alert rules' state saved with the history; returns the seq it is at (0: none usable, said)."""
    saved = store.db.saved_alerts()
    if saved is None:
        return 0
    seq = saved.get("seq") if isinstance(saved, dict) else None
    problem = (alerts.restore(saved) if isinstance(seq, int) and 0 <= seq <= store.last_seq
               else "it does not fit the stored items")
    if problem is None:
        return seq  # type: ignore[return-value]  # an int: restored only then
    log.warning("state %s: the alert rules' saved state is not usable (%s): replaying the %d stored items",
                store.db.path, problem, store.last_seq)
    return 0


def _sigterm_as_sigint() -> Callable[[], object]:
    """SIGTERM takes Ctrl-C's path: uvicorn closes the server, then re-raises the signal it caught with the
    handler it found, which for SIGTERM would end the process at once (exit 143) before the tailer's last pass
    is committed and the state closed. With Ctrl-C's handler the cleanup above runs and mstail exits 0.
    Returns what puts the old handler back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.signal(signal.SIGTERM, signal.getsignal(signal.SIGINT))
    return lambda: signal.signal(signal.SIGTERM, previous)


def _connection_cap(wanted: int) -> int:
    """Raise the soft open-file limit to the hard one, and fit `wanted` connections under it (said when lowered)."""
    fd_limit = raise_fd_limit()
    cap = connection_cap(wanted, fd_limit)
    if cap < wanted:
        log.warning("at most %d connections at once (--max-connections %d): the open-file limit is %s", cap, wanted, fd_limit)
    return cap


def _alertmanager(config: Config, tailer: Tailer, store: Store, sock: socket.socket) -> Optional[Alertmanager]:
    """The Alertmanager poster, listening to the alert changes (None without `--alertmanager` or alerts)."""
    engine = tailer.alerts
    if not config.alertmanager or engine is None:
        return None
    page = url_of(sock)
    if sock.getsockname()[0] in ("0.0.0.0", "::"):  # every address: the one others reach it by is the host's name
        page = f"http://{socket.gethostname()}:{sock.getsockname()[1]}"
    poster = Alertmanager(config.alertmanager, lambda: engine.table()["active"],
                          lambda source: getattr(store.sources.get(source), "run", None), page + "/",
                          node=config.node, repost_s=config.alertmanager_repost_s)
    tailer.alert_listeners.append(poster.submit)
    return poster


def _alert_health(tailer: Tailer, webhooks: Webhooks) -> dict:
    active = tailer.alerts.table()["count"] if tailer.alerts is not None else None
    return {"alerts_active": active, "webhooks": webhooks.stats()}


async def _when_started(server: uvicorn.Server, sock: socket.socket, config: Config, on_started: Optional[Callable[[], None]]) -> None:
    while not server.started:
        await asyncio.sleep(0.02)
    if on_started is not None:
        on_started()
    if config.open_browser:
        await asyncio.to_thread(open_page, url_of(sock) + (f"/?token={config.token}" if config.token else ""))
