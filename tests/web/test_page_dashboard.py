"""The dashboard's features in real headless Chromium against a real mstail following eight ranks.

One mstail and one page serve the whole module, so it costs one start-up; each test first sets the zoom and
smoothing it needs and puts back what else it changed (hidden ranks, theme, log scale), so any subset runs. Every test ends with no console
error, page error, failed request or HTTP error. Screenshots go to tests/artifacts/ (dashboard-8ranks-light.png and
-dark.png: the whole page; dashboard-8ranks-view.png and ranks-8-light.png: the first screen, which docs/screenshot.png
is a copy of; ranks-8-dark.png: the first screen, dark).

Smoothing is checked against an oracle written here (not imported from mstail): the debiased, step-aware EMA
of the exact series, at the steps the page shows, zoomed in and zoomed out.
"""

from __future__ import annotations

import csv
import io
import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, Iterator, List
from urllib.parse import parse_qsl

import pytest

from mstail.tailer.offline.output import csv_time

from ..conftest import finish_writer, spawn_writer, start_mstail, wait_until
from .browser import XSS_IMG, Watched, dashboard, show_chart, wait_js
from .test_page import _error_lines

pytestmark = pytest.mark.browser

RANKS = 8
STEPS = 3000
NAN_STEP = 1500


class Dash:
    def __init__(self, server: Any, watched: Watched, logs: List[Path]) -> None:
        self.server = server
        self.watched = watched
        self.page = watched.page
        self.logs = logs

    def data(self, metric: str) -> List[Dict[str, Any]]:
        return self.page.evaluate("m => window.mstail.chartData(m)", metric)

    def option(self, metric: str) -> Dict[str, Any]:
        return self.page.evaluate("m => window.mstail.option(m)", metric)

    def idle(self) -> None:
        wait_js(self.page, "() => document.body.dataset.busy === '0'")

    def zoom(self, lo: Any, hi: Any) -> None:
        self.page.evaluate("([a, b]) => window.mstail.zoomTo(a, b)", [lo, hi])
        self.idle()

    def smooth(self, weight: float) -> None:
        """Set the slider (as a user drags it) and wait for every chart's re-fetch."""
        if self.page.evaluate("window.mstail.view.smooth") == weight:
            return
        self.page.fill("#smooth", str(weight))
        wait_js(self.page, "w => location.hash.includes(`s=${w}`)", arg=str(weight))
        self.idle()
        wait_js(self.page, "() => window.mstail.chartData('loss').every(l => l.smooth.every(v => v !== null))")

    def show(self, *metrics: str) -> None:
        """Scroll each chart into view (charts are fetched and drawn as they come near the screen), then back up."""
        for metric in metrics:
            self.watched.show_chart(metric)
        self.page.evaluate("() => window.scrollTo(0, 0)")

    def hash(self) -> Dict[str, str]:
        return dict(parse_qsl(self.page.evaluate("location.hash").lstrip("#")))


@pytest.fixture(scope="module")
def dash(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dash]:
    root = tmp_path_factory.mktemp("dash")
    logs = [root / "output" / "log" / f"rank_{r}" / "info.log" for r in range(RANKS)]
    writers = [spawn_writer(log, steps=STEPS, interval_s=0, seed=r, nan_at=(NAN_STEP,) if r == 0 else ())
               for r, log in enumerate(logs)]
    for writer in writers:
        finish_writer(writer, timeout=60)
    with open(logs[0], "a", encoding="utf-8") as f:
        f.write(_error_lines(f"history {XSS_IMG}"))
    server = start_mstail([str(root / "output" / "log" / "rank_*" / "info.log")], root / "mstail")
    try:
        server.wait_records(RANKS * STEPS, timeout=60)
        wait_until(lambda: server.get_json("/api/events?kind=error"), 15, message="the error event")
        with dashboard(browser, server.url, accept_downloads=True) as watched:
            yield Dash(server, watched, logs)
    finally:
        code = server.stop()
    assert code is not None, "mstail did not exit on SIGINT"
    assert "Traceback" not in server.stderr, server.stderr


