"""Source ids tell files apart in every layout, and never change once given."""

from __future__ import annotations

from pathlib import Path
from typing import List

from mstail.tailer.discovery import SourceNamer


def ids(*paths: str) -> List[str]:
    files = [Path(p) for p in paths]
    namer = SourceNamer()
    return [namer.name(path, files) for path in files]


def test_mindformers_rank_folders_are_named_by_their_folder() -> None:
    assert ids("/w/output/log/rank_0/info.log", "/w/output/log/rank_1/info.log") == ["rank_0", "rank_1"]


def test_msrun_worker_logs_are_named_by_their_file() -> None:
    assert ids("/w/output/msrun_log/worker_0.log", "/w/output/msrun_log/worker_1.log") == ["worker_0", "worker_1"]


def test_two_files_in_one_folder_are_named_by_their_files() -> None:
    # Before: `run/train.log` became `run` and `run/metrics.jsonl` became `s2_list/run`.
    assert ids("/w/s2_list/run/train.log", "/w/s2_list/run/metrics.jsonl") == ["run/train", "run/metrics"]


def test_an_id_once_given_stays_when_a_sibling_turns_up_later() -> None:
    namer = SourceNamer()
    first = Path("/w/run/train.log")
    assert namer.name(first, [first]) == "run"
    later = Path("/w/run/metrics.jsonl")
    assert namer.name(later, [first, later]) == "run/metrics"
    assert namer.name(first, [first, later]) == "run"


def test_ids_are_unique_when_folders_repeat_deeper() -> None:
    assert ids("/a/x/rank_0/info.log", "/b/x/rank_0/info.log") == ["rank_0", "x/rank_0"]
