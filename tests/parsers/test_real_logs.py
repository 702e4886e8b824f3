"""The real logs (written by real MindFormers 2.0.0 / MindSpore 2.10.0 runs, used as they are) and `mstail parse`
end to end through the CLI."""

from __future__ import annotations

import csv
import datetime
import io
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, List

import pytest

from .support import READ_TIME, ROOT, parse_file

REAL = Path(__file__).resolve().parents[1] / "real_logs"  # copies of shared/real-logs
MF_INFO = REAL / "mindformers-2.0.0_graph_output_log_rank_0_info.log"
MF_STDOUT = REAL / "mindformers-2.0.0_graph_stdout.log"
MS_STDOUT = REAL / "mindspore-2.10_lossmonitor_timemonitor_stdout.log"
MF_KEYS = {"loss", "loss_avg", "step_time_ms", "lr", "overflow", "loss_scale", "grad_norm", "throughput_tflops",
           "samples_per_s"}


def local(text: str) -> float:
    parsed = datetime.datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f")
    return time.mktime(parsed.timetuple()) + parsed.microsecond / 1e6


def step_lines(path: Path) -> List[int]:
    """1-based numbers of the lines holding an MFLossMonitor step ("{ Epoch:") in a file."""
    text = path.read_text(encoding="utf-8")
    return [n for n, line in enumerate(text.splitlines(), 1) if "{ Epoch:[" in line]


# -- MindFormers 2.0.0, graph mode, non-sink, 2 epochs x 25 steps ------------------------------------------------------
@pytest.mark.parametrize("path", [MF_INFO, MF_STDOUT], ids=["info.log", "stdout"])
def test_mindformers_real_log(path: Path) -> None:
    records, events, parser = parse_file(path)
    assert parser.format is not None and parser.format.name == "mindformers"
    assert len(records) == 50
    assert [r["step"] for r in records] == list(range(1, 51))
    assert [r["epoch"] for r in records] == [1] * 25 + [2] * 25
    assert [r["line"] for r in records] == step_lines(path)  # one record per step line, nothing else
    assert {r["segment"] for r in records} == {0}
    for record in records:
        assert set(record) - {"step", "epoch", "time", "segment", "line"} == MF_KEYS, record
        assert all(not isinstance(v, float) or math.isfinite(v) for v in record.values())
    first, last = records[0], records[-1]
    assert (first["loss"], first["loss_avg"], first["step_time_ms"], first["lr"]) == (4.894795, 4.894795, 8477, 0.0)
    assert (first["overflow"], first["loss_scale"], first["grad_norm"]) == (0, 65536.0, 2.0170105)
    assert (first["throughput_tflops"], first["samples_per_s"]) == (0.0, 0.2359)
    assert first["time"] == pytest.approx(local("2026-12-02 14:35:53,381"), abs=1e-6)
    assert (records[1]["loss"], records[1]["loss_avg"], records[1]["lr"]) == (4.84968, 4.872238, 0.0005)
    assert records[25]["loss"] == 4.68212 and records[25]["loss_avg"] == 4.68212  # epoch 2 resets the mean
    assert (last["loss"], last["loss_avg"], last["step_time_ms"], last["lr"]) == (4.726091, 4.659207, 36, 2.0694588e-06)
    assert (last["grad_norm"], last["throughput_tflops"], last["samples_per_s"]) == (1.9699429, 0.001, 55.29917)
    assert last["time"] == pytest.approx(local("2026-12-02 14:35:55,394"), abs=1e-6)
    assert all(a["time"] <= b["time"] for a, b in zip(records, records[1:]))
    assert [(e["kind"], e.get("step")) for e in events] == [("start", None), ("end", 50)]
    assert events[0]["time"] == pytest.approx(local("2026-12-02 14:35:44,879"), abs=1e-6)
    assert events[1]["time"] == pytest.approx(local("2026-12-02 14:35:55,397"), abs=1e-6)
    assert parser.counts["field_errors"] == 0 and parser.counts["unmatched_metric_lines"] == 0


def test_mindformers_info_log_and_stdout_give_the_same_records() -> None:
    info, _, _ = parse_file(MF_INFO)
    stdout, _, _ = parse_file(MF_STDOUT)
    strip = lambda rs: [{k: v for k, v in r.items() if k != "line"} for r in rs]  # noqa: E731
    assert strip(info) == strip(stdout)


