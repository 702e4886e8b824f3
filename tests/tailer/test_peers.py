"""A central mstail following node mstails (`--peer`): real node mstails on their own loopback addresses, each
following files real writer processes write, and a central mstail following them; nodes killed, paused, behind a
proxy that stalls, a central restarted: every step of every source once, in order."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import closing
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import pytest

from tests.conftest import MstailServer, finish_writer, spawn_writer, start_mstail, wait_until

pytestmark = pytest.mark.slow

STEPS = 40
INTERVAL_S = 0.1  # 4 s of writing per test


def free_port(host: str) -> int:
    with closing(socket.socket()) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class Node:
    """A node mstail on its own loopback address and fixed port (kept over restarts), following its files."""

    def __init__(self, host: str, logs: Sequence[Path], workdir: Path, args: Sequence[str] = ()) -> None:
        self.host, self.port, self.logs, self.workdir, self.args = host, free_port(host), list(logs), workdir, list(args)
        self.server: Optional[MstailServer] = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        self.server = start_mstail(self.logs, self.workdir, args=["--host", self.host, "--port", str(self.port),
                                                                  *self.args])

    def kill(self) -> None:
        assert self.server is not None
        self.server.proc.kill()
        self.server.proc.wait(timeout=10)

    def signal(self, signum: int) -> None:
        assert self.server is not None
        self.server.proc.send_signal(signum)

    def stop(self) -> None:
        if self.server is not None and self.server.proc.poll() is None:
            self.server.proc.send_signal(signal.SIGCONT)
            assert self.server.stop() is not None, "a node mstail did not stop on SIGINT"
            assert "Traceback" not in self.server.stderr, self.server.stderr


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    """`cluster.node(index, ranks)` -> Node writing `ranks` files (one writer process each node, STEPS steps);
    `cluster.central(*urls, args=())` -> the central mstail; all stopped at the end (a traceback fails the test)."""

    class Cluster:
        def __init__(self) -> None:
            self.nodes: List[Node] = []
            self.writers: List["subprocess.Popen[bytes]"] = []
            self.centrals: List[MstailServer] = []

        def node(self, index: int, ranks: int = 2, args: Sequence[str] = ()) -> Node:
            folder = tmp_path / f"node{index}"
            logs = [folder / f"rank_{rank}.log" for rank in range(ranks)]
            node = Node(f"127.0.0.{index + 2}", logs, tmp_path / f"node{index}-mstail", args)
            self.nodes.append(node)
            return node

        def write(self) -> None:
            for node in self.nodes:
                self.writers.append(spawn_writer(node.logs, STEPS, INTERVAL_S))

        def central(self, *peers: str, args: Sequence[str] = (), workdir: str = "central") -> MstailServer:
            options = [option for url in peers for option in ("--peer", url)]
            server = start_mstail([], tmp_path / workdir, args=[*options, *args])
            self.centrals.append(server)
            return server

        def finish(self) -> None:
            for writer in self.writers:
                finish_writer(writer)

        def close(self) -> None:
            for writer in self.writers:
                if writer.poll() is None:
                    writer.kill()
                    writer.wait(timeout=5)
            problems = []
            for central in self.centrals:
                if central.stop() is None:
                    problems.append("the central mstail did not stop on SIGINT")
                elif "Traceback" in central.stderr:
                    problems.append(central.stderr)
            for node in self.nodes:
                node.stop()
            assert not problems, "\n".join(problems)

    made = Cluster()
    yield made
    made.close()


def steps_by_source(server: MstailServer, token: Optional[str] = None) -> Dict[str, List[int]]:
    """Every record's step, per source, in the order the server numbered them."""
    out: Dict[str, List[int]] = {}
    after = 0
    while True:
        records = server.get_json(f"/api/records?after={after}&limit=5000" + (f"&token={token}" if token else ""))
        if not records:
            return out
        for record in records:
            out.setdefault(record["source"], []).append(record["step"])
        after = records[-1]["seq"]


