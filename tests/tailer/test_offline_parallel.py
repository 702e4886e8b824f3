"""`mstail parse` with several sources parses them in worker processes: the output (JSONL and CSV, records and
events), the summary and the progress are exactly those of a parse in one process; a worker that fails or dies
gives one clear line naming its source, not a traceback."""

from __future__ import annotations

import errno
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest

from mstail.parsers.derived import Derived
from mstail.tailer.app import cli
from mstail.tailer.offline import parallel, reading
from mstail.tailer.offline import ParseError, Summary, run_parse

from tests.parsers.support import FORMATS, READ_TIME, ROOT, SAMPLES


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines without a timestamp get the read time: the same one in every process (workers inherit it by fork)."""
    monkeypatch.setattr(reading.time, "time", lambda: READ_TIME)


@pytest.fixture
def logs(tmp_path: Path) -> List[str]:
    """Sources of every kind and size, the biggest not first (workers take the biggest first, output keeps the
    order given), and a rotated chain whose backup is read first."""
    folder = tmp_path / "logs"
    folder.mkdir()
    names = sorted(p.name for p in SAMPLES.iterdir() if p.suffix in (".log", ".jsonl"))
    for name in names:
        shutil.copy(SAMPLES / name, folder / name)
    for real in sorted((ROOT / "tests" / "real_logs").glob("*.log")):
        shutil.copy(real, folder / real.name)
    chain = folder / "chain"
    chain.mkdir()
    text = (SAMPLES / "mindformers_v1.3_sink_info.log").read_text(encoding="utf-8").splitlines(keepends=True)
    half = len(text) // 2
    (chain / "info.log.1").write_text("".join(text[:half]), encoding="utf-8")
    (chain / "info.log").write_text("".join(text[half:]), encoding="utf-8")
    inputs = [str(folder / name) for name in names] + sorted(str(p) for p in folder.glob("*.log") if p.name not in names)
    return inputs + [str(chain / "info.log")]


def parse(inputs: List[str], to: str, jobs: int, events: bool = True) -> Tuple[str, Summary]:
    """What `mstail parse` writes (the built-in derived series too, as the command adds them)."""
    out = io.StringIO()
    summary = run_parse(inputs, FORMATS, None, to, out, with_events=events, jobs=jobs, derived=Derived())
    return out.getvalue(), summary


@pytest.mark.slow  # worker processes
@pytest.mark.parametrize("to", ["jsonl", "csv"])
@pytest.mark.parametrize("events", [True, False])
def test_workers_write_what_one_process_writes(logs: List[str], to: str, events: bool) -> None:
    serial, serial_summary = parse(logs, to, jobs=1, events=events)
    parallel, parallel_summary = parse(logs, to, jobs=3, events=events)
    assert serial_summary.records > 100 and serial_summary.events > 10 and len(serial_summary.formats) == len(logs)
    assert parallel == serial
    assert parallel_summary == serial_summary  # counts, and the formats in the sources' order


def test_workers_are_used_only_when_they_can_help(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "_usable_cpus", lambda: 4)
    big = parallel.PARALLEL_MIN_BYTES
    assert parallel.worker_count(1, big * 10, None) == 1  # one source: nothing to share
    assert parallel.worker_count(3, big - 1, None) == 1  # small input: starting workers costs more
    assert parallel.worker_count(3, big, None) == 3
    assert parallel.worker_count(9, big, None) == 4  # one per usable CPU
    assert parallel.worker_count(9, 10, 2) == 2  # jobs given: used whatever the size
    assert parallel.worker_count(9, big * 10, 1) == 1


@pytest.mark.slow
def test_a_parse_in_one_process_imports_no_worker_or_follower_machinery(tmp_path: Path) -> None:
    """`mstail parse` of a small log starts no worker: it imports neither multiprocessing nor the sidecar's
    followers (their imports were a tenth of its start-up)."""
    log = tmp_path / "info.log"
    shutil.copy(SAMPLES / "mindformers_v1.3_sink_info.log", log)
    code = ("import sys; from mstail.tailer.app.cli import main; main(['parse', sys.argv[1], '-o', sys.argv[2]]); "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith(('multiprocessing', 'concurrent', "
            "'mstail.tailer.inputs.follower', 'mstail.tailer.inputs.eventfollow')))))")
    done = subprocess.run([sys.executable, "-c", code, str(log), str(tmp_path / "out.jsonl")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.jsonl").stat().st_size > 0
    assert done.stdout.split() == []


@pytest.mark.slow  # worker processes
def test_progress_counts_every_byte_once(logs: List[str], monkeypatch: pytest.MonkeyPatch) -> None:
    bars: List["FakeBar"] = []

    class FakeBar:
        def __init__(self, total: int) -> None:
            self.total, self.n, self.updates, self.closed = total, 0, 0, False
            bars.append(self)

        def update(self, n: int) -> None:
            self.n += n
            self.updates += 1

        def close(self) -> None:
            self.closed = True

    monkeypatch.setattr(parallel, "progress_bar", FakeBar)
    parse(logs, "jsonl", jobs=3)
    (bar,) = bars
    assert bar.total == sum(os.path.getsize(f) for g in reading.chains(logs) for f in g.files)
    assert bar.n == bar.total and bar.updates >= 1 and bar.closed


def failing_on(name: str, exc: BaseException):  # type: ignore[no-untyped-def]
    real = reading.chain_lines

    def lines(chain, progress=None, blocks=False):  # type: ignore[no-untyped-def]
        for path, line in real(chain, progress, blocks):
            if path.name == name:
                raise exc
            yield path, line

    return lines


@pytest.mark.slow  # worker processes
def test_a_failing_worker_names_its_source(logs: List[str], monkeypatch: pytest.MonkeyPatch) -> None:
    error = OSError(errno.EIO, "Input/output error", "worker_0.log")
    monkeypatch.setattr(reading, "chain_lines", failing_on("mindformers_pynative_worker_0.log", error))
    with pytest.raises(ParseError) as raised:
        parse(logs, "jsonl", jobs=3)
    assert str(raised.value) == "mindformers_pynative_worker_0: OSError: [Errno 5] Input/output error: 'worker_0.log'"
    with pytest.raises(ParseError) as raised:  # the same line from a parse in this process
        parse(logs, "jsonl", jobs=1)
    assert str(raised.value) == "mindformers_pynative_worker_0: OSError: [Errno 5] Input/output error: 'worker_0.log'"


@pytest.mark.slow  # worker processes
def test_a_worker_that_dies_is_a_clear_error(logs: List[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def die(chain, progress=None, blocks=False):  # type: ignore[no-untyped-def]
        os._exit(9)  # as the OOM killer would leave it: no exception, no result
        yield

    monkeypatch.setattr(reading, "chain_lines", die)
    with pytest.raises(ParseError, match=r"^a parse worker process died \(.*\); not parsed: "):
        parse(logs, "jsonl", jobs=2)


@pytest.mark.slow  # worker processes
def test_the_command_copies_workers_output_and_prints_one_line_for_a_failed_worker(logs: List[str], monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 0)  # these small logs: in workers all the same
    monkeypatch.setattr(parallel, "_usable_cpus", lambda: 2)  # whatever this machine has
    monkeypatch.setenv("MSTAIL_FORMATS_DIR", str(tmp_path / "no-user-formats"))
    out = tmp_path / "out.jsonl"
    assert cli.main(["parse", *logs, "-o", str(out)]) == 0
    summary = capsys.readouterr().err
    assert summary.startswith("mstail: ") and summary.count("\n") == 1 and "Traceback" not in summary
    assert out.read_text(encoding="utf-8") == parse(logs, "jsonl", jobs=1, events=False)[0]  # workers' bytes copied

    monkeypatch.setattr(reading, "chain_lines", failing_on("info.log.1", OSError(errno.EIO, "Input/output error")))
    assert cli.main(["parse", *logs, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err == "mstail: chain: OSError: [Errno 5] Input/output error\n"
