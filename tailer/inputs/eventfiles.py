"""The event-file kind (`events`): TensorBoard's and MindSpore's summary files, read frame by frame.

A folder of event files named as such is one source (`EventFilesFollower` reads them oldest first, as one chain);
a file known by its content alone is a source of its own. `InputSpec.variant` is the kind the names say
(`tensorboard`, `mindspore-summary`), or "" for a file known by its content (its version event decides).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mstail.parsers.eventfile import EventFileParser
from mstail.tailer.inputs.frames import FrameSplitter

if TYPE_CHECKING:
    from mstail.tailer.inputs.eventfollow import EventFilesFollower
    from mstail.tailer.inputs.kind import InputSpec


class EventFiles:
    """The event-file kind (see the module docstring); `InputKind`."""

    name = "events"
    bulk = False  # frames, not lines: no catch-up child

    def follower(self, spec: InputSpec) -> EventFilesFollower:
        from mstail.tailer.inputs.eventfollow import EventFilesFollower  # not for `mstail parse`

        return EventFilesFollower(spec.path, spec.max_line_bytes, folder=bool(spec.variant))

    def parser(self, spec: InputSpec) -> EventFileParser:
        return EventFileParser(spec.variant or None, spec.derived)

    def splitter(self, spec: InputSpec) -> FrameSplitter:
        return FrameSplitter(max_line_bytes=spec.max_line_bytes)


EVENTS = EventFiles()