def expect_every_step(central: MstailServer, nodes: Dict[str, Node], timeout: float = 40.0) -> None:
    """Each node source's steps 1..STEPS on the central as NODE/<id>: none lost, none twice, in order."""
    wanted = {f"{name}/rank_{rank}" for name, node in nodes.items() for rank in range(len(node.logs))}

    def complete() -> Optional[Dict[str, List[int]]]:
        got = steps_by_source(central)
        return got if all(len(got.get(source, [])) >= STEPS for source in wanted) else None

    try:
        got = wait_until(complete, timeout, interval=0.2, message="every step on the central")
    except AssertionError:
        got = steps_by_source(central)
    assert set(got) == wanted
    for name, node in nodes.items():  # the nodes' own (the oracle's other half: they lost nothing themselves)
        assert node.server is not None
        token = node.args[node.args.index("--token") + 1] if "--token" in node.args else None
        for source, steps in steps_by_source(node.server, token).items():
            assert steps == list(range(1, STEPS + 1)), f"node {name}'s own {source}"
    for source in sorted(wanted):
        assert got[source] == list(range(1, STEPS + 1)), source


def expect_node_states(central: MstailServer, nodes: Dict[str, Node]) -> None:
    """Each node source's state and how its run ended, as its node says, on the central's NODE/<id>."""

    def states(server: MstailServer, prefix: str = "") -> Dict[str, Any]:
        return {prefix + s["id"]: (s["state"], s["end_reason"]) for s in server.get_json("/api/sources")}

    def same() -> bool:
        on_central = states(central)
        wanted = {key: value for name, node in nodes.items() for key, value in states(node.server, f"{name}/").items()}
        return all(value[0] == "finished" for value in wanted.values()) and all(
            on_central.get(key) == value for key, value in wanted.items())

    wait_until(same, 30, interval=0.2, message="the nodes' states on the central")


def peer_health(central: MstailServer, name: str) -> Dict[str, Any]:
    return next(entry for entry in central.get_json("/healthz")["peers"] if entry["node"] == name)


def test_a_node_killed_and_restarted_loses_and_repeats_no_step(cluster, tmp_path):
    token = "peer-test-token-0123456789"  # the nodes ask for it; the central has it from a file
    (tmp_path / "token").write_text(token + "\n")
    a, b = cluster.node(0, args=["--token", token]), cluster.node(1, args=["--token", token])
    central = cluster.central(f"a={a.url}", f"b={b.url}", args=["--peer-token-file", str(tmp_path / "token")])
    cluster.write()
    wait_until(lambda: central.get_json("/api/sources") and any(s["id"].startswith("a/") and s["records"] >= 10
                                                                for s in central.get_json("/api/sources")),
               20, message="node a's steps on the central")
    a.kill()  # SIGKILL: what it had not committed is read again after the restart, under new seqs
    wait_until(lambda: peer_health(central, "a")["state"] == "unreachable", 5, message="node a unreachable")
    time.sleep(0.5)
    a.start()
    cluster.finish()
    expect_every_step(central, {"a": a, "b": b})
    assert peer_health(central, "a")["state"] == "following"
    assert "peer a" in central.stderr and "reached again" in central.stderr


def test_a_paused_node_is_unreachable_within_5_s_and_then_loses_nothing(cluster):
    a, b = cluster.node(0), cluster.node(1)
    central = cluster.central(f"a={a.url}", f"b={b.url}")
    cluster.write()
    central.wait_records(10, timeout=20)
    b.signal(signal.SIGSTOP)
    paused = time.time()

    def shown_unreachable() -> bool:  # on /healthz, on the node's card and on its sources' cards
        cards = {s["id"]: s for s in central.get_json("/api/sources") if s["id"].split("/")[0] == "b"}
        ranks = [card for source, card in cards.items() if source != "b"]
        return (peer_health(central, "b")["state"] == "unreachable" and cards["b"]["state"] == "unreachable"
                and bool(ranks) and all((s["problem"] or "").startswith("node unreachable since")
                                        for s in [cards["b"], *ranks]))

    wait_until(shown_unreachable, 5, message="node b shown unreachable")
    health = peer_health(central, "b")
    assert health["unreachable_since"] <= time.time() and "since" in health["problem"]
    assert health["unreachable_since"] >= paused - 3  # when it was last heard: its keep-alives come every second
    time.sleep(1.0)
    b.signal(signal.SIGCONT)
    cluster.finish()
    expect_every_step(central, {"a": a, "b": b})
    assert peer_health(central, "b")["state"] == "following" and peer_health(central, "b")["unreachable_since"] is None


class StallingProxy:
    """A TCP proxy to a node that can stall: while stalled it forwards nothing either way and closes nothing."""

    def __init__(self, target: tuple) -> None:
        self.target = target
        self.flowing = threading.Event()
        self.flowing.set()
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        source.settimeout(None)
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                self.flowing.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.closed = True
        self.flowing.set()
        self.listener.close()


