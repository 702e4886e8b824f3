"""Alert webhooks: POST alert changes to chat/ops endpoints, never stalling the tailing loop.

`Webhooks.submit(alert)` is called from the pass loop and only appends to a bounded queue per target (when
full, the oldest waiting alert is dropped and counted). One asyncio task per target sends with `httpx`:
a timeout per attempt, retries with exponential backoff on connection errors, timeouts and 5xx/429 (not on
other 4xx), then the alert is counted as failed and the next one is sent. A hanging or failing receiver
delays only its own queue.

Targets: `--webhook URL` (generic JSON, or the format guessed from the host: open.feishu.cn /
open.larksuite.com -> feishu, oapi.dingtalk.com -> dingtalk, qyapi.weixin.qq.com -> wecom, hooks.slack.com ->
slack) or `--webhook FORMAT=URL` with FORMAT one of generic, feishu, dingtalk, wecom, slack.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Optional, Sequence
from urllib.parse import urlsplit

from mstail.parsers.record import jsonable

log = logging.getLogger("mstail.webhooks")

FORMATS = ("generic", "feishu", "dingtalk", "wecom", "slack")
_HOSTS = {
    "open.feishu.cn": "feishu", "open.larksuite.com": "feishu", "oapi.dingtalk.com": "dingtalk",
    "qyapi.weixin.qq.com": "wecom", "hooks.slack.com": "slack",
}


class WebhookError(ValueError):
    """A `--webhook` value that cannot be used."""


@dataclass
class Target:
    url: str
    format: str = "generic"

    @property
    def shown(self) -> str:
        """The URL without path and query, which often hold the robot's secret token (logs, /healthz)."""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}/..."


def parse_target(value: str) -> Target:
    """`URL` or `FORMAT=URL` -> Target; raises WebhookError with a one-line reason."""
    fmt: Optional[str] = None
    url = value.strip()
    head, sep, rest = url.partition("=")
    if sep and head in FORMATS:
        fmt, url = head, rest.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise WebhookError(f"--webhook {value!r}: needs an http:// or https:// URL, optionally as FORMAT=URL "
                           f"(FORMAT: {', '.join(FORMATS)})")
    if fmt is None:
        fmt = _HOSTS.get((parts.hostname or "").lower(), "generic")
    return Target(url, fmt)


def text_of(alert: Dict[str, Any]) -> str:
    state = "RESOLVED" if alert.get("state") == "resolved" else str(alert.get("severity", "alert")).upper()
    step = f" step {alert['step']}" if alert.get("step") is not None else ""
    count = f" (x{alert['count']})" if alert.get("count", 1) > 1 else ""
    return f"[mstail {state}] {alert.get('rule')} on {alert.get('source')}{step}: {alert.get('message')}{count}"


def payload(fmt: str, alert: Dict[str, Any]) -> Dict[str, Any]:
    """The JSON body for one alert change in the receiver's format."""
    text = text_of(alert)
    if fmt == "feishu":
        return {"msg_type": "text", "content": {"text": text}}
    if fmt in ("dingtalk", "wecom"):
        return {"msgtype": "text", "text": {"content": text}}
    if fmt == "slack":
        return {"text": text}
    keep = ("id", "rule", "source", "step", "severity", "state", "message", "first_seen", "last_seen", "count", "seq")
    return {"text": text, "alert": jsonable({k: alert[k] for k in keep if k in alert})}


@dataclass
class _Queue:
    target: Target
    items: Deque[Dict[str, Any]] = field(default_factory=deque)
    wake: Optional[asyncio.Event] = None
    stats: Dict[str, int] = field(default_factory=lambda: {"sent": 0, "failed": 0, "dropped": 0, "retries": 0})


class Webhooks:
    """Senders for `targets`, started with `start()` inside the event loop and ended with `stop()`.

    Args:
        targets: where to send (`parse_target` makes them from `--webhook` values).
        timeout_s: per attempt (connect + read); default 5 s.
        retries: extra attempts after the first; default 3.
        backoff_s: first wait before a retry, doubled each time; default 0.5 s.
        max_queue: alerts waiting per target; the oldest is dropped beyond it; default 100.
    """

    def __init__(self, targets: Sequence[Target], timeout_s: float = 5.0, retries: int = 3, backoff_s: float = 0.5,
                 max_queue: int = 100) -> None:
        self.queues = [_Queue(target) for target in targets]
        self.timeout_s, self.retries, self.backoff_s, self.max_queue = timeout_s, retries, backoff_s, max_queue
        self._tasks: List[asyncio.Task] = []
        self._client: Any = None

    def stats(self) -> List[Dict[str, Any]]:
        return [{"target": q.target.shown, "format": q.target.format, "queued": len(q.items), **q.stats} for q in self.queues]

    def submit(self, alert: Dict[str, Any]) -> None:
        """Queue one alert change for every target (non-blocking; the pass loop calls this)."""
        for queue in self.queues:
            if len(queue.items) >= self.max_queue:
                queue.items.popleft()
                queue.stats["dropped"] += 1
            queue.items.append(dict(alert))
            if queue.wake is not None:
                queue.wake.set()

    def start(self) -> None:
        if not self.queues:
            return
        import httpx  # only when there are webhooks

        self._client = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s), trust_env=False)
        for queue in self.queues:
            queue.wake = asyncio.Event()
            if queue.items:
                queue.wake.set()
            self._tasks.append(asyncio.create_task(self._run(queue)))

    async def stop(self) -> None:
        """Cancel the senders at once (an alert still queued at exit is not sent)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if self._client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._client.aclose(), 1.0)
            self._client = None

    async def _run(self, queue: _Queue) -> None:
        assert queue.wake is not None
        while True:
            await queue.wake.wait()
            queue.wake.clear()
            while queue.items:
                alert = queue.items.popleft()
                ok = await self._send(queue, alert)
                queue.stats["sent" if ok else "failed"] += 1

    async def _send(self, queue: _Queue, alert: Dict[str, Any]) -> bool:
        body = payload(queue.target.format, alert)
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            if attempt:
                queue.stats["retries"] += 1
                await asyncio.sleep(delay)
                delay *= 2
            try:
                response = await self._client.post(queue.target.url, json=body)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - timeouts, refused connections, protocol errors: retry
                log.warning("webhook %s: %s (attempt %d)", queue.target.shown, type(exc).__name__, attempt + 1)
                continue
            if response.status_code < 300:
                return True
            log.warning("webhook %s: HTTP %d (attempt %d)", queue.target.shown, response.status_code, attempt + 1)
            if response.status_code < 500 and response.status_code != 429:
                return False
        return False

