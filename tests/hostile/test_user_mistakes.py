"""User mistakes cost nothing: a real `mstail` given an output that is its input, an output it cannot write, a port
that is no port, a FIFO or a device as a log, an unquoted glob, a wildcard CORS origin without a token, Ctrl-C in
the middle of a parse or a demo. Each case: one line on stderr starting `mstail: `, exit 2 (130/143 for a signal),
no traceback, no log destroyed, no partial output, nothing left behind. Also: CSV cells are no formulas (the
offline writer and the page's export, the latter run under node), `--explain` copies no terminal escapes, the
state folder and files are the user's alone, a mistyped --log file or folder is named with the nearest that exists."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from mstail.tailer.offline import OutputError, output
from mstail.tailer.offline.output import csv_cell, write_csv
from tests.conftest import ROOT, wait_until
from tests.tailer.test_cli import assert_clean_error, mstail

pytestmark = pytest.mark.slow

REAL_LOG = ROOT / "tests" / "real_logs" / "mindspore-2.10_lossmonitor_timemonitor_stdout.log"
TOKEN = "t" * 24


def loss_lines(first: int, count: int) -> str:
    return "".join(f"epoch: 1 step: {step}, loss is {1.0 / step:.6f}\n" for step in range(first, first + count))


def files_in(folder: Path) -> List[str]:
    return sorted(entry.name for entry in folder.iterdir())


def run(*args: str, timeout: float = 30, **kwargs: Any) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mstail", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=str(ROOT), **kwargs)


# -- 1. -o that is an input ---------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["plain", "symlink", "hard link", "rotated backup"])
def test_parse_refuses_an_output_that_is_one_of_its_inputs(tmp_path: Path, how: str) -> None:
    log = tmp_path / "info.log"
    log.write_text(loss_lines(11, 10))
    backup = tmp_path / "info.log.1"
    backup.write_text(loss_lines(1, 10))
    out = {"plain": log, "symlink": tmp_path / "latest.log", "hard link": tmp_path / "same.log",
           "rotated backup": backup}[how]
    if how == "symlink":
        out.symlink_to(log)
    elif how == "hard link":
        os.link(log, out)
    before = {path: path.read_bytes() for path in (log, backup)}

    result = mstail("parse", str(log), "-o", str(out))

    assert_clean_error(result, f"cannot write {out}", "input log", "give -o another file")
    assert {path: path.read_bytes() for path in (log, backup)} == before
    assert out.is_symlink() == (how == "symlink")
    assert not [name for name in files_in(tmp_path) if "mstail-tmp" in name]


def test_parse_refuses_an_output_the_glob_reads_too(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_text(loss_lines(1, 5))
    (tmp_path / "b.log").write_text(loss_lines(1, 5))
    result = mstail("parse", str(tmp_path / "*.log"), "-o", str(tmp_path / "b.log"))
    assert_clean_error(result, "input log")
    assert (tmp_path / "b.log").read_text() == loss_lines(1, 5)


# -- 2. the output is written whole or not at all --------------------------------------------------------------
@pytest.fixture(scope="module")
def big_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 30 MB of MindSpore LossMonitor lines: a parse of it takes seconds."""
    path = tmp_path_factory.mktemp("big") / "train.log"
    with open(path, "w", encoding="utf-8") as handle:
        for first in range(1, 800_001, 50_000):
            handle.write(loss_lines(first, 50_000))
    assert path.stat().st_size > 25 << 20
    return path


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_parse_stopped_midway_keeps_the_earlier_output(tmp_path: Path, big_log: Path, signum: int, code: int) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "records.jsonl"
    out.write_bytes(b'{"earlier":"output"}\n')
    proc = subprocess.Popen([sys.executable, "-m", "mstail", "parse", str(big_log), "-o", str(out)], cwd=str(ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        def writing() -> bool:  # the temporary file next to OUT has bytes: the parse is under way
            assert proc.poll() is None, "the parse ended before it could be interrupted"
            return any(p.name.endswith(".mstail-tmp") and p.stat().st_size > 0 for p in folder.iterdir())

        wait_until(writing, timeout=60, message="the parse writing its temporary file")
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=5)
    assert proc.returncode == code, err
    assert b"Traceback" not in err
    assert out.read_bytes() == b'{"earlier":"output"}\n'
    assert files_in(folder) == ["records.jsonl"]


def test_a_parse_killed_with_sigkill_leaves_no_worker_behind(tmp_path: Path, big_log: Path) -> None:
    """kill -9 (or the OOM killer) gives the parent no chance to stop its workers: they end with it, not blocked on
    the pool's queues forever (they were, found as orphans an hour after a test run)."""
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "records.jsonl"
    # The workers' pieces go in a temporary folder that a killed parse cannot remove: this test's, not /tmp.
    proc = subprocess.Popen([sys.executable, "-m", "mstail", "parse", str(big_log), "-o", str(out)], cwd=str(ROOT),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "TMPDIR": str(tmp_path)})

    def ours() -> List[int]:  # the parse's processes, found by the output path in their command line
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and str(out).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue  # gone meanwhile
        return found

    try:
        wait_until(lambda: len(ours()) >= 2 and any(p.name.endswith(".mstail-tmp") for p in folder.iterdir()),
                   timeout=30, message="the parse and its workers under way")
        proc.kill()
        proc.wait(timeout=10)
        wait_until(lambda: not ours(), timeout=10, message="the workers ending with their parent")
    finally:
        for pid in ours():
            os.kill(pid, signal.SIGKILL)


