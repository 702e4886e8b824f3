"""The log's times on the page, in real headless Chromium against a real mstail: an alert raised by a log line shows
that line's time (a log written months ago shows that day, not the moment mstail read it), and "read time" only where
the log has no time, in the alerts list and in an event's text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .browser import dashboard, wait_js

pytestmark = pytest.mark.browser

LOGGED = 1_748_779_200.0  # 2025-06-01 12:00 UTC: the log's own times, long before the test runs


def _jsonl(path: Path, timed: bool) -> Path:
    path.parent.mkdir(parents=True)
    lines = [{"step": s, "loss": "NaN" if s == 10 else 2.0 + 0.01 * s, **({"time": LOGGED + s} if timed else {})}
             for s in range(1, 21)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.mark.timeout(90)
def test_an_alert_shows_its_log_lines_time(browser: Any, mstail_server: Any, tmp_path: Path) -> None:
    timed = _jsonl(tmp_path / "timed" / "metrics.jsonl", True)
    untimed = _jsonl(tmp_path / "untimed" / "metrics.jsonl", False)
    server = mstail_server(args=["--jsonl", str(timed), "--jsonl", str(untimed)])
    server.wait_records(40)
    table = server.get_json("/api/alerts")
    alerts = {a["source"]: a for a in table["active"] + table["resolved"] if a["rule"] == "nonfinite"}
    assert set(alerts) == {"timed", "untimed"} and alerts["timed"]["last_seen"] > LOGGED + 86400  # read, not logged
    with dashboard(browser, server.url) as watched:
        page = watched.page
        page.click("#alerts-badge")
        when = "s => { const r = document.querySelector(`#alerts-list li[data-id='${s}'] .when`);" \
               " return r && r.textContent.includes('…') ? null : r && r.textContent; }"
        wait_js(page, when, arg=alerts["timed"]["id"])
        wait_js(page, when, arg=alerts["untimed"]["id"])
        logged = page.evaluate("t => new Date(t * 1000).toLocaleString()", LOGGED + 10)
        assert page.evaluate(when, alerts["timed"]["id"]) == logged
        read = page.evaluate(when, alerts["untimed"]["id"])
        assert read.endswith("(read time)") and "2025" not in read, read
        watched.assert_clean()


@pytest.mark.timeout(90)
def test_an_event_without_a_log_time_says_read_time(browser: Any, mstail_server: Any, tmp_path: Path) -> None:
    # print()-style lines carry no time: the traceback's event and its alert have the moment mstail read them
    log = tmp_path / "train.log"
    lines = [f"epoch: 1 step: {s}, loss is {2.0 + 0.01 * s}" for s in range(1, 11)]
    lines += ["Traceback (most recent call last):", '  File "train.py", line 3, in <module>', "RuntimeError: boom",
              "epoch: 1 step: 11, loss is 2.2"]
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    server = mstail_server(log)
    server.wait_records(11)
    [alert] = server.get_json("/api/alerts")["active"]
    with dashboard(browser, server.url) as watched:
        page = watched.page
        wait_js(page, "() => (window.mstail.option('loss').series.find(s => s.id === 'events') || {data: []})"
                      ".data.some(d => d.item.kind === 'error')")
        marker = page.evaluate("() => window.mstail.option('loss').series.find(s => s.id === 'events').data"
                               ".find(d => d.item.kind === 'error')")
        x, y = page.evaluate("([s, y]) => window.mstail.pixel('loss', s, y)", [marker["item"]["step"], marker["value"][1]])
        page.mouse.click(x, y)
        wait_js(page, "() => !document.getElementById('detail').hidden")
        assert page.text_content("#detail-title").endswith("(read time)"), page.text_content("#detail-title")
        page.click("#alerts-badge")
        when = f"#alerts-list li[data-id='{alert['id']}'] .when"
        wait_js(page, "s => !!document.querySelector(s) && !document.querySelector(s).textContent.includes('…')",
                arg=when)
        assert page.text_content(when).endswith("(read time)"), page.text_content(when)
        watched.assert_clean()
