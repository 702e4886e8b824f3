"""The dashboard in real headless Chromium (Debian's /usr/bin/chromium through Playwright) against a real mstail.

Every test watches the page for console errors and warnings, uncaught exceptions, failed requests and HTTP
errors, and fails on any of them. Screenshots go to tests/artifacts/ (page.png and page-dark.png: a finished log, light
and dark theme; page-live.png: after live appends).
"""

from __future__ import annotations

import datetime
import time

import pytest

from .browser import XSS_IMG, Watched, wait_js

pytestmark = pytest.mark.browser


def _serve_history(log, steps, log_writer, mstail_server):  # type: ignore[no-untyped-def]
    """Write `steps` steps to `log`, start mstail on it, wait until it holds them: (server, /api/sources)."""
    log_writer.finish(log_writer(log, steps=steps, interval_s=0))
    server = mstail_server(log)
    return server, server.wait_records(steps)


def _open(watched: Watched, url: str) -> None:
    watched.page.goto(url + "/", wait_until="load")
    watched.wait_live()


# -- (a) a log -> one chart per metric ----------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_every_metric_of_the_log_gets_a_chart(watched, mstail_server, log_writer, tmp_path, artifacts_dir):
    log = tmp_path / "output" / "log" / "rank_0" / "info.log"
    server, sources = _serve_history(log, 30, log_writer, mstail_server)
    metrics = {m for s in sources for m in s["metrics"]}
    # The v1.8 step + progress lines carry these at least; the page must show whatever the server found.
    assert {"loss", "loss_avg", "lr", "grad_norm", "step_time_ms", "loss_scale", "throughput_tflops",
            "samples_per_s"} <= metrics

    _open(watched, server.url)
    wait_js(watched.page, "n => document.querySelectorAll('section.chart').length >= n", arg=len(metrics))
    watched.wait_chart("loss", "points", 30)
    watched.show_all_charts()  # charts are fetched and drawn as they come near the screen
    charts = watched.charts()
    assert set(charts) == metrics
    assert all(c["points"] == 30 for c in charts.values()), charts
    assert all(c["nonfinite"] == 0 for c in charts.values()), charts
    assert watched.page.text_content("#connection").strip() == "live"
    assert watched.page.eval_on_selector_all("#sources .source .id", "els => els.map(e => e.textContent)") == ["rank_0"]
    assert watched.page.is_hidden("#empty")
    watched.page.screenshot(path=str(artifacts_dir / "page.png"), full_page=True)
    watched.page.screenshot(path=str(artifacts_dir / "ranks-1-light.png"))  # the first screen
    watched.page.click("#theme")  # the dark theme, one rank
    wait_js(watched.page, "() => document.documentElement.dataset.theme === 'dark'")
    watched.page.screenshot(path=str(artifacts_dir / "page-dark.png"), full_page=True)
    watched.page.evaluate("() => window.scrollTo(0, 0)")
    watched.page.screenshot(path=str(artifacts_dir / "ranks-1-dark.png"))
    watched.assert_clean()


# -- (b) live appends --------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_live_steps_reach_the_loss_chart(watched, mstail_server, log_writer, tmp_path, artifacts_dir):
    log = tmp_path / "output" / "log" / "rank_0" / "info.log"
    server, _ = _serve_history(log, 10, log_writer, mstail_server)
    _open(watched, server.url)
    watched.wait_chart("loss", "points", 10)

    writer = log_writer(log, steps=30, interval_s=0.05, start_step=11)  # the page is open: these arrive over SSE
    began = time.monotonic()
    watched.wait_chart("loss", "points", 40, timeout_ms=20_000)
    arrived_s = time.monotonic() - began
    log_writer.finish(writer)
    assert arrived_s < 20
    # Nothing arrives twice (history + stream overlap) and nothing more comes after the writer stopped.
    server.wait_records(40)
    time.sleep(1.0)  # > grace_s (0.5 s): anything still held would be out by now
    assert watched.charts()["loss"]["points"] == 40
    assert watched.page.text_content("#connection").strip() == "live"
    watched.page.screenshot(path=str(artifacts_dir / "page-live.png"), full_page=True)
    watched.assert_clean()


