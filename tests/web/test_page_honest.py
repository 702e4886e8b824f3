"""What the page says is true at a glance, in real headless Chromium against a real mstail.

One mstail follows JSONL runs written here (what mstail.callback writes), with exactly known content:
twelve ranks (natural order: rank_2 before rank_10), a run that ended a year ago, a run silent for a year, and a
run appended while the page is open. Checked: schedules and flags drawn unsmoothed by default (lr, overflow,
loss_scale) and smoothed on request; a series of one point drawn as a point; markers at one step all visible and
all in the legend; the file counters live (behind "file details"); an ended or old run never shown as hung.
A second mstail follows a log in no known format: the page names the file and says what to try; a third a --log
file that is not there: the page says it is missing and names the nearest file.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from ..conftest import start_mstail, wait_until
from .browser import Watched, dashboard, show_chart, wait_js

pytestmark = pytest.mark.browser

RANKS = 12
STEPS = 60
MARK_STEP = 40
YEAR_S = 365 * 86400


def _record(step: int, t: float, rank: int = 0, **extra: Any) -> Dict[str, Any]:
    return {"step": step, "time": t, "loss": 2.0 + 3.0 * math.exp(-step / 20) + 0.01 * ((step * 7 + rank) % 5),
            "lr": 1e-4 * min(1.0, step / 30), "overflow": 1 if step == MARK_STEP else 0,
            "loss_scale": 65536.0 if step < MARK_STEP else 32768.0, "step_time_ms": 100 + (step + rank) % 7, **extra}


def _write(path: Path, lines: List[Dict[str, Any]], mode: str = "w") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, mode, encoding="utf-8") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)


class Honest:
    def __init__(self, server: Any, watched: Watched, root: Path) -> None:
        self.server = server
        self.watched = watched
        self.page = watched.page
        self.root = root

    def option(self, metric: str) -> Dict[str, Any]:
        return self.page.evaluate("m => window.mstail.option(m)", metric)

    def source_id(self, part: str) -> str:
        [sid] = [s["id"] for s in self.server.get_json("/api/sources") if f"/{part}/" in s["path"]]
        return sid

    def row(self, sid: str) -> str:
        return f"#sources .source[data-source='{sid}']"


@pytest.fixture(scope="module")
def honest(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Honest]:
    root = tmp_path_factory.mktemp("honest")
    now = time.time()
    t0 = now - 600
    for rank in range(RANKS):
        lines: List[Dict[str, Any]] = [{"kind": "start", "time": t0, "message": "training started"}]
        for step in range(1, STEPS + 1):
            extra = {"eval_acc": 0.75} if rank == 0 and step == STEPS else {}
            lines.append(_record(step, t0 + step, rank, **extra))
            if rank == 0 and step == MARK_STEP:  # a checkpoint, an eval and the end at one step (+ overflow there)
                lines += [{"kind": "checkpoint", "step": step, "time": t0 + step, "message": "saved"},
                          {"kind": "eval", "step": step, "time": t0 + step, "message": "eval done"}]
        _write(root / "run" / f"rank_{rank}" / "metrics.jsonl", lines)
    _write(root / "run" / "rank_0" / "metrics.jsonl",
           [{"kind": "end", "step": MARK_STEP, "time": t0 + STEPS, "message": "Training Over!"}], mode="a")
    old = now - YEAR_S
    _write(root / "old" / "ended" / "metrics.jsonl", [_record(s, old + s) for s in range(1, 31)]
           + [{"kind": "end", "step": 30, "time": old + 31, "message": "Training Over!"}])
    _write(root / "old" / "silent" / "metrics.jsonl", [_record(s, old + s) for s in range(1, 31)])
    _write(root / "live" / "now" / "metrics.jsonl", [_record(s, now - 30 + s) for s in range(1, 11)])
    files = sorted(str(p) for p in root.rglob("metrics.jsonl"))
    server = start_mstail([], root / "mstail", args=["--jsonl", *files])
    try:
        server.wait_records(RANKS * STEPS + 70, timeout=60)
        with dashboard(browser, server.url) as watched:
            yield Honest(server, watched, root)
    finally:
        code = server.stop()
    assert code is not None, "mstail did not exit on SIGINT"
    assert "Traceback" not in server.stderr, server.stderr


def _series(option: Dict[str, Any], suffix: str) -> List[Dict[str, Any]]:
    return [s for s in option["series"] if str(s.get("id", "")).endswith(suffix)]


@pytest.mark.timeout(60)
def test_ranks_are_in_natural_order(honest: Honest) -> None:
    page = honest.page
    assert page.get_attribute("#sources-panel", "data-layout") == "table"  # more than 8 sources: a table
    ranks = [f"rank_{r}" for r in range(RANKS)]
    ids = {honest.source_id(r): r for r in ranks}
    rows = page.eval_on_selector_all("#sources .source", "els => els.map(e => e.dataset.source)")
    assert [ids[s] for s in rows if s in ids] == ranks  # rank_2 before rank_10
    legend = honest.option("loss")["legend"][0]["data"]
    assert [ids[s] for s in legend if s in ids] == ranks
    options = page.eval_on_selector_all("#baseline option", "els => els.map(e => e.value)")
    assert [ids[s] for s in options if s in ids] == ranks
    honest.watched.assert_clean()


@pytest.mark.timeout(60)
def test_schedules_and_flags_are_unsmoothed_by_default(honest: Honest) -> None:
    page = honest.page
    assert page.evaluate("window.mstail.view.smooth") == 0.6
    for metric in ("lr", "overflow", "loss_scale"):
        show_chart(page, metric)
        assert page.get_attribute(f"section.chart[data-metric='{metric}']", "data-smoothed") == "0"
        option = honest.option(metric)
        assert not _series(option, "|smooth"), metric
        sid = honest.source_id("rank_3")
        [raw] = [s for s in option["series"] if s["id"] == f"{sid}#0|raw"]
        logged = {p[0]: p[1] for p in raw["data"]}
        expected = {s: _record(s, 0, 3)[metric] for s in range(1, STEPS + 1)}
        assert all(math.isclose(logged[s], v, rel_tol=1e-9) for s, v in expected.items()), metric  # as logged
    sid = honest.source_id("rank_3")
    overflow = {p[0]: p[1] for p in _series(honest.option("overflow"), f"{sid}#0|raw")[0]["data"]}
    assert set(overflow.values()) == {0, 1}  # never 0.42
    show_chart(page, "loss")
    assert page.get_attribute("section.chart[data-metric='loss']", "data-smoothed") == "1"
    raw = _series(honest.option("loss"), "|raw")[0]
    assert raw["lineStyle"]["opacity"] >= 0.5 and raw["lineStyle"]["width"] >= 1  # the raw line clearly visible

    # Per chart: lr smoothed on request (and in the URL), then back.
    show_chart(page, "lr")
    page.click("section.chart[data-metric='lr'] .tool-smooth")
    wait_js(page, "() => document.querySelector(\"section.chart[data-metric='lr']\").dataset.smoothed === '1'"
                  " && window.mstail.option('lr').series.some(s => s.id.endsWith('|smooth'))")
    assert "f=lr" in page.evaluate("location.hash")
    page.click("section.chart[data-metric='lr'] .tool-smooth")
    wait_js(page, "() => !window.mstail.option('lr').series.some(s => s.id.endsWith('|smooth'))")
    honest.watched.assert_clean()


@pytest.mark.timeout(60)
def test_a_single_point_is_visible(honest: Honest) -> None:
    page = honest.page
    show_chart(page, "eval_acc")
    option = honest.option("eval_acc")
    drawn = [s for s in option["series"] if s["id"].endswith(("|raw", "|lone"))]
    assert [p for s in drawn for p in s["data"]] == [[STEPS, 0.75]]
    assert all(s.get("showSymbol", True) for s in drawn), drawn  # drawn as a point, not a line of length 0
    assert page.text_content("section.chart[data-metric='eval_acc'] .latest").endswith("0.75")
    honest.watched.assert_clean()


@pytest.mark.timeout(60)
def test_markers_at_one_step_are_all_visible_and_in_the_legend(honest: Honest) -> None:
    page = honest.page
    show_chart(page, "loss")
    markers = [m for m in _series(honest.option("loss"), "events")[0]["data"] if m["item"].get("step") == MARK_STEP]
    kinds = sorted(m["item"]["kind"] for m in markers)
    assert kinds == ["checkpoint", "end", "eval", "overflow"], kinds
    pixels = [page.evaluate("([s, y]) => window.mstail.pixel('loss', s, y)", [MARK_STEP, m["value"][1]]) for m in markers]
    for i, a in enumerate(pixels):  # stacked: no glyph covers another
        for b in pixels[i + 1:]:
            assert math.dist(a, b) >= 9, pixels
    assert len({m["symbol"] for m in _series(honest.option("loss"), "events")[0]["data"]}) == \
        len({m["item"]["kind"] for m in _series(honest.option("loss"), "events")[0]["data"]})  # one glyph per kind
    legend = page.eval_on_selector_all("#legend-help .glyph-item", "els => els.map(e => [e.dataset.kind,"
                                       " e.querySelector('path').getAttribute('d')])")
    assert {"start", "checkpoint", "eval", "overflow", "resume", "end", "error"} == {k for k, _ in legend}
    assert len({d for _, d in legend}) == len(legend)  # every glyph distinct
    glyphs = {m["item"]["kind"]: m["symbol"] for m in _series(honest.option("loss"), "events")[0]["data"]}
    assert all(glyphs[k] == f"path://{d}" for k, d in legend if k in glyphs)  # the legend shows the chart's glyphs
    honest.watched.assert_clean()


@pytest.mark.timeout(60)
def test_counters_advance_while_following(honest: Honest) -> None:
    page = honest.page
    sid = honest.source_id("now")
    page.click("#file-details")
    extra = f"#sources tr.source[data-source='{sid}'] + tr.source-extra .counters"
    wait_js(page, "s => !!document.querySelector(s)", arg=extra)
    assert "records 10" in page.text_content(extra)
    path = honest.root / "live" / "now" / "metrics.jsonl"
    for step in range(11, 31):
        _write(path, [_record(step, time.time())], mode="a")
        time.sleep(0.05)
    wait_until(lambda: next(s for s in honest.server.get_json("/api/sources") if s["id"] == sid)["records"] == 30, 10)
    began = time.monotonic()
    wait_js(page, "s => / records 30( |$)/.test(document.querySelector(s).textContent)", arg=extra, timeout=3000)
    assert time.monotonic() - began <= 2.5  # at most about a second behind the server
    api = next(s for s in honest.server.get_json("/api/sources") if s["id"] == sid)
    shown = page.text_content(extra)
    assert f"lines {api['counters']['lines']}" in shown and "records 30" in shown
    row = f"#sources tr.source[data-source='{sid}']"
    assert page.text_content(f"{row} .step") == "30"
    assert page.get_attribute(row, "data-state") == "following"
    page.click("#file-details")
    wait_js(page, "s => !document.querySelector(s)", arg=extra)
    honest.watched.assert_clean()


@pytest.mark.timeout(60)
def test_an_ended_or_old_run_is_not_shown_as_hung(honest: Honest) -> None:
    page = honest.page
    ended, silent = honest.source_id("ended"), honest.source_id("silent")
    assert page.get_attribute(honest.row(ended), "data-state") == "finished"  # it logged its end
    assert page.text_content(f"{honest.row(ended)} .eta") == "done"
    # silent for a year, nobody writes its file, no end logged and no total: the server calls it stopped (10 s after
    # reading it), the page too, and never "done"
    wait_until(lambda: next(s for s in honest.server.get_json("/api/sources") if s["id"] == silent)["state"] == "stopped",
               20, message="the silent run stopped")
    wait_js(page, "r => document.querySelector(r).dataset.state === 'stopped'", arg=honest.row(silent), timeout=3000)
    assert page.text_content(f"{honest.row(silent)} .eta") == "stopped"
    for sid in (ended, silent):
        since = f"{honest.row(sid)} td.since"
        assert page.get_attribute(since, "data-level") == "none"  # a year since the last step: not red
        assert page.text_content(since).startswith(("364d", "365d"))
        assert "level-bad" not in page.get_attribute(f"{honest.row(sid)} .state", "class")
    alerts = honest.server.get_json("/api/alerts")["active"]
    assert not [a for a in alerts if a["rule"] == "hang"], alerts
    honest.watched.assert_clean()


@pytest.mark.timeout(60)
def test_an_unrecognised_run_names_its_file_and_what_to_try(watched: Watched, mstail_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "job" / "train.log"
    log.parent.mkdir()
    log.write_text("".join(f"it {s} | my_loss={2.0 / s:.4f} | my_lr=0.001 | t=0.1s\n" for s in range(1, 40)),
                   encoding="utf-8")
    server = mstail_server(log)
    [info] = wait_until(lambda: [s for s in server.get_json("/api/sources") if s["counters"].get("lines") == 39], 15,
                        message="the file read")
    assert info["format"] is None and info["records"] == 0
    page = watched.page
    page.goto(server.url + "/", wait_until="load")
    watched.wait_live()
    wait_js(page, "() => document.getElementById('empty').textContent.includes('--explain')")
    text = page.text_content("#empty")
    assert str(log) in text and "--pattern" in text and "no known format" in text or "no format" in text
    info = next(s for s in server.get_json("/api/sources"))
    if info["problem"]:  # the server's own words on what it cannot do with the file, shown as they are
        wait_js(page, "p => document.getElementById('empty').textContent.includes(p)", arg=info["problem"])
        assert page.get_attribute("#sources .source", "data-state") == "noformat"
    assert page.is_visible("#empty") and page.eval_on_selector_all("section.chart", "els => els.length") == 0
    watched.assert_clean()


@pytest.mark.timeout(60)
def test_alert_labels_never_overlap(honest: Honest) -> None:
    """The same rule at one step on two sources is one line ("×2"); labels closer than a label's width are merged
    into the first ("+1"). The alerts are put into the page's table here (the alert engine's rules have their own
    tests): what is checked is how the page draws them."""
    page = honest.page
    show_chart(page, "loss")
    add = ("() => { const s = window.mstail.state; const add = (id, rule, source, step) => s.alerts.set(id, {id, rule,"
           " source, step, state: 'firing', severity: 'warning', last_seen: 0, message: ''});"
           " add('t1', 'straggler', 'a', 38); add('t2', 'straggler', 'b', 38); add('t3', 'loss_spike', 'a', 39);"
           " s.charts.get('loss').render(); }")
    page.evaluate(add)
    [alerts] = [s for s in honest.option("loss")["series"] if s["id"] == "alerts"]
    marks = alerts["markLine"]["data"]
    assert sorted(m["xAxis"] for m in marks) == [38, 39]
    labelled = [m for m in marks if m.get("label", {}).get("show", True)]
    assert [m["text"] for m in labelled] == ["straggler ×2 @ 38 +1"], marks
    page.evaluate("() => { const s = window.mstail.state; ['t1', 't2', 't3'].forEach(id => s.alerts.delete(id));"
                  " s.charts.get('loss').render(); }")
    honest.watched.assert_clean()


@pytest.mark.timeout(60)
def test_a_mistyped_log_is_shown_missing_with_the_nearest_file(watched: Watched, mstail_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "train_rank0.log").write_text("")
    typo = tmp_path / "train_rank_0.log"
    server = mstail_server(typo)
    page = watched.page
    page.goto(server.url + "/", wait_until="load")
    watched.wait_live()
    missing = f"no file train_rank_0.log in {tmp_path} after 10 s; the nearest there is train_rank0.log"
    wait_js(page, "p => document.getElementById('empty').textContent.includes(p)", arg=missing, timeout=30_000)
    assert page.get_attribute("#sources .source", "data-state") == "missing"
    assert f"{typo} (missing) — {missing}" in page.text_content("#empty")  # not blamed on the format
    watched.assert_clean()
