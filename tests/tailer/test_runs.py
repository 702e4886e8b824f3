"""Folders as runs (`mstail DIR`, `--logdir`, `mstail parse DIR`): which files a folder's walk finds, how each is
named by its run and rank, the walk's bounds, and the CLI's errors; a real mstail following a folder of runs that
real writer processes fill (a run added later included); `mstail parse DIR` against parsing each file."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from mstail.parsers import load_formats
from mstail.tailer.inputs.discovery import SourceNamer
from mstail.tailer.offline.reading import chains
from mstail.tailer.inputs.runs import HEAD_BYTES, RunFinder

from ..conftest import ROOT, finish_writer, spawn_writer, wait_until

REAL_LOGS = Path("/work/shared/real-logs")
INFO_LOG = REAL_LOGS / "mindformers-2.0.0_graph_output_log_rank_0_info.log"
STDOUT_LOG = REAL_LOGS / "mindformers-2.0.0_graph_stdout.log"
LOSS_MONITOR_LOG = REAL_LOGS / "mindspore-2.10_lossmonitor_timemonitor_stdout.log"
SAMPLE_LOGS = ROOT / "sample_logs"
FORMATS = load_formats()
CALLBACK_LINE = '{"step": 1, "epoch": 1, "time": 1764672000.0, "loss": 2.5, "lr": 0.0002}\n'


def touch(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def names(folder: Path, *more: Path) -> Dict[str, str]:
    """relative path -> source id, as the tailer names what a walk finds."""
    namer = SourceNamer()
    found = RunFinder([str(folder), *map(str, more)]).find()
    return {str(f.path.relative_to(folder)): namer.claim(f.path, f.names) for f in found}


# -- what a walk finds, and the names -------------------------------------------------------------------------
def test_three_layouts_are_named_by_run_and_rank(tmp_path: Path) -> None:
    touch(tmp_path / "exp1/output/log/rank_0/info.log")
    touch(tmp_path / "exp1/output/log/rank_1/info.log")
    touch(tmp_path / "exp1/output/log/rank_1/info.log.1")  # a rotated backup: part of rank_1's chain, not a source
    touch(tmp_path / "exp1/output/log/rank_1/error.log")
    touch(tmp_path / "exp2/output/msrun_log/worker_0.log")
    touch(tmp_path / "exp2/output/msrun_log/scheduler.log")  # the meta-server's glog lines: no steps
    touch(tmp_path / "exp3/output/metrics/rank_0.jsonl", CALLBACK_LINE)
    touch(tmp_path / "exp3/data/train.jsonl", '{"text": "a data set, not metrics"}\n')
    touch(tmp_path / "exp4/tensorboard/rank_0/events.out.tfevents.1764672000.host")
    touch(tmp_path / "exp4/summary/rank_0/events.out.events.summary.1764672000.host_MS")
    touch(tmp_path / "exp4/summary/rank_0/events.out.events.summary.1764672000.host_lineage")
    touch(tmp_path / "tb_run/events.out.tfevents.1764672000.host")  # TensorBoard's own layout: the folder is the run
    assert names(tmp_path) == {
        "exp1/output/log/rank_0/info.log": "exp1/rank_0",
        "exp1/output/log/rank_1/info.log": "exp1/rank_1",
        "exp2/output/msrun_log/worker_0.log": "exp2/worker_0",
        "exp3/output/metrics/rank_0.jsonl": "exp3/rank_0",
        "exp4/summary/rank_0/events.out.events.summary.1764672000.host_MS": "exp4/rank_0",
        "exp4/tensorboard/rank_0/events.out.tfevents.1764672000.host": "exp4/tensorboard/rank_0",
        "tb_run/events.out.tfevents.1764672000.host": "tb_run",
    }


def test_a_folder_that_is_the_run_is_named_by_itself_or_the_folder_above_its_layout(tmp_path: Path) -> None:
    touch(tmp_path / "exp1/output/log/rank_0/info.log")
    touch(tmp_path / "exp2/output/log/rank_0/info.log")
    assert names(tmp_path / "exp1") == {"output/log/rank_0/info.log": "exp1/rank_0"}
    namer = SourceNamer()
    found = RunFinder([str(tmp_path / "exp1/output/log"), str(tmp_path / "exp2")]).find()
    assert [(namer.claim(f.path, f.names), f.run) for f in found] == [("exp1/rank_0", "exp1"), ("exp2/rank_0", "exp2")]


def test_two_folders_of_one_name_are_told_apart(tmp_path: Path) -> None:
    touch(tmp_path / "a/exp/output/log/rank_0/info.log")
    touch(tmp_path / "b/exp/output/log/rank_0/info.log")
    found = RunFinder([str(tmp_path / "a/exp"), str(tmp_path / "b/exp")]).find()
    assert [f.run for f in found] == [str(tmp_path / "a/exp"), str(tmp_path / "b/exp")]


def test_a_run_with_worker_logs_is_read_through_them(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # msrun's worker log holds the same step lines as info.log (stdout) and the tracebacks: each rank once.
    touch(tmp_path / "exp1/output/log/rank_0/info.log")
    touch(tmp_path / "exp1/output/msrun_log/worker_0.log")
    touch(tmp_path / "exp2/output/log/rank_0/info.log")
    finder = RunFinder([str(tmp_path)])
    with caplog.at_level(logging.INFO, logger="mstail.runs"):
        assert [f.path.name for f in finder.find()] == ["worker_0.log", "info.log"]
        finder.find()
    said = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert said == ["exp1: read through its msrun worker_*.log; its rank_*/info.log repeat the same steps and are left "
                    "out (--log PATH follows one too)"]


def test_only_events_that_may_name_a_new_run_file_make_the_tailer_walk_again(tmp_path: Path) -> None:
    info = touch(tmp_path / "exp1/output/log/rank_0/info.log")
    touch(tmp_path / "exp1/output/msrun_log/worker_0.log")
    data = touch(tmp_path / "exp1/data.jsonl", '{"text": "a data set"}\n')
    (tmp_path / "exp2").mkdir()
    finder = RunFinder([str(tmp_path)])
    finder.find()
    may = {name: finder.may_name(str(tmp_path / name)) for name in (
        "exp2", "exp2/output/log/rank_0/info.log", "exp1/output/msrun_log/worker_1.log", "exp1/checkpoint/rank_0.ckpt")}
    assert may == {"exp2": True, "exp2/output/log/rank_0/info.log": True, "exp1/output/msrun_log/worker_1.log": True,
                   "exp1/checkpoint/rank_0.ckpt": False}
    # written all the time and never followed: an info.log read through its worker log, a data set's JSONL
    assert not finder.may_name(str(info)) and not finder.may_name(str(data))
    assert not finder.may_name("/elsewhere/output/log/rank_0/info.log")


def test_names_stay_unique_and_stable(tmp_path: Path) -> None:
    touch(tmp_path / "exp1/output/log/rank_0/info.log")
    namer = SourceNamer()
    first = RunFinder([str(tmp_path)]).find()
    assert [namer.claim(f.path, f.names) for f in first] == ["exp1/rank_0"]
    # later: a JSONL file and TensorBoard events of the same rank
    touch(tmp_path / "exp1/output/metrics/rank_0.jsonl", CALLBACK_LINE)
    touch(tmp_path / "exp1/tensorboard/rank_0/events.out.tfevents.1.host")
    touch(tmp_path / "exp1/tensorboard/rank_0/events.out.tfevents.2.host")  # a second writer, after a resume: one source
    touch(tmp_path / "exp1/tensorboard/rank_0/metrics.jsonl", CALLBACK_LINE)  # a third file of rank_0
    again = RunFinder([str(tmp_path)]).find()
    ids = [namer.claim(f.path, f.names) for f in again]
    assert ids == ["exp1/rank_0", "exp1/output/metrics/rank_0", "exp1/tensorboard/rank_0",
                   "exp1/tensorboard/rank_0/metrics.jsonl"]
    # a restart adopts the ids the state kept, whatever order files turn up in
    restarted = SourceNamer()
    for found, source in zip(again, ids):
        restarted.adopt(found.path, source)
    assert [restarted.claim(f.path, f.names) for f in reversed(again)] == ids[::-1]


def test_an_empty_jsonl_file_is_looked_at_again(tmp_path: Path) -> None:
    metrics = touch(tmp_path / "exp1/metrics/rank_0.jsonl")
    finder = RunFinder([str(tmp_path)])
    assert finder.find() == [] and finder.empty == [tmp_path]
    metrics.write_text(CALLBACK_LINE)
    assert [f.run for f in finder.find()] == ["exp1"] and finder.empty == []


# -- text logs found by what they hold ---------------------------------------------------------------------------
def folders_as_users_keep_them(root: Path) -> Dict[str, str]:
    """A folder of runs named by no convention: relative path -> the source id each run's log gets; the files that
    are no run's log are made too (prose, pip output, binary data, a log whose steps start after its first 64 KiB,
    mstail's own output and stderr, MindFormers' error.log)."""
    touch(root / "exp1/train.log", STDOUT_LOG.read_text())
    touch(root / "exp1/train.log.1", LOSS_MONITOR_LOG.read_text())  # a rotated backup: part of train.log's chain
    touch(root / "exp2/nohup.out", LOSS_MONITOR_LOG.read_text())
    touch(root / "mindspeed/megatron.log", (SAMPLE_LOGS / "megatron_mindspeed_llm.log").read_text())
    touch(root / "sft/trainer_log.txt", (SAMPLE_LOGS / "hf_trainer_stdout.log").read_text())
    touch(root / "exp3/notes.txt", "tried a lower learning rate; see the wiki for the plan\n")
    touch(root / "exp3/pip.log", "Collecting mindformers==1.3.0\nSuccessfully installed mindformers-1.3.0\n")
    (root / "exp3/data.log").write_bytes(b"\x00\x01\x02MRD" * 100 + LOSS_MONITOR_LOG.read_bytes())
    filler = "INFO - warming up the compiler cache, nothing to report yet\n"
    touch(root / "exp4/late.log", filler * (HEAD_BYTES // len(filler) + 1) + LOSS_MONITOR_LOG.read_text())
    touch(root / "exp5/output/log/rank_0/info.log", INFO_LOG.read_text())
    touch(root / "exp5/output/log/rank_0/error.log", "2026-12-01 10:00:00,000 - mindformers - ERROR - oops\n")
    parsed = subprocess.run([sys.executable, "-m", "mstail", "parse", str(LOSS_MONITOR_LOG)], capture_output=True,
                            check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    (root / "parsed.out").write_bytes(parsed)  # `mstail parse LOG > parsed.out`: mstail's own output
    (root / "parsed.jsonl").write_bytes(parsed)  # (JSON lines with a step, but each naming its source)
    own_stderr = "mstail: exp2/nohup.out -> exp2/nohup, format mindspore\n"  # `mstail runs/ 2> runs/mstail.log`
    touch(root / "mstail.log", own_stderr + LOSS_MONITOR_LOG.read_text())
    return {"exp1/train.log": "exp1/train", "exp2/nohup.out": "exp2/nohup", "exp5/output/log/rank_0/info.log":
            "exp5/rank_0", "mindspeed/megatron.log": "mindspeed/megatron", "sft/trainer_log.txt": "sft/trainer_log"}


UNRECOGNISED = ["exp3/data.log", "exp3/notes.txt", "exp3/pip.log", "exp4/late.log"]


@pytest.mark.slow  # runs `python -m mstail`
def test_text_logs_a_format_recognises_are_runs_and_the_others_are_said_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    expected = folders_as_users_keep_them(tmp_path)
    namer = SourceNamer()
    finder = RunFinder([str(tmp_path)], FORMATS)
    with caplog.at_level(logging.INFO, logger="mstail.runs"):
        found = finder.find()
        assert {str(f.path.relative_to(tmp_path)): namer.claim(f.path, f.names) for f in found} == expected
        assert {f.kind for f in found} == {"text"}
        assert finder.find() == found  # judged once: the same files, and nothing said again
    said = [r.getMessage() for r in caplog.records]
    assert said == ["not followed, no format recognises a step in the first 64 KiB of "
                    f"{', '.join(str(tmp_path / path) for path in UNRECOGNISED)} (a shorter one is looked at again as "
                    "it grows; see why: `mstail parse FILE --explain`, or give --pattern 'REGEX' with named groups)"]
    # without formats, a walk keeps to the names it knows (`--jsonl`-like callers)
    assert [str(f.path.relative_to(tmp_path)) for f in RunFinder([str(tmp_path)]).find()] == [
        "exp5/output/log/rank_0/info.log"]


def test_a_stdout_without_steps_yet_is_followed_once_its_first_step_comes(tmp_path: Path) -> None:
    stdout = touch(tmp_path / "exp1/stdout", "Loading the dataset\n")
    finder = RunFinder([str(tmp_path)], FORMATS)
    assert finder.find() == [] and finder.empty == [tmp_path]
    assert not finder.may_name(str(stdout))  # looked at just now: its own writes do not make the tailer walk again
    with open(stdout, "a") as out:
        out.write(LOSS_MONITOR_LOG.read_text())
    assert [f.path for f in finder.find()] == [stdout]
    assert not finder.may_name(str(stdout))


def test_a_walk_judges_heads_only_within_its_time(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    touch(tmp_path / "exp1/train.log", LOSS_MONITOR_LOG.read_text())
    with caplog.at_level(logging.INFO, logger="mstail.runs"):
        out_of_time = RunFinder([str(tmp_path)], FORMATS, heads_time_s=0.0)
        assert out_of_time.find() == [] and out_of_time.find() == []
    assert [r.getMessage() for r in caplog.records] == [
        "many text logs to look at for a format: some are looked at in the next walks (every 10 s)"]
    assert [f.run for f in RunFinder([str(tmp_path)], FORMATS, heads_time_s=60.0).find()] == ["exp1"]


def test_a_run_with_worker_logs_is_still_read_through_them_beside_its_other_logs(tmp_path: Path) -> None:
    touch(tmp_path / "exp1/output/log/rank_0/info.log", INFO_LOG.read_text())
    touch(tmp_path / "exp1/output/log/info.log", INFO_LOG.read_text())  # no rank folder: found by what it holds
    touch(tmp_path / "exp1/output/msrun_log/worker_0.log", STDOUT_LOG.read_text())
    found = RunFinder([str(tmp_path)], FORMATS).find()
    assert [str(f.path.relative_to(tmp_path)) for f in found] == ["exp1/output/msrun_log/worker_0.log"]


# -- links out of the folder ------------------------------------------------------------------------------------
def test_links_out_of_the_folder_are_not_opened_unless_asked(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    runs, outside = tmp_path / "runs", tmp_path / "outside"
    touch(runs / "exp1/output/msrun_log/worker_0.log", STDOUT_LOG.read_text())
    private = touch(outside / "private.log", STDOUT_LOG.read_text())
    (runs / "exp1/output/msrun_log/worker_5.log").symlink_to(private)
    (runs / "exp1/train.log").symlink_to(private)  # a text log found by what it holds
    touch(outside / "other_run/output/log/rank_0/info.log", INFO_LOG.read_text())
    (runs / "exp2").symlink_to(outside / "other_run")
    (runs / "latest").symlink_to(runs / "exp1")  # a link that stays inside: exp1, found once
    (tmp_path / "runs_link").symlink_to(runs)  # the folder given may be a link itself
    inside = ["exp1/output/msrun_log/worker_0.log"]
    with caplog.at_level(logging.WARNING, logger="mstail.runs"):
        for given in (runs, tmp_path / "runs_link"):
            finder = RunFinder([str(given)], FORMATS)
            assert [str(f.path.relative_to(given)) for f in finder.find()] == inside
            assert [str(f.path.relative_to(given)) for f in finder.find()] == inside
    said = [r.getMessage() for r in caplog.records if "outside" in r.getMessage()]
    links = {"exp1/output/msrun_log/worker_5.log": private, "exp1/train.log": private, "exp2": outside / "other_run"}
    assert sorted(said) == sorted(f"{given / link} is a link to {target}, outside {runs}: not opened "
                                  "(--follow-symlinks opens such links)" for given in (runs, tmp_path / "runs_link")
                                  for link, target in links.items())
    followed = RunFinder([str(runs)], FORMATS, follow_symlinks=True).find()
    assert sorted(str(f.path.relative_to(runs)) for f in followed) == [
        "exp1/output/msrun_log/worker_0.log", "exp1/output/msrun_log/worker_5.log", "exp1/train.log",
        "exp2/output/log/rank_0/info.log"]


def test_parse_of_a_folder_reads_no_rotated_backup_linked_out_of_it(tmp_path: Path) -> None:
    log = touch(tmp_path / "runs/exp1/train.log", LOSS_MONITOR_LOG.read_text())
    touch(tmp_path / "runs/exp1/train.log.2", LOSS_MONITOR_LOG.read_text())
    (tmp_path / "runs/exp1/train.log.1").symlink_to(touch(tmp_path / "outside/private.log", INFO_LOG.read_text()))
    (chain,) = chains([str(tmp_path / "runs")], FORMATS)
    assert chain.files == [tmp_path / "runs/exp1/train.log.2", log]
    (chain,) = chains([str(tmp_path / "runs")], FORMATS, follow_symlinks=True)
    assert chain.files == [tmp_path / "runs/exp1/train.log.2", tmp_path / "runs/exp1/train.log.1", log]


# -- the walk's bounds ----------------------------------------------------------------------------------------
def test_symlink_loops_end_and_a_linked_run_is_found_once(tmp_path: Path) -> None:
    touch(tmp_path / "real/exp1/output/log/rank_0/info.log")
    (tmp_path / "real/exp1/output/log/rank_0/loop").symlink_to(tmp_path / "real")
    (tmp_path / "real/latest").symlink_to(tmp_path / "real/exp1")
    found = RunFinder([str(tmp_path / "real")]).find()
    assert [str(f.path.relative_to(tmp_path)) for f in found] == ["real/exp1/output/log/rank_0/info.log"]


def test_bounds_are_said_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    touch(tmp_path / "a/b/c/d/output/log/rank_0/info.log")
    for n in range(30):
        touch(tmp_path / f"wide/x{n:02d}.txt")
    with caplog.at_level(logging.WARNING, logger="mstail.runs"):
        shallow = RunFinder([str(tmp_path)], max_depth=4)
        assert shallow.find() == [] and shallow.find() == []
        narrow = RunFinder([str(tmp_path)], max_entries=20)  # cut in `wide`, after `a` was walked
        assert [f.run for f in narrow.find()] == ["a/b/c/d"]
        few = RunFinder([str(tmp_path / "a")], max_files=0)
        assert few.find() == []
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"folders more than 4 levels below {tmp_path} are not looked into (give a folder closer to the "
                    "runs)",
                    f"stopped looking below {tmp_path} after 20 entries: some runs may be missing (give a folder "
                    "closer to the runs)",
                    f"more than 0 run files below {tmp_path / 'a'}: the others are not followed (give a folder closer "
                    "to the runs)"]


@pytest.mark.slow  # starts processes
def test_an_unreadable_folder_is_skipped_with_one_notice(tmp_path: Path) -> None:
    # As root, without the capabilities that let root read every folder whatever its mode.
    touch(tmp_path / "exp1/output/log/rank_0/info.log", INFO_LOG.read_text())
    touch(tmp_path / "exp2/output/log/rank_0/info.log", INFO_LOG.read_text())
    os.chmod(tmp_path / "exp2", 0o000)
    try:
        command = [sys.executable, "-m", "mstail", "parse", str(tmp_path)]
        if os.geteuid() == 0:
            drop = "-dac_override,-dac_read_search"
            command = ["setpriv", f"--inh-caps={drop}", f"--bounding-set={drop}", *command]
        result = subprocess.run(command, cwd="/", env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                                text=True, timeout=60)
    finally:
        os.chmod(tmp_path / "exp2", 0o755)
    assert result.returncode == 0, result.stderr
    assert {json.loads(line)["source"] for line in result.stdout.splitlines()} == {"exp1/rank_0"}
    assert result.stderr.count(f"cannot look into {tmp_path / 'exp2'} (Permission denied); skipped") == 1


# -- the CLI's errors ------------------------------------------------------------------------------------------
def mstail(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mstail", *args], cwd=str(ROOT), capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.slow  # starts processes
@pytest.mark.parametrize("case", ["serve missing", "serve a file", "a folder as --log", "parse missing", "parse empty"])
def test_a_missing_folder_a_file_or_an_empty_folder_is_one_line(tmp_path: Path, case: str) -> None:
    touch(tmp_path / "train.log")
    (tmp_path / "empty").mkdir()
    given = str(tmp_path / {"serve missing": "nope", "serve a file": "train.log", "a folder as --log": "empty",
                            "parse missing": "nope", "parse empty": "empty"}[case])
    args, expected = {
        "serve missing": (["--port", "0", given], f"no such folder: {given}"),
        "serve a file": (["--port", "0", given], f"{given} is a file, not a folder: follow it with --log {given}"),
        "a folder as --log": (["--log", str(tmp_path / "train.log"), given], f"{given} is a folder: follow the runs "
                              f"below it with `mstail {given}` (before any --log) or --logdir {given}, or give the logs "
                              f"in it, e.g. --log '{given}/*.log'"),
        "parse missing": (["parse", given], f"no such log file: {given}"),
        "parse empty": (["parse", given], f"no run files below {given} (looked for output/log/rank_N/info.log, "
                        "worker_N.log, mstail.callback's *.jsonl, event files, or a *.log, *.out, *.txt a format "
                        "recognises)"),
    }[case]
    result = mstail(*args)
    assert result.returncode == 2 and result.stderr == f"mstail: {expected}\n", result


@pytest.mark.slow  # starts processes
def test_formats_lists_the_input_kinds() -> None:
    result = mstail("formats")
    assert result.returncode == 0, result.stderr
    kinds = result.stdout.split("text formats:")[0].splitlines()[1:]
    assert [line.split()[0] for line in kinds] == ["text", "jsonl", "tensorboard", "summary", "folder", "peer"]
    assert "mindformers" in result.stdout.split("text formats:")[1]


# -- a real mstail on a folder of runs ---------------------------------------------------------------------------
@pytest.mark.timeout(90)
def test_a_folder_of_runs_is_followed_and_a_run_added_later_is_found(mstail_server, log_writer, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    server = mstail_server(args=[str(runs)])  # nothing below it yet: it waits, and says so
    wait_until(lambda: "waiting for one to appear" in server.stderr, 10, message="the notice that it waits")
    assert f"no run found below {runs} yet" in server.stderr
    assert server.get_json("/healthz")["waiting_for_runs"] == [str(runs)]
    writers = [log_writer([runs / f"exp{e}/output/log/rank_{r}/info.log" for r in range(2)], steps=20, interval_s=0.01,
                          seed=e) for e in (1, 2)]
    for writer in writers:
        finish_writer(writer)
    server.wait_records(80)
    # a third run starts later, with msrun worker logs
    later = log_writer([runs / "exp3/output/msrun_log/worker_0.log"], steps=10, interval_s=0.01)
    finish_writer(later)
    sources = server.wait_records(90, timeout=20)
    assert {(s["id"], s["run"], s["records"]) for s in sources} == {
        ("exp1/rank_0", "exp1", 20), ("exp1/rank_1", "exp1", 20), ("exp2/rank_0", "exp2", 20),
        ("exp2/rank_1", "exp2", 20), ("exp3/worker_0", "exp3", 10)}
    assert server.get_json("/healthz")["waiting_for_runs"] == []
    assert server.stderr.count("no run found below") == 1
    # a restart on the same folder continues the same history (the same state file): the same ids, runs and records
    assert server.stop() == 0
    again = mstail_server(args=[str(runs)])
    kept = re.compile(r"history kept in (\S+)")
    assert kept.search(again.stderr).group(1) == kept.search(server.stderr).group(1)  # type: ignore[union-attr]
    wait_until(lambda: all(s["run"] for s in again.get_json("/api/sources")), 10, message="the runs after a restart")
    assert {(s["id"], s["run"], s["records"]) for s in again.get_json("/api/sources")} == {
        (s["id"], s["run"], s["records"]) for s in sources}


def records_by_source(*args: str) -> Dict[str, int]:
    result = mstail("parse", *args)
    assert result.returncode == 0, result.stderr
    sources = [json.loads(line)["source"] for line in result.stdout.splitlines()]
    return {source: sources.count(source) for source in sources}


@pytest.mark.timeout(90)
def test_mstail_dir_follows_every_sample_log_and_a_text_log_that_appears_later(mstail_server, log_writer,
                                                                                 tmp_path: Path) -> None:
    runs = tmp_path / "sample_logs"
    shutil.copytree(SAMPLE_LOGS, runs)
    parsed = records_by_source(str(runs))
    assert len(parsed) == len(list(runs.glob("*.log"))) + len(list(runs.glob("*.jsonl"))) == 10
    server = mstail_server(args=[str(runs)])
    sources = server.wait_records(sum(parsed.values()), timeout=30)
    assert {s["id"]: s["records"] for s in sources} == parsed
    writer = log_writer([runs / "later/train.log"], steps=30, interval_s=0.05)
    finish_writer(writer)
    sources = server.wait_records(sum(parsed.values()) + 30, timeout=30)
    assert {s["id"]: s["records"] for s in sources} == {**parsed, "later/train": 30}
    assert "not followed" not in server.stderr and "README" not in server.stderr


# -- mstail parse DIR --------------------------------------------------------------------------------------------
@pytest.mark.slow  # starts processes
def test_parse_of_a_folder_finds_its_text_logs_by_what_they_hold(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    expected = folders_as_users_keep_them(runs)
    result = mstail("parse", str(runs))
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("not followed, no format recognises a step in the first 64 KiB of " + ", ".join(
        str(runs / path) for path in UNRECOGNISED)) == 1
    each = {expected[path]: count for path in expected
            for count in records_by_source(str(runs / path)).values()}  # each file alone (with its rotated backups)
    assert records_by_source(str(runs)) == each and all(each.values())


def parse(*args: str) -> List[dict]:
    result = mstail("parse", "--events", *args)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.mark.slow  # starts processes
@pytest.mark.timeout(90)
def test_parse_of_a_folder_equals_parsing_each_file(tmp_path: Path) -> None:
    layout = {"exp1/output/log/rank_0/info.log": "rank_0", "exp1/output/log/rank_1/info.log": "rank_1",
              "exp2/output/msrun_log/worker_0.log": "worker_0", "exp2/output/msrun_log/worker_1.log": "worker_1"}
    writer = spawn_writer([tmp_path / path for path in layout], steps=30, interval_s=0, max_bytes=4000, backup_count=9)
    finish_writer(writer)
    (tmp_path / "exp2/output/metrics").mkdir(parents=True)
    with open(tmp_path / "exp2/output/metrics/rank_0.jsonl", "w") as metrics:  # mstail.callback's shape
        for step in range(1, 11):
            metrics.write(json.dumps({"step": step, "time": 1764672000.0 + step, "loss": 3.0 - step / 10}) + "\n")
    assert list((tmp_path / "exp1/output/log/rank_0").glob("info.log.*"))  # rotated: chains are read whole
    whole = parse(str(tmp_path))
    files = {**layout, "exp2/output/metrics/rank_0.jsonl": "metrics/rank_0"}  # (`rank_0` is exp1's, given alone)
    walked = sorted(files)  # the walk's order: folder by folder, names sorted
    each = parse(*(str(tmp_path / path) for path in walked))  # every file given: named by the file alone
    as_run = {files[path]: path.split("/")[0] + "/" + files[path].split("/")[-1] for path in walked}
    each = [{**row, "source": as_run[row["source"]]} for row in each]
    assert parse("--format", "mindformers", str(tmp_path)) == whole  # forced on the text logs, not on the JSONL file
    counts = {source: sum(row["source"] == source for row in whole) for source in {row["source"] for row in whole}}
    assert counts == {"exp1/rank_0": 32, "exp1/rank_1": 32, "exp2/worker_0": 32, "exp2/worker_1": 32, "exp2/rank_0": 10}
    assert whole == each  # 30 steps, the start and the end of each log
