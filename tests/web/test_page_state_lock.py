"""The page says when another program holds the history's file locked, and stops saying it within a moment of the
release, in real headless Chromium against a real mstail following a live writer."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, List

import pytest

from ..hostile.state_lock import LockHolder
from .browser import dashboard, wait_js

pytestmark = pytest.mark.browser

BANNER = "() => { const b = document.getElementById('health'); return !b.hidden && b.textContent; }"


def test_the_banner_says_the_lock_and_goes_within_two_seconds_of_its_release(
        tmp_path: Path, mstail_server: Any, log_writer: Any, browser: Any) -> None:
    log, state_dir = tmp_path / "rank_0" / "info.log", tmp_path / "state"
    log.parent.mkdir()
    log.touch()
    server = mstail_server(log, args=("--state-dir", str(state_dir)))
    (state,) = state_dir.glob("*.sqlite")
    writer = log_writer(log, steps=200, interval_s=0.05)
    server.wait_records(5)
    with dashboard(browser, server.url) as watched:
        page = watched.page
        asked: List[float] = []  # when the page asked /healthz
        page.on("request", lambda request: asked.append(time.time()) if "/healthz" in request.url else None)
        holder = LockHolder(state, 10.0)  # the page asks /healthz every 5 s while all is well: it sees this one
        try:
            wait_js(page, BANNER, timeout=6_500)
            assert "database is locked" in page.evaluate(BANNER)
            shown = time.time()
            page.wait_for_timeout(3_500)
            assert time.time() < holder.held_at + 10.0, "the lock was released before the banner was watched"
            # while it shows a problem, the page asks again each second (not every 5 s): it goes soon after
            assert len([at for at in asked if at > shown]) >= 2, asked
            released = holder.wait()
        finally:
            holder.kill()
        wait_js(page, "() => document.getElementById('health').hidden", timeout=10_000)
        gone = time.time()
        assert gone - released < 2.5, f"the banner stayed {gone - released:.1f} s after the lock's release"
        others = [problem for problem in watched.problems if "/healthz" not in problem]  # (its 503s: expected)
        assert not others, others
    log_writer.finish(writer)