def test_output_is_replaced_only_when_the_block_ends_well(tmp_path: Path) -> None:
    out = tmp_path / "records.jsonl"
    out.write_text("earlier\n")
    out.chmod(0o640)
    with pytest.raises(RuntimeError):
        with output(str(out)) as stream:
            stream.write("partial\n")
            raise RuntimeError("a parse error")
    assert out.read_text() == "earlier\n" and files_in(tmp_path) == ["records.jsonl"]
    with output(str(out)) as stream:
        stream.write("new\n")
    assert out.read_text() == "new\n" and files_in(tmp_path) == ["records.jsonl"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o640  # an existing OUT keeps its mode


def test_output_through_a_symlink_writes_the_file_it_names(tmp_path: Path) -> None:
    real = tmp_path / "real.jsonl"
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    with output(str(link)) as stream:
        stream.write("x\n")
    assert link.is_symlink() and real.read_text() == "x\n"


def test_output_to_a_device_is_written_directly(tmp_path: Path) -> None:
    result = mstail("parse", str(REAL_LOG), "-o", os.devnull)
    assert result.returncode == 0, result.stderr
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)  # /dev/null is still a device, not a file renamed over it


# -- 3. an output that cannot be written; a port that is no port -----------------------------------------------
@pytest.mark.parametrize("where", ["missing folder", "under a file", "a folder", "a full disk"])
def test_an_output_that_cannot_be_written_is_one_line(tmp_path: Path, where: str) -> None:
    (tmp_path / "file.txt").write_text("not a folder\n")
    out = {"missing folder": tmp_path / "missing" / "out.jsonl", "under a file": tmp_path / "file.txt" / "out.jsonl",
           "a folder": tmp_path, "a full disk": Path("/dev/full")}[where]  # /dev/full: every write fails ENOSPC
    result = mstail("parse", str(REAL_LOG), "-o", str(out))
    reason = {"missing folder": "does not exist", "under a file": "not a folder", "a folder": "it is a folder",
              "a full disk": "no space left"}[where]
    assert_clean_error(result, f"cannot write {out}: ", reason)
    assert files_in(tmp_path) == ["file.txt"]


def test_stdout_on_a_full_disk_is_one_line_and_a_closed_pipe_no_error(big_log: Path) -> None:
    with open("/dev/full", "wb") as full:
        result = subprocess.run([sys.executable, "-m", "mstail", "parse", str(REAL_LOG)], stdout=full,
                                stderr=subprocess.PIPE, text=True, timeout=30, cwd=str(ROOT))
    assert_clean_error(result, "cannot write stdout: no space left")
    # `mstail parse LOG | head -1`: the reader leaves early; that is no error
    proc = subprocess.Popen([sys.executable, "-m", "mstail", "parse", str(big_log)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=str(ROOT))
    try:
        assert json.loads(proc.stdout.readline())["step"] == 1  # type: ignore[union-attr]
        proc.stdout.close()  # type: ignore[union-attr]
        err = proc.stderr.read().decode()  # type: ignore[union-attr]
        assert proc.wait(timeout=30) == 0 and err == "", err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)


