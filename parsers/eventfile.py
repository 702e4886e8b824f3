"""The frames of event files -> records: one record per step, MindFormers' TensorBoard tags by their canonical names.

`EventFileParser` is the event-file twin of `InterleavedParser` (feed, flush, holding, emitted, counts, format, meta,
parts, snapshot, restore), fed one frame's payload at a time by the tailer and by `mstail parse`. Each file's first
event names its writer (`brain.Event:2`: TensorBoard/tensorboardX; `MindSpore.Event:1`: SummaryRecord), which picks
the schema (`eventschema`) for the events after it.

When is a step's record complete? MindSpore's `SummaryRecord.record(step)` writes a step's scalars in one event;
TensorBoard writers write one event per scalar, so a step's values arrive one by one. The record is built while the
frames of its step arrive and goes out when another step begins, or at the end of what is readable now (`flush`,
called at the end of every read pass): a step's record is never held across passes (the page sees it at once). A
value of that step that arrives later (the writer had not flushed it yet) becomes an `amend` of it, which the store
applies, so live and offline (`mstail parse` flushes only at the end) give the same history. A tag already in its
step's record (a writer logging the same tag twice for one step) keeps its first value; the second is counted in
`repeated_values`.

MindFormers' `MFLossMonitor` writes each scalar twice: at the step (`loss`) and at the samples consumed (`loss vs
samples`, whose event step is step x global batch size). The twin's step becomes the record's `consumed_samples`;
its value, the same as the plain tag's, is not kept twice.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, NamedTuple, Optional, Set, Tuple

from .derived import Derived, Deriver
from .engine import ParserState
from .record import PART_KEY, RESERVED, Item, Record, metric_key

#: The kinds of event files, as `ParserState.format` and `/api/sources` name them.
TENSORBOARD = "tensorboard"
MINDSPORE = "mindspore-summary"
KINDS = (TENSORBOARD, MINDSPORE)
#: The version each writer puts in a file's first event: TensorBoard's `file_version`, MindSpore's `version`.
TENSORBOARD_VERSION = "brain.Event:"
MINDSPORE_VERSION = "MindSpore.Event:"

#: MindFormers' tags (mindformers/core/callback/callback.py, MFLossMonitor) -> the names its text log's format gives
#: the same numbers (formats/mindformers.toml, megatron.toml). `iteration-time` is the step time in ms (the callback's
#: `per_step_seconds` is milliseconds, printed as "per_step_time: %dms"); `throughput` is samples/s per device (the
#: progress line's "samples/s/p"); `model-flops-throughput-per-npu` is TFLOP/s per device.
TAG_NAMES = {
    "learning-rate": "lr",
    "grad-norm": "grad_norm",
    "loss-scale": "loss_scale",
    "iteration-time": "step_time_ms",
    "throughput": "samples_per_s",
    "batch-size": "global_batch_size",
    "model-flops-throughput-per-npu": "throughput_tflops",
    "B-samples-per-day": "b_samples_per_day",
    "lm-loss": "lm_loss",
    "mtp-loss": "mtp_loss",
    "load-balancing-loss": "load_balancing_loss",
}
#: The samples twin of a tag (`loss vs samples`; tensorboardX writes spaces in tags as `_`): its event step is the
#: samples consumed.
_TWIN = re.compile(r"^(?P<tag>.+)[ _]vs[ _]samples$")
#: What MindSpore adds to a scalar's name: ScalarSummary operators in a network write `NAME[:Scalar]`,
#: SummaryCollector its loss as `loss/auto`.
_MS_SUFFIXES = ("[:Scalar]", "/auto")
SAMPLES = "consumed_samples"
#: tags whose metric names a parser keeps at hand (a run has tens)
MAX_TAGS = 4096
#: characters a tag may have to become a metric name (as a text format's pair name, `loader.MAX_PAIR_NAME`): a longer
#: tag (a writer's bug, a hostile file) would be a key of up to a frame's size in every record, series and answer;
#: its values are counted in `dropped_values`
MAX_TAG_CHARS = 256
#: metrics one source may have: a writer inventing tags (one per step, 100,000 in all) would otherwise make as many
#: series, each more memory and more time for every value after it; the values of tags past it count in `dropped_values`
MAX_METRICS = 1024
#: keys one record may hold before its segment: a writer logging thousands of tags a step (one per parameter) fills the first ones;
#: the rest are counted in `dropped_values`, so no step can grow a record without bound
MAX_KEYS = 1024


class EventKind(NamedTuple):
    """What `format` is for an event file's source: the name `/api/sources` and `mstail parse` show."""

    name: str


