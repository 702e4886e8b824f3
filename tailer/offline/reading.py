"""Which files make one source, and the lines and items of such a chain, read as the sidecar reads them.

A rotated chain (`info.log.5` ... `info.log.1`, `info.log`) is read oldest first as one source, whether the
backups were named on the command line or not. Its pieces are split and parsed by its input kind's own halves
(`mstail.tailer.inputs.kind`: the splitter its follower uses, the same parser, `items_of`), so a finished log
parses to the records a live run showed.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from mstail.parsers import Format, Item
from mstail.parsers.amends import Settler
from mstail.parsers.derived import Derived
from mstail.parsers.engine import without_read_time
from mstail.parsers.record import ESTIMATED, PART_KEY, dumps_owned, ordered

from mstail.tailer.inputs.discovery import ROTATED, SourceNamer, expand, has_glob, rotated_backups, within
from mstail.tailer.inputs.frames import event_files_in, event_source
from mstail.tailer.inputs.kind import KINDS, InputSpec, Parser, Piece, items_of
from mstail.tailer.inputs.runs import NOTHING_YET, RunFinder

READ_CHUNK = 1 << 20
#: JSONL rows joined into one write: a write per row cost about 0.5 us of a row's 4 (a text stream's call and encoding).
WRITE_ROWS = 256


@dataclass
class Chain:
    """One source: its files oldest first."""

    source: str
    files: List[Path]
    #: a text log (`--format` applies to it); False for a JSONL or event file found below a folder, read as its kind
    text: bool = True
    #: event files (`frames.is_event_file`), read frame by frame: the kind their names say ("": by content)
    events: Optional[str] = None

    @property
    def kind(self) -> str:
        """Its input kind's name (`KINDS`)."""
        return "events" if self.events is not None else "text" if self.text else "jsonl"


class InputError(Exception):
    """A named input that exists but is no log file (a FIFO, a device, a folder): one line for the user."""


