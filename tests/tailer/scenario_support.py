"""Helpers for tests/tailer/test_scenarios.py and tests/bench/rotation_scenarios.py.

- `spawn(path, count, ...)` starts tests/tailer/scenario_writer.py (a real writer process).
- `make_tailer(mode, *logs)` builds an in-process `Tailer` in one of the two modes: "events" (watchfiles on the
  parent directories plus the 1 s safety timer) or "polling" (timer only, no watcher: what NFS gets).
- `Running(tailer)` runs it as an asyncio task; `await running.until(predicate, timeout)` is bounded.
- `by_writer(records)` / `assert_exact(...)` compute missing, duplicate and out-of-order lines exactly.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

from mstail.parsers import load_formats
from mstail.tailer.config import Config
from mstail.tailer.live.hub import Hub
from mstail.tailer.live.sidecar import Tailer
from mstail.tailer.history.store import Store

WRITER = Path(__file__).with_name("scenario_writer.py")
PATTERN = r"^w=(?P<w>\d+) seq=(?P<step>\d+) pad=(?P<_pad>x*)$"
POLL_S = 0.2
MODES = {"events": None, "polling": POLL_S}


def spawn(path: Path, count: int, *, tag: int = 0, start: int = 1, **options: Any) -> "subprocess.Popen[bytes]":
    """scenario_writer.py PATH --count N --tag T --start S --<option> <value> (True flags: --<option>)."""
    cmd = [sys.executable, str(WRITER), str(path), "--count", str(count), "--tag", str(tag), "--start", str(start)]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            cmd.append(flag)
        elif value not in (None, False):
            cmd += [flag, str(value)]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(*procs: "subprocess.Popen[bytes]", timeout: float = 30.0) -> None:
    """Wait (bounded) for writers; each must print "done" and exit 0."""
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=5)
            raise AssertionError(f"writer still running after {timeout} s: {proc.args}") from None
        assert proc.returncode == 0 and out.strip() == b"done", (proc.args, err.decode(errors="replace"))


async def finished(*procs: "subprocess.Popen[bytes]", timeout: float = 30.0) -> None:
    """`finish` for code on the event loop: waits without blocking it (the tailer keeps running meanwhile)."""
    deadline = time.monotonic() + timeout
    while any(proc.poll() is None for proc in procs) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    finish(*procs, timeout=max(0.1, deadline - time.monotonic()))


def make_tailer(mode: str, *logs: str, **config: Any) -> Tailer:
    config.setdefault("format", "pattern")
    config.setdefault("alert_rules", None)
    settings = Config(logs=logs, patterns=config.pop("patterns", (PATTERN,)), poll_s=MODES[mode], **config)
    formats = load_formats(patterns=settings.patterns, user_dir=Path("/nonexistent"))
    return Tailer(settings, formats, Store(), Hub())


class Running:
    """`async with Running(tailer) as run:` tails in the background of the test's event loop."""

    def __init__(self, tailer: Tailer) -> None:
        self.tailer = tailer
        self._stop = asyncio.Event()
        self._task: Optional["asyncio.Task[None]"] = None

    async def __aenter__(self) -> "Running":
        self._task = asyncio.create_task(self.tailer.run(self._stop))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._stop.set()
        assert self._task is not None
        await asyncio.wait_for(self._task, 10)

    async def until(self, predicate: Callable[[], Any], timeout: float, message: str = "") -> Any:
        deadline = time.monotonic() + timeout
        while True:
            assert self._task is not None
            if self._task.done():
                self._task.result()  # re-raises a crash of the tailer
                raise AssertionError("the tailer stopped")
            value = predicate()
            if value:
                return value
            if time.monotonic() >= deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {message or predicate}")
            await asyncio.sleep(0.02)

    async def settle(self, seconds: float) -> None:
        """Let the tailer run a little longer (late lines, a second pass) before the final checks."""
        await asyncio.sleep(seconds)


def records(tailer: Tailer, source: Optional[str] = None) -> List[Dict[str, Any]]:
    return [r for r in tailer.store.records_after(0, 10**9) if source is None or r["source"] == source]


def count(tailer: Tailer, source: Optional[str] = None) -> int:
    return sum(info.records for sid, info in tailer.store.sources.items() if source is None or sid == source)


def counters(tailer: Tailer, source: str) -> Dict[str, int]:
    return dict(tailer.store.sources[source].counters)


def by_writer(items: Iterable[Dict[str, Any]]) -> Dict[int, List[int]]:
    """Writer tag -> its steps in the order they were stored."""
    out: Dict[int, List[int]] = {}
    for item in items:
        out.setdefault(int(item["w"]), []).append(int(item["step"]))
    return out


def problems(got: Sequence[int], expected: Sequence[int]) -> Dict[str, Any]:
    """Missing, duplicated and out-of-order steps of one writer (empty dict when `got == expected`)."""
    counts = Counter(got)
    missing = sorted(set(expected) - set(got))
    dups = sorted(s for s, n in counts.items() if n > 1)
    extra = sorted(set(got) - set(expected))
    disorder = sum(1 for a, b in zip(got, got[1:]) if b <= a)
    found = {"missing": missing[:20], "n_missing": len(missing), "duplicates": dups[:20], "n_duplicates": len(dups),
             "unexpected": extra[:20], "out_of_order": disorder}
    return {} if list(got) == list(expected) else found


def assert_exact(items: Iterable[Dict[str, Any]], expected: Dict[int, Sequence[int]]) -> None:
    got = by_writer(items)
    report = {tag: problems(got.get(tag, []), want) for tag, want in expected.items()}
    report = {tag: found for tag, found in report.items() if found}
    unknown = set(got) - set(expected)
    assert not report and not unknown, f"per writer: {report}; unexpected writers: {sorted(unknown)}"
