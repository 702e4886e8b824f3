"""/api/stream against a real mstail (uvicorn on an ephemeral loopback port), with a real writer process.

httpx's ASGI transport buffers whole bodies and cannot test endless streams, so these tests talk HTTP.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .sse_client import collect, stream_seqs


def all_seqs(server) -> list:  # type: ignore[no-untyped-def]
    records = server.get_json("/api/records?after=0&limit=10000")
    events = server.get_json("/api/events")
    return sorted([r["seq"] for r in records] + [e["seq"] for e in events])


def test_reconnect_with_last_event_id_gets_exactly_what_was_missed(tmp_path: Path, mstail_server, log_writer) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "rank_0" / "info.log"
    log_writer.finish(log_writer(log, steps=60, interval_s=0))
    server = mstail_server(log)
    server.wait_records(60)
    first_last = server.get_json("/healthz")["last_seq"]

    # A client reads part of the history, then its connection drops.
    got = collect(f"{server.url}/api/stream?after=0", until=lambda g: any(m.get("event") == "records" for m in g))
    assert got[0].get("retry") == "2000"
    dropped_at = int(next(m for m in got if m.get("event") == "records")["id"])
    assert 0 < dropped_at < first_last

    # Training goes on while it is away.
    log_writer.finish(log_writer(log, steps=40, interval_s=0.01, start_step=61))
    server.wait_records(100)
    last = server.get_json("/healthz")["last_seq"]

    # The browser reconnects with Last-Event-ID (the stale ?after= in its URL must not win).
    again = collect(
        f"{server.url}/api/stream?after=0",
        headers={"Last-Event-ID": str(dropped_at)},
        until=lambda g: bool(stream_seqs(g)) and max(stream_seqs(g)) >= last,
    )
    seqs = stream_seqs(again)
    assert seqs == list(range(dropped_at + 1, last + 1))
    amends = [m.data["seq"] for m in again if m.get("event") == "amend"]  # a progress line read a pass after its step
    assert [s for s in seqs if s not in amends] == [s for s in all_seqs(server) if s > dropped_at]
    ids = [int(m["id"]) for m in again if "id" in m]
    assert ids == sorted(ids)


def test_live_only_by_default_and_nan_survives_the_stream(tmp_path: Path, mstail_server, log_writer, wait_until) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "rank_0" / "info.log"
    log_writer.finish(log_writer(log, steps=5, interval_s=0))
    server = mstail_server(log)
    server.wait_records(5)
    before = server.get_json("/healthz")["last_seq"]
    writer = log_writer(log, steps=20, interval_s=0.05, start_step=6, nan_at=(10,))
    got = collect(f"{server.url}/api/stream", until=lambda g: any(m.get("event") == "event" and m.data["kind"] == "end" for m in g))
    log_writer.finish(writer)
    records = [r for m in got if m.get("event") == "records" for r in m.data]
    assert [r["step"] for r in records] == list(range(6, 26))
    assert min(stream_seqs(got)) > before
    nan = next(r for r in records if r["step"] == 10)
    assert nan["loss"] == "NaN" and nan["loss_avg"] == "NaN"
    for message in got:  # never a bare NaN/Infinity token: strict JSON parsers must accept every message
        if "data" in message:
            json.loads(message["data"], parse_constant=lambda token: pytest.fail(f"bare {token} in the stream"))


def test_an_id_beyond_this_history_asks_the_client_to_reload(tmp_path: Path, mstail_server, log_writer) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "info.log"
    log_writer.finish(log_writer(log, steps=3, interval_s=0))
    server = mstail_server(log)
    server.wait_records(3)
    got = collect(f"{server.url}/api/stream", headers={"Last-Event-ID": "999999"}, until=lambda g: len(g) >= 2)
    assert got[1]["event"] == "reset"
    assert got[1].data == {"last_seq": server.get_json("/healthz")["last_seq"]}