def metric_name(tag: str) -> str:
    """The record key of a scalar's tag: MindFormers' names mapped (`TAG_NAMES`), MindSpore's suffixes dropped
    (`_MS_SUFFIXES`), a reserved key (`step`, `time`, ...) prefixed with `tag_` so it cannot overwrite the record's
    own."""
    for suffix in _MS_SUFFIXES:
        if tag.endswith(suffix):
            tag = tag[: -len(suffix)]
            break
    name = TAG_NAMES.get(tag, tag)
    return metric_key(f"tag_{name}" if name in RESERVED or name == PART_KEY else name) or ""  # "": no name


class EventFileParser:
    """Frames of one source's event files (in order) -> records, resume events and amends.

    Args:
        kind: the kind the file name says (`TENSORBOARD`, `MINDSPORE`); None (default) when only the content said
            it. A file's version event decides anyway.
        derived: derived series added to the records and amends (`mstail.parsers.derived`), as a text log's parser
            adds them; None (default) = none.
    """

    def __init__(self, kind: Optional[str] = None, derived: Optional[Derived] = None) -> None:
        from . import eventschema  # protobuf and the schemas: only once an event file is read

        self._decode, self._decode_error = eventschema.decode, eventschema.DecodeError
        self.state = ParserState(format=kind)
        self.state.counts.update(repeated_values=0, undecodable_frames=0, dropped_values=0)
        self._open: Optional[Record] = None  # the record of the step whose frames are arriving (held within a pass)
        self._names: Dict[str, Optional[str]] = {}  # tag -> its metric name (None: a samples twin)
        self._metrics: Set[str] = set()  # the metric names given out (at most MAX_METRICS)
        self.parts: Dict[str, Any] = {}  # no launcher-tagged parts in an event file
        self.overflow_lines = 0
        self._deriver = Deriver(derived) if derived is not None and not derived.empty else None

    @property
    def main(self) -> "EventFileParser":
        return self

    @property
    def format(self) -> Optional[EventKind]:
        return EventKind(self.state.format) if self.state.format else None

    # -- feeding -----------------------------------------------------------------------------------------------
    def feed(self, payload: bytes, number: int, now: float) -> List[Item]:
        """The items one frame completes (`number`: the frame's number in its file, kept as the record's `line`)."""
        return self._derived(self._feed(payload, number))

    def _derived(self, items: List[Item]) -> List[Item]:
        return self._deriver.apply(items) if self._deriver is not None and items else items

    def _feed(self, payload: bytes, number: int) -> List[Item]:
        counts = self.state.counts
        counts["lines"] += 1
        try:
            event = self._decode(payload, self.state.format == MINDSPORE)
        except self._decode_error:
            counts["undecodable_frames"] += 1
            return []
        counts["dropped_values"] += event.bad_tags  # a tag that is not text: its value left out, the event's others kept
        out: List[Item] = []
        if event.version:
            self.state.format = MINDSPORE if event.version.startswith(MINDSPORE_VERSION) else (
                TENSORBOARD if event.version.startswith(TENSORBOARD_VERSION) else self.state.format)
            return out
        if self.state.format is None:
            self.state.format = TENSORBOARD  # a file read from its middle: TensorBoard's schema is the common one
        names = self._names
        for tag, value in event.values:
            if len(tag) > MAX_TAG_CHARS:
                counts["dropped_values"] += 1
                continue
            name = names.get(tag, "")
            if name == "":
                name = names[tag] = None if _TWIN.match(tag) else metric_name(tag)
                if len(names) > MAX_TAGS:
                    names.clear()  # a writer inventing tags: the cache stays bounded, names are computed again
            if name is None:  # a samples twin: its value is its plain tag's, its step the samples consumed
                self._add(SAMPLES, event.step, None, out)
            elif not name or (name not in self._metrics and len(self._metrics) >= MAX_METRICS):
                counts["dropped_values"] += 1
            else:
                self._metrics.add(name)
                self._add(name, value, (event.step, event.wall_time, number), out)
        return out

    def _add(self, key: str, value: Any, at: Optional[Tuple[int, float, int]], out: List[Item]) -> None:
        """One value: into the open record of its step, a new record (another step began), or an amend of the last
        record (its step's record went out already). `at` = (step, wall time, frame number); None for a value of
        whatever step is current (a samples twin)."""
        record = self._open
        if at is not None and (record is None or record["step"] != at[0]):
            if record is not None:
                self._emit(record, out)  # another step began: the open one is complete
            last = self.state.last
            if record is None and last is not None and last["step"] == at[0]:
                record = None  # its step's record went out at the end of a pass: this value amends it
            else:
                record = self._open = {"step": at[0], "time": at[1], "line": at[2]}
        target = record if record is not None else self.state.last
        if target is None:
            return  # a samples twin before any step: nothing to join
        if key in target:
            if at is not None:  # a second value of one tag for one step (twins all repeat the samples: not counted)
                self.state.counts["repeated_values"] += 1
            return
        if len(target) >= MAX_KEYS:
            self.state.counts["dropped_values"] += 1
            return
        target[key] = value
        if record is None:  # the last record, already out: the value goes after it as an amend
            self.state.counts["amends"] += 1
            out.append(Item("amend", {"step": target["step"], "segment": target["segment"], key: value}))

    def _emit(self, record: Record, out: List[Item]) -> None:
        self._open = None
        last = self.state.last
        if last is not None and record["step"] < last["step"]:
            self.state.segment += 1  # a relaunch writing from an earlier step: a new run segment, with its marker
            self.state.counts["events"] += 1
            out.append(Item("event", {"kind": "resume", "time": record["time"], "line": record["line"],
                                      "step": record["step"], "from_step": last["step"],
                                      "message": f"resumed at step {record['step']} (the step before was {last['step']})"}))
        record["segment"] = self.state.segment
        self.state.last = dict(record)
        self.state.counts["records"] += 1
        out.append(Item("record", record))

    def flush(self, now: float, force: bool = False) -> List[Item]:
        """The open step's record (the end of what is readable now): its later values will amend it."""
        out: List[Item] = []
        if self._open is not None:
            self._emit(self._open, out)
        return self._derived(out)

    # -- the InterleavedParser look-alike -----------------------------------------------------------------------
    @property
    def holding(self) -> bool:
        return self._open is not None

    @property
    def emitted(self) -> int:
        counts = self.state.counts
        return counts["records"] + counts["events"] + counts["amends"]

    @property
    def counts(self) -> Dict[str, int]:
        return self.state.counts

    @property
    def meta(self) -> Dict[str, Any]:
        return self.state.meta

    def snapshot(self) -> ParserState:
        """The state to resume from (taken after `flush`, when no record is open)."""
        return ParserState.from_json(self.state.to_json())

    def snapshot_json(self) -> str:
        """`snapshot().to_json()` as text (`ParserState.dumps`): what a checkpoint keeps, as a line parser's."""
        return self.state.dumps()

    def restore(self, state: ParserState) -> bool:
        """Continue from a `snapshot()`; False when it is a line parser's state (not an event file's kind)."""
        if state.format is not None and state.format not in KINDS:
            return False
        self.state = ParserState.from_json(state.to_json())
        self._open = None
        return True
