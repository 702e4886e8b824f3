"""The fast tier (`pytest -m "not slow"`) is fast by construction: a test not marked `slow` cannot start a process
(tests/conftest.py), and the tier collects without MindSpore installed (tests/callback/conftest.py)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from typing import Callable, Dict

import pytest

from tests.callback.conftest import selected_by_markers
from tests.conftest import _SPAWNED, ROOT


def _fork() -> None:
    if os.fork() == 0:
        os._exit(0)


SPAWNS: Dict[str, Callable[[], object]] = {
    "subprocess": lambda: subprocess.run([sys.executable, "-c", "pass"], timeout=30),
    "os.system": lambda: os.system("true"),
    "os.fork": _fork,
    "multiprocessing": lambda: multiprocessing.get_context("spawn").Process(target=int).start(),
}


@pytest.mark.parametrize("spawn", SPAWNS.values(), ids=list(SPAWNS))
def test_a_test_not_marked_slow_cannot_start_a_process(spawn: Callable[[], object],
                                                       request: pytest.FixtureRequest) -> None:
    with pytest.raises(RuntimeError, match="this test spawns a process .*: mark it slow"):
        spawn()
    assert request.node.stash[_SPAWNED]
    request.node.stash[_SPAWNED].clear()  # the refusal was the point here: this test passes


def test_a_test_that_swallows_the_refusal_still_fails(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("from tests.conftest import pytest_runtest_makereport, pytest_runtest_protocol\n")
    pytester.makepyfile(
        """
        import subprocess, sys

        def test_swallows():
            try:
                subprocess.run([sys.executable, "-c", "pass"], timeout=30)
            except RuntimeError:
                pass
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:benchmark")  # benchmark runs git
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*test_swallows*", "*this test spawns a process (subprocess.Popen)*"])


@pytest.mark.parametrize("markexpr, selected", [
    ("", True), ("not slow", False), ("not mindspore", False), ("slow", True), ("mindspore and not browser", True),
    ("browser", False),
])
def test_the_mindspore_modules_are_imported_only_when_selected(markexpr: str, selected: bool) -> None:
    assert selected_by_markers(markexpr) is selected


@pytest.mark.slow
def test_the_fast_tier_collects_without_mindspore() -> None:
    blocked = ("import sys; sys.modules['mindspore'] = None; import pytest; "
               "sys.exit(pytest.main(['--collect-only', '-q', '-m', 'not slow', '-p', 'no:cacheprovider']))")
    done = subprocess.run([sys.executable, "-c", blocked], cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
