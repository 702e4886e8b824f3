"""The text kinds: log lines (`text`: info.log, worker_N.log, stdout) and JSON lines (`jsonl`: mstail.callback's).

Both are lines read by a `FileFollower` (rotated backups first) and parsed by an `InterleavedParser`: one
`SourceParser` per launcher tag (`[rank3]:`), mostly just one. JSON lines are a text format like the others; which
format a source is read with (`--format`, JSONL's for `--jsonl`) is the caller's `InputSpec.forced`.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from mstail.parsers import SourceParser
from mstail.parsers.interleave import InterleavedParser
from mstail.tailer.inputs.lines import LineSplitter

if TYPE_CHECKING:
    from mstail.tailer.inputs.follower import FileFollower
    from mstail.tailer.inputs.kind import InputSpec


class TextLog:
    """A text kind (see the module docstring); `InputKind`."""

    bulk = True

    def __init__(self, name: str) -> None:
        self.name = name

    def follower(self, spec: InputSpec) -> FileFollower:
        from mstail.tailer.inputs.follower import FileFollower  # not for `mstail parse`, which reads files whole

        return FileFollower(spec.path, spec.max_line_bytes)

    def parser(self, spec: InputSpec) -> InterleavedParser:
        return InterleavedParser(partial(SourceParser, spec.formats, forced=spec.forced, grace_s=spec.grace_s,
                                         source=spec.source), spec.derived)

    def splitter(self, spec: InputSpec) -> LineSplitter:
        return LineSplitter(max_line_bytes=spec.max_line_bytes)


TEXT = TextLog("text")
JSONL = TextLog("jsonl")