# -- MindSpore 2.10 LossMonitor(5) + TimeMonitor, 3 epochs x 20 steps --------------------------------------------------
def test_mindspore_real_log() -> None:
    records, events, parser = parse_file(MS_STDOUT)
    assert parser.format is not None and parser.format.name == "mindspore"
    lines = MS_STDOUT.read_text(encoding="utf-8").splitlines()
    loss_lines = [n for n, line in enumerate(lines, 1) if line.startswith("epoch: ")]
    time_lines = [n for n, line in enumerate(lines, 1) if "epoch time:" in line]
    assert (len(loss_lines), len(time_lines)) == (12, 3)
    # 15 metric lines: one record per LossMonitor line, each TimeMonitor line attached to its epoch's last step.
    assert [r["line"] for r in records] == loss_lines
    assert [r["step"] for r in records] == list(range(5, 61, 5))
    assert [r["epoch"] for r in records] == [1] * 4 + [2] * 4 + [3] * 4
    assert all(r["time"] == READ_TIME for r in records)  # print() output has no timestamp: the read time, marked
    assert all(r["estimated"] == "time" for r in records)
    assert records[0]["loss"] == 2.3684120178222656
    assert records[-1]["loss"] == 0.07282037287950516
    timed = [(r["step"], r["epoch_time_ms"], r["step_time_ms"]) for r in records if "epoch_time_ms" in r]
    assert timed == [(20, 1316.218, 65.811), (40, 104.815, 5.241), (60, 37.335, 1.867)]
    assert all(set(r) - {"step", "epoch", "time", "estimated", "segment", "line"} == {"loss"} for r in records if r["step"] % 20)
    assert events == []
    assert parser.counts["field_errors"] == 0 and parser.counts["unmatched_metric_lines"] == 0


# -- `mstail parse` end to end -----------------------------------------------------------------------------------------
def run_cli(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "mstail", "parse", *args], capture_output=True, cwd=str(ROOT), timeout=60
    )
    assert result.returncode == 0, result.stderr.decode("utf-8", "replace")
    return result


def strict_json(line: str) -> Any:
    def refuse(name: str) -> Any:
        raise AssertionError(f"bare {name} in JSON output: {line}")

    return json.loads(line, parse_constant=refuse)


BARE_NON_FINITE = re.compile(r'(?<!")\b(?:NaN|-?Infinity|nan|inf)\b(?!")')


@pytest.mark.slow  # runs `python -m mstail`
def test_parse_to_jsonl_writes_nan_as_a_string() -> None:
    result = run_cli("sample_logs/mindformers_v1.8_nonsink_worker_0.log", "--to", "jsonl", "--events")
    text = result.stdout.decode("utf-8")
    assert not BARE_NON_FINITE.search(text), BARE_NON_FINITE.search(text)
    rows = [strict_json(line) for line in text.splitlines()]
    records = [r for r in rows if "kind" not in r]
    events = [r for r in rows if "kind" in r]
    assert [r["step"] for r in records] == list(range(1, 21))
    assert {r["source"] for r in rows} == {"mindformers_v1.8_nonsink_worker_0"}
    nan_step = records[6]
    for key in ("loss", "loss_avg", "lm_loss", "mtp_loss", "grad_norm"):
        assert nan_step[key] == "NaN", key
    assert records[7]["loss_avg"] == "NaN" and isinstance(records[7]["loss"], float)
    assert records[0]["loss"] == 15.507022 and records[0]["samples_per_s"] == 0.14181
    assert list(records[0])[:6] == ["source", "step", "epoch", "time", "segment", "line"]
    assert [e["kind"] for e in events] == ["start", "error"]
    assert b"20 records, 2 events" in result.stderr


