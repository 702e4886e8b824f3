"""Shared fixtures: a real `mstail` subprocess, a MindFormers-format log writer process, an artifacts folder.

    def test_something(mstail_server, log_writer, tmp_path):
        log = tmp_path / "rank_0" / "info.log"
        writer = log_writer(log, steps=20, interval_s=0.05, nan_at=(7,))
        server = mstail_server(log)                 # waits for "mstail: serving http://..."
        ...server.url, server.proc, server.get_json("/api/sources")...
        assert writer.wait(timeout=10) == 0

Everything is bounded (start-up, shutdown, writer lifetime) and listens on loopback only. The writer is a
separate process using `logging` + `RotatingFileHandler`, exactly as a MindFormers training writes
`output/log/rank_N/info.log`, so rotation, partial lines and inode changes are the real thing.
`spawn_writer` is a plain function too (tests/bench/latency.py loads it from this file).
A test that starts a process is `slow` (through these fixtures, or marked so); one not marked `slow` that starts a
process fails, so that `pytest -m "not slow"` stays an in-process tier.
"""

from __future__ import annotations

import json
import multiprocessing.process
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterable, List, Optional, Sequence, Union

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"

START_TIMEOUT_S = 20.0
#: a server that needs longer to exit after SIGINT hangs (a loaded machine took over 3 s); how promptly it exits
#: is tests/web/test_shutdown.py's
STOP_TIMEOUT_S = 10.0
_BANNER = re.compile(r"mstail: serving (http://127\.0\.0\.\d+:\d+)")  # any loopback address (node mstails)

PathLike = Union[str, "os.PathLike[str]"]
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through an *_proxy