def _ema(steps: List[int], values: List[float], weight: float) -> Dict[int, float]:
    """The oracle: debiased EMA where a gap of k logging strides decays like k points."""
    deltas = [b - a for a, b in zip(steps[:17], steps[1:17]) if b > a]
    stride = min(deltas) if deltas else 1
    num = den = 0.0
    last = None
    out = {}
    for x, v in zip(steps, values):
        if isinstance(v, (int, float)) and math.isfinite(v):
            d = weight ** (((x - last) if last is not None else stride) / stride)
            num, den, last = d * num + (1 - d) * v, d * den + (1 - d), x
        out[x] = num / den if den else math.nan
    return out


def _exact(dash: Dash, metric: str, source: str) -> Dict[str, Any]:
    [entry] = [s for s in dash.server.get_json(f"/api/series?metric={metric}&source={source}&points=20000")["series"]]
    return entry


def _series_by_id(dash: Dash, metric: str, series_id: str) -> Dict[str, Any]:
    return next(s for s in dash.option(metric)["series"] if s["id"] == series_id)


def _line(dash: Dash, metric: str, source: str) -> Dict[str, Any]:
    [line] = [line for line in dash.data(metric) if line["source"] == source]
    return line


# -- layout: groups, header strip, heatmap, screenshots --------------------------------------------------------
@pytest.mark.timeout(120)
def test_charts_are_grouped_with_a_header_per_rank_and_a_heatmap(dash: Dash, artifacts_dir: Path) -> None:
    page = dash.page
    metrics = {m for s in dash.server.get_json("/api/sources") for m in s["metrics"]}
    assert set(dash.watched.charts()) == metrics
    groups = page.eval_on_selector_all("section.group", "els => els.map(e => [e.dataset.group, "
                                       "[...e.querySelectorAll('section.chart')].map(c => c.dataset.metric)])")
    assert [g for g, _ in groups] == ["loss", "optim", "speed"]
    by_group = dict(groups)
    assert {"loss", "loss_avg", "perplexity"} <= set(by_group["loss"])  # perplexity = exp(loss), derived
    assert {"lr", "grad_norm", "loss_scale"} <= set(by_group["optim"])
    assert {"step_time_ms", "throughput_tflops", "samples_per_s"} <= set(by_group["speed"])

    cards = page.eval_on_selector_all("#sources .source", "els => els.map(e => e.dataset.source)")
    assert cards == [f"rank_{r}" for r in range(RANKS)]
    card = "#sources .source[data-source='rank_0']"
    facts = dict(page.eval_on_selector_all(f"{card} .fact", "els => els.map(e => [e.querySelector('.label').textContent,"
                                           " e.querySelector('.value').textContent])"))
    assert facts["step"] == f"{STEPS} / {STEPS}"
    # rank_0 logged "Training Over!" and then an error (the fixture appends it): the error came last, so it died
    assert facts["ETA"] == "died"
    assert page.get_attribute(card, "data-state") == "died"
    assert page.text_content(f"{card} .state").startswith("died")
    assert page.text_content(f"{card} .ending").startswith("ValueError: bad token")  # how it ended, in words
    other = "#sources .source[data-source='rank_1']"
    assert page.get_attribute(other, "data-state") == "finished"  # "Training Over!" came last
    assert page.text_content(f"{other} .fact.eta .value") == "done"
    assert page.get_attribute(f"{other} .fact.since", "data-level") == "none"  # an ended run is never hang-red
    assert facts["step time"].endswith(" ms") and facts["throughput"].endswith("TFLOPS")
    assert facts["loss"] not in ("", "–") and facts["lr"] not in ("", "–")
    assert page.eval_on_selector_all(f"{card} .counters", "els => els.length") == 0  # behind the disclosure
    page.click("#file-details")
    wait_js(page, "s => !!document.querySelector(s)", arg=f"{card} .counters")
    counters = page.text_content(f"{card} .counters")
    assert "lines " in counters and "records 3000" in counters and "rotations 0" in counters
    assert "hang: judged by its writer" in counters  # a local file: silence with no writer is over, never hung
    assert "seq " in page.text_content("#summary")
    page.click("#file-details")
    wait_js(page, "s => !document.querySelector(s)", arg=f"{card} .counters")

    wait_js(page, "n => document.getElementById('heatmap').dataset.rows === String(n)", arg=RANKS)
    assert int(page.get_attribute("#heatmap", "data-cells")) >= RANKS * 10
    # y-axis labels are short (65536 -> 65.5k): nothing is clipped by the fixed gutter
    dash.show("loss_scale", "lr", "throughput_tflops")
    for metric in ("loss_scale", "lr", "throughput_tflops"):
        labels = page.evaluate("m => window.mstail.yLabels(m)", metric)
        texts = [t for t, _ in labels]
        assert len(texts) >= 2 and len(set(texts)) == len(texts), (metric, texts)  # distinct ticks
        assert all(width <= 56 - 8 for _, width in labels), (metric, labels)  # fit the 56 px gutter
    page.screenshot(path=str(artifacts_dir / "dashboard-8ranks-light.png"), full_page=True)
    page.evaluate("() => window.scrollTo(0, 0)")
    page.screenshot(path=str(artifacts_dir / "dashboard-8ranks-view.png"))  # the first screen (README)
    page.screenshot(path=str(artifacts_dir / "ranks-8-light.png"))
    page.click("#theme")
    wait_js(page, "() => document.documentElement.dataset.theme === 'dark'")
    assert dash.hash()["t"] == "dark"
    page.wait_for_timeout(300)
    page.screenshot(path=str(artifacts_dir / "dashboard-8ranks-dark.png"), full_page=True)
    page.evaluate("() => window.scrollTo(0, 0)")
    page.screenshot(path=str(artifacts_dir / "ranks-8-dark.png"))
    page.click("#theme")
    wait_js(page, "() => document.documentElement.dataset.theme === 'light'")
    dash.watched.assert_clean()


