"""`--remote-write URL`: every step's metrics into Prometheus (or VictoriaMetrics, Mimir, Thanos) at the log's time.

Prometheus' scrape of `/metrics` sees each source's newest values only; this sender writes every record as samples
with the Prometheus remote write 1.0 protocol (a protobuf `WriteRequest`, snappy block compressed, POSTed with
`Content-Encoding: snappy`, `Content-Type: application/x-protobuf`, `X-Prometheus-Remote-Write-Version: 0.1.0`).

Where the samples come from: the history itself, read by seq (`Store.items_after`), never a queue of its own, so a
receiver that is down for hours costs no memory: the sender falls behind and catches up from the state file. Only
items already committed are sent (a seq not yet on disk may name another record after a crash). Its checkpoint, the
last seq sent and the timestamps given last per source, is kept in the state's `meta` table (`remote_write`), so a
restart resumes where it was; the file moved aside starts a new history and, with it, a new checkpoint. Delivery is
at least once: a batch sent but not yet checkpointed is sent again after a crash, as identical samples (same
labels, same timestamps, same values), which the receiver takes as duplicates.

Samples: each numeric metric of a record (and the metrics an amend adds to it) as `mstail_<metric>` (the name
made a valid Prometheus name; the `metric` label keeps the name as the log wrote it), and its step as `mstail_step`,
with the labels `source`, `run` (a run found below a folder), `rank` (the number in a `rank_N`, `worker_N`,
`device_N` or `rankN` at the end of the source id) and `node` (`--node`, default this host's name). The timestamp is the record's
`time`: the log's timestamp, or the time mstail read the line when the log has none (stored with the record, so a
resend keeps it). Records of one source sharing a millisecond (logs that stamp whole seconds) get the next free
millisecond each, as Prometheus refuses two values of a series at one timestamp. Events are not sent.

Failures: connection errors, timeouts, 5xx and 429 are retried with backoff (0.5 s doubling to 30 s) until the
receiver takes the batch; another 4xx (a sample too old for the receiver, a bad URL) drops that batch, counted and
said. A catch-up of records older than the receiver's head (about an hour for Prometheus) needs its out-of-order
window (`storage: tsdb: out_of_order_time_window` in prometheus.yml), else they are refused (400) and dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import socket
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple
from urllib.parse import urlsplit

from mstail.parsers.record import RESERVED

from mstail.tailer.inputs.discovery import rank_of
from mstail.tailer.notices import Notices
from mstail.tailer.history.store import Store
from mstail.tailer.outbound.webhooks import shown_url

log = logging.getLogger("mstail.remotewrite")

DEFAULT_ENV = "MSTAIL_REMOTE_WRITE"
META_KEY = "remote_write"  # the checkpoint's row in the state's meta table
HEADERS = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf",
           "X-Prometheus-Remote-Write-Version": "0.1.0", "User-Agent": "mstail"}
_INVALID = re.compile(r"[^a-zA-Z0-9_]")


class UrlError(ValueError):
    """A URL option that cannot be used (one line, without the URL when it came from a file or a variable)."""


def check_url(url: str, where: str) -> str:
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UrlError(f"{where}: needs an http:// or https:// URL")
    return url.strip()


def read_url(option: str, value: Optional[str] = None, path: Optional[str] = None,
             default_env: Optional[str] = None, environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The URL of `option` from its value, else from the file `path` (its first line that is not blank nor a `#`
    comment), else from the environment variable `default_env` when set: a URL holding a secret (a token in its
    query, basic auth) need not be on the command line `ps` shows. None when none is given."""
    if value:
        return check_url(value, f"{option} {value!r}")
    if path:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise UrlError(f"{option}-file {path}: cannot read it: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise UrlError(f"{option}-file {path}: not UTF-8 text") from None
        found = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
        if not found:
            raise UrlError(f"{option}-file {path}: no URL in it")
        return check_url(found[0], f"{option}-file {path}")
    text = environ.get(default_env, "").strip() if default_env else ""
    return check_url(text, f"${default_env}") if text else None


def metric_name(metric: str) -> str:
    """`mstail_<metric>` as a valid Prometheus metric name: every character outside [a-zA-Z0-9_] made `_`."""
    return "mstail_" + _INVALID.sub("_", metric)


def _write_request_class() -> Any:
    """Prometheus' `prompb.WriteRequest` (remote write 1.0, prompb/remote.proto and types.proto), the fields mstail
    writes, built at run time as the event-file schemas are (`mstail.parsers.eventschema`)."""
    from google.protobuf import descriptor_pb2

    from mstail.parsers.eventschema import _event_class

    f = descriptor_pb2.FieldDescriptorProto
    optional, repeated = f.LABEL_OPTIONAL, f.LABEL_REPEATED
    return _event_class("mstail.prometheus", [
        ("WriteRequest", [("timeseries", 1, f.TYPE_MESSAGE, repeated, "TimeSeries")]),
        ("TimeSeries", [("labels", 1, f.TYPE_MESSAGE, repeated, "Label"),
                        ("samples", 2, f.TYPE_MESSAGE, repeated, "Sample")]),
        ("Label", [("name", 1, f.TYPE_STRING, optional, None), ("value", 2, f.TYPE_STRING, optional, None)]),
        ("Sample", [("value", 1, f.TYPE_DOUBLE, optional, None), ("timestamp", 2, f.TYPE_INT64, optional, None)]),
    ], root="WriteRequest")


Series = Tuple[Tuple[str, str], ...]  # sorted (name, value) label pairs, __name__ first


class Batch:
    """The samples of a run of items, grouped by series in the order they came."""

    def __init__(self) -> None:
        self.series: Dict[Series, List[Tuple[int, float]]] = {}
        self.samples = 0

    def add(self, labels: Series, ms: int, value: float) -> None:
        self.series.setdefault(labels, []).append((ms, value))
        self.samples += 1

    def encode(self, message_class: Any) -> bytes:
        """The snappy-compressed WriteRequest (CPU: run it off the event loop)."""
        import cramjam

        request = message_class()
        for labels, samples in self.series.items():
            series = request.timeseries.add()
            for name, value in labels:
                series.labels.add(name=name, value=value)
            for ms, sample in samples:
                series.samples.add(value=sample, timestamp=ms)
        return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


class Stamps:
    """Each source's last (log millisecond, timestamp given), so that records sharing a millisecond get the next free
    one each, the same again on a resend (kept in the checkpoint). A log time that went back (a new run) is taken
    as it is."""

    def __init__(self, saved: Optional[Dict[str, List[int]]] = None) -> None:
        self.last: Dict[str, Tuple[int, int]] = {k: (v[0], v[1]) for k, v in (saved or {}).items()}

    def stamp(self, source: str, when: float) -> int:
        raw = int(round(when * 1000))
        last = self.last.get(source)
        ms = raw if last is None or raw < last[0] else max(raw, last[1] + 1)
        self.last[source] = (raw, ms)
        return ms

    def of_amend(self, source: str, when: float) -> int:
        """The timestamp its record got (an amend adds to the source's newest record)."""
        raw = int(round(when * 1000))
        last = self.last.get(source)
        return last[1] if last is not None and last[0] == raw else raw


class RemoteWrite:
    """The sender, started with `start()` inside the event loop and ended with `stop()`.

    Args:
        url: the receiver's remote write endpoint (Prometheus: `http://HOST:9090/api/v1/write`).
        store: the history it reads by seq.
        node: the `node` label; default the host's name.
        batch_items: items read (and sent) at most at once; default 500.
        flush_s: how often it looks for new committed items when it has caught up; default 1 s.
        timeout_s: the most one attempt may take; default 10 s.
        backoff_s, max_backoff_s: first wait before a retry, doubled up to the second; default 0.5 s and 30 s.
    """

    def __init__(self, url: str, store: Store, node: Optional[str] = None, batch_items: int = 500, flush_s: float = 1.0, timeout_s: float = 10.0,
                 backoff_s: float = 0.5, max_backoff_s: float = 30.0) -> None:
        self.url, self.store = url, store
        self.batch_items, self.flush_s, self.timeout_s = batch_items, flush_s, timeout_s
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.node = node or socket.gethostname()
        self.sent_seq = 0
        self.stamps = Stamps()
        self.counts = {"samples_sent": 0, "requests_sent": 0, "retries": 0, "batches_dropped": 0, "samples_dropped": 0}
        self.last_error: Optional[str] = None
        self.failing_since: Optional[float] = None  # unix time of the first failure of the batch being retried
        self._labels: Dict[str, Dict[str, str]] = {}
        self._notices = Notices(log)
        self._task: Optional[asyncio.Task] = None
        self._client: Any = None
        self._message_class: Any = None

    def stats(self) -> Dict[str, Any]:
        """/healthz's `remote_write` (and /metrics' `mstail_remote_write_*`)."""
        return {"url": shown_url(self.url), "sent_seq": self.sent_seq,
                "behind": max(0, self.store.last_seq - self.sent_seq), **self.counts,
                "last_error": self.last_error, "failing_since": self.failing_since}

    def start(self) -> None:
        import httpx

        self._client = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s), trust_env=False)
        self._message_class = _write_request_class()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Cancel the sender (a batch in flight is sent again by the next start: at least once)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if self._client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._client.aclose(), 1.0)
            self._client = None

    # -- the loop ---------------------------------------------------------------------------------------------
    async def _run(self) -> None:
        db = self.store.db
        while db.checking:  # nothing is written into a state before its integrity check passed
            await asyncio.sleep(self.flush_s)
        loaded = False
        while True:
            try:
                if not loaded:
                    self._load_checkpoint()
                    loaded = True
                sent = await self._send_next()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a read or encoding failure: said, tried again, never the end
                self.last_error = f"{type(exc).__name__}: {exc}"
                self._notices.say("broken", f"remote write: {self.last_error}; trying again", logging.ERROR)
                sent = False
            if not sent:
                await asyncio.sleep(self.flush_s)

    async def _send_next(self) -> bool:
        """Send the next batch of committed items; False when there is none."""
        items = self._committed_after(self.sent_seq)
        if not items:
            return False
        stamps = Stamps({k: list(v) for k, v in self.stamps.last.items()})
        labels = {item["source"]: self._labels_of(item["source"]) for item in items}  # the store's, on the loop
        batch, body = await asyncio.to_thread(self._encoded, items, stamps, labels)
        if batch.samples:
            if await self._deliver(body):
                self.counts["samples_sent"] += batch.samples
            else:
                self.counts["batches_dropped"] += 1
                self.counts["samples_dropped"] += batch.samples
        self.sent_seq, self.stamps = items[-1]["seq"], stamps
        await self._save_checkpoint()
        return True

    def _committed_after(self, seq: int) -> List[Dict[str, Any]]:
        """Items after `seq` that are on disk (the queued ones are the newest seqs), at most `batch_items`."""
        durable = self.store.last_seq - self.store.db.unsaved
        if durable <= seq:
            return []
        return [item for item in self.store.items_after(seq, self.batch_items) if item["seq"] <= durable]

    def _encoded(self, items: List[Dict[str, Any]], stamps: Stamps,
                 labels: Dict[str, Dict[str, str]]) -> Tuple[Batch, bytes]:
        """The samples of `items` and their request body (in a worker thread: about 60 us an item)."""
        batch = self._batch(items, stamps, labels)
        return batch, batch.encode(self._message_class) if batch.samples else b""

    def _batch(self, items: List[Dict[str, Any]], stamps: Stamps, labels_of: Dict[str, Dict[str, str]]) -> Batch:
        batch = Batch()
        for item in items:
            kind = item.get("kind")
            when = item.get("time")
            if kind not in (None, "amend") or not isinstance(when, (int, float)) or not math.isfinite(when):
                continue
            source = item["source"]
            ms = stamps.stamp(source, when) if kind is None else stamps.of_amend(source, when)
            labels = labels_of[source]
            if kind is None and isinstance(item.get("step"), int):
                batch.add(self._series(labels, "mstail_step", None), ms, float(item["step"]))
            for key, value in item.items():
                if key in RESERVED or not isinstance(value, (int, float)):
                    continue
                try:
                    number = float(value)
                except OverflowError:  # an int beyond a double
                    continue
                batch.add(self._series(labels, metric_name(key), key), ms, number)
        return batch

    def _labels_of(self, source: str) -> Dict[str, str]:
        labels = self._labels.get(source)
        if labels is None:
            info = self.store.sources.get(source)
            labels = {"source": source, "node": self.node}
            if info is not None and info.run:
                labels["run"] = info.run
            rank = rank_of(source)
            if rank is not None:
                labels["rank"] = rank
            if info is not None:  # a source not known yet (none expected) is looked up again next time
                self._labels[source] = labels
        return labels

    @staticmethod
    def _series(labels: Dict[str, str], name: str, metric: Optional[str]) -> Series:
        pairs = dict(labels, metric=metric) if metric is not None else labels
        return (("__name__", name), *sorted(pairs.items()))

    async def _deliver(self, body: bytes) -> bool:
        """POST until the receiver takes it (True) or refuses it for good with a 4xx other than 429 (False)."""
        delay = self.backoff_s
        while True:
            problem = await self._attempt(body)
            if problem is None:
                self.last_error = self.failing_since = None
                self._notices.forget("failing")
                self.counts["requests_sent"] += 1
                return True
            self.last_error = problem
            if problem.startswith("HTTP 4") and not problem.startswith("HTTP 429"):
                self._notices.say(("refused", problem[:8]), f"remote write {shown_url(self.url)}: {problem}: a batch dropped")
                return False
            if self.failing_since is None:
                self.failing_since = time.time()
            self._notices.say("failing", f"remote write {shown_url(self.url)}: {problem}; retrying (the samples wait in "
                              "the history)")
            self.counts["retries"] += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_backoff_s)

    async def _attempt(self, body: bytes) -> Optional[str]:
        """One POST: None when taken, else what went wrong."""
        try:
            status, answer = await asyncio.wait_for(self._post(body), self.timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - refused connections, timeouts, protocol errors: retried
            return type(exc).__name__
        if status < 300:
            return None
        return f"HTTP {status} {answer.decode('utf-8', 'replace').strip()[:200]}"

    async def _post(self, body: bytes) -> Tuple[int, bytes]:
        """The status and the first KiB of the answer (the reason of a refusal; the rest is never read)."""
        async with self._client.stream("POST", self.url, content=body, headers=HEADERS) as response:
            answer = b""
            async for chunk in response.aiter_raw():
                answer += chunk
                if len(answer) >= 1024:
                    break
            return response.status_code, answer[:1024]

    # -- the checkpoint ---------------------------------------------------------------------------------------
    def _load_checkpoint(self) -> None:
        saved = self.store.db.meta_value(META_KEY)
        try:
            data = json.loads(saved) if saved else {}
            seq = int(data.get("seq", 0))
            stamps = Stamps(data.get("stamps"))
        except (ValueError, TypeError, AttributeError, IndexError):
            log.warning("remote write: the saved checkpoint is not usable: sending the history from its start")
            seq, stamps = 0, Stamps()
        self.sent_seq, self.stamps = (seq, stamps) if 0 <= seq <= self.store.last_seq else (0, Stamps())

    async def _save_checkpoint(self) -> None:
        text = json.dumps({"seq": self.sent_seq, "stamps": {k: list(v) for k, v in self.stamps.last.items()}})
        await asyncio.to_thread(self.store.db.set_meta_value, META_KEY, text)
