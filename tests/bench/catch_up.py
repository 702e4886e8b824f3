"""The sidecar's catch-up: a real mstail started next to a run that has been logging for days serves its full history,
while the live steps of other ranks keep arriving.

Setup (loopback only): `output/log/rank_0/info.log` holds --size-mb (default 100) of history, the single-file case of
parse_speed.py (one newest-style MindFormers info.log, about 60,000 steps; 1024: a week-long run, about 640,000 steps x
10 metrics), built once into --cache (with what `mstail parse` gives for it) and linked into the run's folder; --live
other `rank_N/info.log` files are being written by writer processes (tests/conftest.py's MindFormers writer) at --rate
steps/s, starting with mstail. A real `mstail --log 'DIR/output/log/rank_*/info.log' --port 0 --state-dir DIR/state`
subprocess is started; the bench polls /api/sources until it counts every record (what `mstail parse` gives for the
file, run first) and then `/api/series?metric=loss&source=rank_0` until it serves the last step of the history, and one
SSE client of `/api/stream` notes when each live record arrives. With --before REV the same runs alternate with the code
of git revision REV, on the same history (--rounds of each).
mstail runs with its bytecode compiled first, as an installed mstail has it (`benchsupport.installed_env`).

Printed: the time the competent loop takes to parse the history file (parse_speed.competent, the baseline of the parse
benches), once a run; the time from starting mstail to its serving line, to the first points of the history and to the
full history served through /api/series (every step, in min/max buckets), and its ratio to the loop's time; the
catch-up's rate in MB/s; mstail's peak RSS (VmHWM) and its catch-up processes'; live latency (arrival - the writer's
time just before it wrote the step line) p50/p99/max of the records written during the catch-up and after it; mstail's
CPU (and its catch-up child's, once the sidecar has waited for it) and RSS; when the child was forked (after mstail's
process started) and when it ended (its parsing done), its CPU and mstail's then and the records stored by then (what
the sidecar still had to store: the critical path's shape); the machine's load average.
With --page, headless Chromium (Debian's chromium, through Playwright) opens the page once the history's first
points are served, while the catch-up goes on: the time from opening it to its first paint (every chart on the first
screen drawn with its data: the page's `mstail-first-paint` mark, page_load.open_page) and the share of the history
stored by then. The browser starts before mstail, so the visit is all that is timed. The page stays open, as a
user's would, until the full history is served (the figures above are taken with it open); Chromium's CPU meanwhile
is printed.

Run: python tests/bench/catch_up.py [--size-mb 100] [--live 4] [--rate 10] [--keep DIR] [--before REV --rounds N]
     [--nice -10] [--page] [--cache DIR]
     the week-long run: python tests/bench/catch_up.py --size-mb 1024 --duration 60

Goals (issue 34, goals 1 and 3): the full history served <= 0.4x the competent loop's parse time of the same file
(measured in the same run); mstail's peak RSS <= 200 MB during the catch-up; live steps of other files within 100 ms
(p99) during the catch-up; with --page (issue 16), the page's first curves <= 1 s after opening it during the catch-up.
Exit status 0 when all are met, 1 otherwise. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from benchsupport import installed_env, load_test_support, record_arrivals

import parse_speed
from latency import loadavg, percentile, proc_cpu_s, proc_mem_kib

GOAL_LOOP_RATIO = 0.4
GOAL_PEAK_RSS_MB = 200.0
GOAL_LIVE_P99_MS = 100.0
GOAL_FIRST_PAINT_MS = 1000.0


def history_file(cache: Path, size_mb: float) -> Tuple[Path, int, int]:
    """The history file of `size_mb` in the cache folder (built the first time) and (records, last step) that
    `mstail parse` gives for it (parsed the first time, kept beside it)."""
    folder = cache / f"single-{size_mb:g}MB"
    path, facts = folder / "info.log", folder / "expected.json"
    if not path.exists():
        started = time.perf_counter()
        [built] = parse_speed.build_single_log(folder / "build", int(size_mb * parse_speed.MB))
        shutil.move(str(built), path)
        shutil.rmtree(folder / "build", ignore_errors=True)
        facts.unlink(missing_ok=True)
        print(f"history built in {time.perf_counter() - started:.1f} s: {path}")
    if not facts.exists():
        facts.write_text(json.dumps(expected(path, folder)))
    records, last_step = json.loads(facts.read_text())
    return path, records, last_step


def expected(path: Path, work: Path) -> Tuple[int, int]:
    """(records, last step) that `mstail parse` gives for the history file."""
    out = work / "expected.jsonl"
    done = subprocess.run([sys.executable, "-m", "mstail", "parse", str(path), "-o", str(out)], cwd=parse_speed.ROOT,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"catch_up: mstail parse failed: {done.stderr.strip()}")
    last = step = 0
    records = 0
    with open(out, encoding="utf-8") as handle:
        for line in handle:
            records += 1
            step = json.loads(line)["step"]
            last = step
    return records, last


def children_cpu_s(pid: int) -> float:
    """CPU time of the waited-for children of `pid` (the catch-up child, once the sidecar reaped it)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")  # cutime, cstime (fields 16, 17)