# -- zoom: linked, and re-fetched as exact points -----------------------------------------------------------
@pytest.mark.timeout(60)
def test_zoom_is_linked_and_fetches_exact_points(dash: Dash) -> None:
    page = dash.page
    full = _line(dash, "loss", "rank_1")
    assert page.get_attribute("section.chart[data-metric='loss']", "data-bucketed") == "1"
    assert len(full["x"]) < STEPS  # min/max buckets, not 3000 points
    assert all(lo <= hi for lo, hi in zip(full["min"], full["max"]))

    requests: List[str] = []
    page.on("request", lambda r: "/api/series?" in r.url and "start=" in r.url and requests.append(r.url))
    # A real wheel zoom over a chart: every chart follows (linked), and each asks the server for its range.
    plot = page.locator("section.chart[data-metric='grad_norm'] .plot")
    plot.scroll_into_view_if_needed()
    box = plot.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
    for _ in range(4):
        page.mouse.wheel(0, -300)
        page.wait_for_timeout(50)
    for _ in range(200):  # Playwright delivers request events while the page is driven: poll through it
        if any("metric=loss&" in u for u in requests):
            break
        page.wait_for_timeout(50)
    assert any("metric=loss&" in u for u in requests), requests
    dash.idle()
    zooms = page.evaluate("() => [...window.mstail.state.charts.values()].map(c => { const z = c.chart.getOption().dataZoom[0];"
                          " return [z.start, z.end]; })")
    assert zooms[0][1] - zooms[0][0] < 100 and all(z == zooms[0] for z in zooms), zooms
    assert "z" in dash.hash()

    page.evaluate("() => window.mstail.zoomTo(1400, 1600)")
    dash.idle()
    zoomed = _line(dash, "loss", "rank_1")
    inside = [x for x in zoomed["x"] if 1400 <= x <= 1600]
    assert inside == list(range(1400, 1601)), inside[:5]  # every step, exactly
    exact = _exact(dash, "loss", "rank_1")
    want = dict(zip(exact["x"], exact["last"]))
    assert all(zoomed["last"][i] == want[x] for i, x in enumerate(zoomed["x"]) if 1400 <= x <= 1600)
    dash.watched.assert_clean()


