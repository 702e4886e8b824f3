"""Page load at scale, in headless Chromium: a run of 1,000,000 steps x 8 metrics (`steps`), 1,024 ranks x 2,000
steps x 8 metrics (`ranks`), and 1,000 metrics (`metrics`).

Setup (this machine, loopback only): a generated JSONL log (what mstail.callback writes; the fastest format to
ingest) of --steps steps with 8 metrics (loss with a NaN and a spike, lr, grad_norm, loss_scale, overflow,
step_time_ms, throughput_tflops, samples_per_s) and its events; a real `mstail --jsonl FILE --port 0` that reads
it all (time printed); then Debian's Chromium through Playwright (1400 x 1000 viewport) opens the page.

Measured:
- first paint: navigation start -> every chart drawn with its data, smoothed (the page's `mstail-first-paint`
  mark, set one animation frame after the first render). First visit (the server builds each series' min/max
  block summary then) and second visit (browser cache disabled by the page's no-store fetches either way).
- zoom: `window.mstail.zoomTo(a, b)`, for several ranges, in phases: the zoom itself (every chart redrawn and
  painted at once with the data it holds, what a wheel shows while it turns), then the re-fetch of every
  chart's visible range, each chart redrawn as its answer arrives, and the last paint (what a wheel zoom
  starts after its 100 ms pause). The goal applies to the re-fetch + redraw of the charts on screen (those near it
  are re-fetched and drawn after them; each zoom starts once the one before is over); the full sum is printed too.
- browser JS heap after a forced GC (CDP `HeapProfiler.collectGarbage`, `Runtime.getHeapUsage`).
- /api/series response sizes (bytes) and server times for the first-paint and zoomed requests.
- mstail's RSS and its peak once the log is read and at the end (informative).

Scenarios besides it:
- ranks: --ranks JSONL files (one per rank, 1,024 by default) of --rank-steps steps (2,000) x the same 8 metrics, one
  mstail following them all. First paint (the source table, the charts on the first screen drawn as the mean + band
  the server computes across the ranks, `/api/series?aggregate=mean`, with the worst ranks on top, the heatmap
  after), heap, zooms; the aggregate answer's size and time beside the per-rank answer the page used to fetch. Screenshots, light and dark, of the first screen:
  tests/artifacts/ranks-1024-light.png and ranks-1024-dark.png.
- metrics: one JSONL file of --metric-steps steps (200) x --metrics metrics (1,000). First paint (the charts near the
  screen fetched and drawn; the others are boxes until scrolled to), then the time to scroll to the last chart and
  see it drawn, and the heap.

Run: python tests/bench/page_load.py [--only steps|ranks|metrics] [--steps 1000000] [--zooms 6] [--ranks 1024]
     [--rank-steps 2000] [--metrics 1000]

Goals: first paint <= 1.5 s, zoom (re-fetch + redraw) <= 300 ms, heap <= 200 MB, in every scenario. Exit status 0
when all are met.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

from benchsupport import load_test_support

GOAL_FIRST_PAINT_MS = 1500.0
GOAL_ZOOM_MS = 300.0
GOAL_HEAP_MB = 200.0
T0 = 1764672000.0
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def write_log(path: Path, steps: int) -> None:
    """One JSON object per step (8 metrics), a checkpoint event every 10,000 steps, a NaN and a spike."""
    nan_at, spike_at = steps // 3, (2 * steps) // 3
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"kind": "start", "time": T0, "message": "training started"}) + "\n")
        out: List[str] = []
        for step in range(1, steps + 1):
            loss = 2.0 + 8.0 * math.exp(-step / 30000.0) + 0.05 * math.sin(step * 0.37)
            loss_text = '"NaN"' if step == nan_at else repr(loss * 5 if step == spike_at else round(loss, 6))
            ms = 500 + (step * 31) % 17
            out.append(
                f'{{"step":{step},"time":{T0 + step * 0.5:.3f},"loss":{loss_text},"lr":{1e-4 * min(1.0, step / 2000):.6g},'
                f'"grad_norm":{0.8 + 3.0 * math.exp(-step / 20000.0):.6f},"loss_scale":65536.0,'
                f'"overflow":{1 if step % 50000 == 0 else 0},"step_time_ms":{ms},'
                f'"throughput_tflops":{120000.0 / ms:.3f},"samples_per_s":{8000.0 / ms:.4f}}}\n'
            )
            if step % 10000 == 0:
                out.append(json.dumps({"kind": "checkpoint", "step": step, "time": T0 + step * 0.5,
                                       "message": f"saved checkpoint at step {step}"}) + "\n")
            if len(out) >= 20000:
                f.write("".join(out))
                out = []
        f.write("".join(out))
        f.write(json.dumps({"kind": "end", "step": steps, "time": T0 + steps * 0.5, "message": "Training Over!"}) + "\n")


def get(url: str) -> Tuple[bytes, float]:
    began = time.perf_counter()
    with _NO_PROXY.open(url, timeout=120) as response:
        body = response.read()
    return body, time.perf_counter() - began


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """A process's resident memory in MiB: now (`VmRSS`), or its peak so far (`VmHWM`)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def launch_chromium(playwright: Any) -> Any:
    """Debian's headless Chromium through Playwright (a started `sync_playwright()`), as the benches drive it."""
    return playwright.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                      args=["--no-sandbox", "--disable-gpu"])


