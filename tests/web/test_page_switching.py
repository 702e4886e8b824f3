"""Every view switch while the mouse is over a chart, in real headless Chromium against a real mstail following
logs a real writer process wrote, at 1, 8, 64 and 1,024 ranks (two runs at 8 and 64, so "compare runs" is
among the modes): ranks mode, "delta vs", x axis, log scale, smoothing, chart and source filters, tooltip order,
theme, pin, enlarge and the filter's matches in one chart. The page must not throw or log a single error, and the tooltip shown after a switch must be the new mode's."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, List, Tuple

import pytest

from ..conftest import start_mstail
from .browser import dashboard, show_chart, wait_js

pytestmark = pytest.mark.browser

STEPS = 12
# The lines ("source#segment", or "mean") in the loss chart's tooltip when one is shown, else null.
SHOWN_TIP = """() => {
  const tip = [...document.querySelectorAll('.mstail-tip')].find(t => getComputedStyle(t).display !== 'none'
    && getComputedStyle(t).visibility !== 'hidden' && t.querySelector(".tip[data-metric='loss']"));
  return tip ? [...tip.querySelectorAll('.tip-row')].map(r => r.dataset.line) : null;
}"""


def _logs(root: Path, ranks: int) -> List[Path]:
    # Two runs ("compare runs" among the modes) up to 64 ranks; 1,024 ranks are one run, drawn as their mean.
    runs = ("exp1", "exp2") if 1 < ranks <= 64 else ("exp1",)
    per_run = max(1, ranks // len(runs))
    return [root / run / "output" / "log" / f"rank_{r}" / "info.log" for run in runs for r in range(per_run)]


DRAWN_IDS = "() => window.mstail.state.charts.get('loss').seriesIds.split('\\n')"


def _hover(page: Any, nudge: int, y: float = 0.5) -> None:
    """The mouse over the loss chart's plot (moved a little each time, so the tooltip is asked for again)."""
    box = page.evaluate("() => { const r = document.querySelector(\"section.chart[data-metric='loss'] .plot\")"
                        ".getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; }")
    page.mouse.move(box[0] + box[2] * (0.45 + 0.01 * (nudge % 10)), box[1] + box[3] * y)


def _settle(page: Any, nudge: int) -> None:
    wait_js(page, "() => document.body.dataset.busy === '0' && !window.mstail.state.charts.get('loss').dirty",
            timeout=60_000)
    _hover(page, nudge, 0.55)
    page.wait_for_timeout(60)


def _select(page: Any, selector: str, value: str) -> None:
    """A choice in a toolbar select, as a user's (without Playwright's wait for the page to be idle: 1,024 lines
    overlaid keep the page busy for seconds, which is slow, not wrong)."""
    page.evaluate("([s, v]) => { const e = document.querySelector(s); e.value = v;"
                  " e.dispatchEvent(new Event('change')); }", [selector, value])


def _switches(page: Any, ranks: int, first: str) -> List[Tuple[bool, Callable[[], None]]]:
    """(a ranks-mode or "delta vs" switch?, the switch). At 1,024 ranks "delta vs" is left out: it overlays 1,023
    lines, tens of seconds of drawing on a busy machine (slow, which this test is not about)."""
    smooth = "v => { const s = document.getElementById('smooth'); s.value = v; s.dispatchEvent(new Event('input')); }"
    modes = [
        lambda: _select(page, "#ranks", "mean"),
        lambda: _select(page, "#ranks", "overlay"),
        lambda: _select(page, "#baseline", first),
        lambda: _select(page, "#ranks", "mean"),
        lambda: _select(page, "#baseline", ""),
        lambda: _select(page, "#ranks", "auto"),
    ]
    if ranks > 64:
        modes = [modes[0], modes[1], modes[5]]
    others = [
        lambda: _select(page, "#xaxis", "time"),
        lambda: _select(page, "#xaxis", "relative"),
        lambda: _select(page, "#xaxis", "samples"),
        lambda: _select(page, "#xaxis", "step"),
        lambda: page.click("section.chart[data-metric='loss'] .tool-log"),
        lambda: page.evaluate(smooth, "0"),
        lambda: page.evaluate(smooth, "0.9"),
        lambda: page.click("section.chart[data-metric='loss'] .tool-log"),
        lambda: _select(page, "#tooltip-sort", "ascending"),
        lambda: _select(page, "#tooltip-sort", "descending"),
        lambda: _select(page, "#tooltip-sort", "nearest"),
        lambda: page.fill("#metric-filter", "lo"),
        lambda: page.fill("#metric-filter", ""),
        lambda: page.click("#theme"),
        lambda: page.click("#theme"),
    ]
    if ranks > 8:  # the sources' table and its filter
        others += [lambda: page.fill("#source-filter", "rank_1"), lambda: page.fill("#source-filter", "")]
    if ranks <= 64:  # pin, enlarge, and the filter's matches in one chart (1,024 lines drawn again: slow, not wrong)
        check = "v => { const c = document.getElementById('combine'); c.checked = v; c.dispatchEvent(new Event('change')); }"
        others += [
            lambda: page.click("section.chart[data-metric='loss'] .tool-pin"),
            lambda: page.click("section.chart[data-metric='loss'] .tool-enlarge"),
            lambda: page.keyboard.press("Escape"),
            lambda: page.click("section.chart[data-metric='loss'] .tool-pin"),
            lambda: page.fill("#metric-filter", "loss|lr"),
            lambda: page.evaluate(check, True),
            lambda: page.evaluate(check, False),
            lambda: page.fill("#metric-filter", ""),
        ]
    return [(True, m) for m in modes] + [(False, o) for o in others]


@pytest.mark.parametrize("ranks", [1, 8, 64, 1024])
@pytest.mark.timeout(120)
def test_switching_every_mode_while_hovering_throws_nothing(browser: Any, log_writer: Any, tmp_path: Path,
                                                            ranks: int) -> None:
    logs = _logs(tmp_path / "runs", ranks)
    log_writer.finish(log_writer(logs, steps=STEPS, interval_s=0))
    server = start_mstail([], tmp_path / "mstail", args=[str(tmp_path / "runs")])
    try:
        server.wait_records(STEPS * len(logs), timeout=60)
        with dashboard(browser, server.url) as watched:
            page = watched.page
            show_chart(page, "loss")
            first = page.evaluate("() => [...window.mstail.state.sources.keys()].sort()[0]")
            for i, (mode, switch) in enumerate(_switches(page, ranks, first)):
                _hover(page, i)
                switch()
                _settle(page, i)
                # the tooltip shown now is the new view's: its rows name lines the chart draws now (none when the
                # chart draws no line: "delta vs" its only source)
                tip = page.evaluate(SHOWN_TIP)
                lines = {i.rsplit("|", 1)[0] for i in page.evaluate(DRAWN_IDS) if i.endswith(("|raw", "|line"))}
                assert tip is None or set(tip) <= lines, (i, tip, lines)
                if lines and mode:  # the ranks mode and "delta vs": the tooltip comes back at once
                    assert tip, (i, lines)
            watched.assert_clean()
    finally:
        code = server.stop()
    assert code is not None and "Traceback" not in server.stderr, server.stderr
