"""Webhooks against real HTTP receivers on loopback: one that answers 200, one that hangs, one that returns 500."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Iterator, List

import pytest

from mstail.tailer.outbound.webhooks import Target, WebhookError, Webhooks, parse_target, payload

ALERT = {"id": "a1", "rule": "nonfinite", "source": "rank_0", "step": 10, "severity": "critical", "state": "firing",
         "message": "non-finite loss = NaN", "first_seen": 1.0, "last_seen": 1.0, "count": 1, "seq": 42}


class Receiver:
    """A real HTTP server on 127.0.0.1:0 in a thread; `mode`: ok | hang | fail (500)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.bodies: List[Dict[str, Any]] = []
        self.attempts = 0
        self.release = threading.Event()  # a hanging handler waits for this (bounded) at teardown
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server API
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.attempts += 1
                if receiver.mode == "hang":
                    receiver.release.wait(10)
                    return
                if receiver.mode == "fail":
                    self.send_response(500)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                receiver.bodies.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def receivers() -> Iterator[Dict[str, Receiver]]:
    made = {mode: Receiver(mode) for mode in ("ok", "hang", "fail")}
    yield made
    for receiver in made.values():
        receiver.close()


def test_targets_and_payload_formats() -> None:
    assert parse_target("http://127.0.0.1:9/x") == Target("http://127.0.0.1:9/x", "generic")
    assert parse_target("slack=http://127.0.0.1:9/x?a=b").format == "slack"
    assert parse_target("https://open.feishu.cn/open-apis/bot/v2/hook/T").format == "feishu"
    assert parse_target("https://oapi.dingtalk.com/robot/send?access_token=T").format == "dingtalk"
    assert parse_target("https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=K").format == "wecom"
    with pytest.raises(WebhookError):
        parse_target("teams=http://x")
    with pytest.raises(WebhookError):
        parse_target("ftp://x")
    text = "[mstail CRITICAL] nonfinite on rank_0 step 10: non-finite loss = NaN"
    assert payload("feishu", ALERT) == {"msg_type": "text", "content": {"text": text}}
    assert payload("dingtalk", ALERT) == payload("wecom", ALERT) == {"msgtype": "text", "text": {"content": text}}
    assert payload("slack", ALERT) == {"text": text}
    generic = payload("generic", ALERT)
    assert generic["text"] == text and generic["alert"]["id"] == "a1" and generic["alert"]["seq"] == 42


def test_a_hanging_and_a_failing_receiver_do_not_delay_a_good_one(receivers: Dict[str, Receiver]) -> None:
    async def scenario() -> Dict[str, Any]:
        hooks = Webhooks([parse_target(v) for v in (receivers["hang"].url, receivers["fail"].url, "feishu=" + receivers["ok"].url)],
                         timeout_s=0.3, retries=2, backoff_s=0.05)
        hooks.start()
        began = time.monotonic()
        hooks.submit(ALERT)
        hooks.submit({**ALERT, "id": "a2"})
        while len(receivers["ok"].bodies) < 2 and time.monotonic() - began < 5:
            await asyncio.sleep(0.01)
        ok_after = time.monotonic() - began
        while sum(s["failed"] for s in hooks.stats()) < 4 and time.monotonic() - began < 10:
            await asyncio.sleep(0.02)
        stats = hooks.stats()
        stopping = time.monotonic()
        await hooks.stop()
        return {"ok_after": ok_after, "stats": stats, "stop_s": time.monotonic() - stopping}

    got = asyncio.run(scenario())
    assert got["ok_after"] < 0.9  # not behind the hanging receiver's timeouts (3 x 0.3 s for an alert)
    assert [b["content"]["text"] for b in receivers["ok"].bodies] == [
        "[mstail CRITICAL] nonfinite on rank_0 step 10: non-finite loss = NaN"] * 2
    hang, fail, ok = got["stats"]
    assert ok["sent"] == 2 and ok["failed"] == 0
    assert fail["failed"] == 2 and fail["retries"] == 4 and receivers["fail"].attempts == 6  # 1 + 2 retries each
    assert hang["failed"] == 2 and hang["retries"] == 4  # each attempt timed out after 0.3 s
    assert got["stop_s"] < 1.5


def test_the_queue_is_bounded_and_drops_the_oldest(receivers: Dict[str, Receiver]) -> None:
    async def scenario() -> List[Dict[str, Any]]:
        hooks = Webhooks([parse_target(receivers["hang"].url)], timeout_s=5, retries=0, max_queue=3)
        hooks.start()
        for n in range(10):
            hooks.submit({**ALERT, "id": f"a{n}"})
        began = time.monotonic()
        await asyncio.sleep(0.2)
        stats = hooks.stats()
        await hooks.stop()  # cancels the send stuck on the hanging receiver at once
        assert time.monotonic() - began < 1.5
        return stats

    [stats] = asyncio.run(scenario())
    assert stats["dropped"] == 7 and stats["queued"] <= 3
