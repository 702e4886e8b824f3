"""Alert webhooks: POST alert changes to chat/ops endpoints, never stalling the tailing loop.

`Webhooks.submit(alert)` is called from the pass loop and only appends to a bounded queue per target (when
full, the oldest waiting alert is dropped and counted). One asyncio task per target sends with `httpx`:
one deadline per attempt for all of it (connect, send, the whole answer: a receiver dripping a byte at a time
cannot hold an alert longer), at most `MAX_ANSWER_BYTES` of the answer read (a receiver answering an endless
body costs nothing), retries with exponential backoff on connection errors, timeouts and 5xx/429 (not on
other 4xx), then the alert is counted as failed and the next one is sent. A hanging or failing receiver
delays only its own queue.

Targets: `--webhook URL` (generic JSON, or the format guessed from the host: open.feishu.cn /
open.larksuite.com -> feishu, oapi.dingtalk.com -> dingtalk, qyapi.weixin.qq.com -> wecom, hooks.slack.com ->
slack) or `--webhook FORMAT=URL` with FORMAT one of generic, feishu, dingtalk, wecom, slack. The same values
can come from a file (`--webhook-file PATH`, one a line) or an environment variable (`--webhook-env NAME`, or
$MSTAIL_WEBHOOKS), so a URL's secret token is not on the command line for `ps` to show (`read_targets`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from mstail.parsers.record import jsonable

log = logging.getLogger("mstail.webhooks")

FORMATS = ("generic", "feishu", "dingtalk", "wecom", "slack")
DEFAULT_ENV = "MSTAIL_WEBHOOKS"  # read when no --webhook-env names a variable
MAX_ANSWER_BYTES = 64 * 1024  # of a receiver's answer body; the rest is never read
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
        """The URL as logs and /healthz show it (`shown_url`)."""
        return shown_url(self.url)


def shown_url(url: str) -> str:
    """The URL without path and query (they often hold a secret token) nor user and password."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}/..."


def parse_target(value: str, where: Optional[str] = None) -> Target:
    """`URL` or `FORMAT=URL` -> Target; raises WebhookError with a one-line reason, naming `where` the value came
    from instead of the value itself when given (a file line, a variable: their URLs hold secrets)."""
    fmt: Optional[str] = None
    url = value.strip()
    head, sep, rest = url.partition("=")
    if sep and head in FORMATS:
        fmt, url = head, rest.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise WebhookError(f"{where or f'--webhook {value!r}'}: needs an http:// or https:// URL, optionally as FORMAT=URL "
                           f"(FORMAT: {', '.join(FORMATS)})")
    if fmt is None:
        fmt = _HOSTS.get((parts.hostname or "").lower(), "generic")
    return Target(url, fmt)


def read_targets(values: Sequence[str] = (), files: Sequence[str] = (), env_names: Sequence[str] = (),
                 environ: Mapping[str, str] = os.environ) -> Tuple[Target, ...]:
    """Every target, parsed once at start: the `--webhook` values, each `--webhook-file` (one `[FORMAT=]URL` a
    line; blank lines and lines starting with `#` skipped) and each `--webhook-env` variable (whitespace-separated
    values), or $MSTAIL_WEBHOOKS when no variable is named and it is not empty. A file that cannot be read or
    holds no URL, or a named variable that is unset or empty, raises WebhookError (one line, no URL in it)."""
    targets = [parse_target(value) for value in values]
    for path in files:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise WebhookError(f"--webhook-file {path}: cannot read it: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise WebhookError(f"--webhook-file {path}: not UTF-8 text") from None
        lines = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1)]
        found = [(n, line) for n, line in lines if line and not line.startswith("#")]
        if not found:
            raise WebhookError(f"--webhook-file {path}: no webhook in it (one [FORMAT=]URL a line, # comments)")
        targets += [parse_target(line, where=f"--webhook-file {path} line {n}") for n, line in found]
    names = list(env_names) or ([DEFAULT_ENV] if environ.get(DEFAULT_ENV, "").strip() else [])
    for name in names:
        items = environ.get(name, "").split()
        if not items:
            state = "is empty" if name in environ else "is not set"
            raise WebhookError(f"--webhook-env {name}: the environment variable {state} (whitespace-separated [FORMAT=]URL values)")
        targets += [parse_target(item, where=f"${name} value {n}") for n, item in enumerate(items, 1)]
    return tuple(targets)


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
    keep = ("id", "rule", "source", "step", "severity", "state", "message", "first_seen", "last_seen", "logged_at",
            "count", "seq")
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
        timeout_s: the most one attempt may take, from connecting to the end of the answer; default 5 s.
        retries: extra attempts after the first; default 3.
        backoff_s: first wait before a retry, doubled each time; default 0.5 s.
        max_queue: alerts waiting per target; the oldest is dropped beyond it; default 100.
        body: the JSON body of a target's format for a queued item; default `payload` (the alert's change).
            `mstail.tailer.outbound.alertmanager` queues its own bodies through these senders.
    """

    def __init__(self, targets: Sequence[Target], timeout_s: float = 5.0, retries: int = 3, backoff_s: float = 0.5,
                 max_queue: int = 100, body: Callable[[str, Dict[str, Any]], Any] = payload) -> None:
        self.queues = [_Queue(target) for target in targets]
        self.body = body
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
        body = self.body(queue.target.format, alert)
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            if attempt:
                queue.stats["retries"] += 1
                await asyncio.sleep(delay)
                delay *= 2
            try:
                status = await asyncio.wait_for(self._post(queue.target.url, body), self.timeout_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - timeouts, refused connections, protocol errors: retry
                log.warning("webhook %s: %s (attempt %d)", queue.target.shown, type(exc).__name__, attempt + 1)
                continue
            if status < 300:
                return True
            log.warning("webhook %s: HTTP %d (attempt %d)", queue.target.shown, status, attempt + 1)
            if status < 500 and status != 429:
                return False
        return False

    async def _post(self, url: str, body: Any) -> int:
        """One attempt: POST, read at most MAX_ANSWER_BYTES of the answer as it came (raw: no decompression),
        close; returns the status. The caller's deadline cancels it wherever it is."""
        async with self._client.stream("POST", url, json=body) as response:
            read = 0
            async for chunk in response.aiter_raw():
                read += len(chunk)
                if read >= MAX_ANSWER_BYTES:
                    break
            return response.status_code

