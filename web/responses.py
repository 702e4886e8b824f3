"""JSON responses that carry NaN/Inf as "NaN"/"Infinity" strings instead of failing (`mstail.parsers.record`)."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from mstail.parsers.record import dumps


class RecordJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return dumps(content).encode("utf-8")
