"""An open page while steps pour in (a history being caught up) and while it follows a run afterwards.

Setup (loopback only): a real mstail follows `output/log/rank_0/info.log`, which holds --history steps (MindFormers
lines from tests/conftest.py's writer); headless Chromium (Debian's chromium, through Playwright) opens the page at
1400 x 1000 and waits for its first paint. Then a writer process appends --flood steps as fast as it can, and the
page streams them; then another appends --live-s seconds of steps at 10 steps/s.

Printed, from Chromium's own counters (less swayed by the machine's load than wall times): the page's main thread
busy (and its script's share) from the flood's start until the loss chart shows its last step, and during the live
steps after it; the most points the loss chart held meanwhile (sampled every 50 ms) and at the end; how long after
the flood's start the last step was on the chart. With --before REV the same runs alternate with the page and mstail
of git revision REV (--rounds of each).

Run: python tests/bench/page_flood.py [--history 100] [--flood 20000] [--live-s 5] [--before REV --rounds N]

No goal of its own: issue 16 asks for the page's first curves during a catch-up (catch_up.py --page); this is what
the page costs the machine meanwhile and afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from benchsupport import installed_env, load_test_support

from page_load import launch_chromium, open_page, page_metrics

LIVE_RATE = 10.0


def _busy(cdp: Any) -> Tuple[float, float]:
    metrics = page_metrics(cdp)
    return metrics["TaskDuration"], metrics["ScriptDuration"]


def _points(page: Any) -> int:
    return int(page.evaluate("() => +(document.querySelector('section.chart[data-metric=\"loss\"]')?.dataset.points || 0)"))


def _last_step(page: Any) -> int:
    return int(page.evaluate("() => Math.max(0, ...(window.mstail.chartData('loss') || []).map(l => l.x[l.x.length - 1] || 0))"))


def measure(support: Any, browser: Any, args: argparse.Namespace, work: Path, code: Optional[Path],
            env: Dict[str, str]) -> None:
    """One round: a fresh log and mstail (run from `code`, None: this tree), the page, the flood, the live steps."""
    shutil.rmtree(work / "run", ignore_errors=True)
    log = work / "run" / "output" / "log" / "rank_0" / "info.log"
    support.finish_writer(support.spawn_writer(log, args.history, 0.0))
    here, support.ROOT = support.ROOT, code or support.ROOT  # start_mstail runs mstail from ROOT (cwd, PYTHONPATH)
    try:
        server = support.start_mstail([str(log)], work / "run" / "mstail", args=("--state-dir", str(work / "run" / "state")),
                                      env=env)
    finally:
        support.ROOT = here
    try:
        server.wait_records(args.history, timeout=60)
        context, page, _ = open_page(browser, server.url, server.proc.pid)
        cdp = context.new_cdp_session(page)
        cdp.send("Performance.enable")
        last = args.history + args.flood
        busy0, script0 = _busy(cdp)
        began = time.monotonic()
        writer = support.spawn_writer(log, args.flood, 0.0, start_step=args.history + 1)
        most, drawn = 0, None
        deadline = began + args.timeout
        while time.monotonic() < deadline:
            most = max(most, _points(page))
            if _last_step(page) >= last:
                drawn = time.monotonic() - began
                break
            page.wait_for_timeout(50)
        support.finish_writer(writer, timeout=args.timeout)
        busy1, script1 = _busy(cdp)
        steps = int(args.live_s * LIVE_RATE)
        writer = support.spawn_writer(log, steps, 1.0 / LIVE_RATE, start_step=last + 1)
        support.finish_writer(writer, timeout=args.live_s + 60)
        page.wait_for_timeout(500)
        busy2, script2 = _busy(cdp)
        end_points = _points(page)
        context.close()
    finally:
        server.stop()
    took = f"{drawn:.2f} s" if drawn is not None else f"NOT within {args.timeout:g} s"
    print(f"  flood of {args.flood:,} steps: its last step on the loss chart after {took}; the page's main thread busy "
          f"{(busy1 - busy0) * 1000:.0f} ms (script {(script1 - script0) * 1000:.0f} ms); the loss chart held at most "
          f"{most:,} points")
    print(f"  then {steps} live steps over {args.live_s:g} s: main thread busy {(busy2 - busy1) * 1000:.0f} ms "
          f"(script {(script2 - script1) * 1000:.0f} ms); the loss chart holds {end_points:,} points", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, default=100, help="steps logged before mstail starts (default 100)")
    parser.add_argument("--flood", type=int, default=20_000, help="steps appended as fast as possible (default 20000)")
    parser.add_argument("--live-s", type=float, default=5.0, help="seconds of live steps at 10/s after it (default 5)")
    parser.add_argument("--before", metavar="REV", help="also run the page and mstail of this git revision, alternating")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of each (default 1)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds allowed for the flood (default 120)")
    args = parser.parse_args()
    support = load_test_support()
    from playwright.sync_api import sync_playwright

    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mstail-page-flood-")))
        codes: List[Tuple[str, Optional[Path]]] = [("this code", None)]
        if args.before:
            from restart import code_of

            codes.append((f"code of {args.before}", code_of(args.before, work / "before-code")))
        env = installed_env([code for _, code in codes])
        p = stack.enter_context(sync_playwright())
        browser = launch_chromium(p)
        stack.callback(browser.close)
        for round_ in range(args.rounds):
            for label, code in codes:
                print(f"-- {label}, round {round_ + 1}", flush=True)
                measure(support, browser, args, work, code, env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
