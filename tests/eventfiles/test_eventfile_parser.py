"""Frames -> records: one record per step, MindFormers' tags by their canonical names, bit-exact float32 values,
the samples twins as `consumed_samples`; live (a flush after any frame) and offline give the same history."""

from __future__ import annotations

from pathlib import Path
from typing import List

import pytest

from mstail.parsers.amends import settled
from mstail.parsers.eventfile import EventFileParser, metric_name
from mstail.parsers.record import Item
from mstail.tailer.inputs.frames import Frame, FrameSplitter

from .tbwrite import GLOBAL_BATCH, values


def frames_of(path: Path) -> List[Frame]:
    return FrameSplitter().feed(path.read_bytes())


def offline(frames: List[Frame]) -> List[Item]:
    parser = EventFileParser()
    items: List[Item] = []
    for f in frames:
        items += parser.feed(f.payload, f.number, 0.0)
    return settled(items + parser.flush(0.0, force=True))


@pytest.mark.slow  # its event files come from a writer process
@pytest.mark.parametrize("fixture", ["event_file", "tensor_event_file"])
def test_every_step_once_with_exact_values(fixture: str, request: pytest.FixtureRequest) -> None:
    items = offline(frames_of(request.getfixturevalue(fixture)))
    assert [item.kind for item in items] == ["record"] * 12
    for step, (_, record) in enumerate(items, start=1):
        expected = {**values(step), "consumed_samples": step * GLOBAL_BATCH}
        assert {key: record[key] for key in expected} == expected  # == on floats: the float32 bits, as written
        assert record["step"] == step and record["segment"] == 0 and set(record) == {*expected, "step", "time", "line",
                                                                                      "segment"}


def test_records_published_at_every_frame_then_amended_settle_to_the_offline_history(event_file: Path) -> None:
    """The worst case of live reading: a pass ends after every frame, so each step's record goes out with its first
    value and every later value of the step is an amend; what the store ends with is the offline history."""
    frames = frames_of(event_file)
    parser, items = EventFileParser(), []
    for f in frames:
        items += parser.feed(f.payload, f.number, 0.0) + parser.flush(0.0)
        assert not parser.holding
    assert sum(item.kind == "amend" for item in items) > 12
    assert settled(items) == offline(frames)


def test_a_restore_at_any_frame_continues_exactly(event_file: Path) -> None:
    frames = frames_of(event_file)
    for cut in (1, 2, 9, 40, 57, len(frames) - 1):
        first, items = EventFileParser(), []
        for f in frames[:cut]:
            items += first.feed(f.payload, f.number, 0.0)
        items += first.flush(0.0)
        second = EventFileParser()
        assert second.restore(first.snapshot())
        for f in frames[cut:]:
            items += second.feed(f.payload, f.number, 0.0)
        assert settled(items + second.flush(0.0)) == offline(frames)


def test_a_relaunch_from_an_earlier_step_opens_a_segment(event_file: Path) -> None:
    frames = frames_of(event_file)
    items = offline(frames + frames[1:])  # the same steps again, as a relaunch from the start writes them
    records = [data for kind, data in items if kind == "record"]
    [resume] = [data for kind, data in items if kind == "event"]
    assert [r["segment"] for r in records] == [0] * 12 + [1] * 12
    assert resume["kind"] == "resume" and resume["step"] == 1 and resume["from_step"] == 12


def test_tag_names() -> None:
    assert [metric_name(t) for t in ("learning-rate", "grad-norm", "loss-scale", "iteration-time", "throughput",
                                     "loss[:Scalar]", "loss/auto", "Loss/train", "step", "time")] == [
        "lr", "grad_norm", "loss_scale", "step_time_ms", "samples_per_s", "loss", "loss", "Loss/train", "tag_step",
        "tag_time"]


def test_a_frame_that_is_no_event_is_counted_not_raised() -> None:
    parser = EventFileParser()
    assert parser.feed(b"\xff\xff\xff", 1, 0.0) == [] and parser.counts["undecodable_frames"] == 1


def test_a_step_with_thousands_of_tags_keeps_a_bounded_record() -> None:
    from mstail.parsers.eventfile import MAX_KEYS
    from mstail.tailer.inputs.frames import frame
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.proto.summary_pb2 import Summary

    summary = Summary(value=[Summary.Value(tag=f"local_norm/p{i}", simple_value=float(i)) for i in range(3000)])
    payload = Event(wall_time=1.0, step=5, summary=summary).SerializeToString()
    assert FrameSplitter().feed(frame(payload))[0].payload == payload
    parser = EventFileParser()
    [(kind, record)] = parser.feed(payload, 1, 0.0) + parser.flush(0.0)
    assert kind == "record" and len(record) == MAX_KEYS + 1 and parser.counts["dropped_values"] == 3000 - (MAX_KEYS - 3)


def test_records_and_amends_get_the_derived_series_as_a_text_log_s_do() -> None:
    """Perplexity of the loss: on a record, and on the amend that brings a step's loss after its record went out
    (a pass ended between the step's frames)."""
    from mstail.parsers.derived import Derived
    from mstail.parsers.eventschema import TensorBoardEvent

    def event(step: int, tag: str, value: float) -> bytes:
        e = TensorBoardEvent(wall_time=1700000000.0 + step, step=step)
        scalar = e.summary.value.add()
        scalar.tag, scalar.simple_value = tag, value
        return e.SerializeToString()

    parser = EventFileParser("tensorboard", Derived())
    items = parser.feed(event(1, "loss", 2.0), 1, 0.0) + parser.feed(event(2, "learning-rate", 0.5), 2, 0.0)
    items += parser.flush(0.0) + parser.feed(event(2, "loss", 1.0), 3, 0.0)  # step 2's loss after its record
    assert [(kind, data.get("perplexity")) for kind, data in items] == [
        ("record", pytest.approx(7.389056)), ("record", None), ("amend", pytest.approx(2.7182818))]
