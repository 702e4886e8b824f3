"""The page under the token and the Content-Security-Policy, in real headless Chromium against a real mstail.

- With `--token`, the URL mstail prints (`/?token=...`) opens a working page: the cookie it sets carries the
  token for the page's own fetches and its EventSource, and later visits without `?token=` work too.
- The strict CSP costs the page nothing (no violation while it loads, streams, draws and shows tooltips) and
  does bite: an injected inline script is blocked and reported. Markup in log text stays inert.
"""

from __future__ import annotations

from typing import Any

import pytest

from .browser import XSS_IMG, Watched, wait_js
from .test_page import _error_lines

pytestmark = pytest.mark.browser

TOKEN = "page-token-0123456789abcdefABCDEF"
CSP_LISTENER = (
    "window.__csp = [];"
    "document.addEventListener('securitypolicyviolation',"
    " e => window.__csp.push(e.effectiveDirective + ' ' + e.blockedURI));"
)


def _violations(page: Any) -> list:
    return page.evaluate("window.__csp")


@pytest.mark.timeout(90)
def test_token_url_opens_a_live_page_with_no_csp_violation(watched: Watched, mstail_server, log_writer, wait_until, tmp_path):  # type: ignore[no-untyped-def]
    log = tmp_path / "rank_0" / "info.log"
    log_writer.finish(log_writer(log, steps=20, interval_s=0))
    with open(log, "a", encoding="utf-8") as f:
        f.write(_error_lines(f"history {XSS_IMG} <script>window.__xss=3</script>"))
    server = mstail_server(log, args=("--token", TOKEN))
    page = watched.page
    page.add_init_script(CSP_LISTENER)

    # Without the token: a clear 401, nothing of the page (in a context of its own: the browser's late
    # /favicon.ico request, refused too, must not land among the watched page's complaints).
    stranger = page.context.browser.new_context()
    try:
        other = stranger.new_page()
        response = other.goto(server.url + "/", wait_until="load")
        assert response is not None and response.status == 401
        assert "token" in other.text_content("body")
    finally:
        stranger.close()

    # The printed URL form: the page, its assets, its API calls and its stream all pass.
    response = page.goto(f"{server.url}/?token={TOKEN}", wait_until="load")
    assert response is not None and response.status == 200
    assert "content-security-policy" in response.headers
    watched.wait_live()
    watched.wait_chart("loss", "points", 20)
    assert page.evaluate("document.cookie") == ""  # HttpOnly: no script can read the token
    writer = log_writer(log, steps=10, interval_s=0.05, start_step=21)  # live over the token-guarded stream
    watched.wait_chart("loss", "points", 30, timeout_ms=20_000)
    log_writer.finish(writer)
    chart = page.locator('section.chart[data-metric="loss"]')
    box = chart.bounding_box()
    assert box is not None
    for fraction in (0.3, 0.5, 0.7):  # tooltips and axis pointer
        page.mouse.move(box["x"] + box["width"] * fraction, box["y"] + box["height"] * 0.5)
        page.wait_for_timeout(150)

    # A later visit without ?token= rides on the cookie. Leaving the page aborts its open stream: exactly that
    # one failed request is expected (as in Watched.reload).
    assert _violations(page) == []
    watched.assert_clean()
    response = page.goto(server.url + "/", wait_until="load")
    assert response is not None and response.status == 200
    aborted = [p for p in watched.problems if "/api/stream?" in p and p.endswith("(net::ERR_ABORTED)")]
    assert len(aborted) <= 1, aborted
    watched.problems = [p for p in watched.problems if p not in aborted]
    watched.wait_live()
    watched.wait_chart("loss", "points", 30)
    assert _violations(page) == []
    assert page.evaluate("typeof window.__xss") == "undefined"
    watched.assert_clean()


@pytest.mark.timeout(60)
def test_the_csp_blocks_an_injected_inline_script(watched: Watched, mstail_server, log_writer, tmp_path):  # type: ignore[no-untyped-def]
    log = tmp_path / "rank_0" / "info.log"
    log_writer.finish(log_writer(log, steps=5, interval_s=0))
    server = mstail_server(log)
    page = watched.page
    page.add_init_script(CSP_LISTENER)
    page.goto(server.url + "/", wait_until="load")
    watched.wait_live()
    watched.wait_chart("loss", "points", 5)
    assert _violations(page) == []
    watched.assert_clean()

    # What an XSS would try once markup got in: an inline script, an inline handler, a remote script.
    page.evaluate(
        "() => {"
        " const s = document.createElement('script'); s.textContent = 'window.__inline = 1'; document.body.appendChild(s);"
        " const d = document.createElement('div'); d.innerHTML = '<img src=\"data:,\" onerror=\"window.__handler=1\">';"
        " document.body.appendChild(d);"
        " const r = document.createElement('script'); r.src = 'https://example.com/x.js'; document.body.appendChild(r);"
        "}"
    )
    wait_js(page, "() => window.__csp.length >= 3")
    assert page.evaluate("typeof window.__inline") == "undefined"
    assert page.evaluate("typeof window.__handler") == "undefined"
    directives = sorted(v.split(" ")[0] for v in _violations(page))
    assert directives == ["script-src-attr", "script-src-elem", "script-src-elem"], directives
    # Chromium reports each blocked attempt on the console; exactly those are expected.
    blocked = [p for p in watched.problems if "Content Security Policy" in p or "example.com/x.js" in p]
    assert blocked and len(blocked) == len(watched.problems), watched.problems
