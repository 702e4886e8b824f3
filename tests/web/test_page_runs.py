"""Two runs below one folder (`mstail DIR`) on the page, in real headless Chromium: what the page says while the folder
holds no run, then the runs as they start, the sources grouped by run, the runs compared by default (one mean +
band per run, in the run's colour; every rank on demand with "overlay"), and a run's heading
shows or hides all its sources. Screenshot: tests/artifacts/runs-2-light.png."""

from __future__ import annotations

import pytest

from .browser import show_chart, wait_js

pytestmark = pytest.mark.browser

RANKS = 9  # 2 x 9 = 18 sources: more than MANY_LINES (16), where a single run's ranks are drawn as their mean


@pytest.mark.timeout(90)
def test_two_runs_are_grouped_and_compared(watched, mstail_server, log_writer, tmp_path, artifacts_dir):
    runs = tmp_path / "runs"
    runs.mkdir()
    server = mstail_server(args=[str(runs)])  # nothing below it yet
    page = watched.page
    page.goto(server.url + "/#t=light", wait_until="load")
    watched.wait_live()
    # the page says what it waits for, then shows the runs as they start
    wait_js(page, "f => document.getElementById('empty').textContent.includes(`No run found yet below ${f}`)",
            arg=str(runs))
    logs = [runs / f"exp{e}/output/log/rank_{r}/info.log" for e in (1, 2) for r in range(RANKS)]
    log_writer.finish(log_writer(logs, steps=20, interval_s=0))
    sources = server.wait_records(20 * len(logs))
    assert sorted((s["run"], s["id"]) for s in sources) == sorted(
        (f"exp{e}", f"exp{e}/rank_{r}") for e in (1, 2) for r in range(RANKS))
    wait_js(page, "() => document.querySelectorAll('#sources tr.source').length === 18")
    # grouped: each run's heading, then its rows
    order = page.eval_on_selector_all(
        "#sources tbody tr", "rows => rows.map(r => r.classList.contains('run-row') ? "
        "'run ' + r.querySelector('.run-heading').dataset.run : r.dataset.source).filter(Boolean)")
    assert order == ["run exp1", *(f"exp1/rank_{r}" for r in range(RANKS)),
                     "run exp2", *(f"exp2/rank_{r}" for r in range(RANKS))]
    assert page.text_content("#ranks option[value='auto']") == "auto (compare runs)"

    # compared: one mean + band per run (not one mean of all 18), each in its run's colour
    show_chart(page, "loss")
    wait_js(page, "() => document.querySelector(\"section.chart[data-metric='loss']\").dataset.mode === 'runs'")
    means = {s["name"]: s["color"] for s in page.evaluate("() => window.mstail.option('loss').series")
             if s["id"].endswith("|line")}
    assert set(means) == {f"exp1: mean of {RANKS}", f"exp2: mean of {RANKS}"}, means
    assert len(set(means.values())) == 2
    # a run's ranks on demand (overlay): 18 lines, the ranks of one run in one colour, the two runs in two
    page.select_option("#ranks", "overlay")
    wait_js(page, "() => window.mstail.option('loss').series.filter(s => s.id.endsWith('|raw')).length === 18")
    colors = {s["name"]: s["color"] for s in page.evaluate("() => window.mstail.option('loss').series")
              if s["id"].endswith("|raw")}
    assert len({colors[f"exp1/rank_{r}"] for r in range(RANKS)}) == 1
    assert len({colors[f"exp2/rank_{r}"] for r in range(RANKS)}) == 1
    assert colors["exp1/rank_0"] != colors["exp2/rank_0"]
    page.select_option("#ranks", "auto")
    page.evaluate("() => window.scrollTo(0, 0)")
    page.screenshot(path=str(artifacts_dir / "runs-2-light.png"))

    # a run's heading hides and shows its sources at once
    page.click(".run-heading[data-run='exp1']")
    wait_js(page, "() => window.mstail.view.hidden.size === 9")
    assert sorted(page.evaluate("() => [...window.mstail.view.hidden]")) == [f"exp1/rank_{r}" for r in range(RANKS)]
    assert page.get_attribute(".run-heading[data-run='exp1']", "aria-pressed") == "false"
    page.click(".run-heading[data-run='exp1']")
    wait_js(page, "() => window.mstail.view.hidden.size === 0")
    watched.assert_clean()


@pytest.mark.timeout(90)
def test_compared_runs_are_the_servers_means_and_a_runs_ranks_come_on_demand(watched, mstail_server, log_writer,
                                                                             tmp_path):
    runs = tmp_path / "runs"
    logs = [runs / f"exp{e}/output/log/rank_{r}/info.log" for e in (1, 2) for r in range(3)]
    log_writer.finish(log_writer(logs, steps=20, interval_s=0))
    server = mstail_server(args=[str(runs)])
    server.wait_records(20 * len(logs))
    page = watched.page
    asked: list = []
    page.on("request", lambda r: "/api/series?metric=loss" in r.url and asked.append(r.url))
    page.goto(server.url + "/#t=light", wait_until="load")
    watched.wait_live()
    show_chart(page, "loss")
    # one mean + band per run, each the server's mean of its 3 ranks (one request per run), no rank's own line
    wait_js(page, "() => document.querySelector(\"section.chart[data-metric='loss']\").dataset.aggregate === 'runs'")
    means = [u for u in asked if "aggregate=mean" in u]
    assert len(means) >= 2 and {("exp1%2Frank_0" in u, "exp2%2Frank_0" in u) for u in means} == {(True, False),
                                                                                               (False, True)}, asked
    series = page.evaluate("() => window.mstail.option('loss').series")
    assert sorted(s["name"] for s in series if s["id"].endswith("|line")) == ["exp1: mean of 3", "exp2: mean of 3"]
    assert not [s for s in series if s["id"].endswith("|raw")]
    assert sorted(page.evaluate("() => window.mstail.option('loss').legend[0].data")) == [
        "exp1: mean of 3", "exp2: mean of 3"]
    # the chart's CSV holds the runs' means
    rows = page.evaluate("() => window.mstail.state.charts.get('loss').visibleRows().map(r => r[0])")
    assert {"exp1: mean of 3", "exp2: mean of 3"} <= set(rows), set(rows)
    # a click on a run's legend entry: its ranks too (kept in the URL); again: its mean alone
    toggle = ("n => window.mstail.state.charts.get('loss').chart.dispatchAction("
              "{type: 'legendToggleSelect', name: n})")
    page.evaluate(toggle, "exp1: mean of 3")
    wait_js(page, "() => window.mstail.option('loss').series.filter(s => s.id.endsWith('|raw')).length === 3")
    series = page.evaluate("() => window.mstail.option('loss').series")
    assert sorted(s["name"] for s in series if s["id"].endswith("|raw")) == [f"exp1/rank_{r}" for r in range(3)]
    assert sorted(s["name"] for s in series if s["id"].endswith("|line")) == ["exp1: mean of 3", "exp2: mean of 3"]
    assert "xr=exp1" in page.url
    page.evaluate(toggle, "exp1: mean of 3")
    wait_js(page, "() => !window.mstail.option('loss').series.some(s => s.id.endsWith('|raw'))")
    assert "xr=" not in page.url
    watched.assert_clean()
