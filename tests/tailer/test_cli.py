"""The `mstail` command as a user meets it: clear one-line errors, never a traceback for a mistake."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REAL_LOGS = Path(__file__).resolve().parents[1] / "real_logs"

pytestmark = pytest.mark.slow  # every test runs `python -m mstail`


def mstail(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mstail", *args], capture_output=True, text=True, timeout=timeout)


def assert_clean_error(result: subprocess.CompletedProcess, *phrases: str) -> None:
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("mstail: ") and result.stderr.count("\n") == 1, result.stderr
    for phrase in phrases:
        assert phrase in result.stderr


def test_help_explains_the_default_command() -> None:
    result = mstail("--help")
    assert result.returncode == 0 and "serve --help" in result.stdout
    serve = mstail("serve", "--help")
    for option in ("--log", "--port", "--poll", "--formats", "--pattern", "--jsonl"):
        assert option in serve.stdout


def test_nothing_to_follow() -> None:
    assert_clean_error(mstail(), "nothing to follow", "--log")


def test_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        result = mstail("--log", str(tmp_path / "info.log"), "--port", str(port))
    assert_clean_error(result, f"port {port}", "in use", "--port 0")


def test_bad_format_file_names_file_rule_and_reason(tmp_path: Path) -> None:
    bad = tmp_path / "mine.toml"
    bad.write_text("[[rule]]\nname = 'step'\nregex = '(?P<step>\\d+'\n")
    result = mstail("--log", str(tmp_path / "info.log"), "--formats", str(bad), "--port", "0")
    assert_clean_error(result, str(bad), "rule 'step'", "bad regex")


def test_bad_pattern_and_unknown_format(tmp_path: Path) -> None:
    assert_clean_error(mstail("--log", "x.log", "--pattern", "loss (\\d+)", "--port", "0"), "named groups")
    assert_clean_error(mstail("parse", str(REAL_LOGS / "mindspore-2.10_lossmonitor_timemonitor_stdout.log"), "--format", "nope"), "unknown format 'nope'")


def test_parse_missing_file() -> None:
    assert_clean_error(mstail("parse", "no/such/info.log"), "no such log file", "no/such/info.log")


def test_parse_real_mindformers_log_to_jsonl(tmp_path: Path) -> None:
    out = tmp_path / "records.jsonl"
    result = mstail("parse", str(REAL_LOGS / "mindformers-2.0.0_graph_output_log_rank_0_info.log"), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "50 records" in result.stderr and "mindformers" in result.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 51))
    assert rows[0]["loss"] == 4.894795 and rows[0]["grad_norm"] == 2.0170105 and rows[0]["samples_per_s"] == 0.2359
    assert all("seq" not in r and r["line"] > 0 for r in rows)


def test_parse_pattern_without_step_counts_matches(tmp_path: Path) -> None:
    log = tmp_path / "custom.log"
    log.write_text("train loss=3.5 acc=0.1\nnoise\ntrain loss=nan acc=0.2\n")
    result = mstail("parse", str(log), "--pattern", r"loss=(?P<loss>\S+) acc=(?P<acc>\S+)")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["step"], r["loss"], r["acc"]) for r in rows] == [(1, 3.5, 0.1), (2, "NaN", 0.2)]


@pytest.mark.parametrize("to", ["csv", "jsonl"])
def test_parse_rotated_chain_oldest_first(tmp_path: Path, to: str) -> None:
    lines = [f"epoch: 1 step: {i}, loss is {1.0 / i}\n" for i in range(1, 31)]
    (tmp_path / "train.log.2").write_text("".join(lines[:10]))
    (tmp_path / "train.log.1").write_text("".join(lines[10:20]))
    (tmp_path / "train.log").write_text("".join(lines[20:]))
    result = mstail("parse", str(tmp_path / "train.log"), "--to", to)
    assert result.returncode == 0, result.stderr
    if to == "jsonl":
        steps = [json.loads(line)["step"] for line in result.stdout.splitlines()]
    else:
        header, *rows = result.stdout.splitlines()
        steps = [int(row.split(",")[header.split(",").index("step")]) for row in rows]
    assert steps == list(range(1, 31))


def test_parse_explain_shows_rules_values_and_metric_looking_misses(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(
        "epoch: 1 step: 1, loss is 2.5\n"
        "some banner\n"
        "epoch: 1 step: 2, loss is nan\n"
        "Train epoch time: 10.000 ms, per step time: 5.000 ms\n"
        "custom: val_loss = 1.25\n"
    )
    result = mstail("parse", str(log), "--explain")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "train.log:1  mindspore/loss_monitor (record)  bare  epoch='1' step_in_epoch='1' loss=2.5"
    assert lines[1] == "train.log:3  mindspore/loss_monitor (record)  bare  epoch='1' step_in_epoch='2' loss=nan"
    assert lines[2].startswith("train.log:4  mindspore/time_monitor (attach)  bare  epoch_time_ms=10.0 step_time_ms=5.0")
    assert lines[3] == "train.log:5  NO RULE MATCHED, but it looks like a metric: custom: val_loss = 1.25"
    assert ": format mindspore\n" in result.stdout
    assert "        2  mindspore/loss_monitor (record)" in result.stdout
    assert "        1  lines that look like metrics but matched no rule" in result.stdout


@pytest.mark.parametrize("argv, option", [
    (("--log", "x.log", "--port", "abc"), "--port"),
    (("serve", "--log", "x.log", "--send-timeout", "soon"), "--send-timeout"),
    (("demo", "--ranks", "two"), "--ranks"),
    (("parse", "x.log", "--to", "xml"), "--to"),
    (("parse",), "LOG"),
    (("formats", "--bogus"), "--bogus"),
    (("--log", "x.log", "--bogus"), "--bogus"),
])
def test_a_bad_option_is_one_line_naming_the_commands_help(argv: tuple, option: str) -> None:
    result = mstail(*argv)
    assert_clean_error(result, "mstail: error: ", option)
    command = argv[0] if argv[0] in ("serve", "demo", "parse", "formats") else "serve"
    assert f"`mstail {command} --help`" in result.stderr and "usage:" not in result.stderr


@pytest.mark.parametrize("argv, option", [
    (("demo", "--ranks", "0", "--port", "0"), "--ranks"),
    (("demo", "--ranks", "100000", "--port", "0"), "--ranks"),
    (("demo", "--step-time", "nan", "--port", "0"), "--step-time"),
    (("--log", "x.log", "--poll", "nan", "--port", "0"), "--poll"),
    (("--log", "x.log", "--header-timeout", "inf", "--port", "0"), "--header-timeout"),
])
def test_a_value_out_of_range_is_one_line(argv: tuple, option: str) -> None:
    assert_clean_error(mstail(*argv), option, "needs")


def test_parse_of_a_log_no_format_matches_exits_3_with_the_hint(tmp_path: Path) -> None:
    log = tmp_path / "custom run.log"
    log.write_text("hello\nval: loss=2.5 acc=0.1\n")
    result = mstail("parse", str(log))
    assert result.returncode == 3 and result.stdout == "", result
    hint = result.stderr.splitlines()[-1]
    assert hint == (f"mstail: custom run: 1 line looks like a metric but no format matches; try "
                    f"`mstail parse '{log}' --explain`, or --pattern 'REGEX' with named groups")
    assert "3 when a log with lines in it matched no format" in " ".join(mstail("parse", "--help").stdout.split())


def test_parse_of_a_folder_parses_what_it_recognises_and_names_the_rest(tmp_path: Path) -> None:
    """rank_1 matches no format: named with the hint, exit 3. rank_2 holds only a MindFormers log's lines before its
    first step (its start event is recognised) and rank_3 is empty: logs with no records yet, not unrecognised."""
    logs = [tmp_path / "run" / f"rank_{rank}" / "info.log" for rank in range(4)]
    for log in logs:
        log.parent.mkdir(parents=True)
    logs[0].write_text("epoch: 1 step: 1, loss is 2.5\nepoch: 1 step: 2, loss is 2.4\n")
    logs[1].write_text("warming up\nnothing here\n")
    with open(REAL_LOGS / "mindformers-2.0.0_graph_output_log_rank_0_info.log") as real:
        logs[2].write_text("".join(line for line in real if "loss:" not in line and "step:" not in line))
    logs[3].write_text("")
    result = mstail("parse", str(tmp_path))
    assert result.returncode == 3, result
    assert [json.loads(line)["step"] for line in result.stdout.splitlines()] == [1, 2]
    (hint,) = [line for line in result.stderr.splitlines() if "no format matches" in line]
    assert hint.startswith("mstail: run/rank_1: no format matches and no line looks like a metric; try "
                           f"`mstail parse {logs[1]} --explain`")
