"""`GET /metrics`: Prometheus text exposition, built with the official `prometheus_client`.

A custom collector reads the store, the hub, the alert engine and the tailer's facts *at scrape time*: the hot
path (reading, parsing, storing, fan-out) does no per-record work for Prometheus. A scrape costs
O(sources) on the event loop, where the store is consistent (a snapshot, capped at `MAX_SOURCES` sources and
`MAX_SERIES` series); the text itself is built from the snapshot in a worker thread.

Families (all prefixed `mstail_`):

- `metric{source,metric}` latest value of every numeric metric (NaN when the last value was NaN), at most
  `max_series` series: the canonical metrics (loss, lr, grad_norm, ...) of every source first, then the others,
  in source order; what did not fit is counted in `metric_series_dropped`.
- `last_step{source}`, `last_step_timestamp_seconds{source}`, `seconds_since_last_step{source}`, `records{source}`
- per-source counters from the follower and the parser: `lines_read_total`, `bytes_read_total`,
  `records_total`, `events_total`, `unmatched_metric_lines_total` (lines that looked like metrics but no rule
  matched: dropped), `cut_lines_total`, `bad_utf8_lines_total`, `parse_errors_total`, `slow_lines_total`, `rotations_total`,
  `truncations_total`, `lost_bytes_total`, `io_errors_total`, `nul_bytes_total`
- `sources{state}` (waiting, following, idle, finished, died, stopped, gone ...), `source_fate{source, fate, guessed}`
  (1 for each source whose run is over: how it ended), `store_items`, `tailer_passes_total`
- SSE: `sse_clients`, `sse_messages_sent_total`, `sse_items_sent_total`, `sse_catch_ups_total`,
  `sse_clients_dropped_total`,
  `hub_batches_published_total`
- alerts: `alerts_active{severity}`, `alerts_fired_total`
- remote write (`--remote-write`): `remote_write_samples_sent_total`, `remote_write_samples_dropped_total`,
  `remote_write_retries_total`, `remote_write_sent_seq` (the last item sent), `remote_write_behind_items`,
  `remote_write_failing` (1 while a batch is being retried)
- the process (prometheus_client's process collector): CPU seconds, resident memory, open fds.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Tuple

from fastapi import APIRouter, Request
from fastapi.responses import Response

from mstail.tailer.alerts.fate import FATES
from mstail.tailer.live.hub import Hub
from mstail.tailer.history.store import Store

if TYPE_CHECKING:
    from prometheus_client.core import Metric

router = APIRouter()

MAX_SERIES = 1000
MAX_SOURCES = 1000  # sources with per-source families (a file with 20,000 launcher tags is 20,000 sources)
# The classic text format, which every Prometheus reads (all names here are legacy-valid, so the body is the same
# whichever version newer prometheus_client releases would announce).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Exported first, so a cap never hides them behind ad hoc metrics.
CANONICAL = ("loss", "lr", "grad_norm", "step_time_ms", "loss_scale", "overflow", "throughput_tflops",
             "samples_per_s", "loss_avg", "epoch_time_ms")
# (family name, counter key in SourceInfo.counters, help)
SOURCE_COUNTERS = (
    ("lines_read", "lines", "Lines read from the source's files."),
    ("bytes_read", "bytes", "Bytes read from the source's files."),
    ("records", "records", "Step records parsed."),
    ("events", "events", "Events parsed (checkpoint, eval, error, end, ...)."),
    ("unmatched_metric_lines", "unmatched_metric_lines",
     "Lines that looked like metrics but matched no rule (dropped); a hint that a format misses lines."),
    ("cut_lines", "cut_lines", "Lines longer than the line limit, cut."),
    ("bad_utf8_lines", "bad_utf8_lines", "Lines with invalid UTF-8 (replaced characters)."),
    ("parse_errors", "field_errors", "Fields that failed to convert (parse errors)."),
    ("slow_lines", "slow_lines", "Lines a user's regex gave up on after its time limit (skipped for that rule)."),
    ("rotations", "rotations", "Log rotations followed."),
    ("truncations", "truncations", "Truncations of a followed file (it started over)."),
    ("lost_bytes", "lost_bytes", "Bytes known to have existed but never read (a truncation without a copy)."),
    ("io_errors", "io_errors", "Read errors (EIO, ESTALE on network mounts), retried with backoff."),
    ("nul_bytes", "nul_bytes", "NUL bytes dropped from lines (a crashed writer's zero-filled tail, sparse holes)."),
)


@dataclass(eq=False)  # hashable by identity: prometheus_client keeps its collectors in a dict
class _Snapshot:
    """What a scrape exports, copied on the event loop (bounded: at most `max_sources` sources' rows and
    `max_series` metric series), so the text is built off it in a worker thread."""

    time: float
    latest: List[Tuple[Tuple[str, str], float]]
    series_dropped: int
    sources: List[Tuple[str, Optional[int], Optional[float], Dict[str, int]]]  # id, last step, last time, counters
    sources_dropped: int
    states: Dict[str, int]
    fates: List[Tuple[str, str, bool]]  # (source, fate, guessed) of the sources whose run is over
    last_seq: int
    passes: Optional[int]
    hub: Dict[str, int]
    severities: Dict[str, int]
    fired: Optional[int]
    remote: Optional[Dict[str, Any]]  # the remote write sender's stats, or None
    version: str
    max_series: int
    max_sources: int

    def collect(self) -> Iterator["Metric"]:
        """The families, as a prometheus_client collector (`render` registers a snapshot)."""
        # prometheus_client is imported at the first scrape, not with the app: a sixth of the server's import time
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

        yield InfoMetricFamily("mstail", "mstail build information.", value={"version": self.version})

        values = GaugeMetricFamily("mstail_metric", "Latest value of a numeric training metric of a source.",
                                   labels=["source", "metric"])
        for (source, metric), value in self.latest:
            values.add_metric([source, metric], value)
        yield values
        yield GaugeMetricFamily("mstail_metric_series_dropped",
                                f"mstail_metric series not exported because of the cap ({self.max_series}).",
                                value=self.series_dropped)

        last_step = GaugeMetricFamily("mstail_last_step", "Global step of the source's newest record.", labels=["source"])
        last_time = GaugeMetricFamily("mstail_last_step_timestamp_seconds",
                                      "Unix time of the source's newest record (its log timestamp).", labels=["source"])
        since = GaugeMetricFamily("mstail_seconds_since_last_step",
                                  "Seconds from the source's newest record to this scrape.", labels=["source"])
        for source, step, when, _ in self.sources:
            if step is not None:
                last_step.add_metric([source], step)
            if isinstance(when, (int, float)) and math.isfinite(when):
                last_time.add_metric([source], when)
                since.add_metric([source], max(0.0, self.time - when))
        yield last_step
        yield last_time
        yield since
        yield GaugeMetricFamily("mstail_sources_not_exported", "Sources left out of the per-source families because "
                                f"of the cap ({self.max_sources}).", value=self.sources_dropped)

        for name, key, help_text in SOURCE_COUNTERS:
            family = CounterMetricFamily(f"mstail_{name}", help_text, labels=["source"])
            for source, _, _, counters in self.sources:
                family.add_metric([source], counters[key])
            yield family

        states = GaugeMetricFamily("mstail_sources", "Sources by state.", labels=["state"])
        for state, count in self.states.items():
            states.add_metric([state], count)
        yield states
        fates = GaugeMetricFamily("mstail_source_fate", "1 for a source whose run is over, labelled with how it ended "
                                  "(finished, died, stopped; guessed: judged by the silence alone).",
                                  labels=["source", "fate", "guessed"])
        for source, fate, guessed in self.fates:
            fates.add_metric([source, fate, "true" if guessed else "false"], 1)
        yield fates
        yield GaugeMetricFamily("mstail_store_items", "Records and events held (the last seq).", value=self.last_seq)
        if self.passes is not None:
            yield CounterMetricFamily("mstail_tailer_passes", "Read passes over all files.", value=self.passes)

        hub = self.hub
        yield GaugeMetricFamily("mstail_sse_clients", "Open SSE streams.", value=hub["clients"])
        yield CounterMetricFamily("mstail_sse_messages_sent", "SSE writes to clients (batches, replays, source "
                                  "changes; pings not counted).", value=hub["messages"])
        yield CounterMetricFamily("mstail_sse_items_sent", "Records and events delivered to SSE clients "
                                  "(an item sent to N clients counts N times).", value=hub["items"])
        yield CounterMetricFamily("mstail_sse_catch_ups", "Times a slow client's queue overflowed and it caught up "
                                  "from the store.", value=hub["catch_ups"])
        yield CounterMetricFamily("mstail_sse_clients_dropped", "SSE clients dropped because they accepted no "
                                  "data for the send timeout (stopped reading).", value=hub["dropped"])
        yield CounterMetricFamily("mstail_hub_batches_published", "Batches published to live clients.",
                                  value=hub["published"])

        active = GaugeMetricFamily("mstail_alerts_active", "Firing alerts by severity.", labels=["severity"])
        for severity, count in self.severities.items():
            active.add_metric([severity], count)
        yield active
        if self.fired is not None:
            yield CounterMetricFamily("mstail_alerts_fired", "Alerts that started firing.", value=self.fired)
        if self.remote is not None:
            yield from _remote_write_families(self.remote)



def _remote_write_families(stats: Dict[str, Any]) -> Iterator["Metric"]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    yield CounterMetricFamily("mstail_remote_write_samples_sent", "Samples the remote write receiver took.",
                              value=stats["samples_sent"])
    yield CounterMetricFamily("mstail_remote_write_samples_dropped", "Samples of batches the receiver refused for "
                              "good (a 4xx answer other than 429).", value=stats["samples_dropped"])
    yield CounterMetricFamily("mstail_remote_write_retries", "Remote write attempts retried (connection errors, "
                              "timeouts, 5xx, 429).", value=stats["retries"])
    yield GaugeMetricFamily("mstail_remote_write_sent_seq", "The last item (seq) sent by remote write.",
                            value=stats["sent_seq"])
    yield GaugeMetricFamily("mstail_remote_write_behind_items", "Items stored but not sent by remote write yet.",
                            value=stats["behind"])
    yield GaugeMetricFamily("mstail_remote_write_failing", "1 while a remote write batch is being retried.",
                            value=1 if stats["failing_since"] is not None else 0)


class MstailCollector:
    """Takes `snapshot()`s of the store, the hub, the alert engine and the tailer's facts (on the event loop).
    `alerts` is the alert engine or None; `facts()` the tailer's facts (`passes`)."""

    def __init__(self, store: Store, hub: Hub, alerts: Optional[Any], facts: Callable[[], Dict[str, Any]],
                 max_series: int = MAX_SERIES, version: str = "", max_sources: int = MAX_SOURCES) -> None:
        self.store = store
        self.hub = hub
        self.alerts = alerts
        self.facts = facts
        self.max_series = max_series
        self.max_sources = max_sources
        self.version = version

    def snapshot(self) -> _Snapshot:
        """What a scrape exports, copied on the event loop, where the store is consistent."""
        store, hub = self.store, self.hub
        latest = _ordered(store.latest_values())
        infos = list(store.sources.values())
        states: Dict[str, int] = dict.fromkeys(("waiting", "following", "idle", *FATES, "gone"), 0)
        for info in infos:
            states[info.state] = states.get(info.state, 0) + 1
        keys = [key for _, key, _ in SOURCE_COUNTERS]
        severities: Dict[str, int] = {"info": 0, "warning": 0, "error": 0, "critical": 0}
        fired: Optional[int] = None
        if self.alerts is not None:
            for alert in self.alerts.table().get("active", []):
                severity = str(alert.get("severity", "warning"))
                severities[severity] = severities.get(severity, 0) + 1
            fired = self.alerts.fired
        facts = self.facts()
        passes, remote = facts.get("passes"), facts.get("remote_write")
        return _Snapshot(
            time=time.time(),
            latest=[(key, value) for key, (_step, value) in latest[: self.max_series]],
            series_dropped=max(0, len(latest) - self.max_series),
            sources=[(info.id, info.last_step, info.last_time,
                      {key: info.counters.get(key, info.records if key == "records" else 0) for key in keys})
                     for info in infos[: self.max_sources]],
            sources_dropped=max(0, len(infos) - self.max_sources),
            states=states,
            fates=[(info.id, info.state, info.end_guessed) for info in infos[: self.max_sources] if info.state in FATES],
            last_seq=store.last_seq,
            passes=passes if isinstance(passes, int) else None,
            hub={"clients": hub.subscriber_count, "messages": hub.sent_messages, "items": hub.sent_items,
                 "catch_ups": hub.catch_ups, "dropped": hub.dropped_clients, "published": hub.published},
            severities=severities,
            fired=fired,
            remote=remote if isinstance(remote, dict) else None,
            version=self.version,
            max_series=self.max_series,
            max_sources=self.max_sources,
        )


def _ordered(latest: Dict[Tuple[str, str], Tuple[int, float]]) -> List[Tuple[Tuple[str, str], Tuple[int, float]]]:
    """Canonical metrics of every source first (in CANONICAL order), then the rest; stable otherwise."""
    rank = {name: i for i, name in enumerate(CANONICAL)}
    items = list(latest.items())
    return sorted(items, key=lambda kv: (rank.get(kv[0][1], len(rank)),))


def render(snapshot: _Snapshot) -> bytes:
    """The exposition text of a snapshot and of this process (CPU, memory, fds)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.process_collector import ProcessCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(snapshot)
    ProcessCollector(registry=registry)
    return generate_latest(registry)


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    """The snapshot is taken on the event loop (the one thread that touches the store), bounded by the caps;
    the text is built from it in a worker thread, so a scrape never holds up tailing or other requests."""
    collector: MstailCollector = request.app.state.metrics_collector
    body = await asyncio.to_thread(render, collector.snapshot())
    return Response(body, media_type=CONTENT_TYPE, headers={"Cache-Control": "no-store"})
