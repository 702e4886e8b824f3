"""Records -> people: the FastAPI app (HTTP API, SSE stream) and the static page with vendored ECharts."""

from .app import create_app

__all__ = ["create_app"]
