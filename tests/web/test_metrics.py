"""`/metrics`: the exposition of a real mstail read with prometheus_client's own parser, the series cap, and a
real Prometheus server (Debian's `prometheus`, started here on loopback with a temporary config and storage)
that scrapes a running mstail with a bearer token and answers PromQL queries with the logged loss and step.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mstail.parsers import Item
from mstail.tailer.live.hub import Hub
from mstail.tailer.history.store import Store
from mstail.web.metrics import MstailCollector, render

from tests.conftest import _NO_PROXY, wait_until
from tests.tailer.prom_support import Server, prometheus

from .sse_client import collect, stream_seqs

TOKEN = "metrics-token-0123456789abcdefABCDEF"


def expected_loss(step: int, seed: int = 0) -> float:
    """The loss tests/conftest.py's writer logs for `step` (`%5.6f`): an oracle independent of the parser."""
    return float("%.6f" % (2.0 + 8.0 * math.exp(-step / 300.0) + 0.01 * ((step * 7919 + seed) % 13)))


def scrape(url: str, token: str = "") -> Dict[str, Any]:
    request = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {token}"} if token else {})
    with _NO_PROXY.open(request, timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode("utf-8")
    samples: Dict[Any, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Dict[Any, float], name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


# -- the exposition of a real mstail -------------------------------------------------------------------------
def test_metrics_of_a_real_mstail(tmp_path: Path, mstail_server, log_writer) -> None:  # type: ignore[no-untyped-def]
    logs = [tmp_path / "output" / "log" / f"rank_{r}" / "info.log" for r in range(2)]
    log_writer.finish(log_writer(logs[0], steps=30, interval_s=0))
    log_writer.finish(log_writer(logs[1], steps=25, interval_s=0, seed=3, nan_at=(25,)))
    server = mstail_server(*logs)
    server.wait_records(55)

    samples = scrape(server.url)
    assert value(samples, "mstail_metric", source="rank_0", metric="loss") == expected_loss(30)
    assert math.isnan(value(samples, "mstail_metric", source="rank_1", metric="loss"))  # a NaN stays a NaN
    assert value(samples, "mstail_metric", source="rank_1", metric="grad_norm") > 0
    assert value(samples, "mstail_last_step", source="rank_0") == 30
    assert value(samples, "mstail_last_step", source="rank_1") == 25
    assert 0 <= value(samples, "mstail_seconds_since_last_step", source="rank_0") < 60
    records = {r["source"]: r for r in server.get_json("/api/records?after=0&limit=10000")}
    assert value(samples, "mstail_last_step_timestamp_seconds", source="rank_0") == pytest.approx(records["rank_0"]["time"])
    for source in ("rank_0", "rank_1"):
        lr = records[source]["lr"]
        assert value(samples, "mstail_metric", source=source, metric="lr") == lr
    sources = {s["id"]: s for s in server.get_json("/api/sources")}
    for source, steps in (("rank_0", 30), ("rank_1", 25)):
        assert value(samples, "mstail_records_total", source=source) == steps
        assert value(samples, "mstail_lines_read_total", source=source) == sources[source]["counters"]["lines"]
        assert value(samples, "mstail_bytes_read_total", source=source) == Path(logs[int(source[-1])]).stat().st_size
        assert value(samples, "mstail_parse_errors_total", source=source) == 0
        assert value(samples, "mstail_unmatched_metric_lines_total", source=source) == 0
    # the writers logged "Training Over!": each run finished, and /metrics says how each ended
    wait_until(lambda: value(scrape(server.url), "mstail_sources", state="finished") == 2, 10, message="finished")
    fates = scrape(server.url)
    for source in ("rank_0", "rank_1"):
        assert value(fates, "mstail_source_fate", source=source, fate="finished", guessed="false") == 1
    assert value(fates, "mstail_sources", state="died") == value(fates, "mstail_sources", state="stopped") == 0
    assert value(samples, "mstail_metric_series_dropped") == 0
    assert value(samples, "mstail_store_items") == server.get_json("/healthz")["last_seq"]
    assert value(samples, "mstail_sse_clients") == 0
    assert value(samples, "process_resident_memory_bytes") > 0
    # Every metric label is a numeric metric the store holds: no text, no reserved keys.
    labels = {dict(k[1])["metric"] for k in samples if k[0] == "mstail_metric"}
    assert labels == {m for s in sources.values() for m in s["metrics"]}
    assert not labels & {"seq", "step", "time", "epoch", "source", "segment"}

    # SSE counters: one client that replays the whole history.
    last = server.get_json("/healthz")["last_seq"]
    got = collect(f"{server.url}/api/stream?after=0", until=lambda g: bool(stream_seqs(g)) and max(stream_seqs(g)) >= last)
    assert len(stream_seqs(got)) == last
    samples = scrape(server.url)
    assert value(samples, "mstail_sse_items_sent_total") == last
    assert value(samples, "mstail_sse_messages_sent_total") >= 1


def test_the_series_cap_keeps_canonical_metrics_and_counts_the_rest() -> None:
    store, hub = Store(), Hub()
    for source in ("rank_0", "rank_1", "rank_2"):
        store.add_source(source, f"/logs/{source}.log")
        record = {"step": 7, "time": 1.0, "loss": 1.5, "lr": 0.001, "note": "text is not a metric"}
        record.update({f"extra_{i:03d}": float(i) for i in range(400)})
        store.add(source, [Item("record", record)])
    collector = MstailCollector(store, hub, alerts=None, facts=lambda: {}, max_series=1000)
    families = {f.name: f for f in collector.snapshot().collect()}
    exported = [s.labels for s in families["mstail_metric"].samples]
    assert len(exported) == 1000
    assert families["mstail_metric_series_dropped"].samples[0].value == 3 * 402 - 1000
    pairs = {(labels["source"], labels["metric"]) for labels in exported}
    for source in ("rank_0", "rank_1", "rank_2"):
        assert {(source, "loss"), (source, "lr")} <= pairs  # canonical metrics of every source come first
    assert not any(metric == "note" for _, metric in pairs)


def test_lines_a_user_regex_gave_up_on_are_exported() -> None:
    """`slow_lines` (a user's regex out of its time limit) reaches /metrics beside the other parser counters."""
    from tests.parsers.test_regex_bounds import user_parser

    parser = user_parser()
    for number in (1, 2):
        parser.feed("a" * 40, number, 0.0)
    store, hub = Store(), Hub()
    store.add_source("run1", "/logs/run1.log").counters = dict(parser.counts)  # what a pass's checkpoint carries
    families = {f.name: f for f in MstailCollector(store, hub, alerts=None, facts=lambda: {}).snapshot().collect()}
    assert [(s.labels["source"], s.value) for s in families["mstail_slow_lines"].samples] == [("run1", 2)]


def test_twenty_thousand_sources_export_a_bounded_scrape() -> None:
    # Before: 20,000 launcher-tagged sources made a 13.9 MB /metrics, built on the event loop (6 s a scrape).
    store, hub = Store(), Hub()
    for i in range(20_000):
        store.add_source(f"run/rank{i}", "/logs/run.log")
    snapshot = MstailCollector(store, hub, alerts=None, facts=lambda: {}).snapshot()
    families = {f.name: f for f in snapshot.collect()}
    assert len(families["mstail_lines_read"].samples) == 1000
    assert families["mstail_sources_not_exported"].samples[0].value == 19_000
    assert families["mstail_sources"].samples[0].value == 20_000  # the state counts cover every source
    assert len(render(snapshot)) < 2_000_000


def test_metrics_needs_the_token_when_there_is_one(tmp_path: Path, mstail_server, log_writer) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "rank_0" / "info.log"
    log_writer.finish(log_writer(log, steps=3, interval_s=0))
    server = mstail_server(log, args=("--token", TOKEN))
    with pytest.raises(urllib.error.HTTPError) as refused:
        scrape(server.url)
    assert refused.value.code == 401
    assert json.loads(refused.value.read())["detail"].startswith("mstail: ")
    assert "mstail_last_step" in {k[0] for k in scrape(server.url, TOKEN)}


# -- a real Prometheus -----------------------------------------------------------------------------------
@pytest.fixture
def prometheus_for(tmp_path: Path) -> Iterator[Any]:
    """`prometheus_for(targets, token)` starts Prometheus on 127.0.0.1 scraping `targets` every second."""
    started: List[Server] = []

    def start(targets: List[str], token: str) -> Server:
        config = ("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                  "scrape_configs:\n"
                  "  - job_name: mstail\n"
                  "    scrape_interval: 1s\n"
                  "    scrape_timeout: 900ms\n"
                  "    authorization:\n"
                  f"      credentials: {token}\n"
                  "    static_configs:\n"
                  f"      - targets: [{', '.join(repr(t) for t in targets)}]\n")
        server = prometheus(tmp_path / "prometheus", config, receiver=False)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.mark.timeout(90)
def test_a_real_prometheus_scrapes_loss_and_step(tmp_path: Path, mstail_server, log_writer, prometheus_for, wait_until) -> None:  # type: ignore[no-untyped-def]
    logs = [tmp_path / "output" / "log" / f"rank_{r}" / "info.log" for r in range(2)]
    log_writer.finish(log_writer(logs[0], steps=40, interval_s=0))
    log_writer.finish(log_writer(logs[1], steps=35, interval_s=0, seed=5))
    server = mstail_server(*logs, args=("--token", TOKEN))
    target = server.url.split("//", 1)[1]
    prometheus = prometheus_for([target], TOKEN)

    up = wait_until(lambda: [r for r in prometheus.query('up{job="mstail"}') if r["value"][1] == "1"], 20,
                    interval=0.2, message="the mstail target up in Prometheus")
    assert up[0]["metric"]["instance"] == target

    def loss_by_source() -> Dict[str, float]:
        return {r["metric"]["source"]: float(r["value"][1]) for r in prometheus.query('mstail_metric{metric="loss"}')}

    losses = wait_until(lambda: len(loss_by_source()) == 2 and loss_by_source(), 15, interval=0.2,
                        message="loss of both sources in Prometheus")
    assert losses == {"rank_0": expected_loss(40), "rank_1": expected_loss(35, seed=5)}
    steps = {r["metric"]["source"]: float(r["value"][1]) for r in prometheus.query("mstail_last_step")}
    assert steps == {"rank_0": 40.0, "rank_1": 35.0}
    assert prometheus.query('mstail_records_total{source="rank_1"}')[0]["value"][1] == "35"

    # Training goes on: the next scrapes carry the new step and loss.
    log_writer.finish(log_writer(logs[0], steps=10, interval_s=0.02, start_step=41))
    wait_until(lambda: prometheus.query('mstail_last_step{source="rank_0"} == 50'), 15, interval=0.2,
               message="step 50 in Prometheus")
    assert loss_by_source()["rank_0"] == expected_loss(50)
    # PromQL over the stored samples: the step moved from 40 to 50 within the last minute.
    span = prometheus.query('max_over_time(mstail_last_step{source="rank_0"}[1m]) - '
                            'min_over_time(mstail_last_step{source="rank_0"}[1m])')
    assert float(span[0]["value"][1]) == 10.0
    assert "level=error" not in prometheus.log.read_text()
