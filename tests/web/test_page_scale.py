"""Many ranks and many metrics, in real headless Chromium against a real mstail following JSONL runs written here.

- 32 ranks: the sources are a compact table (natural order, filter, sort by lag / step time / loss, the worst
  highlighted), the charts start on the first screen, the charts draw the mean + band with the worst ranks on top,
  the drawn lines have distinct colours, the heatmap rows are readable. Screenshots (light and dark):
  tests/artifacts/ranks-32-light.png and ranks-32-dark.png.
- The step-time heatmap has no empty column whatever the logging stride (1, 2, 10) or the number of points.
- Many metrics: charts are made as boxes and drawn only near the screen, grouped and foldable, with a filter box.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from ..conftest import start_mstail
from .browser import dashboard, show_chart, wait_js

pytestmark = pytest.mark.browser

RANKS = 32
STEPS = 200
SLOW = 7        # this rank's steps take 40 % longer and it is 30 steps behind
T0 = time.time() - 3600


def _write(path: Path, lines: List[Dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)


def _rank_lines(rank: int, steps: int, stride: int = 1, slow: bool = False) -> List[Dict[str, Any]]:
    return [{"step": s, "time": T0 + s * 0.1, "loss": 2.0 + 5.0 * math.exp(-s / 50) + 0.02 * ((s * 7 + rank) % 5),
             "lr": 1e-4 * min(1.0, s / 50), "step_time_ms": (140 if slow else 100) + (s + rank) % 5}
            for s in range(stride, steps + 1, stride)]


@pytest.fixture(scope="module")
def ranks32(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("ranks32")
    for rank in range(RANKS):
        steps = STEPS - 30 if rank == SLOW else STEPS
        _write(root / "job" / f"rank_{rank}" / "metrics.jsonl", _rank_lines(rank, steps, slow=rank == SLOW))
    files = [str(root / "job" / f"rank_{r}" / "metrics.jsonl") for r in range(RANKS)]
    server = start_mstail([], root / "mstail", args=["--jsonl", *files])
    try:
        server.wait_records(RANKS * STEPS - 30, timeout=60)
        with dashboard(browser, server.url) as watched:
            yield server, watched
    finally:
        code = server.stop()
    assert code is not None and "Traceback" not in server.stderr, server.stderr


@pytest.mark.timeout(90)
def test_32_ranks_table_mean_band_and_first_screen(ranks32: Any, artifacts_dir: Path) -> None:
    server, watched = ranks32
    page = watched.page
    ids = {s["id"]: s for s in server.get_json("/api/sources")}
    assert len(ids) == RANKS
    slow = next(i for i, s in ids.items() if f"rank_{SLOW}/" in s["path"])
    assert page.get_attribute("#sources-panel", "data-layout") == "table"
    rows = page.eval_on_selector_all("#sources tr.source", "els => els.map(e => e.dataset.source)")
    assert rows == sorted(ids, key=lambda i: int(i.rsplit("_", 1)[-1]))  # natural order
    # the charts start on the first screen
    top = page.evaluate("() => document.querySelector('section.chart').getBoundingClientRect().top")
    assert top < 1000 * 0.75, top
    # the worst rank (behind and slow) is highlighted and drawn on top of the mean + band
    wait_js(page, "s => document.querySelector(`#sources tr.source[data-source=\"${s}\"]`).classList.contains('worst')", arg=slow)
    wait_js(page, "() => document.querySelector(\"section.chart[data-metric='loss']\").dataset.mode === 'mean'")
    series = page.evaluate("() => window.mstail.option('loss').series.map(s => [s.id, s.name, s.color])")
    names = [n for _, n, _ in series]
    assert f"mean of {RANKS}" in names and "min–max" in names
    drawn = {n for i, n, _ in series if str(i).endswith("|raw")}
    assert drawn == {slow}, drawn
    # sort by lag: the rank behind comes first; filter by name
    page.select_option("#source-sort", "lag")
    wait_js(page, "s => document.querySelector('#sources tr.source').dataset.source === s", arg=slow)
    page.fill("#source-filter", "rank_1")
    wait_js(page, "() => document.querySelectorAll('#sources tr.source').length === 11")  # rank_1, rank_10..19
    page.fill("#source-filter", "")
    page.select_option("#source-sort", "name")
    # a starred rank is drawn on top too (its star clicked once the table is whole and in name order again)
    first = rows[0]
    wait_js(page, "([n, s]) => document.querySelectorAll('#sources tr.source').length === n"
                  " && document.querySelector('#sources tr.source').dataset.source === s", arg=[RANKS, first])
    page.click(f"#sources tr.source[data-source='{first}'] .pin")
    wait_js(page, "s => window.mstail.option('loss').series.some(x => x.id === `${s}#0|raw`)", arg=first)
    # distinct colours: every source its own (the first 16 from the palette, the rest by golden-angle hues)
    colors = page.evaluate("() => [...window.mstail.state.colors.values()]")
    assert len(colors) == RANKS and len(set(colors)) == RANKS
    # heatmap: one readable row per rank, labels distinct and not cut to the same prefix
    wait_js(page, "n => document.getElementById('heatmap').dataset.rows === String(n)", arg=RANKS)
    labels = page.get_attribute("#heatmap", "data-labels").split("\n")
    assert len(labels) == RANKS and len(set(labels)) == RANKS, labels
    assert int(page.get_attribute("#heatmap", "data-empty-columns")) == 0
    page.evaluate("() => window.scrollTo(0, 0)")
    page.screenshot(path=str(artifacts_dir / "ranks-32-light.png"))
    page.click("#theme")
    wait_js(page, "() => document.documentElement.dataset.theme === 'dark'")
    page.wait_for_timeout(300)
    page.screenshot(path=str(artifacts_dir / "ranks-32-dark.png"))
    page.click("#theme")
    page.click(f"#sources tr.source[data-source='{first}'] .pin")
    # overlay on request: one line per rank
    page.select_option("#ranks", "overlay")
    wait_js(page, "n => window.mstail.option('loss').series.filter(s => s.id.endsWith('|raw')).length === n", arg=RANKS)
    page.select_option("#ranks", "auto")
    watched.assert_clean()


@pytest.mark.timeout(90)
def test_32_ranks_draw_the_servers_mean_hide_a_rank_and_follow_live(ranks32: Any) -> None:
    server, watched = ranks32
    page = watched.page
    agg = "() => { const a = window.mstail.state.charts.get('loss').agg; return a && {x: a.x, last: a.last, n: a.n," \
          " sources: a.sources, points: window.mstail.state.charts.get('loss').points()}; }"
    wait_js(page, "() => document.querySelector(\"section.chart[data-metric='loss']\").dataset.aggregate === 'server'")
    # the page's mean is the server's aggregate (one answer, not 32 series)
    mine = page.evaluate(agg)
    answer = server.get_json(f"/api/series?metric=loss&aggregate=mean&points={mine['points']}")["aggregate"]
    assert mine["sources"] == RANKS and mine["x"] == answer["x"] and mine["last"] == pytest.approx(answer["mean"])
    lines = page.evaluate("() => window.mstail.chartData('loss').length")
    assert lines <= 4, lines  # only the ranks drawn on top have lines of their own
    # hiding a rank fetches the mean without it
    hidden = page.eval_on_selector_all("#sources tr.source", "els => els.map(e => e.dataset.source)")[1]
    page.click(f"#sources tr.source[data-source='{hidden}'] button.toggle")
    wait_js(page, "n => { const a = window.mstail.state.charts.get('loss').agg; return a && a.sources === n; }", arg=RANKS - 1)
    page.click(f"#sources tr.source[data-source='{hidden}'] button.toggle")
    wait_js(page, "n => { const a = window.mstail.state.charts.get('loss').agg; return a && a.sources === n; }", arg=RANKS)
    # live: new steps of every rank but the slow one extend the mean, each cell the mean of the values logged
    root = Path(server.get_json("/api/sources")[0]["path"]).parents[1]
    new_steps = range(STEPS + 1, STEPS + 6)
    written: Dict[int, List[float]] = {s: [] for s in new_steps}
    for rank in range(RANKS):
        if rank == SLOW:
            continue
        lines_ = [line for line in _rank_lines(rank, STEPS + 5) if line["step"] in written]
        for line in lines_:
            written[line["step"]].append(line["loss"])
        with open(root / f"rank_{rank}" / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines_)
    wait_js(page, "([s, n]) => { const a = window.mstail.state.charts.get('loss').agg;"
                  " const i = a.x.indexOf(s); return i >= 0 && a.n[i] === n; }", arg=[STEPS + 5, RANKS - 1])
    mine = page.evaluate(agg)
    for step, values in written.items():
        i = mine["x"].index(step)
        assert mine["n"][i] == RANKS - 1 and mine["last"][i] == pytest.approx(sum(values) / len(values), rel=1e-12)
    watched.assert_clean()


@pytest.mark.timeout(90)
def test_the_band_of_the_mean_sets_the_y_axis(browser: Any, tmp_path: Path) -> None:
    # Each rank has a one-step spike (at a step of its own, so none is an outlier drawn on top) far above the mean
    # of 20 ranks: the y axis reaches it only through the band's highs (the band's data carries each point's low
    # and high, both on the y axis), so the band is never cut off.
    files = []
    for rank in range(20):
        lines = [{"step": s, "time": T0 + s, "loss": 1000.0 if s == 10 + 4 * rank else 2.0 + 0.01 * rank}
                 for s in range(1, 101)]
        path = tmp_path / "job" / f"rank_{rank}" / "metrics.jsonl"
        _write(path, lines)
        files.append(str(path))
    server = start_mstail([], tmp_path / "mstail", args=["--jsonl", *files])
    try:
        server.wait_records(20 * 100, timeout=60)
        with dashboard(browser, server.url) as watched:
            page = watched.page
            wait_js(page, "() => document.querySelector(\"section.chart[data-metric='loss']\").dataset.aggregate === 'server'")
            facts = page.evaluate("() => { const c = window.mstail.state.charts.get('loss');"
                                  " const i = c.agg.x.indexOf(50);"
                                  " const drawn = window.mstail.option('loss').series.filter(s => s.id.endsWith('|raw'));"
                                  " return {extent: c.chart.getModel().getComponent('yAxis', 0).axis.scale.getExtent(),"
                                  " high: c.agg.max[i], mean: c.agg.last[i], drawn: drawn.length}; }")
            assert facts["high"] == 1000.0 and facts["mean"] < 60 and facts["drawn"] == 0, facts
            assert facts["extent"][1] >= 1000.0, facts
            watched.assert_clean()
    finally:
        code = server.stop()
    assert code is not None and "Traceback" not in server.stderr, server.stderr


@pytest.mark.timeout(90)
def test_a_zoom_asks_for_the_heatmap_only_once_it_is_on_screen(ranks32: Any) -> None:
    # The heatmap's answer costs the server a pass over every rank's points (0.5 s at 1,024 ranks), which the
    # charts' answers of the next zoom waited behind: off screen it is not asked; scrolled to, it is, zoomed.
    server, watched = ranks32
    page = watched.page
    asked = "() => performance.getEntriesByType('resource').filter(e => e.name.includes('/api/heatmap')).map(e => e.name)"
    wait_js(page, "() => Number(document.getElementById('heatmap').dataset.cells || 0) > 0")
    page.set_viewport_size({"width": 1400, "height": 700})
    page.evaluate("() => window.scrollTo(0, 0)")
    assert page.evaluate("() => document.getElementById('heatmap').getBoundingClientRect().top") > 800  # off screen
    before = len(page.evaluate(asked))
    page.evaluate("() => window.mstail.zoomTo(40, 80)")
    wait_js(page, "() => document.body.dataset.busy === '0'")
    page.wait_for_timeout(300)
    assert len(page.evaluate(asked)) == before
    page.evaluate("() => document.getElementById('heatmap').scrollIntoView()")
    wait_js(page, "n => performance.getEntriesByType('resource').filter(e => e.name.includes('/api/heatmap')).length > n",
            arg=before)
    assert "start=40&end=80" in page.evaluate(asked)[-1]
    wait_js(page, "() => document.body.dataset.busy === '0'")
    assert page.evaluate("() => document.getElementById('heatmap').dataset.columns") == "41"  # steps 40..80
    page.evaluate("() => window.mstail.zoomTo(null, null)")
    page.set_viewport_size({"width": 1400, "height": 1000})
    page.evaluate("() => window.scrollTo(0, 0)")
    watched.assert_clean()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stride,steps", [(1, 50), (1, 1000), (2, 400), (10, 300)])
def test_heatmap_has_no_empty_columns(browser: Any, tmp_path: Path, stride: int, steps: int) -> None:
    files = []
    for rank in range(3):
        path = tmp_path / "job" / f"rank_{rank}" / "metrics.jsonl"
        _write(path, _rank_lines(rank, steps, stride=stride, slow=rank == 2))
        files.append(str(path))
    server = start_mstail([], tmp_path / "mstail", args=["--jsonl", *files])
    try:
        server.wait_records(3 * (steps // stride), timeout=30)
        with dashboard(browser, server.url) as watched:
            page = watched.page
            wait_js(page, "() => Number(document.getElementById('heatmap').dataset.cells || 0) > 0")
            heat = page.evaluate("() => ({...document.getElementById('heatmap').dataset})")
            columns = int(heat["columns"])
            assert columns == min(120, steps // stride), heat  # runs of consecutive logged steps, none empty
            assert int(heat["emptyColumns"]) == 0, heat
            assert int(heat["cells"]) == 3 * columns, heat  # every rank has a cell in every column
            watched.assert_clean()
    finally:
        server.stop()


@pytest.mark.timeout(120)
def test_many_metrics_are_drawn_lazily_grouped_and_filtered(browser: Any, tmp_path: Path) -> None:
    metrics = [f"layer{i:03d}_grad_norm" for i in range(300)]
    path = tmp_path / "job" / "metrics.jsonl"
    _write(path, [{"step": s, "time": T0 + s, "loss": 1.0 / s, **{m: (i + 1) * 0.01 * s for i, m in enumerate(metrics)}}
                  for s in range(1, 21)])
    server = start_mstail([], tmp_path / "mstail", args=["--jsonl", str(path)])
    try:
        server.wait_records(20, timeout=30)
        with dashboard(browser, server.url) as watched:
            page = watched.page
            assert page.eval_on_selector_all("section.chart", "els => els.length") == 302  # + perplexity (derived)
            drawn = page.eval_on_selector_all("section.chart[data-drawn='1']", "els => els.length")
            assert 1 <= drawn <= 20, drawn  # only the charts near the screen
            made = page.evaluate("() => [...window.mstail.state.charts.values()].filter(c => c.chart).length")
            assert made <= 20, made
            show_chart(page, "layer250_grad_norm")  # scrolled to: fetched and drawn then
            assert page.get_attribute("section.chart[data-metric='layer250_grad_norm']", "data-points") == "20"
            page.evaluate("() => window.scrollTo(0, 0)")
            # the filter box
            page.fill("#metric-filter", "layer12")
            wait_js(page, "() => [...document.querySelectorAll('section.chart')].filter(e => !e.hidden).length === 10")
            wait_js(page, "() => document.querySelector(\"section.chart[data-metric='layer129_grad_norm']\").dataset.drawn === '1'")
            assert "q=layer12" in page.evaluate("location.hash")
            page.fill("#metric-filter", "")
            # groups fold
            page.click("section.group[data-group='other'] .fold")
            wait_js(page, "() => document.querySelector(\"section.group[data-group='other'] .grid\").hidden")
            assert "c=other" in page.evaluate("location.hash")
            page.click("section.group[data-group='other'] .fold")
            wait_js(page, "() => !document.querySelector(\"section.group[data-group='other'] .grid\").hidden")
            watched.assert_clean()
    finally:
        server.stop()
