"""No chart query runs on the event loop: a real uvicorn server (in-process, loopback, ephemeral port) whose query
is held in the middle of its maths (deterministically: the maths waits for an Event) still answers `/healthz`;
released, the query answers as it would have. Its maths ran on the loop before, and the held query then held the
whole server (each `/api/series?smooth=W` with a new W over a 1 M-point run: 1.1 s of it)."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
from typing import Any, Callable, Dict, List, Tuple

import pytest
import uvicorn

import mstail.tailer.history.store as store_module
from mstail.parsers import Item
from mstail.tailer.history.store import Store
from mstail.tailer.live.hub import Hub
from mstail.web.app import create_app

pytestmark = pytest.mark.slow

WAIT_S = 60  # bounds of the waits: only a broken server reaches them


def _store() -> Store:
    store = Store()
    for rank in range(2):
        store.add_source(f"rank_{rank}", f"/logs/rank_{rank}/info.log")
        store.add(f"rank_{rank}", [Item("record", {"step": step, "time": 1.7e9 + step, "loss": 2.0 + rank + 1 / step})
                                   for step in range(1, 3001)])
    return store


def _get(port: int, path: str) -> Tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S / 2)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


class _Server:
    """`create_app(store)` under uvicorn on a loop of its own, in a thread."""

    def __init__(self, store: Store) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(create_app(store, Hub()), log_config=None, log_level="warning",
                                                    access_log=False, lifespan="off", timeout_graceful_shutdown=5))
        self.loop: Any = None
        self.thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.server.serve(sockets=[self.sock])

    def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """`function(*args)` on the server's loop (where a Store is used), waited for."""
        async def run() -> Any:
            return function(*args)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(WAIT_S / 2)

    def __enter__(self) -> "_Server":
        self.thread.start()
        for _ in range(WAIT_S * 100):
            if self.server.started:
                return self
            threading.Event().wait(0.01)
        raise AssertionError("uvicorn did not start")

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(WAIT_S)
        self.sock.close()


def _held(original: Callable[..., Any], entered: threading.Event, release: threading.Event) -> Callable[..., Any]:
    def held(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        release.wait(WAIT_S)
        return original(*args, **kwargs)

    return held


@pytest.mark.parametrize("path, maths", [
    ("/api/series?metric=loss&smooth=0.9&points=100", "window"),  # a source's window and EMA
    ("/api/series?metric=loss&smooth=0.9&points=100&aggregate=mean&top=rank_1", "aggregate"),  # the mean's
])
def test_a_query_held_in_its_maths_leaves_healthz_answering(
        monkeypatch: pytest.MonkeyPatch, path: str, maths: str) -> None:
    store = _store()
    with _Server(store) as server:
        want = _get(server.port, path)  # the answer, unheld
        entered, release = threading.Event(), threading.Event()
        monkeypatch.setattr(store_module, maths, _held(getattr(store_module, maths), entered, release))
        answers: List[Tuple[int, Any]] = []
        query = threading.Thread(target=lambda: answers.append(_get(server.port, path)), daemon=True)
        query.start()
        try:
            assert entered.wait(WAIT_S), "the query never reached its maths"
            status, health = _get(server.port, "/healthz")  # while the query is held
            assert (status, health["status"], health["last_seq"]) == (200, "ok", 6000)
            assert not answers  # still held
        finally:
            release.set()
            query.join(WAIT_S)
        assert answers == [want] and want[0] == 200
    store.close()


def test_an_answer_holds_what_the_store_held_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Points stored while a query is held are not in its answer: its `seq` says what it holds."""
    store = _store()
    with _Server(store) as server:
        path = "/api/series?metric=loss&source=rank_0&smooth=0.6"
        want = _get(server.port, path)
        entered, release = threading.Event(), threading.Event()
        monkeypatch.setattr(store_module, "window", _held(store_module.window, entered, release))
        answers: List[Tuple[int, Dict[str, Any]]] = []
        query = threading.Thread(target=lambda: answers.append(_get(server.port, path)), daemon=True)
        query.start()
        try:
            assert entered.wait(WAIT_S)
            server.call(store.add, "rank_0", [Item("record", {"step": 3001, "time": 1.7e9, "loss": 9.0})])
        finally:
            release.set()
            query.join(WAIT_S)
        status, later = _get(server.port, path)
    assert answers == [want] and want[0] == 200 and want[1]["seq"] == 6000
    assert status == 200 and later["seq"] == 6001 and later["series"][0]["x"][-1] == 3001
    store.close()
