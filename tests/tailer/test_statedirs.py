"""`mstail state list` / `mstail state prune` over real states: written by real mstail runs and by StateDB, one
held by a running mstail (or an open StateDB), which prune never removes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from mstail.tailer.history.db import StateDB, state_file
from tests.conftest import ROOT

DAY = 86400


def state(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mstail", "state", *args], capture_output=True, text=True,
                          timeout=30, cwd=str(ROOT))


def names(folder: Path) -> List[str]:
    return sorted(p.name for p in folder.iterdir())


def _log(folder: Path) -> Path:
    folder.mkdir(parents=True)
    log = folder / "train.log"
    log.write_text("epoch: 1 step: 1, loss is 2.5\nepoch: 1 step: 2, loss is 2.4\n")
    return log


def listed_states(folder: Path) -> Dict[str, Tuple[str, str]]:
    """`mstail state list`: log -> (its state's file name, status)."""
    listed = state("list", "--state-dir", str(folder))
    assert listed.returncode == 0, listed.stderr
    found, current = {}, ("", "")
    for line in listed.stdout.splitlines()[1:]:
        if line.startswith("    "):
            found[line.strip()] = current
        else:  # "2026-12-07 20:25    52.3 KB  idle    NAME.sqlite"
            status = "in use" if "  in use  " in line else "idle" if "  idle  " in line else "other"
            current = (line.split()[-1], status)
    return found


def test_list_and_prune_states_whose_logs_are_gone_never_one_in_use(mstail_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "states"
    done_log, running_log = _log(tmp_path / "done"), _log(tmp_path / "running")
    done = mstail_server(done_log, args=("--state-dir", str(folder)))
    done.wait_records(2)
    assert done.stop() == 0
    running = mstail_server(running_log, args=("--state-dir", str(folder)))
    running.wait_records(2)
    states = listed_states(folder)
    assert set(states) == {str(done_log), str(running_log)}
    (done_state, done_status), (running_state, running_status) = states[str(done_log)], states[str(running_log)]
    assert (done_status, running_status) == ("idle", "in use") and done_state != running_state
    assert f"{done_state}.lock" in names(folder)
    size = next(line for line in state("list", "--state-dir", str(folder)).stdout.splitlines() if done_state in line)
    assert " KB " in size or " MB " in size

    done_log.unlink()
    running_log.unlink()
    everything = names(folder)
    dry = state("prune", "--missing-logs", "--dry-run", "--state-dir", str(folder))
    assert dry.returncode == 0 and dry.stdout.splitlines() == [f"would remove {done_state} " + dry.stdout.split(" ", 3)[3].strip()], dry
    assert "its logs are gone" in dry.stdout and names(folder) == everything  # nothing removed
    pruned = state("prune", "--missing-logs", "--state-dir", str(folder))
    assert pruned.returncode == 0 and pruned.stdout.startswith(f"removed {done_state} "), pruned
    assert "1 in use by a running mstail kept" in pruned.stderr
    assert not any(name.startswith(done_state) for name in names(folder))
    assert running_state in names(folder) and f"{running_state}.lock" in names(folder)
    assert running.get_json("/healthz") is not None  # the running mstail goes on

    assert running.stop() == 0
    again = state("prune", "--missing-logs", "--state-dir", str(folder))
    assert again.returncode == 0 and again.stdout.startswith(f"removed {running_state} "), again
    assert names(folder) == []


@pytest.mark.slow  # runs `python -m mstail`
def test_prune_older_than_an_age_keeps_recent_and_held_states(tmp_path: Path) -> None:
    folder = tmp_path / "states"
    old, recent, held = (state_file(folder, label, f"{i:016x}") for i, label in enumerate(("old", "recent", "held")))
    for path in (old, recent, held):
        StateDB(path, expected=path.stem[-16:]).close()
    aside = folder / f"{old.name}.corrupt-{int(time.time()) - 30 * DAY}"
    aside.write_bytes(b"not a database")
    long_ago = time.time() - 10 * DAY
    for path in [*folder.iterdir()]:
        if not path.name.startswith("recent"):
            os.utime(path, (long_ago, long_ago))
    holder = StateDB(held, expected=held.stem[-16:])  # an mstail running on it: its lock taken
    try:
        os.utime(held, (long_ago, long_ago))
        os.utime(f"{held}.lock", (long_ago, long_ago))
        listed = state("list", "--state-dir", str(folder))
        assert listed.returncode == 0 and "set aside (corrupt)" in listed.stdout and "in use" in listed.stdout, listed
        assert listed.stdout.index(old.name) < listed.stdout.index(recent.name)  # least recently used first

        assert state("prune", "--older-than", "7x", "--state-dir", str(folder)).returncode == 2
        assert state("prune", "--state-dir", str(folder)).returncode == 2  # no criterion: nothing is guessed
        pruned = state("prune", "--older-than", "7d", "--state-dir", str(folder))
        assert pruned.returncode == 0, pruned
        assert pruned.stdout.count("removed ") == 2 and "1 in use by a running mstail kept" in pruned.stderr
        left = names(folder)
        assert not any(name.startswith("old") for name in left)
        assert recent.name in left and f"{recent.name}.lock" in left and held.name in left
    finally:
        holder.close()  # (its clean-close mark is a use: aged again below)
    os.utime(f"{held}.lock", (long_ago, long_ago))
    assert state("prune", "--older-than", "12h", "--state-dir", str(folder)).stdout.count("removed ") == 1  # held
    assert not any(name.startswith("held") for name in names(folder))