def page_metrics(cdp: Any) -> Dict[str, float]:
    """Chromium's counters for a page (`Performance.getMetrics` of a CDP session with `Performance.enable` sent):
    name -> value, the busy times (TaskDuration, ScriptDuration, LayoutDuration, ...) in seconds since it opened."""
    return {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}


def open_page(browser: Any, url: str, pid: int) -> Tuple[Any, Any, float]:
    """A new browser context on the page until its first paint; prints the page's timeline, the main thread's busy
    time (Chromium's own counters, less swayed by the machine's load than wall times) and mstail's CPU meanwhile."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    cdp = context.new_cdp_session(page)
    cdp.send("Performance.enable")
    server_cpu = cpu_s(pid)
    errors: List[str] = []
    page.on("console", lambda m: m.type in ("error", "warning") and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url + "/#t=light", wait_until="commit", timeout=60_000)
    deadline = time.monotonic() + 120
    while not page.evaluate("() => document.body && document.body.dataset.firstPaint === '1'"):
        if time.monotonic() > deadline:
            raise SystemExit("the page did not paint within 120 s")
        page.wait_for_timeout(20)
    first = page.evaluate("() => performance.getEntriesByName('mstail-first-paint')[0].startTime")
    server_cpu = cpu_s(pid) - server_cpu
    busy = page_metrics(cdp)
    slow = page.evaluate("t => performance.getEntriesByType('resource').filter(e => e.name.includes('/api/')"
                         " && e.startTime < t).sort((a, b) => b.duration - a.duration).slice(0, 4)"
                         ".map(e => [e.name.split('/api/')[1].slice(0, 70), Math.round(e.startTime), Math.round(e.duration),"
                         " e.encodedBodySize])", first)
    marks = page.evaluate("() => ['mstail-boot', 'mstail-sources', 'mstail-boxes', 'mstail-data', 'mstail-first-paint']"
                          ".map(n => [n.slice(7), Math.round(performance.getEntriesByName(n)[0].startTime)])")
    print("  page timeline (ms after navigation): " + ", ".join(f"{name} {ms}" for name, ms in marks)
          + f"; the page's main thread busy {busy['TaskDuration'] * 1000:.0f} ms (script {busy['ScriptDuration'] * 1000:.0f},"
          f" layout {busy['LayoutDuration'] * 1000:.0f}), mstail's CPU {server_cpu * 1000:.0f} ms; load average"
          f" {os.getloadavg()[0]:.2f}")
    print("  slowest requests before the first paint (path, start ms, took ms, bytes): "
          + "; ".join(f"{p} @{s} {d} ms {b / 1024:.0f} KiB" for p, s, d, b in slow))
    if errors:
        print(f"  page complained: {errors[:3]}")
    return context, page, first


ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


def record_line(step: int, seed: int = 0, slow: float = 1.0) -> str:
    loss = 2.0 + 8.0 * math.exp(-step / 600.0) + 0.05 * math.sin(step * 0.37 + seed)
    ms = (500 + (step * 31 + seed) % 17) * slow
    return (f'{{"step":{step},"time":{T0 + step * 0.5:.1f},"loss":{loss:.5f},"lr":{1e-4 * min(1.0, step / 200):.4g},'
            f'"grad_norm":{0.8 + 3.0 * math.exp(-step / 400.0):.4f},"loss_scale":65536.0,"overflow":0,'
            f'"step_time_ms":{ms:.0f},"throughput_tflops":{120000.0 / ms:.2f},"samples_per_s":{8000.0 / ms:.3f}}}\n')


def write_rank_logs(folder: Path, ranks: int, steps: int) -> List[Path]:
    """One JSONL file per rank; rank 5 is 20 % slower and 40 steps behind (a straggler to find)."""
    paths = []
    for rank in range(ranks):
        path = folder / f"rank_{rank}" / "metrics.jsonl"
        path.parent.mkdir(parents=True)
        last = steps - 40 if rank == 5 else steps
        path.write_text("".join(record_line(s, rank, 1.2 if rank == 5 else 1.0) for s in range(1, last + 1)), "utf-8")
        paths.append(path)
    return paths


def write_metric_log(path: Path, metrics: int, steps: int) -> None:
    names = [f"layer{i:04d}.grad_norm" for i in range(metrics - 1)]
    with open(path, "w", encoding="utf-8") as f:
        for step in range(1, steps + 1):
            values = ",".join(f'"{n}":{(i % 97 + 1) * 0.01 * math.exp(-step / 300):.5g}' for i, n in enumerate(names))
            f.write(f'{{"step":{step},"time":{T0 + step:.1f},"loss":{2 + 8 * math.exp(-step / 100):.5f},{values}}}\n')


def heap_mib(context: Any, page: Any) -> float:
    cdp = context.new_cdp_session(page)
    cdp.send("HeapProfiler.collectGarbage")
    return cdp.send("Runtime.getHeapUsage")["usedSize"] / 2**20


def time_zooms(page: Any, ranges: List[Tuple[Any, Any]]) -> Tuple[List[float], List[float]]:
    phases = []
    for a, b in ranges:
        settle(page)  # the zoom before is over, the charts near the screen (drawn after the first screen) included
        phase = page.evaluate("([a, b]) => window.mstail.zoomTo(a, b)", [a, b])
        phases.append(phase)
        what = "all" if a is None else f"{int(a)}-{int(b)}"
        print(f"  zoom to {what}: {phase['total']:.0f} ms = zoom and paint the held data {phase['zoom']:.0f}"
              f" + re-fetch, each chart redrawn as its answer arrives {phase['fetch']:.0f}"
              f" + the last paint {phase['redraw']:.0f}")
    return [p["total"] for p in phases], [p["fetch"] + p["redraw"] for p in phases]


def wait_records(support: Any, server: Any, count: int, timeout: float) -> None:
    def records() -> int:
        table = server.get_json("/api/sources?compact=true", timeout=60)
        column = table["keys"].index("records")
        return sum(row[column] for row in table["rows"])

    support.wait_until(lambda: records() >= count, timeout, interval=1.0, message=f"{count} records")


@contextmanager
def session(support: Any, workdir: Path, files: List[Path], records: int,
            visits: int = 5) -> Iterator[Tuple[Any, Any, Any, float, List[float]]]:
    """A real mstail reading `files` (JSONL) until it holds `records`, and Chromium on its page, opened `visits`
    times: yields (server, context, page of the last visit, first paint of the first visit in ms, of the others)."""
    from playwright.sync_api import sync_playwright

    began = time.perf_counter()
    server = support.start_mstail([], workdir, args=["--jsonl", *map(str, files)], timeout=120)
    try:
        wait_records(support, server, records, 1800)
        print(f"mstail read the log{'s' if len(files) > 1 else ''} in {time.perf_counter() - began:.1f} s; "
              f"RSS {rss_mib(server.proc.pid):.0f} MiB (peak {rss_mib(server.proc.pid, 'VmHWM'):.0f} MiB)")
        with sync_playwright() as p:
            browser = launch_chromium(p)
            try:
                context, page, cold = open_page(browser, server.url, server.proc.pid)
                later = []
                for _ in range(max(1, visits - 1)):
                    settle(page)  # the visit before is over (its heatmap and late requests answered)
                    context.close()
                    context, page, first = open_page(browser, server.url, server.proc.pid)
                    later.append(first)
                yield server, context, page, cold, later
                context.close()
            finally:
                browser.close()
        print(f"mstail RSS at the end: {rss_mib(server.proc.pid):.0f} MiB (peak {rss_mib(server.proc.pid, 'VmHWM'):.0f} "
              f"MiB); load average {os.getloadavg()[0]:.2f}")
    finally:
        server.stop(timeout=10)


def settle(page: Any, timeout: float = 60) -> None:
    """Wait until the page has no request in flight (its tracked requests: charts, heatmap)."""
    deadline = time.monotonic() + timeout
    while page.evaluate("() => document.body.dataset.busy !== '0'") and time.monotonic() < deadline:
        page.wait_for_timeout(50)


def drawn_charts(page: Any) -> int:
    return page.evaluate("() => document.querySelectorAll('section.chart[data-drawn=\"1\"]').length")


def paint_goal(what: str, cold: float, later: List[float]) -> bool:
    median = statistics.median(later)
    print(f"first paint ({what}): first visit {cold:.0f} ms (the server folds and summarises each series then); "
          f"the {len(later)} visits after it: median {median:.0f} ms, {min(later):.0f}-{max(later):.0f} ms "
          f"(goal <= {GOAL_FIRST_PAINT_MS:.0f} ms); load average {os.getloadavg()[0]:.2f}")
    return max(cold, median) <= GOAL_FIRST_PAINT_MS


def heap_goal(context: Any, page: Any) -> bool:
    used = heap_mib(context, page)
    print(f"browser JS heap: {used:.1f} MiB used (goal <= {GOAL_HEAP_MB:.0f} MB)")
    return used <= GOAL_HEAP_MB


def series_sizes(server: Any, queries: List[Tuple[str, str]]) -> None:
    """Each query's answer size and time (a query without a path is one of /api/series)."""
    for what, query in queries:
        path = query if query.startswith("/") else f"/api/series?{query}"
        body, seconds = get(f"{server.url}{path}")
        print(f"{path.split('?')[0]} {what}: {len(body) / 1024:.1f} KiB in {seconds * 1000:.0f} ms")


