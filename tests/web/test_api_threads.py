"""The Store's thread contract under load: a real uvicorn server (in-process, loopback, ephemeral port) answers
eight client threads' `/api/series?smooth=` queries while an ingest task on the same event loop appends ~200k
points. Every answer must be HTTP 200, and every answer must equal what a fresh Store, fed single-threaded exactly
the items up to the answer's `seq`, answers to the same query (after a JSON round trip; floats exact).

Routes that ran in FastAPI's thread pool (plain `def`) broke this: KeyError in the EMA cache (HTTP 500), EMA
columns extended by two threads at once (wrong smoothing ever after), and series holding points past the `seq`
the answer reported. The routes are `async def` now, so they run on the event loop like the ingest.

Why the oracle can be exact: a smoothed value is composed in an order tied to the points' indexes
(`series._smoothed_at`), the same from the EMA's cached states as from the first point, whatever was asked before.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import math
import random
import socket
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlencode

import pytest
import uvicorn

from mstail.parsers import Item
from mstail.tailer.history.db import StateDB
from mstail.tailer.live.hub import Hub
from mstail.tailer.history.store import Store
from mstail.web.app import create_app
from mstail.web.responses import RecordJSONResponse

pytestmark = pytest.mark.slow

METRICS = ("loss", "grad_norm", "lr")
# Records per source: 67k records of 3 metrics, ~200k points; rank_0 gets two batches for each of rank_1's.
RECORDS = {"rank_0": 44_000, "rank_1": 23_000}
BATCH = 500
CLIENTS = 8
REQUESTS_PER_CLIENT = 40  # per client, during the ingest and after it (a corrupted cache shows in later answers)
SAMPLE = 200  # answers checked against the oracle
OVERLAP = 4 * CLIENTS  # answers received while the ingest runs, at least
DEADLINE_S = 60.0  # serving and ingesting; the oracle check after it takes ~5 s
# smoothing weight -> the one `points` it is asked with (see the module docstring), and how often it is picked.
# Many weights on one series keep evicting each other's cached EMA states, so passes from the first point run all the
# time.
PLAN: Tuple[Tuple[float, int, int], ...] = (
    (0.6, 1000, 3),  # buckets of <= 44 points
    (0.9, 500, 3),
    (0.95, 150, 3),  # buckets of >= 256 points once the series is long
    (0.99, 100, 3),
    (0.999, 20, 2),
    (0.5, 100, 1),
    (0.0, 2000, 1),
    (0.0, 300, 1),
    (0.0, 50, 1),
)


def _value(metric: str, step: int, seed: int) -> float:
    if metric == "loss":
        if step % 12_011 == 0:
            return math.nan  # non-finite values: listed in `nonfinite`, skipped by the EMA
        if step % 9_973 == 0:
            return 50.0  # spikes: kept by the min/max buckets
        return 2.0 + 8.0 * math.exp(-step / 5000.0) + 0.01 * ((step * 7919 + seed) % 13)
    if metric == "grad_norm":
        return 0.8 + 3.0 * math.exp(-step / 2000.0) + 0.001 * ((step * 31 + seed) % 17)
    return float("%.8g" % (1e-4 * min(1.0, step / 1000.0) * (1.0 + 0.1 * math.sin(step / 700.0))))


def _batches() -> List[Tuple[str, List[Item]]]:
    """The ingest, in order: (source, items); now and then a checkpoint event, so seqs are not record counts."""
    out: List[Tuple[str, List[Item]]] = []
    next_step = {source: 1 for source in RECORDS}
    seeds = {"rank_0": 0, "rank_1": 5}
    turn = 0
    while any(next_step[s] <= RECORDS[s] for s in RECORDS):
        source = "rank_1" if turn % 3 == 2 else "rank_0"
        turn += 1
        first = next_step[source]
        last = min(first + BATCH - 1, RECORDS[source])
        if first > last:
            continue
        items = [Item("record", {"step": step, "epoch": 1 + step // 10_000, "time": 1.7e9 + step * 0.25,
                                 **{m: _value(m, step, seeds[source]) for m in METRICS}})
                 for step in range(first, last + 1)]
        if len(out) % 20 == 19:
            items.append(Item("event", {"kind": "checkpoint", "step": last, "time": 1.7e9 + last * 0.25}))
        next_step[source] = last + 1
        out.append((source, items))
    return out


def _requests(client: int) -> List[Dict[str, Any]]:
    """A client's queries: mostly `loss` (the longest series), mixed weights and points, sometimes one source."""
    rng = random.Random(1000 + client)
    weights = [entry for entry in PLAN for _ in range(entry[2])]
    out = []
    for _ in range(REQUESTS_PER_CLIENT):
        smooth, points, _ = rng.choice(weights)
        metric = rng.choice(("loss", "loss", "loss", "grad_norm", "lr"))
        sources = rng.choice((None, None, ["rank_0"], ["rank_1"], ["rank_0", "rank_1"]))
        out.append({"metric": metric, "smooth": smooth, "points": points, "source": sources})
    return out


