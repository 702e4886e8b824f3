"""Records -> people: the FastAPI app (HTTP API, SSE stream) and the static page with vendored ECharts.

`create_app` is imported when first asked for (PEP 562), not with the package: the CLI reads `mstail.web.access`
before it opens the state, and FastAPI's import (about half a second) then runs beside the state's integrity check
(`tailer.db.IntegrityCheck`) instead of before it."""

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