def scenario_steps(support: Any, args: Any, work: Path) -> bool:
    log = work / "metrics.jsonl"
    began = time.perf_counter()
    write_log(log, args.steps)
    print(f"[steps] log: {args.steps:,} steps x 8 metrics, {log.stat().st_size / 1e6:.0f} MB JSONL, written in "
          f"{time.perf_counter() - began:.1f} s; load average {os.getloadavg()[0]:.2f}")
    with session(support, work / "mstail", [log], args.steps) as (server, context, page, cold, later):
        ok = paint_goal(f"{drawn_charts(page)} charts drawn", cold, later)
        n = args.steps
        ranges = [(n * 0.4, n * 0.6), (n * 0.45, n * 0.46), (n * 0.451, n * 0.4512), (n * 0.1, n * 0.9),
                  (n * 0.7, n * 0.7 + 500), (n * 0.3332, n * 0.3335)][: max(1, args.zooms)]
        took, refetch = time_zooms(page, [*ranges, (None, None)])
        print(f"zoom -> every chart re-fetched and redrawn ({len(took)} zooms incl. back to all): median "
              f"{statistics.median(took):.0f} ms, max {max(took):.0f} ms; re-fetch + redraw alone: median "
              f"{statistics.median(refetch):.0f} ms, max {max(refetch):.0f} ms (goal <= {GOAL_ZOOM_MS:.0f} ms; "
              f"a wheel zoom redraws at once and re-fetches after a 100 ms pause)")
        ok = heap_goal(context, page) and ok and max(refetch) <= GOAL_ZOOM_MS
        series_sizes(server, [
            ("first paint, loss (1400 px chart -> 660 buckets, smoothed)", "metric=loss&points=660&smooth=0.6"),
            ("zoomed 0.02 % (200 exact points)", f"metric=loss&points=660&smooth=0.6&start={int(n * 0.451)}&end={int(n * 0.4512)}"),
            ("unsmoothed, 2000 buckets", "metric=loss&points=2000")])
    return ok


