"""Readable at any scale, in real headless Chromium against a real mstail: the tooltip of 64 overlaid ranks stays
inside the window and lists a screenful of rows and "and N more", sorted as asked (screenshots:
tests/artifacts/ranks-64-light.png, -dark.png); y-axis labels of 5,000,000 and 1e-7 are whole; a log axis spans the
data (loss 4-10, not 1-100); "ignore outliers" leaves a spike out of the range; zoom bounds are whole steps; the
regex filters and the shortcuts; with two compared runs at 1280 px the toolbar is one row and a legend of 12 lines
has no pages."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Iterator, List

import pytest

from ..conftest import start_mstail
from .browser import dashboard, served_dashboard, show_chart, wait_js, write_rank_jsonl

pytestmark = pytest.mark.browser

RANKS = 64
STEPS = 40
T0 = time.time() - 3600
TIP = """m => {
  const tip = [...document.querySelectorAll('.mstail-tip')].find(t => getComputedStyle(t).display !== 'none'
    && getComputedStyle(t).visibility !== 'hidden' && t.querySelector(`.tip[data-metric='${m}']`));
  if (!tip) return null;
  const r = tip.getBoundingClientRect();
  const box = tip.querySelector('.tip');
  return {box: [r.left, r.top, r.right, r.bottom], rows: +box.dataset.rows, more: +box.dataset.more,
          values: [...tip.querySelectorAll('.tip-value')].map(v => +v.textContent),
          text: tip.querySelector('.tip-more') ? tip.querySelector('.tip-more').textContent : ''};
}"""


def _write_ranks(root: Path) -> List[str]:
    return write_rank_jsonl(root, RANKS, STEPS, lambda rank, s: {
        "step": s, "time": T0 + s, "loss": 4.0 + 6.0 * math.exp(-s / 8) + 0.01 * rank,
        "tokens": 5_000_000 + 1000 * s + rank, "tiny": 1e-7 * (1 + s / 20),
        "spiky": 1000.0 if s == 20 and rank == 0 else 1.0 + 0.01 * s})


@pytest.fixture(scope="module")
def ranks64(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("ranks64")
    with served_dashboard(browser, root / "mstail", ["--jsonl", *_write_ranks(root / "job")], RANKS * STEPS) as watched:
        yield watched


def _hover(page: Any, metric: str, fx: float, fy: float) -> None:
    box = page.evaluate("m => { const r = document.querySelector(`section.chart[data-metric='${m}'] .plot`)"
                        ".getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; }", metric)
    page.mouse.move(box[0] + box[2] * fx, box[1] + box[3] * fy)


def _tip(page: Any, fx: float, fy: float) -> Any:
    """The loss chart's tooltip with the mouse at (fx, fy) of its plot (moved there again until one shows: a redraw
    that changes the chart's lines hides it until the next move)."""
    for attempt in range(50):
        _hover(page, "loss", fx + 0.002 * (attempt % 2), fy)
        page.wait_for_timeout(50)
        tip = page.evaluate(TIP, "loss")
        if tip:
            return tip
    raise AssertionError(f"no tooltip at {fx}, {fy}")


