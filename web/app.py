"""`create_app(store, hub)` -> the FastAPI app: page, static assets, JSON API and SSE stream."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Sequence

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from mstail import __version__
from mstail.tailer.config import Config
from mstail.tailer.live.hub import Hub
from mstail.tailer.history.store import Store

from . import api, metrics, sse
from .limits import ClientBound
from .responses import RecordJSONResponse
from .security import SecurityMiddleware

if TYPE_CHECKING:
    from mstail.tailer.alerts.engine import AlertEngine

STATIC_DIR = Path(str(resources.files("mstail.web") / "static"))
#: The record's definition (mstail.parsers.record), which the page reads beside its static files.
RECORD_SCHEMA = Path(str(resources.files("mstail.parsers") / "record.schema.json"))


def create_app(
    store: Store,
    hub: Hub,
    health: Optional[Callable[[], Dict[str, Any]]] = None,
    token: Optional[str] = None,
    check_host: bool = False,
    cors_origins: Sequence[str] = (),
    send_timeout_s: float = Config.send_timeout_s,
    alerts: Optional["AlertEngine"] = None,
) -> FastAPI:
    """The web face of one sidecar.

    Args:
        store: the history the API reads (never written here).
        hub: where the SSE stream subscribes for live batches.
        health: extra facts for `/healthz` (the tailer's pass count, ...); a non-empty `problems` list among
            them makes it answer 503; default none.
        token: when set, every request must carry it (web/security.py); default none (loopback use).
        check_host: refuse requests whose Host header is not a loopback name (DNS rebinding); default off.
        cors_origins: origins allowed to read the API cross-origin (GET only); default none: CORS closed.
        send_timeout_s: an SSE client that accepts no data for this long is dropped; default `Config.send_timeout_s`.
        alerts: the alert engine `/api/alerts` and `/metrics` read; default none (alerts off).
    """
    app = FastAPI(title="mstail", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.store = store
    app.state.hub = hub
    app.state.send_timeout_s = send_timeout_s
    app.state.alerts = alerts
    app.include_router(api.router)
    app.include_router(sse.router)
    app.include_router(metrics.router)
    app.state.metrics_collector = metrics.MstailCollector(
        store, hub, alerts=alerts, facts=lambda: health() if health else {}, version=__version__)
    # Every asset is served from the package (offline clusters have no CDN). The schema's route comes before the
    # mount: one after it would never be reached.
    @app.get("/static/record.schema.json", include_in_schema=False)
    def record_schema() -> FileResponse:
        return FileResponse(RECORD_SCHEMA)

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    # Middleware added last runs first: the security checks refuse a request before the bound counts it.
    app.add_middleware(ClientBound)
    app.add_middleware(SecurityMiddleware, token=token, check_host=check_host, allowed_origins=cors_origins)
    if cors_origins:  # outside the token check: a CORS preflight carries no credentials
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET"],
                           allow_headers=["Authorization", "Last-Event-ID"])

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/healthz", response_class=RecordJSONResponse, response_model=None)
    async def healthz() -> RecordJSONResponse:  # async: it reads the store and the alert engine (event loop only)
        """200 and `"status": "ok"` while all is well; 503, `"status": "failing"` and the `problems` (tailing
        stopped or stalled, the history not written) otherwise."""
        facts: Dict[str, Any] = {"status": "ok", "sources": len(store.sources), "last_seq": store.last_seq,
                                 "clients": hub.subscriber_count, "problems": []}
        facts.update(health() if health else {})
        if facts["problems"]:
            facts["status"] = "failing"
        return RecordJSONResponse(facts, status_code=503 if facts["problems"] else 200)

    return app
