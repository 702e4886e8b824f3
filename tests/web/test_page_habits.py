"""TensorBoard's habits on the page, in real headless Chromium against a real mstail following 40 ranks: the source
filter filters the charts' lines too (and the server's mean is of the matching sources); a chart pinned first and
one enlarged to the window; the chart filter's matches drawn in one chart (one line per metric and source, the
tooltip's rows named by metric). Each is kept in the URL."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Iterator, List

import pytest

from .browser import served_dashboard, show_chart, wait_js, write_rank_jsonl

pytestmark = pytest.mark.browser

RANKS = 40
STEPS = 20
T0 = time.time() - 3600
CHART = "section.chart[data-metric='{}']"


def _write_ranks(root: Path) -> List[str]:
    return write_rank_jsonl(root, RANKS, STEPS, lambda rank, s: {
        "step": s, "time": T0 + s, "loss": 4.0 + 6.0 * math.exp(-s / 8) + 0.01 * rank,
        "grad_norm": 1.0 + 0.1 * rank + 0.01 * s, "grad_scale": 100.0 + rank, "lr": 1e-4})


@pytest.fixture(scope="module")
def ranks40(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("ranks40")
    with served_dashboard(browser, root / "mstail", ["--jsonl", *_write_ranks(root / "job")], RANKS * STEPS) as watched:
        watched.ids = sorted(s["id"] for s in watched.server.get_json("/api/sources"))
        yield watched


def _visible(page: Any, metric: str) -> List[str]:
    return sorted(filter(None, page.get_attribute(CHART.format(metric), "data-visible").split(",")))


def _drawn(page: Any, metric: str) -> None:
    wait_js(page, "m => { const c = window.mstail.state.charts.get(m); return !c.dirty && !c.refreshing"
                  " && document.body.dataset.busy === '0'; }", arg=metric)


@pytest.mark.timeout(90)
def test_the_source_filter_filters_the_charts_lines(ranks40: Any) -> None:
    page = ranks40.page
    ids = ranks40.ids
    show_chart(page, "loss")
    wait_js(page, "() => window.mstail.option('loss').series.some(s => s.name === 'mean of 40')")
    # two sources: their two lines only (no mean: too few), in the legend too
    page.fill("#source-filter", "rank_(3|7)$")
    wait_js(page, "m => document.querySelector(m).dataset.visible.split(',').length === 2", arg=CHART.format("loss"))
    _drawn(page, "loss")
    wanted = sorted(i for i in ids if i.endswith(("rank_3", "rank_7")))
    assert _visible(page, "loss") == wanted, _visible(page, "loss")
    raw = {s["name"] for s in page.evaluate("() => window.mstail.option('loss').series") if s["id"].endswith("|raw")}
    assert raw == set(wanted), raw
    assert set(page.evaluate("() => window.mstail.option('loss').legend[0].data")) == set(wanted)
    # 30 sources: the server's mean of those 30, not of all 40
    page.fill("#source-filter", "rank_[12]?[0-9]$")
    wait_js(page, "() => (window.mstail.option('loss').series || []).some(s => s.name === 'mean of 30')")
    assert "sq=" in page.url
    # kept in the URL: a reload draws the same lines
    page.fill("#source-filter", "rank_(3|7)$")
    wait_js(page, "m => document.querySelector(m).dataset.visible.split(',').length === 2", arg=CHART.format("loss"))
    ranks40.reload()
    wait_js(page, "() => document.body.dataset.firstPaint === '1' && document.body.dataset.busy === '0'")
    show_chart(page, "loss")
    assert page.input_value("#source-filter") == "rank_(3|7)$"
    assert _visible(page, "loss") == wanted
    page.fill("#source-filter", "")
    wait_js(page, "() => (window.mstail.option('loss').series || []).some(s => s.name === 'mean of 40')")
    ranks40.assert_clean()


def _chart_order(page: Any) -> List[List[str]]:
    return page.eval_on_selector_all("section.chart", "els => els.map(e => [e.closest('section.group').dataset.group,"
                                                      " e.dataset.metric])")


@pytest.mark.timeout(90)
def test_a_pinned_chart_comes_first_and_an_enlarged_one_fills_the_window(ranks40: Any) -> None:
    page = ranks40.page
    before = _chart_order(page)
    assert before[0][1] == "loss" and ["other", "grad_scale"] in before, before
    page.click(CHART.format("grad_scale") + " .tool-pin")
    wait_js(page, "() => document.querySelector('#charts > section.group').dataset.group === 'pinned'")
    assert _chart_order(page)[0] == ["pinned", "grad_scale"]
    assert page.text_content("#charts > section.group h2").strip().startswith("Pinned")
    assert "pin=grad_scale" in page.url
    # kept in the URL
    ranks40.reload()
    wait_js(page, "() => document.body.dataset.firstPaint === '1' && document.body.dataset.busy === '0'")
    assert _chart_order(page)[0] == ["pinned", "grad_scale"]
    assert page.get_attribute(CHART.format("grad_scale") + " .tool-pin", "aria-pressed") == "true"
    # unpinned: back in its group, where it was
    page.click(CHART.format("grad_scale") + " .tool-pin")
    wait_js(page, "() => document.querySelector('section.group[data-group=\"pinned\"]').hidden")
    assert _chart_order(page) == before
    assert "pin=" not in page.url

    # enlarged: the chart fills the window, drawn at that size; Esc brings it back
    show_chart(page, "loss")
    normal = page.evaluate("() => window.mstail.state.charts.get('loss').chart.getWidth()")
    page.click(CHART.format("loss") + " .tool-enlarge")
    wait_js(page, "() => window.mstail.state.charts.get('loss').chart.getWidth() > 1300")
    box = page.evaluate("m => { const r = document.querySelector(m).getBoundingClientRect();"
                        " return [r.left, r.top, r.width, r.height]; }", CHART.format("loss"))
    assert box[0] == 0 and box[1] == 0 and box[2] >= 1390 and box[3] >= 990, box
    assert page.evaluate("() => window.mstail.state.charts.get('loss').chart.getHeight()") > 800
    assert "e=loss" in page.url
    _drawn(page, "loss")
    assert page.evaluate("() => window.mstail.option('loss').series.some(s => s.name === 'mean of 40')")
    page.keyboard.press("Escape")
    wait_js(page, "w => window.mstail.state.charts.get('loss').chart.getWidth() === w", arg=normal)
    assert not page.evaluate("m => document.querySelector(m).classList.contains('enlarged')", CHART.format("loss"))
    assert "e=loss" not in page.url
    ranks40.assert_clean()


COMBINED = "section.chart[data-metric='matching metrics']"
TIP_NAMES = """() => {
  const tip = [...document.querySelectorAll('.mstail-tip')].find(t => getComputedStyle(t).display !== 'none'
    && getComputedStyle(t).visibility !== 'hidden' && t.querySelector(".tip[data-metric='matching metrics']"));
  return tip ? [...tip.querySelectorAll('.tip-name')].map(n => n.textContent).sort() : null;
}"""


def _combined_tip(page: Any) -> List[str]:
    box = page.evaluate("s => { const r = document.querySelector(s + ' .plot').getBoundingClientRect();"
                        " return [r.left, r.top, r.width, r.height]; }", COMBINED)
    for attempt in range(50):
        page.mouse.move(box[0] + box[2] * (0.5 + 0.002 * (attempt % 2)), box[1] + box[3] * 0.5)
        page.wait_for_timeout(50)
        names = page.evaluate(TIP_NAMES)
        if names:
            return names
    raise AssertionError("no tooltip on the matching metrics' chart")


@pytest.mark.timeout(90)
def test_the_filters_matches_in_one_chart(ranks40: Any) -> None:
    page = ranks40.page
    assert page.is_hidden("#combine-label")
    page.fill("#metric-filter", "^grad_")
    page.check("#combine")
    wait_js(page, "s => { const e = document.querySelector(s); return !!e && e.dataset.lines === '2'; }", arg=COMBINED)
    assert page.get_attribute(COMBINED, "data-members") == "grad_norm,grad_scale"
    assert "qm=1" in page.url
    # the means of 40 ranks: one line per metric, the legend and the tooltip by metric
    assert _combined_tip(page) == ["grad_norm · mean of 40", "grad_scale · mean of 40"]
    # two sources: one line per metric and source
    page.fill("#source-filter", "rank_(3|7)$")
    wait_js(page, "s => document.querySelector(s).dataset.lines === '4'", arg=COMBINED)
    ids = sorted(i for i in ranks40.ids if i.endswith(("rank_3", "rank_7")))
    assert _combined_tip(page) == sorted(f"{m} · {i}" for m in ("grad_norm", "grad_scale") for i in ids)
    # kept in the URL
    ranks40.reload()
    wait_js(page, "s => { const e = document.querySelector(s); return !!e && e.dataset.lines === '4'; }", arg=COMBINED)
    assert page.is_checked("#combine")
    # off, or one match only: no such chart
    page.fill("#metric-filter", "^grad_norm$")
    wait_js(page, "s => !document.querySelector(s)", arg=COMBINED)
    page.uncheck("#combine")
    page.fill("#metric-filter", "")
    assert page.is_hidden("#combine-label")  # it draws the filter's matches: shown with a filter only
    page.fill("#source-filter", "")
    assert "qm=1" not in page.url
    ranks40.assert_clean()
