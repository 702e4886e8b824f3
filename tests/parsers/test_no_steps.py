"""Logs without step lines give no record: MindSpore's glog INFO and WARNING files (its C++ and Python loggers), config
and dataset dumps, pip and compiler output (tests/parsers/no_steps/, written from the real formats). Their counters
("Number repeats per epoch : 1 [workers: 2]", "step: 1875", "Step 3/12 : RUN ...") beside numbers made steps of them.
Line by line here, and through `mstail parse` (its block path); live in tests/tailer/test_generic_sources.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .support import ROOT, parse_file

NO_STEPS = sorted((Path(__file__).parent / "no_steps").glob("*.log"))


def test_the_corpus_holds_every_kind() -> None:
    assert [path.stem for path in NO_STEPS] == ["compiler_output", "config_dump", "dataset_dump", "mindspore_glog_info",
                                                "mindspore_glog_warning", "pip_install"]


@pytest.mark.parametrize("path", NO_STEPS, ids=[path.stem for path in NO_STEPS])
def test_a_log_without_step_lines_gives_no_record(path: Path) -> None:
    records, _, parser = parse_file(path)
    assert records == [], records[:3]
    assert parser.counts["amends"] == 0


@pytest.mark.slow  # runs `python -m mstail`
def test_mstail_parse_gives_no_record_of_them() -> None:
    result = subprocess.run([sys.executable, "-m", "mstail", "parse", *map(str, NO_STEPS), "--to", "jsonl", "--events"],
                            capture_output=True, cwd=str(ROOT), timeout=60)
    assert result.returncode == 3, result.stderr  # no format recognises them: exit 3 with the hint, not an error
    assert [row for row in result.stdout.decode().splitlines() if '"kind"' not in row] == []
    assert b" 0 records, " in result.stderr
