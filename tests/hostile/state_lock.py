"""Another program holding the state file's lock while a real mstail serves: the holder (a second process, as a
`sqlite3` shell's `BEGIN EXCLUSIVE` is) and what a client sees meanwhile (each /healthz answer's time, each live
record's delay on the stream). Shared by tests/hostile/test_state_lock.py and tests/bench/state_lock.py."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import httpx

#: the holder: opens the state file with Python's sqlite3, takes the exclusive lock, says "held", keeps it for the
#: seconds given, rolls back, says "released"
HOLDER = r'''
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
conn.execute("BEGIN EXCLUSIVE")
print("held %.6f" % time.time(), flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("ROLLBACK")
print("released %.6f" % time.time(), flush=True)
conn.close()
'''


class LockHolder:
    """A second process holding `state`'s exclusive SQLite lock for `seconds`, from `start` (which waits until it
    holds it) to its "released" line (`wait`); times are unix times."""

    def __init__(self, state: Path, seconds: float) -> None:
        self._proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(state), repr(seconds)], text=True,
                                      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.held_at = self._said("held")
        self.released_at: Optional[float] = None

    def _said(self, word: str) -> float:
        line = self._proc.stdout.readline()  # type: ignore[union-attr]
        if not line.startswith(word):
            self.kill()
            raise AssertionError(f"the lock holder did not say {word!r}: {line!r} {self._proc.stderr.read()!r}")
        return float(line.split()[1])

    def wait(self) -> float:
        self.released_at = self._said("released")
        self._proc.wait(timeout=10)
        return self.released_at

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=5)


class HealthProbe:
    """Asks /healthz every `every` s in a thread of its own: (unix time asked, seconds to the answer, status, its
    JSON) each."""

    def __init__(self, url: str, every: float = 0.05) -> None:
        self.samples: List[Tuple[float, float, int, Dict]] = []
        self._url, self._every, self._stop = url, every, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=30.0, trust_env=False) as client:
            while not self._stop.is_set():
                asked = time.time()
                began = time.monotonic()
                response = client.get(self._url + "/healthz")
                self.samples.append((asked, time.monotonic() - began, response.status_code, response.json()))
                self._stop.wait(self._every)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=35)

    def between(self, start: float, end: float) -> List[Tuple[float, float, int, Dict]]:
        return [sample for sample in self.samples if start <= sample[0] <= end]


class StreamProbe:
    """Reads /api/stream in a thread of its own, from the first record: the unix time each record (source, step)
    arrived."""

    def __init__(self, url: str) -> None:
        self.arrived: Dict[Tuple[str, int], float] = {}
        self.duplicates = 0
        self._url, self._stop = url, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=httpx.Timeout(5.0, read=1.0), trust_env=False) as client:
            last_id = "0"  # from the first record, whenever this thread gets to connect
            while not self._stop.is_set():
                try:
                    headers = {"Last-Event-ID": last_id}
                    with client.stream("GET", self._url + "/api/stream", headers=headers) as response:
                        event, data = "message", []
                        for line in response.iter_lines():
                            if line.startswith("id:"):
                                last_id = line[3:].strip()
                            elif line.startswith("event:"):
                                event = line[6:].strip()
                            elif line.startswith("data:"):
                                data.append(line[5:].strip())
                            elif line == "":
                                if event == "records" and data:
                                    self._note(json.loads("\n".join(data)), time.time())
                                event, data = "message", []
                            if self._stop.is_set():
                                return
                except httpx.HTTPError:
                    continue  # a read timeout between pings: read on (from the last id)

    def _note(self, records: List[Dict], now: float) -> None:
        for record in records:
            key = (record["source"], record["step"])
            if key in self.arrived:
                self.duplicates += 1
            else:
                self.arrived[key] = now

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def write_times(path: Path) -> Dict[int, float]:
    """The writer's side file ("STEP BEFORE AFTER" a line): step -> unix time just before its line was written."""
    times = {}
    for line in path.read_text().splitlines():
        step, before, _after = line.split()
        times[int(step)] = float(before)
    return times


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (NaN of nothing)."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1] if ordered else math.nan