def test_a_stalling_proxy_between_central_and_node_loses_nothing(cluster):
    a = cluster.node(0)
    proxy = StallingProxy((a.host, a.port))
    try:
        central = cluster.central(f"a=http://127.0.0.1:{proxy.port}")
        cluster.write()
        central.wait_records(10, timeout=20)
        proxy.flowing.clear()
        wait_until(lambda: peer_health(central, "a")["state"] == "unreachable", 5, message="node a unreachable")
        time.sleep(1.5)  # reconnections stall too
        proxy.flowing.set()
        cluster.finish()
        expect_every_step(central, {"a": a})
        assert peer_health(central, "a")["state"] == "following"
    finally:
        proxy.close()


def test_the_central_killed_and_restarted_resumes_with_no_step_lost_or_repeated(cluster):
    a, b = cluster.node(0), cluster.node(1)
    central = cluster.central(f"a={a.url}", f"b={b.url}")
    cluster.write()
    central.wait_records(20, timeout=20)
    central.proc.kill()  # its last seq per node is committed with the items: nothing twice after the restart
    central.proc.wait(timeout=10)
    time.sleep(0.5)
    again = cluster.central(f"a={a.url}", f"b={b.url}", workdir="central-again")
    cluster.finish()
    expect_every_step(again, {"a": a, "b": b})
    expect_node_states(again, {"a": a, "b": b})  # the runs' ends as the nodes judged them (`Training Over!`)


def test_a_node_whose_history_was_reset_is_said_and_not_merged(cluster):
    a = cluster.node(0, ranks=1, args=["--no-state"])  # a restart starts another history, its seqs from 1 again
    central = cluster.central(f"a={a.url}")
    cluster.write()
    central.wait_records(10, timeout=20)
    a.kill()
    a.start()
    cluster.finish()
    wait_until(lambda: peer_health(central, "a")["reset"], 15, message="the reset said")
    time.sleep(1.0)
    steps = steps_by_source(central)["a/rank_0"]
    assert len(steps) == len(set(steps)) and steps == sorted(steps)  # the history read again is not taken twice
    card = next(s for s in central.get_json("/api/sources") if s["id"] == "a")
    assert "reset" in card["problem"] and "history was reset" in central.stderr


class _Hostile(BaseHTTPRequestHandler):
    """Not an mstail: HTML, a wrong token's 401, or a stream of one endless line, by the path's first part."""

    def do_GET(self) -> None:  # http.server's name
        mode = self.server.mode  # type: ignore[attr-defined]
        if mode == "token":
            self.send_response(401)
            self.end_headers()
            return
        if mode == "html" or self.path.startswith("/api/sources"):
            body = b"[]" if mode == "huge" else b"<html><body>a router's login page</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "application/json" if mode == "huge" else "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("X-Mstail-History", "1")
        self.end_headers()
        try:
            self.wfile.write(b"id: 1\nevent: records\ndata: [")
            for _ in range(40):
                self.wfile.write(b"x" * (1 << 20))
        except OSError:
            pass

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize("mode, said", [("html", "not JSON: not an mstail"), ("token", "refused the token"),
                                        ("huge", "a line over 32 MiB")])
def test_a_peer_that_is_no_mstail_is_said_in_one_line_and_never_stops_the_central(cluster, mode, said):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    server.mode = mode  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        central = cluster.central(f"x=http://127.0.0.1:{server.server_address[1]}")
        wait_until(lambda: said in (peer_health(central, "x")["problem"] or ""), 15, message=said)
        assert central.get_json("/healthz")["status"] == "ok"
        lines = [line for line in central.stderr.splitlines() if "peer x" in line]
        assert len(lines) == 1 and said in lines[0]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("argv, phrases", [
    (("--peer", "node-3:6150"), ("--peer 'node-3:6150'", "base URL")),
    (("--peer", "a=http://x:1", "--peer", "a=http://y:1"), ("two nodes named 'a'",)),
    (("--peer", "bad/name=http://x:1"), ("a node's name",)),
    (("--peers", "/nonexistent/nodes.txt"), ("--peers /nonexistent/nodes.txt", "cannot read it")),
    (("--peer", "http://x:1", "--peer-token-file", os.devnull), ("is empty",)),
])
def test_a_mistake_in_the_peers_is_one_line(argv, phrases):
    result = subprocess.run([sys.executable, "-m", "mstail", *argv, "--port", "0"], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("mstail: ") and result.stderr.count("\n") == 1, result.stderr
    for phrase in phrases:
        assert phrase in result.stderr