def _path(query: Dict[str, Any]) -> str:
    params: List[Tuple[str, Any]] = [(key, query[key]) for key in ("metric", "smooth", "points")]
    params += [("source", s) for s in query["source"] or ()]
    return "/api/series?" + urlencode(params)


class Answer:
    __slots__ = ("body", "client", "index", "query", "status")

    def __init__(self, client: int, index: int, query: Dict[str, Any], status: int, body: bytes) -> None:
        self.client, self.index, self.query, self.status, self.body = client, index, query, status, body


def _client(port: int, client: int, stop: threading.Event, answers: List[Answer], errors: List[str]) -> None:
    """One keep-alive connection (http.client: never through a proxy). A connection the server dropped (uvicorn
    closes it after an exception in a route) is reopened once per request and counted in `errors`."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        for index, query in enumerate(_requests(client)):
            if stop.is_set():
                return
            for attempt in (1, 2):
                try:
                    conn.request("GET", _path(query))
                    response = conn.getresponse()
                    answers.append(Answer(client, index, query, response.status, response.read()))
                    break
                except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                    errors.append(f"client {client}, request {index} (attempt {attempt}): connection dropped: {exc!r}")
                    conn.close()
                    if attempt == 2:
                        return
    except Exception as exc:  # noqa: BLE001 - reported by the test
        errors.append(f"client {client}: {exc!r}")
    finally:
        conn.close()


async def _hammer(store: Store, batches: List[Tuple[str, List[Item]]]
                  ) -> Tuple[List[Answer], List[str], Dict[str, float]]:
    """Serve `store` on 127.0.0.1:<ephemeral> while CLIENTS threads query it and this loop ingests `batches`;
    returns the answers, the clients' errors, and facts (ingest time, answers received during the ingest)."""
    app = create_app(store, Hub())
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, log_level="warning", access_log=False,
                                           lifespan="off", timeout_graceful_shutdown=5))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    answers: List[Answer] = []
    errors: List[str] = []
    stop = threading.Event()
    facts: Dict[str, float] = {}
    threads = [threading.Thread(target=_client, args=(port, c, stop, answers, errors), daemon=True)
               for c in range(CLIENTS)]
    try:
        while not server.started:
            assert not serving.done(), "uvicorn stopped before it started"
            await asyncio.sleep(0.01)
        for thread in threads:
            thread.start()
        started = time.monotonic()
        for k, (source, items) in enumerate(batches):
            store.add(source, items)
            if k % 10 == 9:
                store.commit()
            await asyncio.sleep(0)
            # paced by the answers, each wait bounded: the queries spread over the whole ingest (a store that
            # takes the batches faster than the clients ask would otherwise be done before most of them started)
            wanted, waited = OVERLAP * (k + 1) // len(batches), time.monotonic()
            while len(answers) < wanted and time.monotonic() - waited < 1.0:
                await asyncio.sleep(0.005)
        store.commit()
        facts["ingest_s"] = time.monotonic() - started
        facts["answers_during_ingest"] = len(answers)
        while any(t.is_alive() for t in threads):
            await asyncio.sleep(0.02)
    finally:
        stop.set()
        server.should_exit = True
        await asyncio.wait_for(serving, 15)
        sock.close()
    return answers, errors, facts


