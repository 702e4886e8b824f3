"""Marks that never hide each other, in real headless Chromium against a real mstail following 64 ranks with many
alerts at nearby steps: the alert labels, the NaN labels and the event glyphs drawn on the loss chart are each
apart (stacked, or merged with a count), at the whole run and zoomed in."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from .browser import served_dashboard, show_chart, wait_js, write_rank_jsonl

pytestmark = pytest.mark.browser

RANKS = 64
STEPS = 300
# Every box drawn for a mark on the loss chart: the labels (text with " @ "), and the event glyphs (from their data).
BOXES = """() => {
  const chart = window.mstail.state.charts.get('loss').chart;
  const labels = chart.getZr().storage.getDisplayList(true)
    .filter(el => el.style && typeof el.style.text === 'string' && el.style.text.includes(' @ ') && !el.ignore
            && !el.invisible && el.style.opacity !== 0)
    .map(el => { const r = el.getBoundingRect().clone(); if (el.transform) r.applyTransform(el.transform);
                 return {what: el.style.text, box: [r.x, r.y, r.x + r.width, r.y + r.height]}; });
  const events = (chart.getOption().series.find(s => s && s.id === 'events') || {data: []}).data;
  const glyphs = events.map(d => { const [x, y] = chart.convertToPixel({xAxisIndex: 0, yAxisIndex: 1}, d.value);
    const h = d.symbolSize / 2; return {what: `${d.item.kind} @ ${d.item.step}`, box: [x - h, y - h, x + h, y + h]}; });
  return labels.concat(glyphs);
}"""


def _write(root: Path) -> List[str]:
    def record(rank: int, s: int) -> Dict[str, Any]:
        nan_at = {200 + rank % 5} if rank % 8 == 0 else set()  # 8 NaNs (each labelled), 8 alerts at 200-204
        return {"step": s, "loss": "NaN" if s in nan_at else 3.0 - s / STEPS + 0.001 * rank,
                "overflow": s in range(150 + rank % 7, 153 + rank % 7)}

    return write_rank_jsonl(root, RANKS, STEPS, record)


@pytest.fixture(scope="module")
def marks64(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("marks64")
    with served_dashboard(browser, root / "mstail", ["--jsonl", *_write(root / "job")], RANKS * STEPS) as watched:
        yield watched


def _overlaps(boxes: List[Any]) -> List[Any]:
    def meet(a: List[float], b: List[float]) -> bool:
        return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
    return [(p["what"], q["what"]) for i, p in enumerate(boxes) for q in boxes[i + 1:] if meet(p["box"], q["box"])]


@pytest.mark.timeout(90)
def test_marks_and_labels_never_overlap(marks64: Any) -> None:
    page = marks64.page
    show_chart(page, "overflow")
    found: List[Any] = []
    for ranks in ("overlay", "mean"):
        page.select_option("#ranks", ranks)
        for zoom in (None, (195, 210), (140, 160)):
            page.evaluate("z => z ? window.mstail.zoomTo(z[0], z[1]) : window.mstail.zoomTo(null, null)", zoom)
            show_chart(page, "loss")
            wait_js(page, "() => +window.mstail.state.charts.get('loss').el.dataset.alertMarks > 0")
            boxes = page.evaluate(BOXES)
            if zoom != (140, 160):  # the NaNs' and the alerts' steps
                assert any("nonfinite" in b["what"] for b in boxes), (ranks, zoom, boxes)
                assert any(b["what"].startswith("NaN @ ") for b in boxes), (ranks, zoom, boxes)
            assert any(b["what"].startswith("overflow") for b in boxes), boxes
            found += [(ranks, zoom, o) for o in _overlaps(boxes)]
    assert found == [], "\n".join(map(str, found[:12]))
    page.select_option("#ranks", "auto")
    marks64.assert_clean()
