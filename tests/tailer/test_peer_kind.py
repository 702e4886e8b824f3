"""The `peer` input kind in hand: a node's messages -> the central's items, its checkpoint (no process, no socket)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from mstail.parsers.record import PART_KEY
from mstail.tailer.inputs.checkpoint import SourceCheckpoint
from mstail.tailer.inputs.kind import KINDS, InputSpec, items_of
from mstail.tailer.inputs.peer import PeerFollower, PeerMessage


def follower_parser_json() -> str:
    return KINDS["peer"].parser(InputSpec(Path("n1"))).snapshot_json()


def test_a_nodes_records_amends_and_events_become_items_of_its_sources_and_its_alerts_do_not():
    parser = KINDS["peer"].parser(InputSpec(Path("n1"), source="n1", variant="http://n1:6150"))
    records = ("records", [{"seq": 7, "source": "rank_0", "step": 3, "loss": "NaN", "kind_of_run": "x"},
                           {"seq": 8, "source": "exp/rank_1", "step": 3, "loss": 1.5}])
    items = items_of(parser, PeerMessage(records, 8, "h", 10), 0.0)
    assert [(item.kind, item.data[PART_KEY], item.data["step"]) for item in items] == [
        ("record", "rank_0", 3), ("record", "exp/rank_1", 3)]
    assert math.isnan(items[0].data["loss"]) and "seq" not in items[0].data and "source" not in items[0].data
    amend = ("amend", {"seq": 9, "source": "rank_0", "step": 3, "segment": 0, "kind": "amend", "lr": 0.1})
    (item,) = items_of(parser, PeerMessage(amend, 9, "h", 10), 0.0)
    assert item.kind == "amend" and "kind" not in item.data and item.data["lr"] == 0.1  # joined as values only
    event = ("event", {"seq": 10, "source": "rank_0", "kind": "end", "step": 3})
    assert items_of(parser, PeerMessage(event, 10, "h", 10), 0.0)[0].data["kind"] == "end"
    alert = ("alert", {"seq": 11, "source": "rank_0", "kind": "alert", "rule": "nonfinite"})
    assert items_of(parser, PeerMessage(alert, 11, "h", 10), 0.0) == []  # the central judges for itself
    assert sorted(parser.parts) == ["exp/rank_1", "rank_0"] and parser.emitted == 4


def test_a_nodes_source_entries_give_its_sources_state_fate_and_writer():
    parser = KINDS["peer"].parser(InputSpec(Path("n1"), source="n1"))
    entries = [{"id": "rank_0", "state": "died", "end_reason": "a traceback", "end_guessed": False,
                "hang_rule": "writer", "format": "mindformers", "counters": {"lines": 5}},
               {"id": "rank_1", "state": "following", "hang_rule": "writer"},
               {"id": "rank_2", "state": "idle", "hang_rule": "time bound"}]
    items_of(parser, PeerMessage(("sources", entries), 0, "h", 0), 0.0)
    dead, live, remote = (parser.parts[f"rank_{n}"] for n in range(3))
    assert dead.fate() == ("died", "a traceback", False) and dead.writing() is False
    assert dead.format.name == "mindformers" and dead.counts["lines"] == 5
    assert live.fate() is None and live.writing() is True and remote.writing() is None
    items_of(parser, PeerMessage(("source", {"id": "rank_1", "state": "finished"}), 0, "h", 0), 0.0)
    assert live.state == "finished"


def test_the_position_taken_is_the_checkpoint_and_a_restart_resumes_there():
    follower = PeerFollower("n1", "http://127.0.0.1:9")
    follower._queue.extend([PeerMessage(("sources", []), 0, "h1", 0), PeerMessage(("records", []), 41, "h1", 5),
                            PeerMessage(("source", {"id": "x"}), 41, "h1", 5)])
    follower._thread = object()  # type: ignore[assignment]  # no connection in this test
    assert len(follower.read(1 << 20, 0.0)) == 3
    stored = SourceCheckpoint(follower.checkpoint(), follower_parser_json(), 0).dumps()
    saved = SourceCheckpoint.from_json(json.loads(stored))  # as a restart reads it back
    again = PeerFollower("n1", "http://127.0.0.1:9")
    assert again.restore(saved.follower)
    assert (again._taken.history, again._taken.seq) == ("h1", 41)  # a source entry's id is no position
    assert (again._received.history, again._received.seq) == ("h1", 41)


def test_after_a_nodes_reset_what_it_reads_again_is_not_taken_twice():
    parser = KINDS["peer"].parser(InputSpec(Path("n1"), source="n1"))
    parser.remember("rank_1", 3)  # held before a restart of the central: known by its step alone

    def feed(event, data):
        return [(item.kind, item.data[PART_KEY], item.data.get("step"))
                for item in items_of(parser, PeerMessage((event, data), 0, "h", 0), 0.0)]

    first = [{"source": "rank_0", "step": step, "segment": 0} for step in (1, 2, 3)]
    assert len(feed("records", first)) == 3
    feed("reset", {"last_seq": 0})
    assert feed("event", {"source": "rank_0", "kind": "start"}) == []  # the start it reads again
    again = [{"source": source, "step": step, "segment": 0} for step in (1, 2, 3, 4, 5) for source in ("rank_0", "rank_1")]
    assert feed("records", again) == [("record", "rank_0", 4), ("record", "rank_1", 4), ("record", "rank_0", 5),
                                      ("record", "rank_1", 5)]
    assert feed("records", [{"source": "rank_0", "step": 1, "segment": 1}]) == [("record", "rank_0", 1)]  # a new run
    assert feed("records", [{"source": "rank_2", "step": 1}]) == [("record", "rank_2", 1)]  # a source new to it