_NOT_FILES = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
              (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _log_files(pattern: str) -> List[Path]:
    """The regular files `pattern` names now. A glob keeps only regular files; a plain path that exists but is
    no regular file raises InputError, found by stat alone: opening a FIFO would wait for a writer forever."""
    found = expand(pattern)
    if has_glob(os.path.expanduser(pattern)):
        return found  # `expand` kept regular files only
    path = found[0]
    try:
        mode = path.stat().st_mode  # through symlinks, as `open` would go
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    if stat.S_ISREG(mode):
        return [path]
    kind = next((name for test, name in _NOT_FILES if test(mode)), "a special file")
    raise InputError(f"{path} is {kind}, not a log file: mstail parse reads regular files and folders of runs only")


def chains(inputs: Sequence[str], formats: Sequence[Format] = (), forced: Optional[Format] = None,
           follow_symlinks: bool = False) -> List[Chain]:
    """Group the given paths/globs into rotated chains, and the run files below given folders (`runs`; text logs
    named by no convention when `formats` recognise them, links out of a folder with `follow_symlinks`) into chains
    named by run and rank; missing inputs raise FileNotFoundError, a path that is neither a regular file nor a
    folder (FIFO, device) InputError, a folder with no run file in it InputError."""
    paths: List[Path] = []
    folders: List[str] = []
    for pattern in inputs:
        if not has_glob(os.path.expanduser(pattern)) and os.path.isdir(os.path.expanduser(pattern)):
            folders.append(pattern)
            continue
        found = _log_files(pattern)
        if not found:
            raise FileNotFoundError(pattern)
        paths += found
    given = {p.absolute() for p in paths}
    namer = SourceNamer()
    out: List[Chain] = []
    seen: set = set()
    for path in paths:
        stands_for, kind = event_source(path)
        if kind is not None:  # a folder's event files are one source, read oldest first, as when following
            if stands_for.absolute() not in seen:
                seen.add(stands_for.absolute())
                files = event_files_in(stands_for) if kind else [path]
                out.append(Chain(source=namer.name(stands_for, paths), files=files, events=kind))
            continue
        rotated = ROTATED.match(path.name)
        if rotated and (path.parent / rotated.group("base")).absolute() in given:
            continue  # a backup of a live file that was given too: read as part of that chain
        key = path.absolute()
        if key in seen:
            continue
        seen.add(key)
        files = rotated_backups(path) + [path] if not rotated else [path]
        out.append(Chain(source=namer.name(path, paths), files=files))
    for folder in folders:
        finder = RunFinder([folder], formats, forced, follow_symlinks)
        found_below = [f for f in finder.find() if f.path.absolute() not in seen]
        if not found_below:
            raise InputError(f"no run files below {folder} (looked for {NOTHING_YET})")
        for run_file in found_below:
            seen.add(run_file.path.absolute())
            name = namer.claim(run_file.path, run_file.names)
            if run_file.kind == "events":  # the folder's event files, oldest first, as when following
                stands_for, kind = event_source(run_file.path)
                files = event_files_in(stands_for) if kind else [run_file.path]
                out.append(Chain(source=name, files=files, text=False, events=kind))
                continue
            backups = [backup for backup in rotated_backups(run_file.path)  # (none linked out of the folder)
                       if run_file.confine is None or within(os.path.realpath(backup), run_file.confine)]
            out.append(Chain(source=name, files=backups + [run_file.path], text=run_file.kind == "text"))
    return out


def chain_lines(
    chain: Chain, progress: Optional[Callable[[int], object]] = None, blocks: bool = False
) -> Iterator[Tuple[Path, Piece]]:
    """The pieces (lines, frames) of one chain in order, split exactly as when following; `progress(n_bytes)` as bytes
    are read. With `blocks` (default False), runs of whole lines come as `Block`s (`LineSplitter.feed`)."""
    kind = KINDS[chain.kind]
    for path in chain.files:
        splitter = kind.splitter(InputSpec(path))
        with open(path, "rb") as handle:
            while True:
                data = handle.read(READ_CHUNK)
                if not data:
                    break
                if progress is not None:
                    progress(len(data))
                for line in splitter.feed(data, blocks):
                    yield path, line
            if splitter.pending_bytes and chain.events is None:  # a finished log may end without a newline
                for line in splitter.feed(b"\n"):
                    yield path, line


def parse_chain(
    chain: Chain, parser: Parser, progress: Optional[Callable[[int], object]] = None, now: Optional[float] = None
) -> Iterator[Item]:
    """Records and events of one chain in order: its pieces fed to `parser` (`items_of`: blocks of lines through the
    fast path, as the sidecar's catch-up feeds them), then everything still held (a finished log has no later line to wait for);
    each amend joined to its record (a `Settler`), as the sidecar's history ends up. `now`: the read time lines
    without a timestamp get (default: the time now)."""
    now = time.time() if now is None else now
    settler = Settler()
    for _path, piece in chain_lines(chain, progress, blocks=True):
        yield from settler.push(items_of(parser, piece, now))
    yield from settler.push(parser.flush(now, force=True))
    yield from settler.finish()


@dataclass
class Summary:
    files: int = 0
    records: int = 0
    events: int = 0
    unmatched: int = 0
    formats: Dict[str, str] = field(default_factory=dict)  # source -> detected format
    #: text logs with lines but no record, event or format recognised: source -> (its newest file, its unmatched
    #: metric-looking lines)
    unrecognised: Dict[str, Tuple[Path, int]] = field(default_factory=dict)


class ParseError(Exception):
    """A chain could not be parsed (an unreadable file, a worker that died): one line for the user."""


@dataclass
class _Part:
    """What parsing one chain counted (its output went to a writer, or to `rows` for CSV)."""

    records: int = 0
    events: int = 0
    unmatched: int = 0
    format: str = "none"
    rows: Optional[List[dict]] = None
    written: int = 0  # rows written (JSONL lines) or appended (CSV)


def add_part(summary: Summary, group: Chain, part: _Part) -> None:
    summary.records += part.records
    summary.events += part.events
    summary.unmatched += part.unmatched
    summary.formats[group.source] = part.format
    # A log whose format's events were seen (MindFormers' start, before the first step) is one with no records yet.
    recognised = part.format != "none" or part.records or part.events
    if not recognised and group.events is None and any(os.path.getsize(f) for f in group.files):
        summary.unrecognised[group.source] = (group.files[-1], part.unmatched)


def new_parser(chain: Chain, formats: Sequence[Format], forced: Optional[Format], derived: Optional[Derived] = None,
               ) -> Parser:
    """A parser for `chain`, by its input kind (`forced`, `--format`, applies to text logs only)."""
    spec = InputSpec(chain.files[-1], formats=formats, forced=forced if chain.text else None, derived=derived,
                     variant=chain.events or "")
    return KINDS[chain.kind].parser(spec)


def parse_group(
    group: Chain, formats: Sequence[Format], forced: Optional[Format], to: str, write: Callable[[str], object],
    rows: List[dict], with_events: bool, progress: Optional[Callable[[int], object]], now: Optional[float] = None,
    derived: Optional[Derived] = None,
) -> _Part:
    """Parse one chain: JSONL lines go to `write`, CSV rows are appended to `rows`; `derived` series are added to
    the records (default none)."""
    parser = new_parser(group, formats, forced, derived)
    part = _Part()
    write_items(parse_chain(group, parser, progress=progress, now=now), group.source, part, to, write, rows, with_events)
    part.format = parser.format.name if parser.format else "none"
    part.unmatched = parser.counts["unmatched_metric_lines"]
    return part


def write_items(
    items: Iterable[Item], source: str, part: _Part, to: str, write: Callable[[str], object], rows: List[dict],
    with_events: bool,
) -> None:
    """Items of a chain as rows of its source: JSONL lines to `write`, CSV rows appended to `rows`; counted in `part`
    (`written`: rows written or appended)."""
    jsonl = to == "jsonl"
    lines: List[str] = []  # JSONL lines not written yet: one `write` per WRITE_ROWS rows, not one per row
    for kind, data in items:
        name = source
        if PART_KEY in data:  # a launcher-tagged rank's line (torchrun `[rank3]: `): a source of its own
            name += "/" + data.pop(PART_KEY)
        if kind == "event":
            part.events += 1
            if not with_events:
                continue
        else:
            part.records += 1
        if ESTIMATED in data:
            without_read_time(data)  # no time where the log has none
        row = ordered(data, name)
        part.written += 1
        if jsonl:
            lines.append(dumps_owned(row))  # the row is not used after: written in place
            if len(lines) == WRITE_ROWS:
                _write_lines(lines, write)
        else:
            rows.append(row)
    if lines:
        _write_lines(lines, write)


def _write_lines(lines: List[str], write: Callable[[str], object]) -> None:
    """`lines` as JSONL in one `write`; emptied."""
    lines.append("")  # the last line's end
    write("\n".join(lines))
    lines.clear()