@pytest.mark.timeout(60)
def test_live_steps_reach_every_chart(watched, mstail_server, log_writer, tmp_path):
    """Every metric the history shows also grows live (the same record feeds all charts)."""
    log = tmp_path / "rank_0" / "info.log"
    server, sources = _serve_history(log, 5, log_writer, mstail_server)
    metrics = {m for s in sources for m in s["metrics"]}
    _open(watched, server.url)
    watched.wait_chart("loss", "points", 5)
    watched.show_all_charts()  # each chart has fetched its history once: from then on it keeps live points too
    log_writer.finish(log_writer(log, steps=10, interval_s=0.02, start_step=6))
    server.wait_records(15)
    watched.wait_chart("loss", "points", 15)
    time.sleep(1.0)
    charts = watched.charts()
    assert set(charts) == metrics
    stuck = {m: c["points"] for m, c in charts.items() if c["points"] != 15}
    assert not stuck, f"charts that did not get the live steps (points != 15): {stuck}"
    watched.assert_clean()


@pytest.mark.timeout(90)
def test_a_flood_of_streamed_steps_keeps_the_chart_bounded_and_then_shows_all_of_it(
        watched, mstail_server, log_writer, tmp_path):
    """Steps streamed faster than a page could draw them one by one (a history the sidecar is catching up on) keep
    the chart's points bounded (an answer's buckets plus LIVE_POINTS_MAX streamed points, merged two by two past
    that); the chart still holds all of them: the last step, a one-step spike and a NaN in the middle of the flood."""
    log = tmp_path / "output" / "log" / "rank_0" / "info.log"
    server, _ = _serve_history(log, 10, log_writer, mstail_server)
    _open(watched, server.url)
    watched.wait_chart("loss", "points", 10)
    bound = watched.page.evaluate("() => window.mstail.state.charts.get('loss').points()") + 500
    flood = bound + 4000
    writer = log_writer(log, steps=flood, interval_s=0, start_step=11, spike_at=(2011,), nan_at=(3011,))
    most = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the page's points while the flood is streamed
        most = max(most, watched.charts()["loss"]["points"])
        if writer.poll() is not None and sum(s["records"] for s in server.get_json("/api/sources")) >= 10 + flood:
            break
        time.sleep(0.02)
    log_writer.finish(writer)
    server.wait_records(10 + flood)

    wait_js(watched.page, "n => Math.max(...window.mstail.chartData('loss').map(l => l.x[l.x.length - 1])) === n",
            arg=10 + flood, timeout=15_000)
    assert most <= bound, f"the loss chart held {most} points during the flood (bound {bound})"
    lines = watched.page.evaluate("() => window.mstail.chartData('loss')")
    assert max(v for line in lines for v in line["max"] if v is not None) == 50.0  # the spike, in its bucket
    assert max(line["x"][-1] for line in lines) == 10 + flood
    watched.wait_chart("loss", "nonfinite", 1)
    watched.assert_clean()


# -- (c) a NaN loss ----------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_nan_loss_is_marked_live_and_after_reload(watched, mstail_server, log_writer, tmp_path):
    log = tmp_path / "rank_0" / "info.log"
    server, _ = _serve_history(log, 5, log_writer, mstail_server)
    _open(watched, server.url)
    watched.wait_chart("loss", "points", 5)
    assert watched.charts()["loss"]["nonfinite"] == 0

    log_writer.finish(log_writer(log, steps=10, interval_s=0.02, start_step=6, nan_at=(9,)))
    watched.wait_chart("loss", "nonfinite", 1)
    watched.wait_chart("loss", "points", 15)  # the NaN step is a point (a gap in the line), not dropped
    series = server.get_json("/api/series?metric=loss")["series"]
    assert [s["nonfinite"] for s in series] == [{"x": [9], "value": ["NaN"]}]

    # the alert: a row in the panel (opened by the badge) and a red marker on the loss chart, live ...
    page = watched.page
    wait_js(page, "() => !!document.querySelector('#alerts-list li[data-rule=\"nonfinite\"]')")
    watched.wait_chart("loss", "alertMarks", 1)
    assert page.is_hidden("#alerts-panel")
    page.click("#alerts-badge")
    assert page.is_visible("#alerts-list li[data-rule='nonfinite']")
    assert "rank_0 step 9" in page.text_content("#alerts-list li[data-rule='nonfinite'] .what")
    [alert] = [a for a in server.get_json("/api/alerts")["active"] + server.get_json("/api/alerts")["resolved"]]
    assert page.text_content("#alerts-count") == str(int(alert["state"] == "firing"))

    watched.reload()  # the history path (/api/series) marks it too
    watched.wait_chart("loss", "points", 15)
    watched.wait_chart("loss", "nonfinite", 1)
    watched.wait_chart("loss", "alertMarks", 1)  # ... and after a reload, from /api/alerts
    assert page.eval_on_selector_all("#alerts-list li", "els => els.map(e => e.dataset.rule)") == ["nonfinite"]
    watched.assert_clean()