def test_output_errors_in_process_are_output_errors(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="cannot write .*: its folder does not exist"):
        with output(str(tmp_path / "no" / "out.jsonl")):
            pass  # pragma: no cover


@pytest.mark.parametrize("port", ["99999", "-1", "65536"])
def test_a_port_out_of_range_is_one_line(tmp_path: Path, port: str) -> None:
    assert_clean_error(mstail("--log", str(tmp_path / "info.log"), "--port", port), f"--port {port}", "0 for any free port")


# -- 4. a FIFO, a device, a folder as a log ---------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "/dev/urandom", "symlink to a device"])
def test_parse_refuses_what_is_no_log_file(tmp_path: Path, kind: str) -> None:
    # (a folder is read as a folder of runs: tests/tailer/test_runs.py)
    path = {"fifo": tmp_path / "pipe.log", "symlink to a device": tmp_path / "zero.log"}.get(kind, kind)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink to a device":
        Path(path).symlink_to("/dev/zero")
    began = time.monotonic()
    result = mstail("parse", str(path), timeout=10)  # a FIFO opened for reading would wait for a writer forever
    assert time.monotonic() - began < 10
    what = {"fifo": "is a FIFO (named pipe)"}.get(kind, "is a character device")
    assert_clean_error(result, f"{path} {what}, not a log file")


# -- 5. the demo's temporary folder -------------------------------------------------------------------------------
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_demo_removes_its_temporary_folder(tmp_path: Path, signum: int) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONUNBUFFERED": "1"}  # the demo's folder goes here, not in /tmp
    stdout, stderr = tmp_path / "demo.out", tmp_path / "demo.err"
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "mstail", "demo", "--port", "0", "--step-time", "0.05"],
                                cwd=str(ROOT), env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
    try:
        wait_until(lambda: "mstail: serving http://127.0.0.1:" in stdout.read_text(), timeout=20,
                   message="the demo's serving line")
        folder = Path(re.search(r"demo training writes (\S+)/output/log/", stderr.read_text()).group(1))  # type: ignore[union-attr]
        assert folder.parent == temp and folder.name.startswith("mstail-demo-")
        wait_until(lambda: list(folder.glob("output/log/rank_*/info.log")), timeout=10, message="the demo's logs")
        proc.send_signal(signum)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
    assert proc.returncode in (0, 143), stderr.read_text()  # SIGTERM while serving takes Ctrl-C's path (serve.py)
    assert "Traceback" not in stderr.read_text()
    assert not folder.exists() and files_in(temp) == []


def test_demo_that_fails_to_start_leaves_no_folder(tmp_path: Path) -> None:
    result = run("demo", "--port", "99999", env={**os.environ, "TMPDIR": str(tmp_path)})
    assert_clean_error(result, "--port 99999")
    assert files_in(tmp_path) == []


# -- 6. CSV cells that are formulas --------------------------------------------------------------------------------
FORMULAS = ["=HYPERLINK(\"http://x\")", "+1+1", "-1+cmd|' /C calc'!A0", "@SUM(A1)", "\t=1", "\r=1"]


def test_csv_text_cells_are_no_formulas_and_numbers_stay_numbers() -> None:
    for text in FORMULAS:  # (a tab or CR written as JSON writes it, as every control character)
        assert csv_cell(text) == "'" + text.replace("\t", "\\t").replace("\r", "\\r")
    for text in ("plain", "1.5", "'quoted", "Infinity", "NaN", "-Infinity"):
        assert csv_cell(text) == text
    for number, shown in ((-1.5, -1.5), (-3, -3), (float("-inf"), "-Infinity"), (float("nan"), "NaN"), (None, "")):
        assert csv_cell(number) == shown
    out = io.StringIO()
    write_csv([{"source": "=cmd", "step": 1, "loss": -1.5, "grad_norm": float("-inf")},
               {"source": "run", "kind": "error", "message": "-1+cmd|' /C calc'!A0", "@evil": 2}], out)
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert list(rows[0]) == ["source", "step", "loss", "grad_norm", "kind", "message", "'@evil"]
    assert rows[0]["source"] == "'=cmd" and rows[0]["loss"] == "-1.5" and rows[0]["grad_norm"] == "-Infinity"
    assert rows[1]["message"] == "'-1+cmd|' /C calc'!A0" and rows[1]["loss"] == "" and rows[1]["'@evil"] == "2"