def scenario_ranks(support: Any, args: Any, work: Path) -> bool:
    began = time.perf_counter()
    paths = write_rank_logs(work / "ranks", args.ranks, args.rank_steps)
    size = sum(p.stat().st_size for p in paths)
    print(f"[ranks] logs: {args.ranks:,} ranks x {args.rank_steps:,} steps x 8 metrics, {size / 1e6:.0f} MB JSONL, "
          f"written in {time.perf_counter() - began:.1f} s; load average {os.getloadavg()[0]:.2f}")
    with session(support, work / "mstail-ranks", paths, args.ranks * args.rank_steps - 40) as (server, context, page, cold, later):
        facts = page.evaluate("() => ({ mode: document.querySelector('section.chart').dataset.mode,"
                              " layout: document.getElementById('sources-panel').dataset.layout })")
        ok = paint_goal(f"{drawn_charts(page)} charts drawn, {facts['mode']} mode, the sources as a {facts['layout']}",
                        cold, later)
        settle(page)
        page.wait_for_function("() => document.getElementById('heatmap').dataset.cells", timeout=60_000)
        settle(page)
        n = args.rank_steps
        took, refetch = time_zooms(page, [(n * 0.4, n * 0.6), (n * 0.45, n * 0.46), (n * 0.1, n * 0.9), (None, None)])
        print(f"zoom with {args.ranks} ranks: re-fetch + redraw median {statistics.median(refetch):.0f} ms, "
              f"max {max(refetch):.0f} ms (goal <= {GOAL_ZOOM_MS:.0f} ms); with the immediate redraw: median "
              f"{statistics.median(took):.0f} ms, max {max(took):.0f} ms")
        ok = heap_goal(context, page) and ok and max(refetch) <= GOAL_ZOOM_MS
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.evaluate("() => window.scrollTo(0, 0)")
        page.wait_for_timeout(300)
        page.screenshot(path=str(ARTIFACTS / "ranks-1024-light.png"))
        page.click("#theme")
        page.wait_for_timeout(600)
        page.screenshot(path=str(ARTIFACTS / "ranks-1024-dark.png"))
        print(f"screenshots: {ARTIFACTS / 'ranks-1024-light.png'}, {ARTIFACTS / 'ranks-1024-dark.png'}")
        share = max(50, 60000 // args.ranks)  # chart.js MANY_SOURCES_POINTS shared by the ranks
        series_sizes(server, [
            ("loss, the server's mean + band of every rank, 660 buckets, smoothed (what the page asks now)",
             "metric=loss&points=660&smooth=0.6&aggregate=mean"),
            ("the same zoomed to 10 % of the run", f"metric=loss&points=660&smooth=0.6&aggregate=mean"
             f"&start={int(n * 0.45)}&end={int(n * 0.55)}"),
            (f"loss, {share} buckets per rank (what the page asked before: every rank's series)",
             f"metric=loss&points={share}&smooth=0.6"),
            ("heatmap, 39 columns per rank (what the page asked before)", "metric=step_time_ms&points=39&smooth=0.9"),
            ("the heatmap the page asks now: 32 rows x 120 columns", "/api/heatmap?columns=120&rows=32"),
            ("the sources, as the page asks first", "/api/sources?compact=true"),
            ("the sources with their counters", "/api/sources")])
    return ok


def scenario_metrics(support: Any, args: Any, work: Path) -> bool:
    log = work / "many-metrics.jsonl"
    began = time.perf_counter()
    write_metric_log(log, args.metrics, args.metric_steps)
    print(f"[metrics] log: {args.metrics:,} metrics x {args.metric_steps} steps, {log.stat().st_size / 1e6:.0f} MB JSONL, "
          f"written in {time.perf_counter() - began:.1f} s")
    with session(support, work / "mstail-metrics", [log], args.metric_steps) as (server, context, page, cold, later):
        boxes = page.evaluate("() => document.querySelectorAll('section.chart').length")
        ok = paint_goal(f"{boxes} chart boxes, {drawn_charts(page)} drawn near the screen", cold, later)
        began = time.perf_counter()
        last = page.evaluate("() => { const e = [...document.querySelectorAll('section.chart')].pop();"
                             " e.scrollIntoView(); return e.dataset.metric; }")
        while page.evaluate("m => window.mstail.state.charts.get(m).el.dataset.drawn !== '1'", last):
            page.wait_for_timeout(10)
        print(f"scrolled to the last chart ({last}): drawn {1000 * (time.perf_counter() - began):.0f} ms later")
        ok = heap_goal(context, page) and ok
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=["steps", "ranks", "metrics"], help="one scenario (default: all three)")
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--zooms", type=int, default=6, help="zoom ranges to time (default 6)")
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--rank-steps", type=int, default=2000)
    ap.add_argument("--metrics", type=int, default=1000)
    ap.add_argument("--metric-steps", type=int, default=200)
    args = ap.parse_args()
    support = load_test_support()
    work = Path(tempfile.mkdtemp(prefix="mstail-page-bench-"))
    scenarios = {"steps": scenario_steps, "ranks": scenario_ranks, "metrics": scenario_metrics}
    results = {}
    for name, run in scenarios.items():
        if args.only in (None, name):
            results[name] = run(support, args, work)
    for name, met in results.items():
        print(f"{name}: {'goal met' if met else 'goal MISSED'}")
    ok = all(results.values())
    print("goal met" if ok else "goal MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