@pytest.mark.timeout(90)
def test_the_tooltip_of_64_lines_fits_the_window_sorted_as_asked(ranks64: Any, artifacts_dir: Path) -> None:
    page = ranks64.page
    page.select_option("#ranks", "overlay")
    show_chart(page, "loss")
    wait_js(page, "n => window.mstail.state.charts.get('loss').seriesIds.split('\\n')"
                  ".filter(i => i.endsWith('|raw')).length === n", arg=RANKS)
    height = page.evaluate("() => window.innerHeight")
    width = page.evaluate("() => window.innerWidth")
    for fx, fy in ((0.5, 0.5), (0.95, 0.78), (0.12, 0.3)):  # inside the plot's grid
        for order in ("descending", "ascending", "nearest"):
            page.select_option("#tooltip-sort", order)
            tip = _tip(page, fx, fy)
            left, top, right, bottom = tip["box"]
            assert 0 <= left and right <= width and 0 <= top and bottom <= height, (tip["box"], width, height)
            # a screenful of rows, then "and N more" for the rest of the 64 lines
            assert 4 <= tip["rows"] < RANKS and tip["rows"] + tip["more"] == RANKS, tip
            assert tip["text"] == f"and {tip['more']} more"
            values = tip["values"]
            if order == "descending":
                assert values == sorted(values, reverse=True), values
            elif order == "ascending":
                assert values == sorted(values), values
    # screenshots with the tooltip shown: tests/artifacts/ranks-64-light.png and -dark.png
    page.evaluate("() => window.scrollTo(0, 0)")
    for theme in ("light", "dark"):
        if theme == "dark":
            page.click("#theme")
            wait_js(page, "() => document.documentElement.dataset.theme === 'dark'")
            page.wait_for_timeout(300)
        _tip(page, 0.6, 0.5)
        page.screenshot(path=str(artifacts_dir / f"ranks-64-{theme}.png"))
    page.click("#theme")
    assert "ts=nearest" not in page.url and page.evaluate("() => window.mstail.view.tipSort") == "nearest"
    page.select_option("#tooltip-sort", "descending")
    assert "ts=descending" in page.url
    page.select_option("#tooltip-sort", "nearest")
    page.select_option("#ranks", "auto")
    ranks64.assert_clean()


@pytest.mark.timeout(90)
def test_axis_labels_are_whole_and_a_log_axis_spans_the_data(ranks64: Any) -> None:
    page = ranks64.page
    for metric, unit in (("tokens", "M"), ("tiny", "e-")):
        show_chart(page, metric)
        labels = page.evaluate("m => window.mstail.yLabels(m)", metric)
        texts = [text for text, _ in labels]
        assert len(texts) >= 2 and len(set(texts)) == len(texts), texts
        # every label fits the 56 px gutter, in the unit of its magnitude
        assert all(px <= 50 and unit in text for text, px in labels), labels
    show_chart(page, "loss")
    page.click("section.chart[data-metric='loss'] .tool-log")
    wait_js(page, "() => window.mstail.state.charts.get('loss').el.dataset.log === '1'"
                  " && !window.mstail.state.charts.get('loss').dirty")
    low, high = page.evaluate("() => window.mstail.yExtent('loss')")
    assert 3.9 <= low <= 4.2 and 9.5 <= high <= 10.7, (low, high)
    page.click("section.chart[data-metric='loss'] .tool-log")
    # "ignore outliers": one rank's 1000 at one step among values of 1-1.4 no longer sets the y axis; in the URL
    page.select_option("#ranks", "overlay")
    show_chart(page, "spiky")
    wait_js(page, "n => window.mstail.state.charts.get('spiky').seriesIds.split('\\n')"
                  ".filter(i => i.endsWith('|raw')).length === n", arg=RANKS)
    assert page.evaluate("() => window.mstail.yExtent('spiky')")[1] >= 1000
    page.click("section.chart[data-metric='spiky'] .tool-fit")
    wait_js(page, "() => window.mstail.state.charts.get('spiky').el.dataset.fit !== ''"
                  " && !window.mstail.state.charts.get('spiky').dirty")
    low, high = page.evaluate("() => window.mstail.yExtent('spiky')")
    assert 0.9 <= low and high <= 2, (low, high)
    assert "io=spiky" in page.url
    page.click("section.chart[data-metric='spiky'] .tool-fit")
    page.select_option("#ranks", "auto")
    ranks64.assert_clean()


@pytest.mark.timeout(90)
def test_zoom_bounds_are_whole_steps(ranks64: Any) -> None:
    page = ranks64.page
    show_chart(page, "loss")
    page.evaluate("() => window.mstail.state.charts.get('loss').chart"
                  ".dispatchAction({type: 'dataZoom', start: 13.3, end: 61.7})")
    wait_js(page, "() => window.mstail.view.zoom !== null")
    zoom = page.evaluate("() => window.mstail.view.zoom")
    assert all(float(v).is_integer() for v in zoom), zoom
    assert "z=" in page.url and "." not in page.url.split("z=")[1].split("&")[0], page.url
    page.click("#reset-zoom")
    wait_js(page, "() => window.mstail.view.zoom === null && document.body.dataset.busy === '0'")
    ranks64.assert_clean()