def test_parse_to_csv_escapes_a_formula_source_and_keeps_negative_numbers(tmp_path: Path) -> None:
    log = tmp_path / "=cmd.log"
    log.write_text("epoch: 1 step: 1, loss is -1.5\n")
    result = mstail("parse", str(log), "--to", "csv")
    assert result.returncode == 0, result.stderr
    (row,) = list(csv.DictReader(io.StringIO(result.stdout)))
    assert row["source"] == "'=cmd" and row["loss"] == "-1.5"


CONTROLS = ["boom \x1b]0;pwned\x07\x1b[2J\nline 2\r\tend\x00", "c1 \x9b31m del \x7f", "=\x1b[31m"]


def test_parse_to_csv_escapes_control_characters_as_jsonl_does(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(json.dumps(row) + "\n" for row in (
        {"step": 1, "loss": 2.5}, *({"kind": "error", "message": message} for message in CONTROLS))), encoding="utf-8")
    result = mstail("parse", str(log), "--events", "--to", "csv")
    assert result.returncode == 0, result.stderr
    assert not re.search(r"[\x00-\x1f\x7f-\x9f]", result.stdout.replace("\n", "")), repr(result.stdout)
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(result.stdout.splitlines()) == len(rows) + 1 == 5  # a row is one line
    jsonl = [json.loads(line) for line in mstail("parse", str(log), "--events").stdout.splitlines()]
    assert [row["message"] for row in jsonl[1:]] == CONTROLS
    as_json = json.dumps(CONTROLS[0], ensure_ascii=False)[1:-1]  # how a JSONL file shows it
    assert rows[1]["message"] == as_json == "boom \\u001b]0;pwned\\u0007\\u001b[2J\\nline 2\\r\\tend\\u0000"
    assert rows[2]["message"] == "c1 \\u009b31m del \\u007f" and rows[3]["message"] == "'=\\u001b[31m"


def _page_util(tmp_path: Path, names: str) -> str:
    """The start of a node script that has the page's util.js (an ES module: a .mjs copy imports without a
    package.json) give `names`: its fetch of the record's schema answered from parsers/record.schema.json, as the
    app serves it."""
    module = tmp_path / "util.mjs"
    shutil.copyfile(ROOT / "web" / "static" / "util.js", module)
    schema = ROOT / "parsers" / "record.schema.json"
    return (f"import {{ readFileSync }} from 'node:fs';\n"
            f"globalThis.fetch = async () => ({{ ok: true, json: async () => JSON.parse(readFileSync("
            f"{json.dumps(str(schema))}, 'utf8')) }});\n"
            f"const {{ {names} }} = await import({json.dumps(module.as_uri())});\n")


