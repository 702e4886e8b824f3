"""Source ids tell files apart in every layout, and never change once given."""

from __future__ import annotations

from pathlib import Path
from typing import List, Set, Tuple

from mstail.tailer.inputs.discovery import SourceNamer, WatchRoots, watch_roots


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


def test_watch_roots_worked_out_again_follow_folders_and_links_as_a_fresh_look_does(tmp_path: Path) -> None:
    """`WatchRoots` keeps resolved folders between looks: each look equals a fresh `watch_roots` as a run's folder
    appears, a link on the way is pointed elsewhere, and a folder is replaced by a link."""
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "rank_0").mkdir(parents=True)
    (b / "rank_0").mkdir(parents=True)
    link = tmp_path / "run"
    link.symlink_to(a)
    patterns = [str(link / "rank_0" / "info.log"), str(link / "rank_1" / "info.log"),
                str(tmp_path / "c" / "info.log"), str(tmp_path / "*" / "rank_0" / "worker_*.log")]
    roots = WatchRoots(patterns)

    def looks_fresh() -> Set[Tuple[Path, bool]]:
        found = roots()
        assert found == watch_roots(patterns)
        return found

    assert looks_fresh() == {(a / "rank_0", False), (a, True), (tmp_path, True)}
    (a / "rank_1").mkdir()
    assert (a / "rank_1", False) in looks_fresh()
    link.unlink()
    link.symlink_to(b)  # pointed elsewhere: b has no rank_1 yet
    assert looks_fresh() == {(b / "rank_0", False), (b, True), (tmp_path, True)}
    (tmp_path / "c").mkdir()
    assert (tmp_path / "c", False) in looks_fresh()
    (tmp_path / "c").rmdir()
    (tmp_path / "c").symlink_to(a / "rank_0")
    assert (a / "rank_0", False) in looks_fresh() and (tmp_path / "c", False) not in roots()