def child_of(pid: int) -> Optional[int]:
    """The pid of a child process of `pid` (the sidecar's catch-up child, forked by any of its threads), or None."""
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f:
            children = f.read().split()
            if children:
                return int(children[0])
    return None


def peak_rss_mb(pid: int) -> float:
    """A process's peak RSS so far (VmHWM), MiB; 0 once it is gone."""
    with contextlib.suppress(OSError):
        return proc_mem_kib(pid).get("VmHWM", 0) / 1024
    return 0.0


def loop_time(history: Path, work: Path) -> float:
    """Wall seconds the competent loop (parse_speed.competent, the parse benches' baseline) takes over the history."""
    out = work / "loop.jsonl"
    started, cpu = time.perf_counter(), parse_speed.cpu_seconds()
    parse_speed.competent([history], out)
    elapsed = time.perf_counter() - started
    out.unlink()
    print(f"the competent loop parses the history in {elapsed:.2f} s (CPU {parse_speed.cpu_seconds() - cpu:.2f} s)",
          flush=True)
    return elapsed


class ChildWatch:
    """When the sidecar's catch-up child ended (its parsing done: exited, not yet reaped) and the figures then, from
    looks every poll (`look`). Args: pid: the sidecar's."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.child: Optional[int] = None
        self.forked: Optional[float] = None  # when the child was forked, seconds after the sidecar started
        self.cpu = 0.0  # the child's CPU at the last look
        self.peak_mb = 0.0  # the child's peak RSS (with its own children's, each at its peak) seen so far
        self.ended: Optional[Tuple[float, float, float, int]] = None  # (time after start, child CPU, mstail CPU, stored)

    def look(self, since: float, stored: int) -> None:
        """One look (`since`: the sidecar's start, wall clock; `stored`: the history's records stored now)."""
        if self.ended is not None:
            return
        if self.child is None:
            self.child = child_of(self.pid)
            if self.child is None:
                return
            with contextlib.suppress(OSError, IndexError):  # (starttime: clock ticks after boot, 10 ms steps)
                self.forked = (_stat(self.child)[19] - _stat(self.pid)[19]) / os.sysconf("SC_CLK_TCK")
        self.peak_mb = max(self.peak_mb, _tree_peak_mb(self.child))
        try:
            fields = _stat(self.child)
            self.cpu = (fields[11] + fields[12]) / os.sysconf("SC_CLK_TCK")
            over = fields[0] in (ord("Z"), ord("X"))
        except (OSError, IndexError):
            over = True  # reaped already: seen a poll late
        if over:
            self.ended = (time.time() - since, self.cpu, proc_cpu_s(self.pid), stored)


class PageVisit(threading.Thread):
    """One headless Chromium visit of mstail's page (--page): the browser starts at once; `open(url, pid)` opens the
    page (`opened`, wall clock), and the visit notes its first paint (`first_paint_ms`, after opening it). The page
    stays open, as a user's would, until `leave` is set; Chromium's CPU time from opening the page until then is
    `browser_cpu_s`, and `busy` is (the page's main thread busy, its script's share, seconds since the first paint),
    from its first paint until then (Chromium's own counters)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.ready, self.go, self.leave, self.done = (threading.Event(), threading.Event(), threading.Event(),
                                                      threading.Event())
        self.browser_cpu_s: Optional[float] = None
        self.busy: Optional[Tuple[float, float, float]] = None
        self.target: Tuple[str, int] = ("", 0)
        self.opened = 0.0
        self.first_paint_ms: Optional[float] = None
        self.error: Optional[str] = None

    def open(self, url: str, pid: int) -> None:
        self.target = (url, pid)
        self.go.set()

    def run(self) -> None:  # Playwright's sync API: every call of it in this thread
        from page_load import launch_chromium, open_page, page_metrics
        from playwright.sync_api import sync_playwright

        try:
            with sync_playwright() as p:
                browser = launch_chromium(p)
                self.ready.set()
                if self.go.wait(timeout=300) and self.target[0]:
                    self.opened = time.time()
                    cpu = chromium_cpu_s()
                    context, page, self.first_paint_ms = open_page(browser, *self.target)
                    painted = time.time()
                    cdp = context.new_cdp_session(page)
                    cdp.send("Performance.enable")
                    before = page_metrics(cdp)
                    self.leave.wait(timeout=300)
                    self.browser_cpu_s = chromium_cpu_s() - cpu
                    after = page_metrics(cdp)
                    self.busy = (after["TaskDuration"] - before["TaskDuration"],
                                 after["ScriptDuration"] - before["ScriptDuration"], time.time() - painted)
                    context.close()
                browser.close()
        except Exception as exc:  # noqa: BLE001 - reported by the bench, which goes on without the page's figure
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.ready.set()
            self.done.set()


