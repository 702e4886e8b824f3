"""A minimal, bounded Server-Sent Events reader for tests (httpx streaming against a real server)."""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import httpx


class SSEMessage(dict):
    @property
    def data(self) -> Any:
        return json.loads(self["data"]) if self.get("data") else None


def messages(url: str, headers: Optional[Dict[str, str]] = None, timeout_s: float = 10.0) -> Iterator[SSEMessage]:
    """Yield parsed messages until the caller stops or `timeout_s` passes (then StopIteration)."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=httpx.Timeout(timeout_s, read=2.0)) as client:
        with client.stream("GET", url, headers=headers or {}) as response:
            assert response.status_code == 200, response.status_code
            assert response.headers["content-type"].startswith("text/event-stream")
            current = SSEMessage()
            lines = response.iter_lines()
            while time.monotonic() < deadline:
                try:
                    line = next(lines)
                except (StopIteration, httpx.ReadTimeout):
                    return
                if line == "":
                    if current:
                        yield current
                    current = SSEMessage()
                    continue
                field, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if field == "data" and "data" in current:
                    current["data"] += "\n" + value
                elif field:
                    current[field] = value
                else:
                    current.setdefault("comments", []).append(value)


def collect(url: str, until: Callable[[List[SSEMessage]], bool], headers: Optional[Dict[str, str]] = None, timeout_s: float = 15.0) -> List[SSEMessage]:
    got: List[SSEMessage] = []
    for message in messages(url, headers, timeout_s):
        got.append(message)
        if until(got):
            break
    return got


def stream_seqs(got: List[SSEMessage]) -> List[int]:
    """Every seq delivered (records, events, alerts and amends), in arrival order."""
    seqs: List[int] = []
    for message in got:
        if message.get("event") == "records":
            seqs += [r["seq"] for r in message.data]
        elif message.get("event") in ("event", "alert", "amend"):
            seqs.append(message.data["seq"])
    return seqs