# -- (d) markup from logs and paths stays text -------------------------------------------------------------
def _error_lines(message: str) -> str:
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
    return (
        f"[ERROR] {stamp} [mindformers/trainer/base_trainer.py:99] training_process: {message}\n"
        "Traceback (most recent call last):\n"
        '  File "run_mindformer.py", line 12, in <module>\n'
        f"    main({XSS_IMG!r})\n"
        f"ValueError: bad token {XSS_IMG}\n"
    )


@pytest.mark.timeout(60)
def test_markup_in_logs_and_paths_is_inert(watched, mstail_server, log_writer, wait_until, tmp_path):
    # A file name cannot hold "/", so `tmp_path / "<b>x</b>"` is two directories ("<b>x<" / "b>") and its
    # source id is "b>"; the second directory puts a complete tag into the source id itself.
    logs = [tmp_path / "<b>x</b>" / "info.log", tmp_path / "<b>x<img src=x onerror=window.__xss=2>" / "info.log"]
    for log in logs:
        log_writer.finish(log_writer(log, steps=5, interval_s=0))
        with open(log, "a", encoding="utf-8") as f:
            f.write(_error_lines(f"history {XSS_IMG}"))
    server = mstail_server(*logs)
    server.wait_records(10)
    wait_until(lambda: len(server.get_json("/api/events?kind=error")) >= 2, 10, message="2 error events")
    ids = sorted(s["id"] for s in server.get_json("/api/sources"))

    _open(watched, server.url)
    watched.wait_chart("loss", "points", 10)
    # Live too: an error with markup and more steps arrive while the page is open.
    for log in logs:
        with open(log, "a", encoding="utf-8") as f:
            f.write(_error_lines(f"live {XSS_IMG}"))
        log_writer.finish(log_writer(log, steps=3, interval_s=0, start_step=6))
    wait_until(lambda: len(server.get_json("/api/events?kind=error")) >= 4, 10, message="4 error events")
    watched.wait_chart("loss", "points", 16)
    assert any(XSS_IMG in e["message"] for e in server.get_json("/api/events?kind=error"))

    page = watched.page
    shown = page.eval_on_selector_all("#sources .source .id", "els => els.map(e => e.textContent)")
    assert sorted(shown) == ids  # the ids are on the page, as text
    assert any("<img" in i for i in ids)
    assert page.evaluate("typeof window.__xss") == "undefined"
    assert page.eval_on_selector_all("#sources b, #sources img", "els => els.length") == 0
    assert page.eval_on_selector_all("img", "els => els.length") == 0
    # the error alerts carry the same text into the alerts panel: as text
    wait_js(page, "() => document.querySelectorAll('#alerts-list li[data-rule=\"error\"]').length === 2")
    messages = page.eval_on_selector_all("#alerts-list li .message", "els => els.map(e => e.textContent)")
    assert all(XSS_IMG in m for m in messages), messages
    assert page.eval_on_selector_all("#alerts-panel img, #alerts-panel b", "els => els.length") == 0
    watched.assert_clean()


@pytest.mark.timeout(60)
def test_a_late_timemonitor_line_amends_its_step_on_the_page(watched, mstail_server, tmp_path):
    """A LossMonitor step is drawn at once; TimeMonitor's line, 1 s later, arrives as an amend: its times join the
    epoch's last step in their own charts, and the step stays one point (issue 15)."""
    log = tmp_path / "train.log"
    log.write_text("".join(f"epoch: 1 step: {s}, loss is {3 - s / 10:.4f}\n" for s in range(1, 4)), encoding="utf-8")
    server = mstail_server(log)
    server.wait_records(3)
    _open(watched, server.url)
    watched.wait_chart("loss", "points", 3)
    with open(log, "a", encoding="utf-8") as out:
        out.write("epoch: 1 step: 4, loss is 2.6000\n")
        out.flush()
        watched.wait_chart("loss", "points", 4)  # drawn at its line: nothing waits for the TimeMonitor line
        time.sleep(1.0)
        out.write("Train epoch time: 400.000 ms, per step time: 100.000 ms\n")
    watched.wait_chart("step_time_ms", "points", 1, timeout_ms=10_000)
    watched.show_all_charts()
    charts = watched.charts()
    assert charts["epoch_time_ms"]["points"] == 1 and charts["loss"]["points"] == 4
    records = server.get_json("/api/records?after=0")
    assert [(r["step"], r.get("step_time_ms")) for r in records] == [(1, None), (2, None), (3, None), (4, 100.0)]
    watched.assert_clean()