def _oracle_answers(batches: List[Tuple[str, List[Item]]], sample: List[Tuple[int, Answer]]
                    ) -> List[Tuple[Answer, Any]]:
    """For each sampled (seq, answer), in seq order, what a fresh Store fed exactly the items up to that seq
    answers, single-threaded (one Store fed in seq order, so each item is added once)."""
    flat = [(source, item) for source, items in batches for item in items]
    oracle = Store()
    for source in RECORDS:
        oracle.add_source(source, f"/logs/{source}/info.log")
    fed = 0
    out: List[Tuple[Answer, Any]] = []
    for seq, answer in sorted(sample, key=lambda pair: pair[0]):
        assert fed <= seq <= len(flat), (fed, seq)
        while fed < seq:  # runs of one source, cut at `seq`
            source = flat[fed][0]
            end = fed
            while end < seq and flat[end][0] == source:
                end += 1
            oracle.add(source, [item for _, item in flat[fed:end]])
            fed = end
        assert oracle.last_seq == seq
        query = answer.query
        content = {
            "metric": query["metric"],
            "seq": oracle.last_seq,
            "series": oracle.series(query["metric"], sources=query["source"], points=query["points"],
                                    smooth=round(query["smooth"], 3)),
        }
        out.append((answer, json.loads(RecordJSONResponse(content).body)))
    oracle.close()
    return out


def _first_difference(got: Any, want: Any, where: str = "") -> Optional[str]:
    if type(got) is not type(want):
        return f"{where}: {got!r:.80} != {want!r:.80}"
    if isinstance(got, dict):
        if list(got) != list(want):
            return f"{where}: keys {list(got)} != {list(want)}"
        for key in got:
            found = _first_difference(got[key], want[key], f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(got, list):
        if len(got) != len(want):
            return f"{where}: {len(got)} items != {len(want)}"
        for i, (a, b) in enumerate(zip(got, want)):
            found = _first_difference(a, b, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if got == want else f"{where}: {got!r} != {want!r}"


@pytest.mark.timeout(90)
def test_concurrent_series_queries_during_ingest_are_all_200_and_exact(tmp_path: Path) -> None:
    batches = _batches()
    assert sum(len(items) for _, items in batches) > 67_000
    store = Store(StateDB(tmp_path / "state.sqlite"))
    for source in RECORDS:
        store.add_source(source, f"/logs/{source}/info.log")
    started = time.monotonic()
    try:
        answers, errors, facts = asyncio.run(asyncio.wait_for(_hammer(store, batches), DEADLINE_S))
    finally:
        store.close()
    served_s = time.monotonic() - started

    statuses: Dict[int, int] = {}
    for answer in answers:
        statuses[answer.status] = statuses.get(answer.status, 0) + 1
    failed = [a for a in answers if a.status != 200]
    assert not failed, (
        f"{len(failed)} of {len(answers)} answers were not HTTP 200 ({statuses}; {len(errors)} dropped connections); "
        f"first: {failed[0].query} -> {failed[0].status} {failed[0].body[:200]!r}"
    )
    assert not errors, errors
    assert len(answers) == CLIENTS * REQUESTS_PER_CLIENT
    assert facts["answers_during_ingest"] >= OVERLAP, facts  # the queries overlapped the ingest

    # A deterministic sample, evenly spread over the answers in (seq, client, index) order.
    ordered = sorted(((json.loads(a.body)["seq"], a) for a in answers), key=lambda p: (p[0], p[1].client, p[1].index))
    spacing = max(1.0, len(ordered) / SAMPLE)
    sample = [ordered[int(i * spacing)] for i in range(min(SAMPLE, len(ordered)))]
    mismatches = []
    for answer, want in _oracle_answers(batches, sample):
        got = json.loads(answer.body)
        found = _first_difference(got, want)
        if found:
            mismatches.append(f"seq {got['seq']} {answer.query}: {found}")
    assert not mismatches, (f"{len(mismatches)} of {len(sample)} sampled answers differ from the oracle; first:\n"
                            + "\n".join(mismatches[:5]))
    print(f"\n{len(answers)} answers ({facts['answers_during_ingest']} during the {facts['ingest_s']:.1f} s "
          f"ingest), served in {served_s:.1f} s, {len(sample)} checked against the oracle in "
          f"{time.monotonic() - started - served_s:.1f} s")