#: Fixtures that start a process: a test using one is `slow` whatever its module says.
_PROCESS_FIXTURES = {"mstail_server", "log_writer"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    """`pytest -m "not slow"` is the fast inner loop: tests that start processes (mstail, writers), drive the
    browser or train with MindSpore are `slow` too, besides the modules marked so by hand.

    Under `-n 2 --dist loadgroup` (README's test command) a module's tests run on one worker, so that its module
    fixtures (a server, a browser, a built history) are made once, and every browser test on one worker: two pages
    drawn at once would starve each other's bounded waits on two cores."""
    grouped = getattr(config.option, "loadgroup", False)  # set by pytest-xdist in its workers
    for item in items:
        if _PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("browser") \
                or item.get_closest_marker("mindspore"):
            item.add_marker(pytest.mark.slow)
        if grouped and not item.get_closest_marker("xdist_group"):
            group = "browser" if item.get_closest_marker("browser") else item.path.stem
            item.add_marker(pytest.mark.xdist_group(group))


#: Every way a test could start a process (subprocess and asyncio's, os.system and os.popen, fork, posix_spawn,
#: multiprocessing and its pools all go through one of these), refused while a test not marked `slow` runs.
_SPAWNERS = {"subprocess.Popen": (subprocess.Popen, "_execute_child"), "os.system": (os, "system"),
             "os.fork": (os, "fork"), "os.forkpty": (os, "forkpty"), "os.posix_spawn": (os, "posix_spawn"),
             "os.posix_spawnp": (os, "posix_spawnp"), "multiprocessing": (multiprocessing.process.BaseProcess, "start")}
_SPAWNED = pytest.StashKey[List[str]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterable[None]:
    """The fast tier (`-m "not slow"`) starts no process, by construction: while a test not marked `slow` runs
    (its fixtures of every scope included), starting one raises, and the test fails."""
    if item.get_closest_marker("slow"):
        yield
        return
    attempts = item.stash[_SPAWNED] = []

    def refuse(name: str) -> Callable[..., Any]:
        def spawn(*args: Any, **kwargs: Any) -> Any:
            attempts.append(name)
            raise RuntimeError(f"this test spawns a process ({name}): mark it slow")
        return spawn

    with pytest.MonkeyPatch.context() as patch:
        for shown, (owner, name) in _SPAWNERS.items():
            patch.setattr(owner, name, refuse(shown))
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterable[None]:
    # A test whose code caught the refusal and carried on still fails.
    outcome = yield
    report = outcome.get_result()
    attempts = item.stash.get(_SPAWNED, [])
    if report.when == "call" and report.passed and attempts:
        report.outcome = "failed"
        report.longrepr = f"this test spawns a process ({', '.join(sorted(set(attempts)))}): mark it slow"


@pytest.fixture(autouse=True, scope="session")
def _state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterable[None]:
    # Every mstail the tests start (in-process or as a subprocess) keeps its history in one throwaway folder,
    # never in the user's ~/.local/state/mstail.
    os.environ["MSTAIL_STATE_DIR"] = str(tmp_path_factory.mktemp("mstail-state"))
    yield
    del os.environ["MSTAIL_STATE_DIR"]

# -- the writer process ------------------------------------------------------------------------------------
# MindFormers' file-handler format and MFLossMonitor's v1.8 step + progress lines, written on purpose here and
# not imported from tailer/: a test oracle must not come from the code under test.
WRITER_SCRIPT = r'''
import argparse, datetime, logging, logging.handlers, math, os, sys, time

FILE_FORMAT = ("[%(levelname)s] %(asctime)s [mindformers/core/callback/callback.py:%(lineno)d] "
               "%(funcName)s: %(message)s")

ap = argparse.ArgumentParser()
ap.add_argument("--path", action="append", required=True)  # several: one handler each, written in turn
ap.add_argument("--steps", type=int, required=True)
ap.add_argument("--interval", type=float, required=True)
ap.add_argument("--max-bytes", type=int, default=0)
ap.add_argument("--backup-count", type=int, default=0)
ap.add_argument("--nan-at", default="")
ap.add_argument("--spike-at", default="")
ap.add_argument("--start-step", type=int, default=1)
ap.add_argument("--steps-per-epoch", type=int, default=1000)
ap.add_argument("--times", action="append", default=[])  # one per --path
ap.add_argument("--spread", type=float, default=0.0)  # seconds between the step lines of consecutive paths
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--start-at", type=float, default=0.0)
args = ap.parse_args()

nan_at = {int(s) for s in args.nan_at.split(",") if s}
spike_at = {int(s) for s in args.spike_at.split(",") if s}

def open_log(index, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    logger = logging.getLogger("mindformers" if index == 0 else "mindformers.%d" % index)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=args.max_bytes, backupCount=args.backup_count,
                                                   encoding="utf-8")
    handler.setFormatter(logging.Formatter(FILE_FORMAT))
    logger.addHandler(handler)
    return logger, handler

logs = [open_log(index, path) for index, path in enumerate(args.path)]
times = [open(path, "a", encoding="utf-8") for path in args.times] or [None] * len(logs)

def print_output_info(logger, step, seed):
    spe = args.steps_per_epoch
    last = args.start_step + args.steps - 1
    epochs = max(1, -(-last // spe))
    epoch, in_epoch = (step - 1) // spe + 1, (step - 1) % spe + 1
    loss = float("nan") if step in nan_at else 2.0 + 8.0 * math.exp(-step / 300.0) + 0.01 * ((step * 7919 + seed) % 13)
    loss = 50.0 if step in spike_at else loss
    step_ms = 100 + (step * 31 + seed) % 17
    lr = float("%.8g" % (1e-4 * min(1.0, step / 100.0)))
    norm = round(0.8 + 3.0 * math.exp(-step / 200.0), 7)
    logger.info(
        "{ Epoch:[%3d/%3d], step:[%5d/%5d], loss:[%5.6f/%5.6f], per_step_time: %dms, lr: %s, overflow cond: %s, "
        "loss_scale: %s, global_norm: [%s], train_throughput_per_npu: %.3fT",
        epoch, epochs, in_epoch, spe, loss, loss, step_ms, repr(lr), False, 65536.0, repr(norm), 24000.0 / step_ms)
    percent = in_epoch / spe * 100
    bar = "|%-50s|" % ("\u2588" * int(50 * percent / 100))
    remaining = datetime.timedelta(seconds=int((spe - in_epoch) * step_ms / 1000))
    logger.info("  %4.1f%% %s %.5f samples/s/p  %s }", percent, bar, 8 / (step_ms / 1000), remaining)

def main():
    for logger, _ in logs:
        logger.info(".........Starting Training Model..........")
    if args.start_at:
        time.sleep(max(0.0, min(args.start_at - time.time(), 60.0)))
    t0 = time.monotonic()
    for i in range(args.steps):
        step = args.start_step + i
        for index, ((logger, _), times_file) in enumerate(zip(logs, times)):
            delay = t0 + i * args.interval + index * args.spread - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            written = time.time()
            print_output_info(logger, step, args.seed + index)  # the handler flushes after every line
            if times_file is not None:
                times_file.write("%d %.6f %.6f\n" % (step, written, time.time()))
    for (logger, handler), times_file in zip(logs, times):
        logger.info(".........Training Over!.............")
        handler.close()
        if times_file is not None:
            times_file.close()

main()
'''


def spawn_writer(
    path: Union[PathLike, Sequence[PathLike]],
    steps: int,
    interval_s: float,
    max_bytes: int = 0,
    backup_count: int = 0,
    nan_at: Iterable[int] = (),
    start_step: int = 1,
    steps_per_epoch: int = 1000,
    times_path: Union[None, PathLike, Sequence[PathLike]] = None,
    seed: int = 0,
    start_at: Optional[float] = None,
    spread_s: float = 0.0,
    spike_at: Iterable[int] = (),
) -> "subprocess.Popen[bytes]":
    """Start a process that logs `steps` MindFormers v1.8 step+progress line pairs to `path`.

    Global steps are `start_step .. start_step+steps-1` (printed as epoch / step-in-epoch with
    `steps_per_epoch`), one pair every `interval_s` seconds on an absolute schedule (0 = as fast as possible),
    framed by "Starting Training Model" and "Training Over!" lines. `max_bytes`/`backup_count` go to
    RotatingFileHandler (rotation when both are > 0). Steps in `nan_at` log a `nan` loss, steps in `spike_at` a
    loss of 50.0. With `times_path`, one "STEP BEFORE AFTER" line per step is appended there: the unix times just
    before the step line was written and just after its progress line was written (flushed).
    `start_at` (unix time, at most 60 s ahead) delays the first step so that several writers keep a chosen phase.
    Several paths (and as many `times_path`s) make one process write several logs, each step to each in turn,
    `spread_s` apart (file k's lines come k * `spread_s` after the first file's; seeds `seed`, `seed` + 1, ...):
    a thousand rank files without a thousand processes.
    The caller owns the Popen (the `log_writer` fixture kills leftovers at teardown).
    """
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    times = [] if times_path is None else [times_path] if isinstance(times_path, (str, os.PathLike)) else list(times_path)
    cmd = [sys.executable, "-c", WRITER_SCRIPT]
    for one in paths:
        cmd += ["--path", os.fspath(one)]
    for one in times:
        cmd += ["--times", os.fspath(one)]
    cmd += [
        "--steps", str(int(steps)),
        "--interval", repr(float(interval_s)),
        "--max-bytes", str(int(max_bytes)),
        "--backup-count", str(int(backup_count)),
        "--nan-at", ",".join(str(int(s)) for s in nan_at),
        "--spike-at", ",".join(str(int(s)) for s in spike_at),
        "--start-step", str(int(start_step)),
        "--steps-per-epoch", str(int(steps_per_epoch)),
        "--seed", str(int(seed)),
        "--spread", repr(float(spread_s)),
    ]
    if start_at is not None:
        cmd += ["--start-at", repr(float(start_at))]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _stop(proc: "subprocess.Popen[Any]", timeout: float = 2.0) -> None:
    if proc.poll() is None:
        proc.kill()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass


class LogWriters:
    """What the `log_writer` fixture yields: call it like `spawn_writer`; `.finish(proc)` waits for one."""

    def __init__(self) -> None:
        self.procs: List["subprocess.Popen[bytes]"] = []

    def __call__(self, *args: Any, **kwargs: Any) -> "subprocess.Popen[bytes]":
        proc = spawn_writer(*args, **kwargs)
        self.procs.append(proc)
        return proc

    @staticmethod
    def finish(proc: "subprocess.Popen[bytes]", timeout: float = 30.0) -> None:
        finish_writer(proc, timeout)

    def close(self) -> None:
        for proc in self.procs:
            _stop(proc)
            if proc.stderr is not None:
                proc.stderr.close()


@pytest.fixture
def log_writer() -> Any:
    """`log_writer(path, steps, interval_s, ...)` -> Popen (see `spawn_writer`); `log_writer.finish(proc)` waits
    (bounded) for a writer and asserts it succeeded. Unfinished writers are killed at teardown."""
    writers = LogWriters()
    yield writers
    writers.close()


def finish_writer(proc: "subprocess.Popen[bytes]", timeout: float = 30.0) -> None:
    """Wait for a writer to end and assert it succeeded (its stderr in the message if not)."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        raise AssertionError(f"log writer still running after {timeout} s") from None
    err = proc.stderr.read().decode("utf-8", "replace") if proc.stderr is not None else ""
    assert proc.returncode == 0, f"log writer failed ({proc.returncode}): {err}"


# -- waiting ----------------------------------------------------------------------------------------------
def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.05, message: str = "") -> Any:
    """Poll `predicate` until it returns something truthy (returned) or `timeout` seconds pass (AssertionError).
    Exceptions from the predicate count as "not yet" until the deadline; the last one is reported."""
    deadline = time.monotonic() + timeout
    last_exc: Optional[BaseException] = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - reported below if it never succeeds
            last_exc = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_exc!r})" if last_exc is not None else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {message or predicate}{detail}")
        time.sleep(interval)


# -- the mstail server ------------------------------------------------------------------------------------
class MstailServer:
    """A running `python -m tailer --log ... --port 0` and how to reach it."""

    def __init__(self, proc: "subprocess.Popen[bytes]", url: str, stdout_path: Path, stderr_path: Path) -> None:
        self.proc = proc
        self.url = url
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text("utf-8", "replace")

    def get_json(self, path: str, timeout: float = 5.0) -> Any:
        with _NO_PROXY.open(self.url + path, timeout=timeout) as response:
            return json.loads(response.read().decode("utf-8"))

    def wait_records(self, count: int, timeout: float = 15.0, source: Optional[str] = None) -> List[dict]:
        """Wait until /api/sources reports at least `count` records (in `source`, or summed over all)."""

        def enough() -> Optional[List[dict]]:
            sources = self.get_json("/api/sources")
            held = sum(s["records"] for s in sources if source is None or s["id"] == source)
            return sources if held >= count else None

        return wait_until(enough, timeout, message=f"{count} records in /api/sources")

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> Optional[int]:
        """SIGINT, then wait up to `timeout` s; returns the exit code, or None if it had to be killed."""
        if self.proc.poll() is not None:
            return self.proc.returncode
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
            return None


def start_mstail(
    logs: Sequence[PathLike],
    workdir: Path,
    args: Sequence[str] = (),
    timeout: float = START_TIMEOUT_S,
    env: Optional[dict] = None,
    preexec_fn: Optional[Callable[[], None]] = None,
) -> MstailServer:
    """Start a real mstail on loopback with a free port and wait (bounded) for its "serving" line.
    `preexec_fn` runs in the child before mstail starts (e.g. to lower its resource limits)."""
    workdir.mkdir(parents=True, exist_ok=True)
    stdout_path, stderr_path = workdir / "mstail.stdout", workdir / "mstail.stderr"
    cmd = [sys.executable, "-m", "mstail"]
    for log in logs:
        cmd += ["--log", os.fspath(log)]
    cmd += ["--host", "127.0.0.1", "--port", "0", *args]
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONUNBUFFERED"] = "1"
    child_env.setdefault("MSTAIL_FORMATS_DIR", str(workdir / "no-user-formats"))  # no formats from ~/.config
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), child_env.get("PYTHONPATH", "")]))
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        proc = subprocess.Popen(cmd, cwd=str(ROOT), env=child_env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                preexec_fn=preexec_fn)
    deadline = time.monotonic() + timeout
    while True:
        match = _BANNER.search(stdout_path.read_text("utf-8", "replace"))
        if match:
            return MstailServer(proc, match.group(1), stdout_path, stderr_path)
        if proc.poll() is not None:
            raise AssertionError(
                f"mstail exited with {proc.returncode} before serving; stderr:\n{stderr_path.read_text('utf-8', 'replace')}"
            )
        if time.monotonic() >= deadline:
            proc.kill()
            proc.wait(timeout=5)
            raise AssertionError(
                f"mstail did not print its serving line within {timeout} s; stderr:\n{stderr_path.read_text('utf-8', 'replace')}"
            )
        time.sleep(0.05)


@pytest.fixture
def mstail_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """`mstail_server(*logs, args=(), env=None, preexec_fn=None)` -> MstailServer (`.url`, `.proc`, `.get_json()`,
    `.wait_records()`).

    Teardown sends SIGINT to every server started and fails the test if one needs more than
    `STOP_TIMEOUT_S` seconds to exit, or printed a traceback.
    """
    servers: List[MstailServer] = []

    def start(*logs: PathLike, args: Sequence[str] = (), timeout: float = START_TIMEOUT_S, **options: Any) -> MstailServer:
        server = start_mstail(logs, tmp_path_factory.mktemp("mstail"), args=args, timeout=timeout, **options)
        servers.append(server)
        return server

    yield start
    problems = []
    for server in servers:
        began = time.monotonic()
        code = server.stop()
        took = time.monotonic() - began
        if code is None:
            problems.append(f"mstail {server.url} did not exit within {STOP_TIMEOUT_S} s of SIGINT (killed)")
        elif "Traceback" in server.stderr:
            problems.append(f"mstail {server.url} printed a traceback (exit {code}, {took:.2f} s):\n{server.stderr}")
    assert not problems, "\n".join(problems)


@pytest.fixture(name="wait_until")
def wait_until_fixture() -> Callable[..., Any]:
    """`wait_until(predicate, timeout, interval=0.05, message="")`: bounded polling, as a fixture."""
    return wait_until


@pytest.fixture
def artifacts_dir() -> Path:
    """tests/artifacts/: screenshots and other files worth keeping after a run (not committed)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