# -- smoothing: computed on every step, the same at any zoom; raw data untouched -----------------------------
@pytest.mark.timeout(60)
def test_smoothing_is_zoom_invariant_and_leaves_the_raw_data(dash: Dash) -> None:
    dash.smooth(0.6)  # the default
    dash.zoom(1400, 1600)
    exact = _exact(dash, "loss", "rank_1")
    oracle = _ema(exact["x"], exact["last"], 0.6)

    zoomed = _line(dash, "loss", "rank_1")
    pairs = [(x, s) for x, s in zip(zoomed["x"], zoomed["smooth"]) if 1400 <= x <= 1600]
    assert len(pairs) == 201
    assert all(math.isclose(s, oracle[x], rel_tol=1e-9) for x, s in pairs)
    raw_before = {x: v for x, v in zip(zoomed["x"], zoomed["last"]) if 1400 <= x <= 1600}

    dash.zoom(None, None)
    out = _line(dash, "loss", "rank_1")
    assert len(out["x"]) < STEPS
    assert all(math.isclose(s, oracle[x], rel_tol=1e-9) for x, s in zip(out["x"], out["smooth"]))  # the same curve
    option = dash.option("loss")
    ids = [s["id"] for s in option["series"]]
    assert "rank_1#0|raw" in ids and "rank_1#0|smooth" in ids and "rank_1#0|band" in ids  # raw line + band stay

    # The slider: a stronger smoothing changes the smoothed line, and only that.
    dash.zoom(1400, 1600)
    dash.smooth(0.9)
    after = _line(dash, "loss", "rank_1")
    strong = _ema(exact["x"], exact["last"], 0.9)
    pairs = [(x, s) for x, s in zip(after["x"], after["smooth"]) if 1400 <= x <= 1600]
    assert all(math.isclose(s, strong[x], rel_tol=1e-9) for x, s in pairs)
    assert any(not math.isclose(s, oracle[x], rel_tol=1e-6) for x, s in pairs)
    assert {x: v for x, v in zip(after["x"], after["last"]) if 1400 <= x <= 1600} == raw_before
    dash.watched.assert_clean()


# -- a NaN step is marked -------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_nan_step_is_marked(dash: Dash) -> None:
    page = dash.page
    assert page.get_attribute("section.chart[data-metric='loss']", "data-nonfinite") == "1"
    marks = _series_by_id(dash, "loss", "nonfinite")["markLine"]["data"]
    assert [m["xAxis"] for m in marks] == [NAN_STEP]
    line = _line(dash, "loss", "rank_0")
    assert NAN_STEP not in [x for x, v in zip(line["x"], line["last"]) if isinstance(v, (int, float)) and math.isfinite(v)]
    dash.watched.assert_clean()


# -- ranks: toggle, mean + band, difference view -------------------------------------------------------------
@pytest.mark.timeout(60)
def test_toggling_a_rank_hides_it_everywhere_and_mean_mode(dash: Dash) -> None:
    page = dash.page
    dash.zoom(1400, 1600)
    page.click("#sources .source[data-source='rank_2'] .toggle")
    wait_js(page, "() => [...document.querySelectorAll('section.chart')].every(c => !c.dataset.visible.split(',').includes('rank_2'))")
    assert dash.hash()["h"] == "rank_2"
    dash.show("lr", "step_time_ms")
    for metric in ("loss", "lr", "step_time_ms"):
        assert dash.option(metric)["legend"][0]["selected"]["rank_2"] is False
    wait_js(page, "n => document.getElementById('heatmap').dataset.rows === String(n)", arg=RANKS - 1)

    page.select_option("#ranks", "mean")
    wait_js(page, "() => window.mstail.option('loss').series.some(s => s.id === 'mean|line')")
    option = dash.option("loss")
    assert [s["name"] for s in option["series"] if s["id"] == "mean|line"] == [f"mean of {RANKS - 1}"]
    assert any(s["id"] == "mean|band" for s in option["series"])
    page.select_option("#ranks", "overlay")

    # Compare: every other source minus rank_0, step by step.
    page.select_option("#baseline", "rank_0")
    wait_js(page, "() => !window.mstail.option('loss').series.some(s => s.id.startsWith('rank_0#'))")
    series = {s["id"]: s for s in dash.option("loss")["series"]}
    diff = {p[0]: p[1] for p in series["rank_1#0|raw"]["data"] if p[1] is not None}
    a, b = _line(dash, "loss", "rank_1"), _line(dash, "loss", "rank_0")
    base = dict(zip(b["x"], b["last"]))
    checked = 0
    for x, v in zip(a["x"], a["last"]):
        if 1400 <= x <= 1600 and x != NAN_STEP:
            assert math.isclose(diff[x], v - base[x], rel_tol=1e-9, abs_tol=1e-12)
            checked += 1
    assert checked == 200
    page.select_option("#baseline", "")
    page.click("#sources .source[data-source='rank_2'] .toggle")
    wait_js(page, "() => document.querySelector('section.chart[data-metric=\"loss\"]').dataset.visible.split(',').includes('rank_2')")
    dash.watched.assert_clean()


