"""Browser fixtures for the page tests: one Chromium per module, a fresh watched page per test."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from .browser import CHROMIUM, CHROMIUM_ARGS, UI_TIMEOUT_MS, Watched


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True, timeout=30_000)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def watched(browser: Any) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(UI_TIMEOUT_MS)
    try:
        yield Watched(page)
    finally:
        context.close()
