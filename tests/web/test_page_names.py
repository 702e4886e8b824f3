"""Odd metric names drawn safely, in real headless Chromium against a real mstail: a JSONL source (written by a
writer process, history then live steps) whose metrics are named `__proto__`, `constructor`, `toString`, markup,
a name of the longest length kept, unicode, a newline, an escape sequence, nothing. Each name that is a metric
gets its chart under its safe name (`record.metric_key`), the page raises nothing and no element is injected."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, List

import pytest

from mstail.parsers.record import MAX_NAME_CHARS

from .browser import XSS_IMG, Watched

pytestmark = pytest.mark.browser

LONG = "long_" + "n" * (MAX_NAME_CHARS - 5)
#: name in the file -> the chart's name (None: no metric)
NAMES = {
    "loss": "loss",
    "__proto__": "metric___proto__",
    "constructor": "constructor",
    "toString": "toString",
    "hasOwnProperty": "hasOwnProperty",
    XSS_IMG: XSS_IMG,
    "<img src=x onerror=alert(1)>": "<img src=x onerror=alert(1)>",
    LONG: LONG,
    "损失/训练 λ": "损失/训练 λ",
    "a\nb": "a\\nb",
    "\x1b[31mred": "\\x1b[31mred",
    "": None,
}
CHARTS = sorted([*(name for name in NAMES.values() if name is not None), "perplexity"])  # derived from loss

#: `python -c WRITER FILE FIRST LAST`: appends one JSONL record a step holding every name, flushed each line.
WRITER = r'''
import json, sys
names = json.loads(sys.stdin.read())
with open(sys.argv[1], "a", encoding="utf-8") as out:
    for step in range(int(sys.argv[2]), int(sys.argv[3]) + 1):
        out.write(json.dumps({"step": step, **{name: step + i / 100 for i, name in enumerate(names)}}) + "\n")
        out.flush()
'''


def _write(path: Path, first: int, last: int) -> None:
    subprocess.run([sys.executable, "-c", WRITER, str(path), str(first), str(last)], input=json.dumps(list(NAMES)),
                   text=True, check=True, timeout=30)


def _points(watched: Watched) -> List[Any]:
    return sorted(watched.page.evaluate(
        "() => [...window.mstail.state.charts.values()].map(c => [c.metric, Number(c.el.dataset.points || 0)])"))


@pytest.mark.timeout(90)
def test_odd_metric_names_are_drawn_safely(watched: Watched, mstail_server: Any, wait_until: Any,
                                           tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    _write(log, 1, 5)
    server = mstail_server(log)
    server.wait_records(5)
    assert sorted(server.get_json("/api/sources")[0]["metrics"]) == CHARTS

    page = watched.page
    page.goto(server.url + "/", wait_until="load")
    watched.wait_live()
    wait_until(lambda: sorted(m for m, _ in _points(watched)) == CHARTS, 15, message="a chart per metric")
    watched.show_all_charts()
    assert _points(watched) == [[name, 5] for name in CHARTS]

    _write(log, 6, 8)  # live: the stream's records carry the same names
    wait_until(lambda: _points(watched) == [[name, 8] for name in CHARTS], 20, message="8 points in every chart")

    titles = page.eval_on_selector_all("section.chart", "els => els.map(e => e.firstChild.firstChild.textContent)")
    assert sorted(titles) == CHARTS  # each name shown as text
    assert page.evaluate("typeof window.__xss") == "undefined"
    assert page.eval_on_selector_all("img", "els => els.length") == 0
    assert page.evaluate("Object.getPrototypeOf({}) === Object.prototype && !('x' in Object.prototype)")
    watched.assert_clean()