@pytest.mark.slow  # runs `python -m mstail`
def test_parse_to_jsonl_infinity_and_null(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    run_cli("sample_logs/metrics.jsonl", "--to", "jsonl", "-o", str(out))
    text = out.read_text(encoding="utf-8")
    assert not BARE_NON_FINITE.search(text)
    records = [strict_json(line) for line in text.splitlines()]
    assert len(records) == 12
    assert (records[4]["loss"], records[4]["grad_norm"], records[5]["grad_norm"]) == ("NaN", "Infinity", "-Infinity")
    assert records[8]["grad_norm"] is None


@pytest.mark.slow  # runs `python -m mstail`
def test_parse_to_csv_writes_nan_as_text() -> None:
    result = run_cli("sample_logs/mindformers_v1.3_sink_info.log", "--to", "csv")
    rows = list(csv.DictReader(io.StringIO(result.stdout.decode("utf-8"))))
    assert len(rows) == 20
    assert list(rows[0])[:7] == ["source", "step", "epoch", "time", "time_s", "segment", "line"]
    assert {"loss", "lr", "grad_norm", "samples_per_s", "loss_scale", "overflow", "step_time_ms"} <= set(rows[0])
    assert [row["step"] for row in rows] == [str(s) for s in range(2, 41, 2)]
    nan_row = rows[5]
    assert (nan_row["step"], nan_row["loss"], nan_row["grad_norm"], nan_row["overflow"]) == ("12", "NaN", "NaN", "1")
    assert rows[0]["loss"] == "10.986" and rows[0]["lr"] == "0.0"
    assert all(row["loss"] != "nan" for row in rows)
    assert "nan" not in result.stdout.decode("utf-8").replace("NaN", "")


@pytest.mark.slow  # runs `python -m mstail`
def test_parse_detects_the_format_of_each_file() -> None:
    result = run_cli(
        "sample_logs/mindformers_v1.3_sink_info.log", "sample_logs/mindspore_lossmonitor.log",
        "sample_logs/mindformers_v1.8_nonsink_worker_0.log", str(MS_STDOUT), "--to", "jsonl",
    )
    rows = [strict_json(line) for line in result.stdout.decode("utf-8").splitlines()]
    per_source: dict = {}
    for row in rows:
        per_source[row["source"]] = per_source.get(row["source"], 0) + 1
    assert sorted(per_source.values()) == [12, 20, 20, 24]  # the LossMonitor sample's 24 steps (its eval amends one)
    stderr = result.stderr.decode("utf-8")
    assert "mindformers_v1.3_sink_info: mindformers" in stderr
    assert "mindformers_v1.8_nonsink_worker_0: mindformers" in stderr
    assert "mindspore_lossmonitor: mindspore" in stderr
    assert "76 records" in stderr


@pytest.mark.slow  # runs `python -m mstail`
def test_parse_real_mindformers_log_to_csv() -> None:
    result = run_cli(str(MF_INFO), "--to", "csv")
    rows = list(csv.DictReader(io.StringIO(result.stdout.decode("utf-8"))))
    assert len(rows) == 50
    assert (rows[0]["step"], rows[0]["loss"], rows[-1]["step"], rows[-1]["loss"]) == ("1", "4.894795", "50", "4.726091")
    assert float(rows[0]["time_s"]) == pytest.approx(local("2026-12-02 14:35:53,381"), abs=1e-3)
    shown = datetime.datetime.fromisoformat(rows[0]["time"])  # ISO 8601 with the zone's offset, as the page's CSV writes it
    assert shown.utcoffset() is not None and shown.timestamp() == pytest.approx(float(rows[0]["time_s"]), abs=1e-3)



@pytest.mark.slow  # runs `python -m mstail`
def test_parse_gives_no_time_where_the_log_has_none() -> None:
    # LossMonitor's print() lines and the traceback on stdout have no timestamp: no time at all (it gave the moment of
    # parsing); MindFormers' prefixed lines keep theirs. Live gives the read time, marked (`estimated`).
    result = run_cli(str(MS_STDOUT), "sample_logs/mindformers_v1.8_nonsink_worker_0.log", "--to", "jsonl", "--events")
    rows = [strict_json(line) for line in result.stdout.decode("utf-8").splitlines()]
    plain = [r for r in rows if r["source"] == MS_STDOUT.stem]
    prefixed = [r for r in rows if r["source"] == "mindformers_v1.8_nonsink_worker_0" and "kind" not in r]
    assert len(plain) == 12 and not any("time" in r or "estimated" in r for r in plain)
    assert len(prefixed) == 20 and all(isinstance(r["time"], float) and "estimated" not in r for r in prefixed)
