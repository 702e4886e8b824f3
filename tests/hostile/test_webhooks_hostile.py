"""Hostile webhook receivers against a real mstail, and webhook URLs kept off the command line.

The receivers are raw sockets on 127.0.0.1 in a thread (no HTTP library to be polite on their behalf): one
answers 200 and then a body that never ends, one drips its answer a byte at a time. An alert fires at once
on a MindFormers `loss: nan` step (the `nonfinite` rule), resolves after 5 finite steps and, with
`cooldown_s = 0`, fires again on the next NaN: each change is one webhook POST.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from pathlib import Path
from typing import Dict, List

import pytest

from mstail.tailer.app import cli
from mstail.tailer.outbound.webhooks import DEFAULT_ENV, read_targets

pytestmark = pytest.mark.slow

SECRET = "s3cret-robot-token-4f1a"
OK_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
CHUNK = b"x" * 65536


class RawReceiver:
    """An HTTP receiver on 127.0.0.1:0 made of plain sockets, a thread per connection, everything bounded.

    mode: `ok` answers 200 "ok"; `endless` answers 200 and then body bytes until the client goes (at most
    `limit_s`); `drip` sends a 200 answer one byte every `drip_s` seconds. Each attempt is recorded as a dict:
    `path`, `body` (the request's), `began`, `gone` (when the client closed; None while it is connected), `sent`.
    """

    def __init__(self, mode: str, drip_s: float = 2.0, limit_s: float = 30.0) -> None:
        self.mode, self.drip_s, self.limit_s = mode, drip_s, limit_s
        self.attempts: List[Dict[str, object]] = []
        self.closing = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/hook/{SECRET}"
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                conn, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        attempt: Dict[str, object] = {"began": time.monotonic(), "gone": None, "sent": 0}
        try:
            conn.settimeout(5)
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                request += chunk
            head, _, body = request.partition(b"\r\n\r\n")
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length:
                body += conn.recv(65536)
            attempt.update(path=head.split(b" ")[1].decode(), body=body)
            self.attempts.append(attempt)
            getattr(self, "_" + self.mode)(conn, attempt)
        except OSError:
            attempt["gone"] = attempt["gone"] or time.monotonic()
        finally:
            conn.close()

    def _ok(self, conn: socket.socket, attempt: Dict[str, object]) -> None:
        conn.sendall(OK_ANSWER)
        self._wait_gone(conn, attempt, 5)

    def _endless(self, conn: socket.socket, attempt: Dict[str, object]) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n")
        conn.settimeout(0.5)
        while not self.closing.is_set() and time.monotonic() - float(attempt["began"]) < self.limit_s:  # type: ignore[arg-type]
            try:
                attempt["sent"] = int(attempt["sent"]) + conn.send(CHUNK)  # type: ignore[call-overload]
            except socket.timeout:  # the client reads nothing more but is still there
                continue
        # reaching here means the client kept reading for limit_s: `gone` stays None

    def _drip(self, conn: socket.socket, attempt: Dict[str, object]) -> None:
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"." * 100
        for byte in answer:
            if self._wait_gone(conn, attempt, self.drip_s):
                return
            conn.sendall(bytes([byte]))
            attempt["sent"] = int(attempt["sent"]) + 1  # type: ignore[call-overload]

    def _wait_gone(self, conn: socket.socket, attempt: Dict[str, object], seconds: float) -> bool:
        """Wait up to `seconds` for the client to close; True (and `gone` noted) if it did."""
        readable, _, _ = select.select([conn], [], [], seconds)
        if readable and conn.recv(65536) == b"":
            attempt["gone"] = time.monotonic()
            return True
        return False

    def close(self) -> None:
        self.closing.set()
        self.listener.close()
        for thread in self.threads:
            thread.join(10)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _flapping_alerts(tmp_path: Path) -> str:
    rules = tmp_path / "alerts.toml"
    rules.write_text("[general]\ncooldown_s = 0\n")  # every fire and every resolve is a POST
    return str(rules)


def test_an_endless_answer_is_read_to_64_kib_and_costs_no_memory(  # type: ignore[no-untyped-def]
        tmp_path: Path, mstail_server, log_writer, wait_until) -> None:
    receiver = RawReceiver("endless")
    try:
        log = tmp_path / "rank_0" / "info.log"
        log_writer.finish(log_writer(log, steps=5, interval_s=0))
        server = mstail_server(log, args=["--webhook", receiver.url, "--alerts", _flapping_alerts(tmp_path)])
        server.wait_records(5)
        before = _rss_kib(server.proc.pid)
        log_writer.finish(log_writer(log, steps=30, interval_s=0, start_step=6, nan_at=(10, 20, 30)))
        hooks = wait_until(lambda: [w for w in server.get_json("/healthz")["webhooks"] if w["sent"] >= 4], 20,
                           message="4 alert changes POSTed")
        after = _rss_kib(server.proc.pid)
        assert hooks[0]["failed"] == 0
        assert after - before < 50 * 1024, (before, after)
        attempts = receiver.attempts[:4]
        wait_until(lambda: all(a["gone"] for a in attempts), 5, message="each attempt over")
        for attempt in attempts:
            assert float(attempt["gone"]) - float(attempt["began"]) < 2.0, attempts  # type: ignore[arg-type]
            assert int(attempt["sent"]) < 32 << 20, attempts  # type: ignore[call-overload]  # socket buffers, not the body
    finally:
        receiver.close()


def test_a_dripping_receiver_is_given_up_at_the_deadline_of_the_attempt(  # type: ignore[no-untyped-def]
        tmp_path: Path, mstail_server, log_writer, wait_until) -> None:
    receiver = RawReceiver("drip", drip_s=2.0)
    try:
        log = tmp_path / "rank_0" / "info.log"
        log_writer.finish(log_writer(log, steps=5, interval_s=0))
        server = mstail_server(log, args=["--webhook", receiver.url])
        server.wait_records(5)
        log_writer.finish(log_writer(log, steps=5, interval_s=0, start_step=6, nan_at=(7,)))
        first = wait_until(lambda: receiver.attempts and receiver.attempts[0], 10, message="the first attempt")
        gone = wait_until(lambda: first["gone"], 10, message="mstail to give the attempt up")
        took = float(gone) - float(first["began"])  # type: ignore[arg-type]
        assert 4.0 < took < 6.5, took  # the 5 s deadline of the whole attempt, not 5 s per byte
        assert int(first["sent"]) <= 4  # type: ignore[call-overload]
    finally:
        receiver.close()


def test_webhooks_from_a_file_and_the_environment_arrive_and_stay_off_the_command_line(  # type: ignore[no-untyped-def]
        tmp_path: Path, mstail_server, log_writer, wait_until) -> None:
    in_file, in_env = RawReceiver("ok"), RawReceiver("ok")
    try:
        hooks = tmp_path / "hooks.txt"
        hooks.write_text(f"# the team's robot\n\n  generic={in_file.url}  \n")
        log = tmp_path / "rank_0" / "info.log"
        log_writer.finish(log_writer(log, steps=5, interval_s=0))
        server = mstail_server(log, args=["--webhook-file", str(hooks)], env={**os.environ, DEFAULT_ENV: in_env.url})
        server.wait_records(5)
        log_writer.finish(log_writer(log, steps=3, interval_s=0, start_step=6, nan_at=(7,)))
        for receiver in (in_file, in_env):
            wait_until(lambda: receiver.attempts, 10, message="the alert at the receiver")
            assert receiver.attempts[0]["path"] == f"/hook/{SECRET}"
            assert b'"rule":"nonfinite"' in receiver.attempts[0]["body"].replace(b" ", b"")  # type: ignore[union-attr]
        cmdline = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes()
        assert str(hooks).encode() in cmdline and SECRET.encode() not in cmdline
        assert SECRET not in server.stderr
        assert [w["target"] for w in server.get_json("/healthz")["webhooks"]] == [
            in_file.url.split("/hook")[0] + "/...", in_env.url.split("/hook")[0] + "/..."]
    finally:
        in_file.close()
        in_env.close()


def test_webhook_sources_resolve_in_order_and_env_names_win_over_the_default(tmp_path: Path) -> None:
    hooks = tmp_path / "hooks.txt"
    hooks.write_text("slack=http://127.0.0.1:9/a\n# http://127.0.0.1:9/commented\nhttp://127.0.0.1:9/b\n")
    environ = {"TEAM_HOOKS": " feishu=http://127.0.0.1:9/c\n\thttp://127.0.0.1:9/d ", DEFAULT_ENV: "http://127.0.0.1:9/e"}
    got = read_targets(["http://127.0.0.1:9/z"], [str(hooks)], ["TEAM_HOOKS"], environ)
    assert [(t.url[-1], t.format) for t in got] == [("z", "generic"), ("a", "slack"), ("b", "generic"),
                                                    ("c", "feishu"), ("d", "generic")]
    assert [t.url[-1] for t in read_targets(environ=environ)] == ["e"]  # no --webhook-env: $MSTAIL_WEBHOOKS
    assert read_targets(environ={DEFAULT_ENV: "  "}) == ()  # an empty default variable means none


@pytest.mark.parametrize("make_args, says", [
    (lambda p: ["--webhook-file", str(p / "missing.txt")], "missing.txt: cannot read it: No such file or directory"),
    (lambda p: ["--webhook-file", str(p)], "cannot read it: Is a directory"),
    (lambda p: ["--webhook-file", str(_write(p / "only-comments.txt", "# nothing\n\n"))], "no webhook in it"),
    (lambda p: ["--webhook-file", str(_write(p / "bad.txt", f"\nftp://host/{SECRET}\n"))], "bad.txt line 2: needs an http://"),
    (lambda p: ["--webhook-env", "MSTAIL_TEST_UNSET"], "--webhook-env MSTAIL_TEST_UNSET: the environment variable is not set"),
    (lambda p: ["--webhook-env", "MSTAIL_TEST_EMPTY"], "--webhook-env MSTAIL_TEST_EMPTY: the environment variable is empty"),
])
def test_an_unusable_webhook_source_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture,  # type: ignore[no-untyped-def]
                                                          monkeypatch: pytest.MonkeyPatch, make_args, says: str) -> None:
    monkeypatch.setenv("MSTAIL_TEST_EMPTY", " ")
    monkeypatch.delenv("MSTAIL_TEST_UNSET", raising=False)
    code = cli.main(["--log", str(tmp_path / "info.log"), "--no-state", *make_args(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and says in err, err
    assert SECRET not in err


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
