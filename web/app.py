"""`create_app(store, hub)` -> the FastAPI app: page, static assets, JSON API and SSE stream."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from tailer.hub import Hub
from tailer.store import Store

from . import api, sse
from .responses import RecordJSONResponse

STATIC_DIR = Path(str(resources.files("web") / "static"))


def create_app(store: Store, hub: Hub, health: Optional[Callable[[], Dict[str, Any]]] = None) -> FastAPI:
    """The web face of one sidecar.

    Args:
        store: the history the API reads (never written here).
        hub: where the SSE stream subscribes for live batches.
        health: extra facts for `/healthz` (e.g. the tailer's pass count); default none.
    """
    app = FastAPI(title="mstail", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.store = store
    app.state.hub = hub
    app.include_router(api.router)
    app.include_router(sse.router)
    # Every asset is served from the package (offline clusters have no CDN).
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/healthz", response_class=RecordJSONResponse)
    def healthz() -> dict:
        facts = {"status": "ok", "sources": len(store.sources), "last_seq": store.last_seq, "clients": hub.subscriber_count}
        facts.update(health() if health else {})
        return facts

    return app