# -- events on the x axis; an error's text on click, as text ---------------------------------------------------
@pytest.mark.timeout(60)
def test_event_markers_and_error_text(dash: Dash) -> None:
    page = dash.page
    dash.zoom(None, None)
    markers = _series_by_id(dash, "loss", "events")["data"]
    kinds = {m["item"]["kind"] for m in markers}
    assert {"start", "end", "error"} <= kinds, kinds
    [error] = [m for m in markers if m["item"]["kind"] == "error"]
    x, y = page.evaluate("([s, y]) => window.mstail.pixel('loss', s, y)", [error["item"]["step"], error["value"][1]])
    page.mouse.click(x, y)
    wait_js(page, "() => !document.getElementById('detail').hidden")
    text = page.text_content("#detail-text")
    assert "Traceback (most recent call last)" in text and XSS_IMG in text
    assert page.eval_on_selector_all("#detail img", "els => els.length") == 0
    assert page.evaluate("typeof window.__xss") == "undefined"
    page.click("#detail-close")
    dash.watched.assert_clean()


# -- export ---------------------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_export_csv_and_png(dash: Dash, tmp_path: Path) -> None:
    page = dash.page
    dash.zoom(1400, 1600)
    with page.expect_download() as info:
        page.click("section.chart[data-metric='loss'] .tool-csv")
    path = tmp_path / "loss.csv"
    info.value.save_as(path)
    rows = list(csv.DictReader(io.StringIO(path.read_text("utf-8"))))
    assert info.value.suggested_filename == "mstail-loss.csv"
    rank1 = [r for r in rows if r["source"] == "rank_1"]
    assert [int(r["step"]) for r in rank1] == list(range(1400, 1601))  # the visible range, every step
    assert {r["source"] for r in rows} == {f"rank_{r}" for r in range(RANKS)}
    assert all(r["smoothed"] for r in rank1)
    nan_row = [r for r in rows if r["source"] == "rank_0" and r["step"] == str(NAN_STEP)]
    assert nan_row and nan_row[0]["value"] == "NaN"
    # the times as `mstail parse --to csv` writes them: ISO 8601 with the zone's offset, and epoch seconds beside
    assert list(rows[0])[3:5] == ["time", "time_s"]
    for row in rank1[:3]:
        shown = datetime.fromisoformat(row["time"])
        assert shown.utcoffset() is not None and shown.timestamp() == pytest.approx(float(row["time_s"]), abs=1e-3)
        assert row["time"] == csv_time(float(row["time_s"]))

    with page.expect_download() as info:
        page.click("section.chart[data-metric='loss_scale'] .tool-png")
    png = tmp_path / "loss_scale.png"
    info.value.save_as(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    dash.watched.assert_clean()


# -- the URL reproduces the view ---------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_url_reproduces_the_view(dash: Dash) -> None:
    page = dash.page
    dash.smooth(0.9)
    dash.zoom(1400, 1600)
    page.click("section.chart[data-metric='loss_scale'] .tool-log")
    page.click("#sources .source[data-source='rank_5'] .toggle")
    page.click("#theme")
    wait_js(page, "() => location.hash.includes('l=loss_scale') && location.hash.includes('h=rank_5') && location.hash.includes('t=dark')")
    url = page.url
    other = page.context.new_page()
    watched = Watched(other)
    try:
        other.goto(url, wait_until="load")
        watched.wait_live()
        wait_js(other, "() => document.body.dataset.firstPaint === '1' && document.body.dataset.busy === '0'")
        assert other.evaluate("document.documentElement.dataset.theme") == "dark"
        assert other.input_value("#smooth") == "0.9"
        show_chart(other, "loss_scale")
        assert other.get_attribute("section.chart[data-metric='loss_scale']", "data-log") == "1"
        assert "rank_5" not in other.get_attribute("section.chart[data-metric='loss']", "data-visible").split(",")
        zoom = other.evaluate("() => { const z = window.mstail.state.charts.get('loss').chart.getOption().dataZoom[0];"
                              " return [z.startValue, z.endValue]; }")
        assert abs(zoom[0] - 1400) <= 1 and abs(zoom[1] - 1600) <= 1, zoom
        inside = [x for x in _line_of(other, "loss", "rank_1")["x"] if 1400 <= x <= 1600]
        assert inside == list(range(1400, 1601))  # the zoomed range was fetched exactly, as in the original view
        watched.assert_clean()
    finally:
        other.close()
    page.click("#theme")
    page.click("#sources .source[data-source='rank_5'] .toggle")
    page.click("section.chart[data-metric='loss_scale'] .tool-log")
    dash.watched.assert_clean()


def _line_of(page: Any, metric: str, source: str) -> Dict[str, Any]:
    return next(line for line in page.evaluate("m => window.mstail.chartData(m)", metric) if line["source"] == source)


# -- x axes and live points ----------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_time_axes_and_live_points(dash: Dash) -> None:
    page = dash.page
    dash.smooth(0.9)
    dash.zoom(None, None)
    page.select_option("#xaxis", "time")
    wait_js(page, "() => window.mstail.option('loss').xAxis[0].type === 'time'")
    page.select_option("#xaxis", "relative")
    wait_js(page, "() => window.mstail.option('loss').xAxis[0].type === 'value' && location.hash.includes('x=relative')")
    xs = [p[0] for p in _series_by_id(dash, "loss", "rank_1#0|raw")["data"]]
    assert xs[0] >= 0 and xs[-1] < 3600  # seconds since rank_1's first step
    page.select_option("#xaxis", "step")

    before = _line(dash, "loss", "rank_0")
    writer = spawn_writer(dash.logs[0], steps=20, interval_s=0.02, start_step=STEPS + 1, seed=0)
    try:
        finish_writer(writer)
    finally:
        if writer.poll() is None:
            writer.kill()
    wait_js(page, "n => window.mstail.chartData('loss').find(l => l.source === 'rank_0').x.slice(-1)[0] === n", arg=STEPS + 20)
    after = _line(dash, "loss", "rank_0")
    assert after["x"][-20:] == list(range(STEPS + 1, STEPS + 21))
    assert len(after["x"]) == len(before["x"]) + 20
    assert all(s is not None for s in after["smooth"][-20:])  # the server's EMA continued live
    exact = _exact(dash, "loss", "rank_0")
    oracle = _ema(exact["x"], exact["last"], 0.9)
    assert all(math.isclose(s, oracle[x], rel_tol=1e-9) for x, s in zip(after["x"][-20:], after["smooth"][-20:]))
    wait_js(page, "n => document.querySelector(\"#sources .source[data-source='rank_0'] .fact.step .value\").textContent.startsWith(n)",
            arg=str(STEPS + 20))
    dash.watched.assert_clean()


# -- XSS: a metric and a source named with markup, in charts, legend, CSV and header ----------------------------
@pytest.mark.timeout(60)
def test_markup_in_metric_names_stays_text_and_samples_axis(watched: Watched, mstail_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "<b>x<img src=x onerror=window.__xss=4>" / "metrics.jsonl"
    path.parent.mkdir(parents=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"step": step, "time": 1764672000 + step, "loss": 2.0 / step, XSS_IMG: step,
                                 "global_batch_size": 64}) + "\n" for step in range(1, 41))
    server = mstail_server(args=("--jsonl", str(path)))
    server.wait_records(40)
    page = watched.page
    page.goto(server.url + "/", wait_until="load")
    watched.wait_live()
    wait_js(page, "m => { const c = window.mstail.state.charts.get(m); return !!c && c.el.dataset.points === '40'; }", arg=XSS_IMG)
    assert XSS_IMG in page.eval_on_selector_all("section.chart .name", "els => els.map(e => e.textContent)")
    page.select_option("#xaxis", "samples")
    wait_js(page, "() => document.querySelector('section.chart').dataset.x === 'samples' && document.body.dataset.busy === '0'")
    wait_js(page, "() => window.mstail.option('loss').series.find(s => s.id.endsWith('|raw')).data.slice(-1)[0][0] === 40 * 64")
    with page.expect_download() as info:
        page.locator("section.chart .tool-csv").first.click()
    assert info.value.suggested_filename.endswith(".csv")
    assert page.evaluate("typeof window.__xss") == "undefined"
    assert page.eval_on_selector_all("img, b", "els => els.length") == 0
    watched.assert_clean()


