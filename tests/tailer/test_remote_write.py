"""`--remote-write`: every record in a real Prometheus (Debian's, its remote write receiver on), through a receiver
that stops for a while and an mstail restarted meanwhile (resumed from its checkpoint); and the pieces alone."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Dict

import cramjam
import pytest

from mstail.tailer.inputs.discovery import rank_of
from mstail.tailer.outbound.remotewrite import Batch, Stamps, _write_request_class, metric_name, read_url, UrlError

from .prom_support import prometheus, victoria_metrics

#: what a MindFormers step line and its progress line give (the writer's lines; `perplexity` is derived from loss)
METRICS = ("loss", "loss_avg", "step_time_ms", "lr", "overflow", "loss_scale", "grad_norm", "throughput_tflops",
           "perplexity", "samples_per_s")
SOURCES = ("rank_0", "rank_1")


def _counts(server: Any, source: str) -> Dict[str, int]:
    """metric -> samples Prometheus holds for it of `source` (mstail_step as "step")."""
    found = server.query(f'count_over_time({{__name__=~"mstail_.+", source="{source}"}}[1d])')
    return {r["metric"].get("metric", "step"): int(r["value"][1]) for r in found}


@pytest.mark.timeout(110)
def test_every_record_reaches_prometheus_through_its_downtime_and_a_restart(tmp_path: Path, mstail_server, log_writer,
                                                                            wait_until) -> None:  # type: ignore[no-untyped-def]
    receiver = prometheus(tmp_path / "prometheus")
    try:
        logs = [tmp_path / "logs" / source / "info.log" for source in SOURCES]
        # LossMonitor's lines carry no time: their records are stamped when read, all in one millisecond here
        plain = tmp_path / "logs" / "lossmonitor.log"
        plain.parent.mkdir(parents=True)
        plain.write_text("".join(f"epoch: 1 step: {step}, loss is {1.0 / step:.6f}\n" for step in range(1, 51)))
        args = ("--remote-write", f"{receiver.url}/api/v1/write", "--node", "node-7", "--log", str(plain))
        server = mstail_server(*logs, args=args)
        log_writer.finish(log_writer(logs, 60, 0.02, nan_at=[30]))
        want = {metric: 60 for metric in (*METRICS, "step")}  # step 30's NaN loss and perplexity included
        for source in SOURCES:
            wait_until(lambda: _counts(receiver, source) == want, 30, interval=0.2,
                       message=f"60 samples of every metric of {source} in Prometheus")
        wait_until(lambda: _counts(receiver, "lossmonitor") == {"loss": 50, "perplexity": 50, "step": 50}, 30,
                   interval=0.2, message="50 samples of every metric of the log without times")
        sample = receiver.query('mstail_loss{source="rank_1"}')[0]["metric"]
        assert sample == {"__name__": "mstail_loss", "source": "rank_1", "rank": "1", "metric": "loss", "node": "node-7"}

        receiver.stop()
        down_at = time.monotonic()
        log_writer.finish(log_writer(logs, 60, 0.02, start_step=61))
        server.wait_records(290)
        failing = wait_until(lambda: server.get_json("/healthz")["remote_write"]["failing_since"] is not None
                             and server.get_json("/healthz")["remote_write"], 15, interval=0.1,
                             message="the receiver's downtime on /healthz")
        assert failing["behind"] > 0 and failing["retries"] > 0, failing
        sent_before = failing["sent_seq"]
        assert server.stop() == 0

        server = mstail_server(*logs, args=args)  # the same state: the checkpoint is taken back
        resumed = server.get_json("/healthz")["remote_write"]
        assert 0 < resumed["sent_seq"] == sent_before, resumed
        time.sleep(max(0.0, 10 - (time.monotonic() - down_at)))  # the receiver down for 10 s in all
        receiver.start()
        want = {metric: 120 for metric in (*METRICS, "step")}
        for source in SOURCES:
            wait_until(lambda: _counts(receiver, source) == want, 60, interval=0.2,
                       message=f"120 samples of every metric of {source} in Prometheus after its downtime")
        stats = wait_until(lambda: server.get_json("/healthz")["remote_write"]["behind"] <= 2
                           and server.get_json("/healthz")["remote_write"], 10, message="everything sent")
        # the restarted mstail sent the second 60 steps only (11 series each, 2 sources), not the whole history again;
        # an amend read after the record it amended had been rewritten with it repeats its sample (identical)
        assert 60 * 11 * len(SOURCES) <= stats["samples_sent"] <= 60 * 12 * len(SOURCES), stats
        assert stats["failing_since"] is None and stats["samples_dropped"] == 0, stats
        exposition = _get_text(server.url + "/metrics")
        assert f"mstail_remote_write_samples_sent_total {float(stats['samples_sent'])}" in exposition
        assert "level=error" not in receiver.log.read_text()
    finally:
        receiver.stop()


@pytest.mark.timeout(90)
def test_every_record_reaches_victoria_metrics_started_after_them(tmp_path: Path, mstail_server, log_writer,
                                                                  wait_until) -> None:  # type: ignore[no-untyped-def]
    receiver = victoria_metrics(tmp_path / "vm")
    try:
        logs = [tmp_path / "logs" / source / "info.log" for source in SOURCES]
        server = mstail_server(*logs, args=("--remote-write", f"{receiver.url}/api/v1/write"))
        log_writer.finish(log_writer(logs, 30, 0.02))
        wait_until(lambda: server.get_json("/healthz")["remote_write"]["retries"] > 0, 15, interval=0.1,
                   message="the sender retrying while the receiver is not up")
        receiver.start()
        want = {metric: 30 for metric in (*METRICS, "step")}
        for source in SOURCES:
            wait_until(lambda: _counts(receiver, source) == want, 30, interval=0.3,
                       message=f"30 samples of every metric of {source} in VictoriaMetrics")
    finally:
        receiver.stop()


def _get_text(url: str) -> str:
    from tests.conftest import _NO_PROXY

    with _NO_PROXY.open(url, timeout=5) as response:
        return response.read().decode("utf-8")


def test_a_batch_is_a_snappy_write_request_of_sorted_labels() -> None:
    batch = Batch()
    batch.add((("__name__", "mstail_loss"), ("metric", "loss"), ("source", "a")), 1_000, 2.5)
    batch.add((("__name__", "mstail_loss"), ("metric", "loss"), ("source", "a")), 1_001, math.nan)
    message_class = _write_request_class()
    request = message_class.FromString(bytes(cramjam.snappy.decompress_raw(batch.encode(message_class))))
    (series,) = request.timeseries
    assert [(label.name, label.value) for label in series.labels] == [("__name__", "mstail_loss"), ("metric", "loss"),
                                                                      ("source", "a")]
    assert [s.timestamp for s in series.samples] == [1_000, 1_001]
    assert series.samples[0].value == 2.5 and math.isnan(series.samples[1].value)


def test_records_sharing_a_millisecond_get_the_next_free_one_and_a_resend_the_same() -> None:
    stamps = Stamps()
    given = [stamps.stamp("a", t) for t in (10.0, 10.0, 10.0, 10.001, 11.0)]
    assert given == [10_000, 10_001, 10_002, 10_003, 11_000]
    assert stamps.of_amend("a", 11.0) == 11_000
    again = Stamps({"a": [10_000, 10_000]})  # a checkpoint taken after the first record
    assert [again.stamp("a", t) for t in (10.0, 10.0, 10.001, 11.0)] == given[1:]
    assert stamps.stamp("a", 5.0) == 5_000  # the log's time went back (a new run): taken as it is


def test_names_and_ranks() -> None:
    assert metric_name("eval/acc-top1") == "mstail_eval_acc_top1"
    assert [rank_of(s) for s in ("exp1/rank_3", "worker_12", "run/device-7", "rank3", "exp/info")] == [
        "3", "12", "7", "3", None]


def test_the_url_comes_from_the_option_a_file_or_the_environment(tmp_path: Path) -> None:
    secret = tmp_path / "url"
    secret.write_text("# the receiver\n\nhttps://user:pw@mimir.example/api/v1/push\n", encoding="utf-8")
    assert read_url("--remote-write", path=str(secret)) == "https://user:pw@mimir.example/api/v1/push"
    assert read_url("--remote-write", default_env="X", environ={"X": " http://p:9090/api/v1/write "}) == \
        "http://p:9090/api/v1/write"
    assert read_url("--remote-write", default_env="X", environ={}) is None
    with pytest.raises(UrlError, match="--remote-write-file .*: no URL in it"):
        read_url("--remote-write", path=str(secret.with_name("empty")) if secret.with_name("empty").write_text("#\n")
                 is not None else "")
    with pytest.raises(UrlError, match="needs an http"):
        read_url("--remote-write", "prometheus:9090")


@pytest.mark.slow  # runs `python -m mstail`
@pytest.mark.parametrize("args, said", [
    (("--remote-write", "prometheus:9090/api/v1/write"), "--remote-write 'prometheus:9090/api/v1/write': needs an http"),
    (("--remote-write-file", "/nonexistent/url"), "--remote-write-file /nonexistent/url: cannot read it"),
    (("--alertmanager", "am:9093"), "--alertmanager 'am:9093': needs an http"),
])
def test_a_bad_url_is_one_line_and_exit_2(tmp_path: Path, args: tuple, said: str) -> None:
    from tests.hostile.test_user_mistakes import run

    done = run("--log", str(tmp_path / "train.log"), "--port", "0", *args)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and said in done.stderr, done.stderr


@pytest.mark.timeout(90)
def test_samples_the_receiver_refuses_are_dropped_counted_and_said_and_later_ones_go_on(
        tmp_path: Path, mstail_server, wait_until) -> None:  # type: ignore[no-untyped-def]
    receiver = prometheus(tmp_path / "prometheus", "global:\n  evaluation_interval: 1s\n")  # no out-of-order window
    try:
        log = tmp_path / "job7.jsonl"
        now = time.time()

        def append(steps: range, when: float) -> None:
            with open(log, "a", encoding="utf-8") as handle:
                handle.writelines(f'{{"step": {s}, "time": {when + s}, "loss": 1.5}}\n' for s in steps)

        append(range(1, 11), now - 60)
        server = mstail_server(args=("--jsonl", str(log), "--remote-write", f"{receiver.url}/api/v1/write"))
        wait_until(lambda: _counts(receiver, "job7").get("loss") == 10, 30, interval=0.2, message="the first steps")
        append(range(11, 21), now - 2 * 86400)  # two days old: beyond Prometheus' head without the window
        stats = wait_until(lambda: server.get_json("/healthz")["remote_write"]["batches_dropped"] == 1
                           and server.get_json("/healthz")["remote_write"], 30, interval=0.1, message="a refused batch")
        assert stats["samples_dropped"] == 10 * 3 and stats["last_error"].startswith("HTTP 400"), stats  # loss, perplexity, step
        append(range(21, 31), now - 40)  # after the first steps, and past: a query at now sees them
        wait_until(lambda: _counts(receiver, "job7").get("loss") == 20, 30, interval=0.2, message="the later steps")
        assert server.get_json("/healthz")["remote_write"]["failing_since"] is None
        assert server.stderr.count("a batch dropped") == 1, server.stderr
    finally:
        receiver.stop()
