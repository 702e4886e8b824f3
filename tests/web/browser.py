"""Driving Debian's Chromium through Playwright for the page tests: launch flags, a page watched for errors,
and polling that works under the page's strict CSP (Playwright's wait_for_function needs eval)."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
UI_TIMEOUT_MS = 15_000
XSS_IMG = '<img src=x onerror="window.__xss=1">'


def wait_js(page: Any, function: str, arg: Any = None, timeout: int = UI_TIMEOUT_MS, interval_ms: int = 50) -> None:
    """`page.wait_for_function` without eval: Playwright's version evals its predicate inside the page, which
    the page's Content-Security-Policy (no 'unsafe-eval') forbids; `page.evaluate` goes through DevTools."""
    deadline = time.monotonic() + timeout / 1000
    while not page.evaluate(function, arg):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} ms waiting for {function} ({arg!r})")
        page.wait_for_timeout(interval_ms)


@contextmanager
def dashboard(browser: Any, url: str, **context_options: Any) -> Iterator[Watched]:
    """A fresh 1400 x 1000 browser context on mstail's page (light theme), live and first painted; closed after."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, **context_options)
    try:
        page = context.new_page()
        page.set_default_timeout(UI_TIMEOUT_MS)
        watched = Watched(page)
        page.goto(url + "/#t=light", wait_until="load")
        watched.wait_live()
        wait_js(page, "() => document.body.dataset.firstPaint === '1' && document.body.dataset.busy === '0'")
        yield watched
    finally:
        context.close()


def write_rank_jsonl(root: Path, ranks: int, steps: int, record: Callable[[int, int], Dict[str, Any]]) -> List[str]:
    """`root/rank_R/metrics.jsonl` for each rank, steps 1..`steps`, each line `record(rank, step)`; their paths."""
    files = []
    for rank in range(ranks):
        path = root / f"rank_{rank}" / "metrics.jsonl"
        path.parent.mkdir(parents=True)
        path.write_text("".join(json.dumps(record(rank, s)) + "\n" for s in range(1, steps + 1)), encoding="utf-8")
        files.append(str(path))
    return files


@contextmanager
def served_dashboard(browser: Any, state: Path, args: List[str], records: int) -> Iterator[Watched]:
    """A real mstail started with `args` (its state under `state`) and the page on it once `records` records are in
    (`watched.server` is the server); the server stopped after, which must end without a traceback."""
    from ..conftest import start_mstail

    server = start_mstail([], state, args=args)
    try:
        server.wait_records(records, timeout=60)
        with dashboard(browser, server.url) as watched:
            watched.server = server
            yield watched
    finally:
        code = server.stop()
    assert code is not None and "Traceback" not in server.stderr, server.stderr


def show_chart(page: Any, metric: str) -> None:
    page.evaluate("m => [...document.querySelectorAll('section.chart')].find(e => e.dataset.metric === m)"
                  ".scrollIntoView({block: 'center'})", metric)
    # drawn as the page is now (not dirty): a chart drawn once before is redrawn by the next render pass (up to
    # RENDER_MIN_INTERVAL_MS later), which would otherwise find it scrolled off again and only note what it shows
    wait_js(page, "m => { const c = window.mstail.state.charts.get(m); return !!c && c.el.dataset.drawn === '1'"
                  " && c.loaded && !c.refreshing && !c.dirty && document.body.dataset.busy === '0'; }", arg=metric)


class Watched:
    """A page plus everything it complained about."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.problems: List[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.problems.append(f"page error: {exc}"))
        page.on("requestfailed", lambda req: self.problems.append(f"request failed: {req.url} ({req.failure})"))
        page.on("response", lambda r: r.status >= 400 and self.problems.append(f"HTTP {r.status}: {r.url}"))

    def _console(self, msg: Any) -> None:
        if msg.type in ("error", "warning", "assert"):
            self.problems.append(f"console.{msg.type}: {msg.text} at {msg.location}")

    def assert_clean(self) -> None:
        assert self.problems == [], "the page complained:\n" + "\n".join(self.problems)

    # -- what the page shows ------------------------------------------------------------------------------
    def charts(self) -> Dict[str, Dict[str, int]]:
        rows = self.page.eval_on_selector_all(
            "section.chart",
            "els => els.map(e => [e.dataset.metric, +(e.dataset.points || 0), +(e.dataset.nonfinite || 0)])",
        )
        return {metric: {"points": points, "nonfinite": bad} for metric, points, bad in rows}

    def wait_chart(self, metric: str, attr: str, expected: int, timeout_ms: int = UI_TIMEOUT_MS) -> None:
        """Wait until the chart of `metric` has data-`attr` == expected."""
        wait_js(
            self.page,
            "([m, a, n]) => { const el = document.querySelector(`section.chart[data-metric=\"${m}\"]`);"
            " return !!el && Number(el.dataset[a]) === n; }",
            arg=[metric, attr, expected],
            timeout=timeout_ms,
        )

    def show_chart(self, metric: str) -> None:
        """Scroll the chart of `metric` into view (charts are fetched and drawn as they come near the screen) and
        wait until it is drawn and no request is in flight."""
        show_chart(self.page, metric)

    def show_all_charts(self) -> None:
        """Every chart drawn once (scrolled through, then back to the top): each then holds its data."""
        for metric in self.page.eval_on_selector_all("section.chart", "els => els.map(e => e.dataset.metric)"):
            self.show_chart(metric)
        self.page.evaluate("() => window.scrollTo(0, 0)")

    def reload(self) -> None:
        """Reload the page. The navigation itself aborts what the page has in flight: its open EventSource
        request, and any `/api/` question not yet answered (a chart refetching on a busy machine). Those failures
        (net::ERR_ABORTED, during the reload) are expected and removed; any other complaint, before or during the
        reload, stays."""
        self.assert_clean()
        self.page.reload(wait_until="load")
        aborted = [p for p in self.problems if p.startswith("request failed: ") and "/api/" in p
                   and p.endswith("(net::ERR_ABORTED)")]
        assert sum("/api/stream?" in p for p in aborted) <= 1, aborted
        self.problems = [p for p in self.problems if p not in aborted]
        self.wait_live()

    def wait_live(self) -> None:
        wait_js(self.page, "() => document.getElementById('connection').textContent.trim() === 'live'")