def test_torchrun_tagged_ranks_are_sources_of_their_own_on_the_page(watched: Watched, mstail_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """One file, two ranks tagged `[rankN]: ` (source ids with a `/`): a card and a line per rank, a rank hidden
    through the URL stays hidden in a fresh page."""
    body = (Path(__file__).resolve().parents[2] / "sample_logs" / "mindformers_v1.8_nonsink_worker_0.log").read_text(encoding="utf-8")
    log = tmp_path / "job" / "train.log"
    log.parent.mkdir()
    log.write_text("".join(f"[rank{r}]: {line}\n" for line in body.splitlines() for r in (0, 1)), encoding="utf-8")
    server = mstail_server(log)
    per_rank = len([line for line in body.splitlines() if "per_step_time" in line])
    server.wait_records(2 * per_rank)
    ids = sorted(s["id"] for s in server.get_json("/api/sources"))
    file_id = ids[0]
    assert ids == [file_id, f"{file_id}/rank0", f"{file_id}/rank1"]
    page = watched.page
    page.goto(server.url + "/", wait_until="load")
    watched.wait_live()
    wait_js(page, "n => { const c = window.mstail.state.charts.get('loss'); return !!c && c.el.dataset.points === String(n); }",
            arg=2 * per_rank)
    cards = page.eval_on_selector_all("#sources .source", "els => els.map(e => e.dataset.source)")
    assert f"{file_id}/rank0" in cards and f"{file_id}/rank1" in cards
    page.click(f"#sources .source[data-source='{file_id}/rank1'] .toggle")
    wait_js(page, "id => !document.querySelector('section.chart[data-metric=\"loss\"]').dataset.visible.split(',').includes(id)",
            arg=f"{file_id}/rank1")
    fresh = page.context.new_page()
    other = Watched(fresh)
    try:
        fresh.goto(page.url, wait_until="load")
        other.wait_live()
        wait_js(fresh, "() => document.body.dataset.firstPaint === '1' && document.body.dataset.busy === '0'")
        visible = fresh.get_attribute("section.chart[data-metric='loss']", "data-visible").split(",")
        assert f"{file_id}/rank0" in visible and f"{file_id}/rank1" not in visible
        other.assert_clean()
    finally:
        fresh.close()
    watched.assert_clean()


def test_a_wall_time_axis_says_when_its_times_are_read_times(watched: Watched, mstail_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """LossMonitor prints no time: its records are drawn at the moments mstail read them, and the time axes say so;
    a JSONL log's own times are not noted."""
    printed = tmp_path / "train.log"
    printed.write_text("".join(f"epoch: 1 step: {s}, loss is {2.0 / s}\n" for s in range(1, 21)), encoding="utf-8")
    timed = tmp_path / "metrics.jsonl"
    timed.write_text("".join(json.dumps({"step": s, "time": 1764672000 + s, "lr": 0.1}) + "\n" for s in range(1, 21)),
                     encoding="utf-8")
    server = mstail_server(printed, args=("--jsonl", str(timed)))
    server.wait_records(40)
    page = watched.page
    page.goto(server.url + "/", wait_until="load")
    watched.wait_live()
    wait_js(page, "() => ['loss', 'lr'].every(m => window.mstail.state.charts.get(m)?.el.dataset.points === '20')")
    page.select_option("#xaxis", "time")
    wait_js(page, "() => window.mstail.option('loss').xAxis[0].type === 'time'")
    assert page.evaluate("() => [window.mstail.option('loss').xAxis[0].name, window.mstail.option('lr').xAxis[0].name]") \
        == ["read time", ""]
    page.select_option("#xaxis", "relative")
    wait_js(page, "() => window.mstail.option('loss').xAxis[0].type === 'value' && location.hash.includes('x=relative')")
    assert page.evaluate("() => window.mstail.option('loss').xAxis[0].name") == "read time"
    page.select_option("#xaxis", "step")
    wait_js(page, "() => window.mstail.option('loss').xAxis[0].name === ''")
    watched.assert_clean()
