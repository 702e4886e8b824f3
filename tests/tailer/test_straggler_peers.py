"""The straggler rule compares like with like: a rank's MindFormers info.log and its own JSONL (the pair the README
recommends) measure a step differently (per_step_time leaves out what the callback's wall time holds), so they are
never compared; ranks of one format still are. Real writer processes, a real mstail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import wait_until

STEPS = 30
JSONL_WRITER = r'''
import json, sys, time
path, step_ms, steps = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
with open(path, "a", buffering=1) as out:
    for step in range(1, steps + 1):
        out.write(json.dumps({"step": step, "time": time.time(), "loss": 3.0 - step / 100,
                              "step_time_ms": step_ms + step % 3}) + "\n")
        time.sleep(0.01)
'''


def test_a_ranks_info_log_and_its_jsonl_are_not_compared_but_other_ranks_are(
        tmp_path: Path, mstail_server: Any, log_writer: Any) -> None:
    info = [tmp_path / "output" / "log" / f"rank_{rank}" / "info.log" for rank in (0, 1)]
    metrics = tmp_path / "output" / "metrics"
    metrics.mkdir(parents=True)
    server = mstail_server(str(tmp_path / "output" / "log" / "rank_*" / "info.log"),
                           args=("--jsonl", str(metrics / "rank_*.jsonl")))
    mindformers = log_writer(info, steps=STEPS, interval_s=0.01)  # per_step_time 100-116 ms, ranks 0 and 1
    # the JSONL of rank 0 and rank 1 (wall time with the callback: 300 ms), and a slow rank 2 (600 ms)
    jsonl = [subprocess.Popen([sys.executable, "-c", JSONL_WRITER, str(metrics / f"rank_{rank}.jsonl"), str(ms),
                               str(STEPS)]) for rank, ms in ((0, 300), (1, 300), (2, 600))]
    for proc in jsonl:
        assert proc.wait(timeout=30) == 0
    log_writer.finish(mindformers)
    server.wait_records(5 * STEPS)
    ids = {Path(s["path"]).relative_to(tmp_path).as_posix(): s["id"] for s in server.get_json("/api/sources")}

    def stragglers() -> Any:
        return {a["source"] for a in server.get_json("/api/alerts")["active"] if a["rule"] == "straggler"}

    wait_until(stragglers, 10, message="the slow rank's straggler alert")
    assert stragglers() == {ids["output/metrics/rank_2.jsonl"]}


def test_logs_that_name_no_rank_are_never_compared(tmp_path: Path, mstail_server: Any) -> None:
    """Two experiments kept in one folder (`exp/lr1e-4`, `exp/lr3e-4_bs64`) are no ranks of one run: no straggler
    between them, however different their step times; ranks of a run beside them still are compared."""
    runs = {"exp/lr1e-4.jsonl": 100, "exp/lr3e-4_bs64.jsonl": 600,
            "job/rank_0.jsonl": 100, "job/rank_1.jsonl": 100, "job/rank_2.jsonl": 600}
    for name in runs:
        (tmp_path / name).parent.mkdir(exist_ok=True)
    server = mstail_server(args=("--logdir", str(tmp_path)))
    writers = [subprocess.Popen([sys.executable, "-c", JSONL_WRITER, str(tmp_path / name), str(ms), str(STEPS)])
               for name, ms in runs.items()]
    for proc in writers:
        assert proc.wait(timeout=30) == 0
    server.wait_records(len(runs) * STEPS)
    ids = {Path(s["path"]).relative_to(tmp_path).as_posix(): s["id"] for s in server.get_json("/api/sources")}

    def stragglers() -> Any:
        return {a["source"] for a in server.get_json("/api/alerts")["active"] if a["rule"] == "straggler"}

    wait_until(stragglers, 10, message="the slow rank's straggler alert")
    assert stragglers() == {ids["job/rank_2.jsonl"]}
