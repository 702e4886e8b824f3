"""JSON responses that carry NaN/Inf as "NaN"/"Infinity" strings instead of failing (`mstail.parsers.record`)."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from mstail.parsers.record import dumps, orjson_exact


class RecordJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        # orjson when that is exact (a /api/series answer of 2,000 buckets: most of its time was the json module)
        body = orjson_exact(content)
        return body if body is not None else dumps(content).encode("utf-8")