def chromium_cpu_s() -> float:
    """The CPU time (user + system) of every Chromium process on the machine so far, in seconds."""
    ticks = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as f:
                    text = f.read()
                name, fields = text[text.index("(") + 1:].rsplit(")", 1)
                if name.startswith("chrom"):
                    ticks += sum(map(int, fields.split()[11:13]))  # utime, stime (fields 14 and 15)
    return ticks / os.sysconf("SC_CLK_TCK")


def _tree_peak_mb(pid: int) -> float:
    """The peak RSS of a process and of its children (the catch-up child's parse workers), summed."""
    total = peak_rss_mb(pid)
    with contextlib.suppress(OSError, ValueError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f:
                total += sum(_tree_peak_mb(int(child)) for child in f.read().split())
    return total


def _stat(pid: int) -> List[int]:
    """The fields of /proc/PID/stat after the command, from the state (field 3) on: numbers (the state as its code)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return [ord(fields[0]), *map(int, fields[1:])]


def run(args: argparse.Namespace) -> int:
    support = load_test_support()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="mstail-catchup-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ["MSTAIL_FORMATS_DIR"] = str(work / "no-user-formats")
    log_dir = work / "output" / "log"
    cached, records, last_step = history_file(Path(args.cache), args.size_mb)
    history = log_dir / "rank_0" / "info.log"
    history.parent.mkdir(parents=True, exist_ok=True)
    history.unlink(missing_ok=True)
    try:
        os.link(cached, history)  # the cached file itself: mstail only reads it
    except OSError:  # another filesystem
        shutil.copyfile(cached, history)
    size = history.stat().st_size
    print(f"history: {size / 1e6:.1f} MB, {records:,} records (last step {last_step}) in {history.relative_to(work)}; "
          f"{args.live} live files at {args.rate:g} steps/s")
    loop_s = loop_time(history, work)
    codes: List[Tuple[str, Optional[Path]]] = [("this code", None)]
    if args.before:
        from restart import code_of

        shutil.rmtree(work / "before-code", ignore_errors=True)
        codes.append((f"code of {args.before}", code_of(args.before, work / "before-code")))
    env = installed_env([code for _, code in codes])
    met = True
    for round_ in range(args.rounds):
        for label, code in codes:
            print(f"-- {label}, round {round_ + 1}")
            this_met = measure(support, args, work, code, size, records, last_step, env, loop_s)
            met = met and (this_met or code is not None)  # the goals are this code's
    print("goals met" if met else "GOALS MISSED")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if met else 1


def measure(support: Any, args: argparse.Namespace, work: Path, code: Optional[Path], size: int, records: int,
            last_step: int, env: Dict[str, str], loop_s: float) -> bool:
    """One real mstail (run from `code`, default this tree, in `env`: `installed_env`) over the history and the live
    files; prints its figures (the history's time against `loop_s`, the competent loop's) and returns whether the
    goals were met."""
    log_dir = work / "output" / "log"
    for rank in range(1, args.live + 1):
        (log_dir / f"rank_{rank}").mkdir(parents=True, exist_ok=True)
        (log_dir / f"rank_{rank}" / "info.log").write_bytes(b"")
        (work / f"times_{rank}.txt").unlink(missing_ok=True)
    print(f"load average before: {loadavg()}")
    arrivals: Dict[Tuple[str, int], float] = {}
    stop = threading.Event()
    writers: List[subprocess.Popen] = []
    state = work / "state"
    shutil.rmtree(state, ignore_errors=True)
    visit: Optional[PageVisit] = None
    if args.page:
        visit = PageVisit()
        visit.start()
        visit.ready.wait(timeout=60)
    launched = time.time()
    here, support.ROOT = support.ROOT, code or support.ROOT  # start_mstail runs mstail from ROOT (cwd, PYTHONPATH)
    try:
        server = support.start_mstail([str(log_dir / "rank_*" / "info.log")], work / "mstail",
                                      args=("--state-dir", str(state)), env=env,
                                      preexec_fn=(lambda: os.nice(args.nice)) if args.nice else None)
    finally:
        support.ROOT = here
    serving = time.time() - launched
    first_curve: Optional[float] = None
    try:
        client = threading.Thread(target=record_arrivals, args=(server.url, arrivals.setdefault, stop, 1.0), daemon=True)
        client.start()
        deadline = time.monotonic() + 20
        while server.get_json("/healthz").get("clients", 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # connected before the first live step is written
        steps = int(args.rate * args.duration)
        for rank in range(1, args.live + 1):
            writers.append(support.spawn_writer(log_dir / f"rank_{rank}" / "info.log", steps, 1.0 / args.rate,
                                                times_path=work / f"times_{rank}.txt", seed=rank, steps_per_epoch=steps))
        served: Optional[float] = None
        stored_at_open = 0
        cpu_at_history = child_cpu = rss_at_history = peak_at_history = 0.0
        watch = ChildWatch(server.proc.pid)
        while served is None and time.time() - launched < args.timeout:
            # the page's query only once the counters say every record is in (or until a first curve is there):
            # a 2,000-bucket answer costs mstail tens of ms, which polling it every 50 ms would add to the catch-up
            info = {s["id"]: s for s in server.get_json("/api/sources")}.get("rank_0", {})
            watch.look(launched, info.get("records", 0))
            done = info.get("counters", {}).get("records") == records
            if done or first_curve is None:
                answer = server.get_json("/api/series?metric=loss&source=rank_0&points=2000")
                xs = [x for series in answer["series"] for x in series.get("x", [])]
                if xs and first_curve is None:
                    first_curve = time.time() - launched
                    if visit is not None and not done:
                        visit.open(server.url, server.proc.pid)
                        stored_at_open = info.get("records", 0)
                if done and xs and max(xs) >= last_step:
                    served = time.time() - launched
                    cpu_at_history = proc_cpu_s(server.proc.pid)
                    child_cpu = children_cpu_s(server.proc.pid)
                    rss_at_history = proc_mem_kib(server.proc.pid).get("VmRSS", 0) / 1024
                    peak_at_history = peak_rss_mb(server.proc.pid)
            time.sleep(0.05)
        if visit is not None:
            visit.leave.set()  # the history is served (or never will be): the page is closed
        for writer in writers:
            writer.wait(timeout=args.duration + 60)
        if visit is not None:
            visit.go.set()  # never opened (the history was served at the first look): the visit ends unopened
            visit.done.wait(timeout=120)
        time.sleep(1.0)  # the last live steps reach the client
        load_end = loadavg()
    finally:
        stop.set()
        for writer in writers:
            if writer.poll() is None:
                writer.kill()
                writer.wait(timeout=5)
        server.stop()

    during: List[float] = []
    after: List[float] = []
    missing = 0
    for rank in range(1, args.live + 1):
        for line in (work / f"times_{rank}.txt").read_text().split("\n"):
            if not line:
                continue
            step, before, _after = line.split()
            arrived = arrivals.get((f"rank_{rank}", int(step)))
            if arrived is None:
                missing += 1
                continue
            latency_ms = (arrived - float(before)) * 1000
            (during if served is None or float(before) - launched < served else after).append(latency_ms)
    print(f"mstail serving after {serving:.2f} s; load average at the end: {load_end}")
    if first_curve is not None:
        print(f"first points of the history served {first_curve:.2f} s after start")
    if served is None:
        print(f"history NOT served within {args.timeout:g} s")
    else:
        print(f"full history served by /api/series {served:.2f} s after start ({size / 1e6 / served:.1f} MB/s): "
              f"{served / loop_s:.2f}x the competent loop's parse   goal <= {GOAL_LOOP_RATIO:g}x\n"
              f"mstail CPU by then {cpu_at_history:.2f} s (+ {child_cpu:.2f} s in its catch-up child); "
              f"RSS {rss_at_history:.0f} MiB, peak {peak_at_history:.0f} MiB   goal <= {GOAL_PEAK_RSS_MB:g} MB "
              f"(its catch-up child's peak, with its workers': {watch.peak_mb:.0f} MiB)")
    if watch.ended is not None:
        at, cpu, parent_cpu, stored = watch.ended
        forked = f"forked {watch.forked:.2f} s, " if watch.forked is not None else ""
        print(f"catch-up child {forked}ended {at:.2f} s after start (its CPU {cpu:.2f} s; mstail's then "
              f"{parent_cpu:.2f} s), {stored:,} of {records:,} records stored by then")
    for name, values in (("during the catch-up", during), ("after it", after)):
        values.sort()
        if values:
            print(f"live latency {name}: {len(values)} records, p50 {percentile(values, 50):.0f} ms, "
                  f"p99 {percentile(values, 99):.0f} ms, max {values[-1]:.0f} ms")
    print(f"live records missing: {missing}", flush=True)
    p99 = percentile(sorted(during), 99) if during else float("inf")
    page_met = visit is None or page_figures(visit, launched, served, stored_at_open, records)
    return (served is not None and served <= GOAL_LOOP_RATIO * loop_s and peak_at_history <= GOAL_PEAK_RSS_MB
            and p99 <= GOAL_LIVE_P99_MS and not missing and page_met)


def page_figures(visit: PageVisit, launched: float, served: Optional[float], stored_at_open: int, records: int) -> bool:
    """Print the page visit's figures (--page); whether its goal was met: first curves <= 1 s after opening the page
    while the catch-up went on."""
    if visit.error is not None or visit.first_paint_ms is None:
        print(f"page: no first paint ({visit.error or 'not opened: the history was whole at the first look'})")
        return False
    painted = visit.opened + visit.first_paint_ms / 1000 - launched
    during = served is None or painted < served
    print(f"page opened {visit.opened - launched:.2f} s after start ({stored_at_open:,} of {records:,} records stored), "
          f"first curves painted {visit.first_paint_ms:.0f} ms after opening it, "
          f"{'while the catch-up went on' if during else 'after the history was served'}   goal <= "
          f"{GOAL_FIRST_PAINT_MS:g} ms during the catch-up")
    if visit.browser_cpu_s is not None:
        print(f"the page stayed open until the history was served: Chromium's CPU from opening it until then "
              f"{visit.browser_cpu_s:.2f} s", end="")
        if visit.busy is not None:
            busy, script, seconds = visit.busy
            print(f"; from its first paint until then ({seconds:.2f} s) the page's main thread was busy "
                  f"{busy * 1000:.0f} ms (script {script * 1000:.0f} ms)", end="")
        print()
    return during and visit.first_paint_ms <= GOAL_FIRST_PAINT_MS


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=100.0, help="history in rank_0's file (default 100)")
    parser.add_argument("--live", type=int, default=4, help="live files being written (default 4)")
    parser.add_argument("--rate", type=float, default=10.0, help="steps per second of each live file (default 10)")
    parser.add_argument("--duration", type=float, default=20.0, help="how long the live files are written (default 20 s)")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up waiting for the history after (default 300 s)")
    parser.add_argument("--keep", metavar="DIR", help="run in this folder and keep it")
    parser.add_argument("--cache", metavar="DIR", default=str(Path.home() / ".cache" / "mstail" / "catch-up-bench"),
                        help="where each size's history is built once and kept "
                        "(default ~/.cache/mstail/catch-up-bench)")
    parser.add_argument("--before", metavar="REV", help="also run the code of this git revision, alternating with this "
                        "code (its tree exported and put first on the path, as restart.py does)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each code (default 1)")
    parser.add_argument("--nice", type=int, default=0, help="run mstail at this niceness (e.g. -10 on a machine other "
                        "work loads, as root; default 0)")
    parser.add_argument("--page", action="store_true", help="also open the page in headless Chromium once the history's "
                        "first points are served, and time its first paint")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
