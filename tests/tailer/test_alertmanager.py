"""`--alertmanager`: two node mstails raising the same job-level alert through a real Alertmanager (Debian's) give one
notification, then its resolve; the labels of a rank's own alert; the posts' shape."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from mstail.tailer.outbound.alertmanager import Alertmanager

from .prom_support import alertmanager


class Receiver:
    """A webhook receiver on 127.0.0.1 that keeps every notification Alertmanager posts to it."""

    def __init__(self) -> None:
        self.notifications: List[Dict[str, Any]] = []
        received = self.notifications

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name
                received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def of(self, status: str) -> List[Dict[str, Any]]:
        return [n for n in list(self.notifications) if n["status"] == status]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.mark.timeout(90)
def test_two_nodes_raising_one_job_alert_give_one_notification_and_its_resolve(
        tmp_path: Path, mstail_server, log_writer, wait_until, receiver: Receiver) -> None:  # type: ignore[no-untyped-def]
    manager = alertmanager(tmp_path / "alertmanager", receiver.url)
    try:
        runs = [tmp_path / node / "exp1" for node in ("node_a", "node_b")]  # one job's run, on two nodes' disks
        logs = [run / "output" / "log" / f"rank_{rank}" / "info.log" for run, rank in zip(runs, (0, 8))]
        for log in logs:
            log.parent.mkdir(parents=True)
        servers = [mstail_server(args=("--logdir", str(run), "--alertmanager", manager.url, "--node", run.parent.name,
                                       "--alertmanager-interval", "1")) for run in runs]
        for log in logs:  # every rank's loss goes NaN at step 20 (the all-reduced loss), and back at step 21
            log_writer(log, 40, 0.02, nan_at=[20])
        firing = wait_until(lambda: receiver.of("firing"), 30, interval=0.1, message="a firing notification")
        resolved = wait_until(lambda: receiver.of("resolved"), 30, interval=0.1, message="the resolve's notification")
        for server in servers:  # both did post it
            assert server.get_json("/healthz")["alertmanager"][0]["sent"] >= 1
        assert len(receiver.of("firing")) == 1 == len(firing[0]["alerts"]), receiver.notifications
        alert = firing[0]["alerts"][0]
        assert alert["labels"] == {"alertname": "nonfinite", "job": "exp1", "severity": "critical"}
        assert "step 20" in alert["annotations"]["summary"]
        assert alert["generatorURL"] in {server.url + "/" for server in servers}
        assert [a["labels"] for a in resolved[0]["alerts"]] == [alert["labels"]]
        assert "level=error" not in manager.log.read_text()
    finally:
        manager.stop()


def _poster(active: List[Dict[str, Any]]) -> Alertmanager:
    return Alertmanager(["http://am:9093/"], lambda: active, lambda source: "exp1", "http://node:6150/", repost_s=60)


def test_a_ranks_own_alert_names_its_source_node_and_rank_and_resolves_at_once() -> None:
    error = {"rule": "error", "source": "exp1/rank_3", "severity": "error", "step": 7, "message": "RuntimeError: x",
             "first_seen": 1000.0, "state": "firing"}
    active: List[Dict[str, Any]] = [error]
    poster = _poster(active)
    assert dict(poster.labels(error)) == {"alertname": "error", "severity": "error", "job": "exp1",
                                          "source": "exp1/rank_3", "node": socket.gethostname(), "rank": "3"}
    poster.submit(error)
    active.clear()
    poster.submit({**error, "state": "resolved"})
    queue = poster.sender.queues[0]
    assert queue.target.url == "http://am:9093/api/v2/alerts"
    fired, ended = (item["alerts"][0] for item in queue.items)
    assert fired["startsAt"] == "1970-01-01T00:16:40.000Z" and fired["endsAt"] > fired["startsAt"]
    assert ended["endsAt"] < fired["endsAt"]  # resolved now, not at the firing post's end


def test_a_repost_sends_each_job_alert_once_and_a_job_alerts_resolve_waits_for_its_end() -> None:
    ranks = [{"rule": "nonfinite", "source": f"exp1/rank_{r}", "severity": "critical", "step": 20, "message": "NaN",
              "first_seen": 1000.0, "state": "firing"} for r in range(8)]
    poster = _poster(ranks)
    poster.repost()
    poster.submit({**ranks[0], "state": "resolved"})  # another node may still see it: not resolved from here
    (item,) = poster.sender.queues[0].items
    assert [a["labels"] for a in item["alerts"]] == [{"alertname": "nonfinite", "job": "exp1", "severity": "critical"}]


@pytest.mark.timeout(90)
def test_an_alert_raised_while_alertmanager_is_down_reaches_it_by_the_repost(
        tmp_path: Path, mstail_server, wait_until, receiver: Receiver) -> None:  # type: ignore[no-untyped-def]
    manager = alertmanager(tmp_path / "alertmanager", receiver.url)
    manager.stop()  # down: its port known, nothing listening
    try:
        log = tmp_path / "job7.jsonl"
        log.write_text("".join(f'{{"step": {s}, "loss": {"NaN" if s == 10 else 1.5}}}\n' for s in range(1, 11)))
        server = mstail_server(args=("--jsonl", str(log), "--alertmanager", manager.url, "--alertmanager-interval", "1"))
        wait_until(lambda: server.get_json("/healthz")["alertmanager"][0]["failed"] >= 1, 30, interval=0.2,
                   message="a post that failed (Alertmanager down)")
        manager.start()
        posted = wait_until(lambda: manager.get("/api/v2/alerts"), 30, interval=0.2, message="the alert re-posted")
        assert [a["labels"] for a in posted] == [{"alertname": "nonfinite", "severity": "critical"}]
        assert posted[0]["status"]["state"] == "active"
    finally:
        manager.stop()
