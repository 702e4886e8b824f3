"""A central mstail's page (`--peer`) in real headless Chromium: a node mstail paused (SIGSTOP) is shown unreachable
on its card within 5 s, saying since when; its sources keep their steps under the node's name."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from ..conftest import start_mstail, wait_until
from ..tailer.test_peers import free_port
from .browser import Watched, wait_js

pytestmark = pytest.mark.browser


@pytest.mark.timeout(90)
def test_a_paused_node_shows_unreachable_on_the_central_page_within_5_s(watched: Watched, tmp_path: Path) -> None:
    log = tmp_path / "rank_0.jsonl"
    log.write_text("".join(json.dumps({"step": step, "loss": 2.0 / step}) + "\n" for step in range(1, 6)))
    port = free_port("127.0.0.2")
    node = start_mstail([], tmp_path / "node", args=["--jsonl", str(log), "--host", "127.0.0.2", "--port", str(port)])
    central = start_mstail([], tmp_path / "central", args=["--peer", f"n1=http://127.0.0.2:{port}"])
    try:
        central.wait_records(5, timeout=30, source="n1/rank_0")
        page = watched.page
        page.goto(central.url + "/", wait_until="load")
        watched.wait_live()
        card = "#sources .source[data-source='n1']"
        wait_js(page, "c => document.querySelector(c) !== null", arg=card)
        assert page.get_attribute(card, "data-state") != "unreachable"
        node.proc.send_signal(signal.SIGSTOP)
        paused = time.monotonic()
        wait_js(page, "c => document.querySelector(c).dataset.state === 'unreachable'", arg=card, timeout=5_000)
        assert time.monotonic() - paused <= 5.5  # (the wait's own bound, plus its last poll)
        assert "node unreachable since" in page.inner_text(card)
        node.proc.send_signal(signal.SIGCONT)
        wait_js(page, "c => document.querySelector(c).dataset.state !== 'unreachable'", arg=card, timeout=15_000)
        assert page.locator("#sources .source[data-source='n1/rank_0']").count() == 1
        watched.assert_clean()
    finally:
        node.proc.send_signal(signal.SIGCONT)
        for server in (central, node):
            assert server.stop() is not None and "Traceback" not in server.stderr, server.stderr
        wait_until(lambda: node.proc.poll() is not None, 5)
