"""`--alertmanager URL`: the alert rules' alerts posted to Prometheus' Alertmanager (its v2 API), which groups,
silences, deduplicates and routes them where a cluster's other alerts already go.

Every alert change that notifies (`Tailer.alert_listeners`) is posted at once (`POST /api/v2/alerts`, a JSON list),
and every firing alert of the engine again each `repost_s` (60 s; less than Alertmanager's `resolve_timeout`), each
with `endsAt` = now + 3 x `repost_s`: an alert nobody posts any more resolves then, so one whose mstail died does not
fire for ever. Posting goes through the webhook senders (`mstail.tailer.outbound.webhooks`: a bounded queue per Alertmanager,
one deadline an attempt, retries with backoff, counted), so a down Alertmanager never holds up tailing.

Labels: `alertname` (the rule), `severity`, `job` (the source's run, when it has one), and for an alert of one
rank's own (`error`, `gone`, `hang`... every rule but `JOB_RULES`) `source`, `node` (`--node`, default this host's
name) and `rank`. A rule of `JOB_RULES` judges what every rank of a data-parallel job shares (the all-reduced loss, its scale and
overflow, the global gradient norm): its alert carries no source, node nor rank, so the same problem raised by
every rank of every node mstail is one alert with one label set, which Alertmanager deduplicates into one
notification. Such an alert is never resolved explicitly (another node may still see it): it resolves when no mstail
has posted it for 3 x `repost_s`. An alert of one rank's own is resolved at once (`endsAt` = now). Annotations:
`summary` (the rule's message, with the source and step), `source` and `step`; `generatorURL` is the page.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from datetime import datetime, timezone
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from mstail.tailer.inputs.discovery import rank_of
from mstail.tailer.outbound.webhooks import Target, Webhooks

#: rules whose alerts are the job's, not a rank's (see the module's docstring)
JOB_RULES = frozenset({"nonfinite", "loss_spike", "grad_norm", "overflow", "loss_scale", "trend"})
API_PATH = "/api/v2/alerts"

Labels = Tuple[Tuple[str, str], ...]


def _rfc3339(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Alertmanager:
    """Posts the engine's alerts to every Alertmanager of `urls` (the members of one cluster each get every alert,
    as Prometheus sends them). Start with `start()` inside the event loop, end with `stop()`.

    Args:
        urls: Alertmanager base URLs (`http://am:9093`).
        active: the engine's firing alerts now (`AlertEngine.table()["active"]`).
        run_of: a source's run, or None.
        page_url: this mstail's page (each alert's `generatorURL`).
        node: the `node` label; default the host's name.
        repost_s: how often firing alerts are posted again; default 60 s.
        timeout_s: the most one attempt may take; default 5 s.
    """

    def __init__(self, urls: Sequence[str], active: Callable[[], List[Dict[str, Any]]],
                 run_of: Callable[[str], Optional[str]], page_url: str, node: Optional[str] = None, repost_s: float = 60.0,
                 timeout_s: float = 5.0) -> None:
        self.active, self.run_of, self.page_url, self.repost_s = active, run_of, page_url, repost_s
        self.node = node or socket.gethostname()
        self.sender = Webhooks([Target(url.rstrip("/") + API_PATH, "alertmanager") for url in urls],
                               timeout_s=timeout_s, body=lambda _format, item: item["alerts"])
        self._task: Optional[asyncio.Task] = None

    def stats(self) -> List[Dict[str, Any]]:
        """/healthz's `alertmanager`: per Alertmanager, posts sent, failed, dropped, retried and queued."""
        return self.sender.stats()

    def labels(self, alert: Dict[str, Any]) -> Labels:
        """The label set of an alert (`Labels`: sorted pairs); equal for the same job-level problem anywhere."""
        source = str(alert.get("source", ""))
        labels = {"alertname": str(alert.get("rule")), "severity": str(alert.get("severity", "warning"))}
        run = self.run_of(source)
        if run:
            labels["job"] = run
        if alert.get("rule") not in JOB_RULES:
            labels.update(source=source, node=self.node)
            rank = rank_of(source)
            if rank is not None:
                labels["rank"] = rank
        return tuple(sorted(labels.items()))

    def posted(self, alert: Dict[str, Any], now: float, ends: float) -> Dict[str, Any]:
        """The v2 API's alert (`postableAlert`) of one engine alert, ending at `ends`."""
        step = alert.get("step")
        where = f"{alert.get('source')}" + (f", step {step}" if step is not None else "")
        return {"labels": dict(self.labels(alert)),
                "annotations": {"summary": f"{alert.get('message')} ({where})", "source": str(alert.get("source")),
                                **({"step": str(step)} if step is not None else {})},
                "startsAt": _rfc3339(min(float(alert.get("first_seen") or now), now)), "endsAt": _rfc3339(ends),
                "generatorURL": self.page_url}

    def submit(self, change: Dict[str, Any]) -> None:
        """An alert change that notifies (an alert listener: non-blocking). A firing one is posted now; a resolved one
        of a rank's own is posted with `endsAt` = now unless another alert with its labels still fires here."""
        now = time.time()
        if change.get("state") == "firing":
            self.sender.submit({"alerts": [self.posted(change, now, now + 3 * self.repost_s)]})
            return
        if change.get("rule") in JOB_RULES:
            return  # it resolves when nobody posts it any more (another node may still see it)
        labels = self.labels(change)
        if not any(self.labels(alert) == labels for alert in self.active()):
            self.sender.submit({"alerts": [self.posted(change, now, now)]})

    def repost(self) -> None:
        """Every firing alert again, one of each label set (a job's same problem on many ranks is one alert)."""
        now = time.time()
        unique: Dict[Labels, Dict[str, Any]] = {}
        for alert in self.active():
            unique.setdefault(self.labels(alert), alert)
        if unique:
            self.sender.submit({"alerts": [self.posted(alert, now, now + 3 * self.repost_s) for alert in unique.values()]})

    def start(self) -> None:
        self.sender.start()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.sender.stop()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.repost_s)
            self.repost()
