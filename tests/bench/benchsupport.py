"""What the benchmark scripts share (they run as plain scripts: `python tests/bench/NAME.py`)."""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def load_test_support() -> Any:
    """tests/conftest.py (real mstail start-up and the MindFormers writer), loaded as a plain module. The mstail
    processes it starts keep their state in a temporary folder removed at exit (as the test session's fixture
    does), not in the user's ~/.local/state/mstail, unless MSTAIL_STATE_DIR or a bench's --state-dir says where."""
    if "MSTAIL_STATE_DIR" not in os.environ:
        os.environ["MSTAIL_STATE_DIR"] = state = tempfile.mkdtemp(prefix="mstail-bench-state-")
        atexit.register(shutil.rmtree, state, True)
    spec = importlib.util.spec_from_file_location("mstail_test_support", HERE.parent / "conftest.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def installed_env(codes: Sequence[Optional[Path]] = (None,)) -> Dict[str, str]:
    """The environment of an installed mstail, whose modules' bytecode is there to load (pip compiles a wheel's at
    install). A source tree imported where PYTHONDONTWRITEBYTECODE is set, as on this machine, compiles its modules at
    every start (0.15 s of CPU before a catch-up child forks, 0.3 s before the server listens). `codes`: the code each
    start runs, compiled now into its own __pycache__ folders, which git ignores (None: this tree; else a folder
    holding an importable `mstail`, `restart.code_of`). No PYTHONPYCACHEPREFIX: the packages mstail imports would be
    compiled again into it at the first start."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    for code in codes:
        folders = [ROOT / part for part in ("mstail", "parsers", "tailer", "web")] if code is None else [
            code / "mstail", *(code / "mstail" / part for part in ("parsers", "tailer", "web"))]  # those are links
        subprocess.run([sys.executable, "-m", "compileall", "-q", *map(str, folders)], env=env, check=True,
                       stdout=subprocess.DEVNULL)
    return env


def serve_rank_logs(support: Any, prefix: str, ranks: int, args: Sequence[str] = (),
                    one_by_one: bool = False) -> Tuple[Any, Path, Path]:
    """Empty `output/log/rank_N/info.log` files in a new temp dir (the writers append to these very files) and a
    real mstail following them, given one glob (default) or, `one_by_one`, a `--log` per file: (server, log_dir,
    work_dir)."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    log_dir = work / "output" / "log"
    for rank in range(ranks):
        (log_dir / f"rank_{rank}").mkdir(parents=True)
        (log_dir / f"rank_{rank}" / "info.log").touch()
    logs = [log_dir / f"rank_{rank}" / "info.log" for rank in range(ranks)] if one_by_one \
        else [log_dir / "rank_*" / "info.log"]
    server = support.start_mstail(logs, work / "mstail", args=tuple(args))
    return server, log_dir, work


def write_times(work: Path, ranks: int) -> Tuple[Dict[Tuple[str, int], float], Dict[Tuple[str, int], float]]:
    """The writers' side files (`times_N.txt`, "STEP BEFORE AFTER" a line): per (source, step), the unix time
    just before its step line was written and just after its progress line was."""
    written: Dict[Tuple[str, int], float] = {}
    completed: Dict[Tuple[str, int], float] = {}
    for rank in range(ranks):
        for line in (work / f"times_{rank}.txt").read_text().split("\n"):
            if line:
                step, before, after = line.split()
                written[(f"rank_{rank}", int(step))] = float(before)
                completed[(f"rank_{rank}", int(step))] = float(after)
    return written, completed


class SSEReader:
    """The messages in the lines of an SSE stream (the HTML spec's field rules): `feed(line)` gives (event, data)
    when a blank line ends a message that has data, else None. `last_id` is the id to resume from with
    Last-Event-ID; `start()` forgets a message cut off by a dropped connection."""

    def __init__(self) -> None:
        self.last_id: Optional[str] = None
        self._event, self._data = "message", []  # type: Tuple[str, List[str]]

    def start(self) -> None:
        self._event, self._data = "message", []

    def feed(self, line: str) -> Optional[Tuple[str, str]]:
        if line == "":
            message = (self._event, "\n".join(self._data)) if self._data else None
            self.start()
            return message
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            self._event = value
        elif field == "data":
            self._data.append(value)
        elif field == "id":
            self.last_id = value
        return None


def record_arrivals(url: str, arrived: Callable[[Tuple[str, int], float], Any], stop: threading.Event,
                    read_timeout: float = 20.0) -> None:
    """One SSE client of `url`'s /api/stream until `stop` is set: `arrived((source, step), time.time())` for every
    record received (when the blank line ending its message is read); after a dropped connection or a read slower
    than `read_timeout` it connects again with Last-Event-ID, 0.2 s later."""
    import httpx

    sse = SSEReader()
    with httpx.Client(timeout=httpx.Timeout(5.0, read=read_timeout), trust_env=False) as client:
        while not stop.is_set():
            headers = {"Last-Event-ID": sse.last_id} if sse.last_id is not None else {}
            try:
                with client.stream("GET", url + "/api/stream", headers=headers) as response:
                    sse.start()
                    for line in response.iter_lines():
                        if stop.is_set():
                            return
                        message = sse.feed(line)
                        if message is not None and message[0] == "records":
                            now = time.time()
                            for record in json.loads(message[1]):
                                arrived((record["source"], record["step"]), now)
            except httpx.HTTPError:
                time.sleep(0.2)
