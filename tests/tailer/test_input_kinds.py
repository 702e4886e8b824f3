"""The input-kind protocol (tailer/inputs/kind.py): every kind's halves have every member the live pass, the catch-up
child and `mstail parse` use, and `items_of` turns any piece into the items feeding its lines one by one gives."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import List

import pytest

from mstail.parsers import Item, load_formats
from mstail.tailer.inputs import kind as kinds
from mstail.tailer.inputs.kind import KINDS, Follower, InputKind, InputSpec, Parser, items_of
from mstail.tailer.inputs.lines import Block

FORMATS = load_formats()
MINDFORMERS = (Path(__file__).resolve().parents[2] / "sample_logs" / "mindformers_v1.9_eval_worker_0.log")


def members(protocol: type) -> List[str]:
    """What a protocol asks for: its attributes, properties and methods."""
    names = set(getattr(protocol, "__annotations__", {}))
    names |= {name for name, _ in inspect.getmembers(protocol) if not name.startswith("_")}
    return sorted(names)


def test_the_kinds_are_text_jsonl_events_and_peer_each_under_its_name():
    assert sorted(KINDS) == ["events", "jsonl", "peer", "text"]
    for name, kind in KINDS.items():
        assert kind.name == name
        assert set(members(InputKind)) <= set(dir(kind)), name


@pytest.mark.parametrize("name", sorted(KINDS))
def test_each_kind_makes_a_follower_and_a_parser_with_every_member_the_protocol_names(tmp_path, name):
    spec = InputSpec(tmp_path / "x.log", source="x", formats=FORMATS)
    follower, parser = KINDS[name].follower(spec), KINDS[name].parser(spec)
    try:
        missing = [m for m in members(Follower) if not hasattr(follower, m)]
        assert not missing, f"{name}'s follower lacks {missing}"
        missing = [m for m in members(Parser) if not hasattr(parser, m)]
        assert not missing, f"{name}'s parser lacks {missing}"
        assert parser.emitted == 0 and not parser.holding and json.loads(parser.snapshot_json())
    finally:
        follower.close()


def test_the_protocols_name_what_the_loop_uses():
    """A member the protocol lost would let a kind without it pass the test above: the core ones are listed."""
    assert {"read", "checkpoint", "restore", "may_have_news", "close", "counters", "current", "path"} <= set(
        members(Follower))
    assert {"feed", "flush", "holding", "emitted", "snapshot_json", "restore", "parts", "main", "counts"} <= set(
        members(Parser))


def test_items_of_a_block_equal_those_of_its_lines_fed_one_by_one():
    data = MINDFORMERS.read_bytes()
    spec = InputSpec(MINDFORMERS, formats=FORMATS)
    by_line = KINDS["text"].parser(spec)
    one_by_one: List[Item] = []
    for line in KINDS["text"].splitter(spec).feed(data):
        one_by_one += items_of(by_line, line, 0.0)
    by_block = KINDS["text"].parser(spec)
    pieces = KINDS["text"].splitter(spec).feed(data, blocks=True)
    assert any(isinstance(piece, Block) for piece in pieces)
    blocked: List[Item] = []
    for piece in pieces:
        blocked += items_of(by_block, piece, 0.0)
    assert sum(item.kind == "record" for item in one_by_one) > 10
    assert blocked == one_by_one
    assert by_block.counts == by_line.counts


def test_a_piece_the_parser_fails_on_is_skipped_and_named_with_on_error_else_raised():
    class Failing:
        def feed(self, text, number, now):
            raise ValueError(f"bad {text}")

    (line,) = KINDS["text"].splitter(InputSpec(Path())).feed(b"loss: 1\n")
    failed = []
    assert items_of(Failing(), line, 0.0, lambda number, exc: failed.append((number, str(exc)))) == []  # type: ignore[arg-type]  # a parser half only
    assert failed == [(1, "bad loss: 1")]
    with pytest.raises(ValueError):
        items_of(Failing(), line, 0.0)  # type: ignore[arg-type]  # a parser half only


def test_an_event_file_is_split_into_frames_and_parsed_by_the_events_kind():
    """MindSpore 2.10's SummaryRecord, steps 1-3 (tests/eventfiles/data/README.md)."""
    path = Path(__file__).resolve().parents[1] / "eventfiles" / "data" / "summary_record_3_steps_MS"
    spec = InputSpec(path, variant="")  # known by its content: the version event decides
    parser = KINDS["events"].parser(spec)
    items: List[Item] = []
    for piece in KINDS["events"].splitter(spec).feed(path.read_bytes()):
        items += items_of(parser, piece, 0.0)
    items += parser.flush(0.0, force=True)
    records = [item.data for item in items if item.kind == "record"]
    assert [(r["step"], r["loss"]) for r in records] == [(1, pytest.approx(0.1)), (2, pytest.approx(0.2)),
                                                         (3, pytest.approx(0.3))]
    assert parser.format is not None and parser.format.name == "mindspore-summary"


def test_kind_module_imports_no_follower_so_mstail_parse_opens_none():
    """`mstail parse` reads files whole: the kinds make followers only when asked (their modules import lazily)."""
    source = inspect.getsource(kinds)
    assert "import FileFollower" not in source and "import EventFilesFollower" not in source