def test_page_csv_cell_follows_the_same_rule(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the page's csvCell is not checked here")
    values: List[Any] = [*FORMULAS, -1.5, -3, "-Infinity", "plain", "a,b", 'say "hi"', 0, None, *CONTROLS]
    script = (_page_util(tmp_path, "csvCell") +
              f"console.log(JSON.stringify({json.dumps(values)}.map(csvCell).concat([csvCell(-Infinity)])));\n")
    done = subprocess.run([node, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    page = json.loads(done.stdout)

    cells = [next(csv.reader([cell])) or [""] for cell in page]  # unquoted as a spreadsheet reads them
    assert cells[:-1] == [[str(csv_cell(value))] for value in values], page
    assert cells[-1] == [csv_cell(float("-inf"))] == ["-Infinity"]


def test_page_csv_time_is_the_offline_csv_time(tmp_path: Path) -> None:
    """The page's CSV and `mstail parse`'s write a time alike: ISO 8601 in the local zone with its offset (a zone
    half an hour off, behind and ahead of UTC)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the page's isoTime is not checked here")
    start = _page_util(tmp_path, "isoTime")
    times = [0, 1723438095.163, 1764672000.5, 1798761599.999, None]
    for zone, offset in (("Asia/Kolkata", "+05:30"), ("America/St_Johns", "-0"), ("UTC", "+00:00")):
        env = {**os.environ, "TZ": zone}
        page = subprocess.run([node, "--input-type=module", "-e", start +
                               f"console.log(JSON.stringify({json.dumps(times)}.map(isoTime)));\n"],
                              capture_output=True, text=True, timeout=30, env=env)
        offline = subprocess.run([sys.executable, "-c", "import json, sys; from mstail.tailer.offline.output import "
                                  f"csv_time; print(json.dumps([csv_time(t) for t in {times!r}]))"],
                                 capture_output=True, text=True, timeout=30, env=env, cwd=str(ROOT))
        assert page.returncode == 0 and offline.returncode == 0, (page.stderr, offline.stderr)
        assert json.loads(page.stdout) == json.loads(offline.stdout), zone
        assert all(shown.endswith(offset) or offset == "-0" and shown[-6:-3] in ("-02", "-03")
                   for shown in json.loads(page.stdout)[:-1]), page.stdout
        assert json.loads(page.stdout)[-1] == ""


# -- 7. --explain copies no terminal escapes ------------------------------------------------------------------------
def test_explain_strips_terminal_escapes(tmp_path: Path) -> None:
    log = tmp_path / "evil\x1b]0;title\x07.log"
    log.write_bytes(b"epoch: 1 step: 1, loss is 2.5\n"
                    b"\x1b]0;pwned\x07\x1b[2J\x1b[H custom: val_loss = 1.25 \x9b31m\x7f\x00\n"
                    b"\x1bPdevice control\x1b\\epoch: 1 step: 2, loss is \x1b[31m2.4\x1b[0m\n")
    result = subprocess.run([sys.executable, "-m", "mstail", "parse", str(log), "--explain"], capture_output=True,
                            timeout=30, cwd=str(ROOT))
    assert result.returncode == 0, result.stderr
    shown = result.stdout.decode("utf-8")
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", shown), repr(shown)
    assert "NO RULE MATCHED, but it looks like a metric:  custom: val_loss = 1.25" in shown
    assert "evil]0;title.log" not in shown and "evil.log:1  mindspore/loss_monitor" in shown


# -- 8. the state folder and its files ------------------------------------------------------------------------------
@pytest.mark.parametrize("folder", ["new", "existing"])
def test_state_folder_is_0700_and_its_files_0600(tmp_path: Path, mstail_server, folder: str) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "logs" / "train.log"
    log.parent.mkdir()
    log.write_text(loss_lines(1, 20))
    state = tmp_path / "state" / "nested" if folder == "new" else tmp_path / "mine"
    if folder == "existing":
        state.mkdir(mode=0o755)
        state.chmod(0o755)
    umask = os.umask(0)  # the child inherits it: mstail must not depend on it
    try:
        server = mstail_server(log, args=["--state-dir", str(state)])
    finally:
        os.umask(umask)
    server.wait_records(20)
    wait_until(lambda: any(p.name.endswith("-wal") for p in state.iterdir()), timeout=10, message="the -wal file")
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in state.iterdir()}
    assert {name for name in modes if name.endswith((".sqlite", ".sqlite-wal", ".sqlite-shm", ".sqlite.lock"))} \
        == set(modes) and len(modes) == 4, modes
    assert set(modes.values()) == {0o600}, modes
    if folder == "new":
        assert stat.S_IMODE(state.stat().st_mode) == 0o700 and stat.S_IMODE(state.parent.stat().st_mode) == 0o700
    else:
        assert stat.S_IMODE(state.stat().st_mode) == 0o755  # the user's own folder is left as it is


# -- 9. a wildcard CORS origin needs a token ------------------------------------------------------------------------
def test_cors_wildcard_without_a_token_is_refused(tmp_path: Path, mstail_server) -> None:  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if k != "MSTAIL_TOKEN"}
    result = run("--log", str(tmp_path / "info.log"), "--port", "0", "--cors-origin", "*", env=env)
    assert_clean_error(result, "--cors-origin '*'", "--token")
    server = mstail_server(tmp_path / "info.log", args=["--cors-origin", "*", "--token", TOKEN])
    assert "token required" in server.stdout_path.read_text()


# -- 10. an unquoted glob: several paths after one --log ------------------------------------------------------------
def test_several_paths_after_one_log_option(tmp_path: Path, mstail_server) -> None:  # type: ignore[no-untyped-def]
    logs: Dict[str, Path] = {}
    for rank in range(3):
        logs[f"rank_{rank}"] = tmp_path / f"rank_{rank}" / "info.log"
        logs[f"rank_{rank}"].parent.mkdir()
        logs[f"rank_{rank}"].write_text(loss_lines(1, 5))
    # what the shell makes of `--log rank_*/info.log`, and a second --log after it
    server = mstail_server(args=["--log", str(logs["rank_0"]), str(logs["rank_1"]), "--log", str(logs["rank_2"])])
    assert "(following 3 files)" in server.stdout_path.read_text()
    sources = server.wait_records(15)
    assert sorted(s["id"] for s in sources) == ["rank_0", "rank_1", "rank_2"]


def test_two_paths_after_one_log_option(tmp_path: Path, mstail_server) -> None:  # type: ignore[no-untyped-def]
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text(loss_lines(1, 3))
    b.write_text(loss_lines(1, 3))
    server = mstail_server(args=["--log", str(a), str(b)])
    assert "(following 2 files)" in server.stdout_path.read_text()


# -- 11. a mistyped --log file or folder: named after 10 s, with what exists nearest ---------------------------------
@pytest.mark.timeout(90)
def test_a_mistyped_log_is_named_with_the_nearest_file_or_folder(tmp_path: Path, mstail_server) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "output" / "log" / "rank_0"
    folder.mkdir(parents=True)
    (folder / "info.log").write_text(loss_lines(1, 5))
    (folder / "error.log").write_text("")
    typo, lost = folder / "inf.log", tmp_path / "outptu" / "log" / "rank_0" / "info.log"
    server = mstail_server(typo, lost)
    missing = f"no file inf.log in {folder} after 10 s; the nearest there is info.log"

    def problem() -> Any:
        return next(s["problem"] for s in server.get_json("/api/sources") if s["path"] == str(typo))

    wait_until(lambda: problem() == missing, 30, interval=0.2, message="the card naming the nearest file")
    time.sleep(1.5)  # more passes: said once
    assert server.stderr.count(f"nothing at {typo} yet: {missing}; waiting") == 1, server.stderr
    assert server.stderr.count(f"nothing at {lost} yet: {lost.parent} does not exist (the nearest existing "
                               f"folder is {tmp_path})") == 1, server.stderr
    typo.write_text(loss_lines(1, 3))  # the file comes after all: followed, and the card's problem goes
    server.wait_records(3)
    wait_until(lambda: problem() is None, 10, message="the problem gone once the file is there")


@pytest.mark.timeout(90)
def test_a_mistyped_glob_is_named_with_the_nearest_path(tmp_path: Path, mstail_server) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "output" / "log" / "rank_0"
    folder.mkdir(parents=True)
    (folder / "info.log").write_text(loss_lines(1, 5))
    typo = tmp_path / "output" / "log" / "rnak_*" / "info.log"
    server = mstail_server(typo)
    said = f"nothing matches {typo} after 10 s; the nearest existing path is {folder}"
    wait_until(lambda: server.get_json("/healthz")["unmatched_patterns"] == [said], 30, interval=0.2,
               message="/healthz naming the glob and the nearest path")
    time.sleep(1.5)  # more passes: said once
    assert server.stderr.count(f"{said}; waiting") == 1, server.stderr
    (tmp_path / "output" / "log" / "rnak_1").mkdir()
    (tmp_path / "output" / "log" / "rnak_1" / "info.log").write_text(loss_lines(1, 3))  # it matches after all
    server.wait_records(3)
    wait_until(lambda: server.get_json("/healthz")["unmatched_patterns"] == [], 10, message="gone once it matches")