@pytest.mark.timeout(90)
def test_compared_runs_one_row_toolbar_at_1280_px_and_a_legend_without_pages(browser: Any, log_writer: Any,
                                                                            tmp_path: Path) -> None:
    logs = [tmp_path / "runs" / f"exp{e}" / "output" / "log" / f"rank_{r}" / "info.log"
            for e in (1, 2) for r in range(6)]
    log_writer.finish(log_writer(logs, steps=5, interval_s=0))
    server = start_mstail([], tmp_path / "mstail", args=[str(tmp_path / "runs")])
    try:
        server.wait_records(5 * len(logs), timeout=60)
        with dashboard(browser, server.url) as watched:
            page = watched.page
            page.set_viewport_size({"width": 1280, "height": 900})
            wait_js(page, "() => document.querySelector('#ranks option[value=auto]').textContent.includes('compare')")
            height = page.evaluate("() => document.querySelector('.topbar').getBoundingClientRect().height")
            assert height < 70, height  # one row: 51 px (two: 105 px)
            # 12 lines: every name in the legend, on as many rows as they need above the plot (no pages)
            page.select_option("#ranks", "overlay")
            show_chart(page, "loss")
            wait_js(page, "() => document.querySelector(\"section.chart[data-metric='loss']\")"
                          ".dataset.mode === 'overlay'")
            legend, top = page.evaluate("() => { const o = window.mstail.option('loss');"
                                        " return [o.legend[0], o.grid[0].top]; }")
            rows = int(page.get_attribute("section.chart[data-metric='loss']", "data-legend-rows"))
            assert legend["type"] == "plain" and legend["show"] and len(legend["data"]) == len(logs), legend
            assert rows >= 2 and top == 14 + 18 * rows, (rows, top)
            watched.assert_clean()
    finally:
        code = server.stop()
    assert code is not None and "Traceback" not in server.stderr, server.stderr


@pytest.mark.timeout(90)
def test_the_chart_filter_is_a_regex_and_shortcuts_are_listed(ranks64: Any) -> None:
    page = ranks64.page
    shown = ("() => [...document.querySelectorAll('section.chart')].filter(e => !e.hidden)"
             ".map(e => e.dataset.metric).sort()")
    page.select_option("#tooltip-sort", "nearest")
    every = page.evaluate(shown)
    page.fill("#metric-filter", "^t(ok|in)")
    wait_js(page, "() => document.querySelectorAll('section.chart:not([hidden])').length === 2")
    assert page.evaluate(shown) == ["tiny", "tokens"]
    assert "q=%5Et%28ok%7Cin%29" in page.url
    # an invalid regex: said next to the box, read as text, no exception
    page.fill("#metric-filter", "to(")
    wait_js(page, "() => !document.getElementById('metric-filter-error').hidden")
    assert page.text_content("#metric-filter-error") == "invalid regex"
    assert page.evaluate(shown) == []
    page.fill("#metric-filter", "")
    wait_js(page, "() => document.getElementById('metric-filter-error').hidden")
    assert page.evaluate(shown) == every
    # the sources' filter is a regex too: rank_1 and rank_10..19 of 64, not rank_21
    page.fill("#source-filter", "^rank_1\\d?$")
    wait_js(page, "() => document.querySelectorAll('#sources tr.source').length === 11")
    page.fill("#source-filter", "rank_(")
    wait_js(page, "() => document.getElementById('source-filter').classList.contains('invalid')")
    page.fill("#source-filter", "")
    wait_js(page, "() => !document.getElementById('source-filter').classList.contains('invalid')")
    # "?" lists the shortcuts; "o" turns the tooltip order; Esc closes the list
    page.evaluate("() => document.activeElement.blur()")  # shortcuts are not taken while typing in a box
    page.keyboard.press("?")
    wait_js(page, "() => !document.getElementById('shortcuts').hidden")
    assert "tooltip order" in page.text_content("#shortcuts")
    page.keyboard.press("o")
    assert page.evaluate("() => window.mstail.view.tipSort") == "ascending"
    page.keyboard.press("Escape")
    wait_js(page, "() => document.getElementById('shortcuts').hidden")
    page.select_option("#tooltip-sort", "nearest")
    ranks64.assert_clean()
