"""Real Prometheus and Alertmanager servers (Debian's packages) started by a test on loopback, with temporary data."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from tests.conftest import _NO_PROXY

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
ALERTMANAGER = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
VICTORIA_METRICS = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"

#: prometheus.yml of a remote write receiver that takes samples up to a day old (a catch-up's, after its downtime)
RECEIVER_CONFIG = """\
global:
  evaluation_interval: 1s
storage:
  tsdb:
    out_of_order_time_window: 1d
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A started server process: `url`, `log` (its output), `stop()`, `start()` again on the same port and data."""

    def __init__(self, name: str, argv: Sequence[str], url: str, ready: str, folder: Path) -> None:
        self.name, self.argv, self.url, self.ready, self.folder = name, list(argv), url, ready, folder
        self.log = folder / f"{name}.log"
        self.proc: Optional["subprocess.Popen[bytes]"] = None

    def start(self) -> "Server":
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         cwd=str(self.folder))
        deadline = time.monotonic() + 30
        while True:
            try:
                with _NO_PROXY.open(self.url + self.ready, timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                pass
            assert self.proc.poll() is None, f"{self.name} exited with {self.proc.returncode}:\n{self.log.read_text()}"
            assert time.monotonic() < deadline, f"{self.name} not ready within 30 s:\n{self.log.read_text()}"
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        with _NO_PROXY.open(url, timeout=5) as response:
            return json.loads(response.read().decode("utf-8"))

    def query(self, promql: str) -> List[Dict[str, Any]]:
        """An instant PromQL query's result (Prometheus' and VictoriaMetrics' `/api/v1/query`)."""
        answer = self.get("/api/v1/query", query=promql)
        assert answer["status"] == "success", answer
        return answer["data"]["result"]


def prometheus(folder: Path, config: str = RECEIVER_CONFIG, receiver: bool = True) -> Server:
    """Prometheus on a free loopback port with `config`, its remote write receiver on unless `receiver` is False
    (started)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prometheus.yml").write_text(config, encoding="utf-8")
    port = _free_port()
    argv = [PROMETHEUS, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    if receiver:
        argv.append("--web.enable-remote-write-receiver")
    return Server("prometheus", argv, f"http://127.0.0.1:{port}", "/-/ready", folder).start()


def alertmanager(folder: Path, webhook_url: str, group_wait: str = "1s") -> Server:
    """Alertmanager on a free loopback port (no cluster), every alert routed to the webhook receiver at
    `webhook_url`, grouped by alertname, job and rule labels (started)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "alertmanager.yml"
    config.write_text(
        "route:\n"
        "  receiver: test\n"
        "  group_by: [alertname, job, source, node]\n"
        f"  group_wait: {group_wait}\n"
        "  group_interval: 1s\n"
        "  repeat_interval: 1h\n"
        "receivers:\n"
        "  - name: test\n"
        "    webhook_configs:\n"
        f"      - url: {webhook_url}\n"
        "        send_resolved: true\n",
        encoding="utf-8")
    port = _free_port()
    argv = [ALERTMANAGER, f"--config.file={config}", f"--storage.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", "--log.level=warn"]
    return Server("alertmanager", argv, f"http://127.0.0.1:{port}", "/-/ready", folder).start()


def victoria_metrics(folder: Path) -> Server:
    """VictoriaMetrics on a free loopback port, not started yet (`start()`): samples are visible to queries at once,
    and samples of a series sharing a timestamp are one (a resend's duplicates)."""
    folder.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    argv = [VICTORIA_METRICS, f"-httpListenAddr=127.0.0.1:{port}", f"-storageDataPath={folder / 'data'}",
            "-search.latencyOffset=0s", "-search.disableCache", "-dedup.minScrapeInterval=1ms", "-loggerLevel=WARN"]
    return Server("victoria-metrics", argv, f"http://127.0.0.1:{port}", "/health", folder)
