"""The Prometheus rules and the Grafana dashboard shipped in docs/, checked against a real Prometheus fed by
`--remote-write`: promtool accepts them, every recording rule records series, every alert rule fires (or waits out
its `for`) on data made to raise it, and every dashboard query returns the written data."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from .prom_support import PROMTOOL, prometheus

DOCS = Path(__file__).resolve().parents[2] / "docs"
RULES = DOCS / "prometheus" / "rules.yml"
DASHBOARD = DOCS / "grafana" / "mstail.json"


def _jsonl(path: Path, times: List[float], step_ms: float, nan_last: bool = False) -> None:
    lines = []
    for step, when in enumerate(times, 1):
        loss = "NaN" if nan_last and step == len(times) else 2.0 + 1.0 / step
        lines.append(json.dumps({"step": step, "time": when, "loss": loss, "lr": 1e-4, "grad_norm": 1.5,
                                 "step_time_ms": step_ms, "throughput_tflops": 200.0}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.mark.slow  # runs promtool
def test_promtool_accepts_the_rules_and_the_config() -> None:
    for command in (["check", "rules", str(RULES)], ["check", "config", str(DOCS / "prometheus" / "prometheus.yml")]):
        done = subprocess.run([PROMTOOL, *command], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.timeout(100)
def test_every_rule_and_dashboard_query_answers_on_written_data(tmp_path: Path, mstail_server, wait_until) -> None:  # type: ignore[no-untyped-def]
    now = time.time()
    recent = [now - 295 + 5 * i for i in range(60)]  # the last 5 minutes
    _jsonl(tmp_path / "fast.jsonl", recent, 100.0)
    _jsonl(tmp_path / "slow.jsonl", recent, 400.0, nan_last=True)  # a straggler whose loss just went NaN
    _jsonl(tmp_path / "stalled.jsonl", [now - 1800 + 10 * i for i in range(30)], 100.0)  # silent for 25 minutes
    config = ("global:\n  evaluation_interval: 1s\nstorage:\n  tsdb:\n    out_of_order_time_window: 1d\n"
              f"rule_files:\n  - {RULES}\n")
    receiver = prometheus(tmp_path / "prometheus", config)
    try:
        args = ["--remote-write", f"{receiver.url}/api/v1/write"]
        for name in ("fast", "slow", "stalled"):
            args += ["--jsonl", str(tmp_path / f"{name}.jsonl")]
        mstail_server(args=args)
        for source, count in (("fast", 60), ("slow", 60), ("stalled", 30)):
            wait_until(lambda: receiver.query(f'count_over_time(mstail_step{{source="{source}"}}[1d])') and int(
                receiver.query(f'count_over_time(mstail_step{{source="{source}"}}[1d])')[0]["value"][1]) == count,
                30, interval=0.2, message=f"{count} steps of {source} in Prometheus")

        rules = [rule for group in receiver.get("/api/v1/rules")["data"]["groups"] for rule in group["rules"]]
        shipped = re.findall(r"^\s*- (?:record|alert): (\S+)$", RULES.read_text(encoding="utf-8"), re.M)
        assert sorted(rule["name"] for rule in rules) == sorted(shipped)
        for rule in rules:
            if rule["type"] == "recording":
                wait_until(lambda: receiver.query(rule["name"]), 15, interval=0.2,
                           message=f"series recorded by {rule['name']}")
            else:
                wait_until(lambda: receiver.query(f'ALERTS{{alertname="{rule["name"]}"}}'), 15, interval=0.2,
                           message=f"{rule['name']} raised")
        alerts: Dict[str, Any] = {a["labels"]["alertname"]: a for a in receiver.get("/api/v1/alerts")["data"]["alerts"]}
        assert alerts["MstailStraggler"]["labels"]["source"] == "slow"
        assert alerts["MstailNoNewSteps"]["labels"]["source"] == "stalled"
        evaluated = [rule for group in receiver.get("/api/v1/rules")["data"]["groups"] for rule in group["rules"]]
        assert [rule["lastError"] for rule in evaluated if rule["health"] != "ok"] == []

        dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                expr = target["expr"].replace("$run", ".*").replace("$source", ".*").replace("$__rate_interval", "5m")
                assert receiver.query(expr), f"panel {panel['title']!r}: {target['expr']} returned nothing"
        assert receiver.get("/api/v1/label/source/values", **{"match[]": "mstail_step"})["data"] == [
            "fast", "slow", "stalled"]  # the dashboard's $source choices
    finally:
        receiver.stop()
