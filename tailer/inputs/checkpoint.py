"""Where a followed source resumes after a restart: the shapes a pass commits beside its items, with their JSON.

A `SourceCheckpoint` is taken between passes, only while the source's parser holds nothing: the follower's
open files with the offset of the next unread line, the files it has seen whole, its counters, and the
parser's `ParserState` (as JSON text). `emitted_at` counts the items the parser had handed out when it was taken
and `emitted` those handed out by the commit: after a restart the parser reads the same lines again and the difference is
skipped, so nothing is stored twice (ARCHITECTURE.md, Checkpoints).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

from mstail.parsers.engine import ParserState, json_text

Signature = Tuple[int, str]  # (length of a file's head, its digest): compact enough to persist every pass


@dataclass(frozen=True)
class FilePosition:
    """One open file: its identity (device, inode), the signature of its head, the offset and number of its
    next complete line."""

    id: Tuple[int, int]
    head: Signature
    offset: int
    line: int


@dataclass
class FollowerCheckpoint:
    """A `FileFollower`'s position: open files oldest first, recently seen files as (device, inode, head
    length, head digest), and its counters."""

    files: List[FilePosition] = field(default_factory=list)
    seen: List[Tuple[int, int, int, str]] = field(default_factory=list)
    counters: Dict[str, int] = field(default_factory=dict)


@dataclass
class SourceCheckpoint:
    """What a source resumes from: follower position, parser state, and the items emitted when and since it was
    taken. The parser state is kept as its JSON text (`ParserState.dumps`, by `InterleavedParser.snapshot_json`):
    encoded once, from the live state, when the checkpoint is taken (for every file a pass read), it is the copy, is
    compared as a string and goes into the stored JSON as it is; it is decoded only to resume (`parser`)."""

    follower: FollowerCheckpoint
    parser_json: str
    emitted_at: int
    emitted: int = 0

    @property
    def parser(self) -> ParserState:
        """The parser state, decoded (a new copy on every call)."""
        return ParserState.from_json(json.loads(self.parser_json))

    def dumps(self) -> str:
        """The checkpoint's JSON text, as stored beside the items."""
        follower = json_text({
            "files": [{"id": list(f.id), "head": list(f.head), "offset": f.offset, "line": f.line}
                      for f in self.follower.files],
            "seen": [list(entry) for entry in self.follower.seen],
            "counters": self.follower.counters,
        })
        return (f'{{"follower":{follower},"parser":{self.parser_json},"emitted_at":{int(self.emitted_at)},'
                f'"emitted":{int(self.emitted)}}}')

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "SourceCheckpoint":
        """The checkpoint `json.loads(dumps())` gives back."""
        follower = data["follower"]
        return cls(
            follower=FollowerCheckpoint(
                files=[FilePosition(tuple(f["id"]), tuple(f["head"]), f["offset"], f["line"])
                       for f in follower.get("files", [])],
                seen=[tuple(entry) for entry in follower.get("seen", [])],
                counters=dict(follower.get("counters", {})),
            ),
            parser_json=json_text(data["parser"]),
            emitted_at=data["emitted_at"],
            emitted=data.get("emitted", 0),
        )
