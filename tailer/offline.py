"""`mstail parse`: legacy logs -> records as JSONL or CSV, offline.

A rotated chain (`info.log.5` ... `info.log.1`, `info.log`) is read oldest first as one source, whether the
backups were named on the command line or not. Lines are split exactly as when following (bounded length,
invalid UTF-8 replaced), so a finished log parses to the same records a live run showed.
"""

from __future__ import annotations

import csv
import io
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, TextIO, Tuple, Union

from parsers import Format, Item, SourceParser
from parsers.explain import Explainer
from parsers.interleave import PART_KEY, InterleavedParser

from .discovery import SourceNamer, expand, rotated_backups
from .encoding import dumps_owned, finite_or_name, ordered
from .lines import Line, LineSplitter

_ROTATED = re.compile(r"^(?P<base>.+)\.(?P<n>\d+)$")
READ_CHUNK = 1 << 20
AnyParser = Union[SourceParser, InterleavedParser]
PROGRESS_MIN_BYTES = 8 << 20  # smaller inputs parse too fast for a progress bar to help


@dataclass
class Chain:
    """One source: its files oldest first."""

    source: str
    files: List[Path]


@dataclass
class Summary:
    files: int = 0
    records: int = 0
    events: int = 0
    unmatched: int = 0
    formats: Dict[str, str] = field(default_factory=dict)  # source -> detected format


def chains(inputs: Sequence[str]) -> List[Chain]:
    """Group the given paths/globs into rotated chains; missing inputs raise FileNotFoundError."""
    paths: List[Path] = []
    for pattern in inputs:
        found = expand(pattern)
        found = [p for p in found if p.is_file()] if found else []
        if not found:
            raise FileNotFoundError(pattern)
        paths += found
    given = {p.absolute() for p in paths}
    namer = SourceNamer()
    out: List[Chain] = []
    seen: set = set()
    for path in paths:
        rotated = _ROTATED.match(path.name)
        if rotated and (path.parent / rotated.group("base")).absolute() in given:
            continue  # a backup of a live file that was given too: read as part of that chain
        key = path.absolute()
        if key in seen:
            continue
        seen.add(key)
        files = rotated_backups(path) + [path] if not rotated else [path]
        out.append(Chain(source=namer.name(path), files=files))
    return out


def chain_lines(chain: Chain, progress=None) -> Iterator[Tuple[Path, Line]]:  # type: ignore[no-untyped-def]
    """The lines of one chain in order, split exactly as when following; `progress(n_bytes)` as bytes are read."""
    for path in chain.files:
        splitter = LineSplitter()
        with open(path, "rb") as handle:
            while True:
                data = handle.read(READ_CHUNK)
                if not data:
                    break
                if progress is not None:
                    progress(len(data))
                for line in splitter.feed(data):
                    yield path, line
            if splitter.pending_bytes:  # a finished log may end without a newline
                for line in splitter.feed(b"\n"):
                    yield path, line


def parse_chain(chain: Chain, parser: AnyParser, progress=None) -> Iterator[Item]:  # type: ignore[no-untyped-def]
    """Items of one chain in order: the items `chain_lines` fed one by one would give."""
    now = time.time()
    for path in chain.files:
        yield from _file_items(path, parser, now, progress)
    yield from parser.flush(now, force=True)


def _file_items(path: Path, parser: AnyParser, now: float, progress=None) -> Iterator[Item]:  # type: ignore[no-untyped-def]
    """One file's items. Blocks of whole lines go to `SourceParser.feed_block`, decoded by the line reader; what
    the reader must split itself (NUL bytes, a line that may reach its length limit, the unfinished last line)
    goes through a `LineSplitter` and `feed`."""
    reader = LineSplitter()
    window = reader.max_line_bytes // 2  # when every window this long holds a newline, no line reaches the limit
    long_line: Optional[LineSplitter] = None  # the reader, while inside a line that may be over-long
    number, carry, end = 1, b"", 0  # carry: the unfinished line after the last block; end: bytes read
    with open(path, "rb") as handle:
        for data in iter(lambda: handle.read(READ_CHUNK), b""):
            end += len(data)
            if progress is not None:
                progress(len(data))
            cut = data.rfind(b"\n") + 1
            if long_line is not None:
                yield from _fed(parser, long_line.feed(data[:cut] if cut else data), now)
                if cut:
                    number, long_line, carry = long_line.next_number, None, data[cut:]
                continue
            if not cut:
                carry += data
                if len(carry) >= window:
                    long_line = LineSplitter(end - len(carry), reader.max_line_bytes, number)
                    long_line.feed(carry)  # no newline yet: no line
                    carry = b""
                continue
            block, carry = carry + data[:cut], data[cut:]
            base = end - len(carry) - len(block)  # the block's file offset
            if _plain(block, window):
                before = parser.counts["lines"]
                yield from parser.feed_block(block, number, now, reader.decode, base)
                number += parser.counts["lines"] - before  # feed_block counts every line of the block
            else:
                lines = LineSplitter(base, reader.max_line_bytes, number).feed(block)
                yield from _fed(parser, lines, now)
                number += len(lines)
    if long_line is None and carry:
        long_line = LineSplitter(end - len(carry), reader.max_line_bytes, number)
        long_line.feed(carry)
    if long_line is not None and long_line.pending_bytes:  # a finished log may end without a newline
        yield from _fed(parser, long_line.feed(b"\n"), now)


def _fed(parser: AnyParser, lines: List[Line], now: float) -> Iterator[Item]:
    for line in lines:
        yield from parser.feed(line.text, line.number, now)


def _plain(block: bytes, window: int) -> bool:
    """Whether the reader would split `block` at its newlines and nothing else: no NUL byte, no long line."""
    if b"\x00" in block:
        return False
    return all(block.find(b"\n", at, at + window) >= 0 for at in range(0, len(block), window))


def run_explain(inputs: Sequence[str], formats: Sequence[Format], forced: Optional[Format], out: TextIO) -> None:
    """`--explain`: how every line matched, per chain, then a count per rule."""
    now = time.time()
    for group in chains(inputs):
        explainer = Explainer(InterleavedParser(lambda: SourceParser(formats, forced=forced)))
        for path, line in chain_lines(group):
            shown = explainer.explain(path.name, line.number, line.text, now)
            if shown is not None:
                out.write(shown + "\n")
        detected = explainer.parser.format.name if explainer.parser.format else "none"
        out.write(f"\n{group.source}: format {detected}\n{explainer.summary()}\n\n")


def run_parse(
    inputs: Sequence[str],
    formats: Sequence[Format],
    forced: Optional[Format],
    to: str,
    out: TextIO,
    with_events: bool = False,
    jobs: Optional[int] = None,
) -> Summary:
    """Parse every chain and write records (and events, if asked) to `out` as `to` ("jsonl" or "csv").

    Chains are independent: with more than one, they are parsed in worker processes (at most `jobs`, default
    one per usable CPU; inputs under PARALLEL_MIN_BYTES stay in this process unless `jobs` is given) and written
    in their order, exactly as one process would. `jobs=1` parses here. A worker's failure raises ParseError
    (a missing file still raises FileNotFoundError)."""
    groups = chains(inputs)
    sizes = [sum(os.path.getsize(f) for f in g.files) for g in groups]
    workers = _worker_count(len(groups), sum(sizes), jobs)
    if workers > 1:
        return _run_parallel(groups, sizes, workers, formats, forced, to, out, with_events)
    summary = Summary(files=sum(len(g.files) for g in groups))
    bar = _progress_bar(sum(sizes))
    rows: List[dict] = []
    try:
        for group in groups:
            try:
                part = _parse_group(group, formats, forced, to, out.write, rows, with_events, bar.update if bar else None)
            except FileNotFoundError:
                raise
            except OSError as exc:  # a log that cannot be read (EIO, EACCES ...): one clear line, as from a worker
                raise ParseError(f"{group.source}: {type(exc).__name__}: {exc}") from None
            _add(summary, group, part)
    finally:
        if bar:
            bar.close()
    if to == "csv":
        _write_csv(rows, out)
    return summary


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


def _add(summary: Summary, group: Chain, part: _Part) -> None:
    summary.records += part.records
    summary.events += part.events
    summary.unmatched += part.unmatched
    summary.formats[group.source] = part.format


def _parse_group(
    group: Chain, formats: Sequence[Format], forced: Optional[Format], to: str, write: Callable[[str], object],
    rows: List[dict], with_events: bool, progress: Optional[Callable[[int], object]],
) -> _Part:
    """Parse one chain: JSONL lines go to `write`, CSV rows are appended to `rows`."""
    parser = InterleavedParser(lambda: SourceParser(formats, forced=forced))
    part = _Part()
    jsonl = to == "jsonl"
    for kind, data in parse_chain(group, parser, progress=progress):
        source = group.source
        if PART_KEY in data:  # a launcher-tagged rank's line (torchrun `[rank3]: `): a source of its own
            source += "/" + data.pop(PART_KEY)
        if kind == "event":
            part.events += 1
            if not with_events:
                continue
        else:
            part.records += 1
        row = ordered({"source": source, **data})
        if jsonl:
            write(dumps_owned(row) + "\n")  # the row is not used after: written in place
        else:
            rows.append(row)
    part.format = parser.format.name if parser.format else "none"
    part.unmatched = parser.counts["unmatched_metric_lines"]
    return part


# -- parallel: one chain per worker process ----------------------------------------------------------------------------
#: Below this many bytes in all, chains are parsed in this process: starting workers would cost more than it saves.
PARALLEL_MIN_BYTES = 4 << 20
_POLL_S = 0.2  # how often the parent updates the progress bar while workers parse


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))  # type: ignore[attr-defined]  # the CPUs this process may run on
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _worker_count(chains_: int, total_bytes: int, jobs: Optional[int]) -> int:
    if chains_ < 2 or jobs == 1 or not _can_fork():
        return 1
    if jobs is None:
        if total_bytes < PARALLEL_MIN_BYTES:
            return 1
        jobs = _usable_cpus()
    return max(1, min(chains_, jobs))


def _can_fork() -> bool:
    # Workers inherit the formats (compiled regexes, closures: not picklable) by fork.
    import multiprocessing

    return "fork" in multiprocessing.get_all_start_methods()


@dataclass
class _Job:
    """What every worker needs, inherited through fork (set before the workers start)."""

    groups: List[Chain]
    formats: Sequence[Format]
    forced: Optional[Format]
    to: str
    with_events: bool
    folder: str
    progress: "Sequence[int]"  # a shared array: bytes read so far, per chain


_JOB: Optional[_Job] = None


def _worker_init() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops the workers


def _parse_in_worker(index: int) -> _Part:
    job = _JOB
    assert job is not None, "a parse worker started without its job"
    group, progress = job.groups[index], job.progress

    def advance(n_bytes: int) -> None:
        progress[index] += n_bytes

    rows: List[dict] = []
    if job.to == "jsonl":
        with open(os.path.join(job.folder, f"{index}.jsonl"), "w", encoding="utf-8", newline="") as handle:
            part = _parse_group(group, job.formats, job.forced, job.to, handle.write, rows, job.with_events, advance)
    else:
        part = _parse_group(group, job.formats, job.forced, job.to, _no_write, rows, job.with_events, advance)
        part.rows = rows
    return part


def _no_write(text: str) -> None:  # pragma: no cover - CSV output is collected as rows
    raise AssertionError("CSV rows are not written line by line")


def _run_parallel(
    groups: List[Chain], sizes: List[int], workers: int, formats: Sequence[Format], forced: Optional[Format], to: str,
    out: TextIO, with_events: bool,
) -> Summary:
    import multiprocessing
    import tempfile
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    global _JOB
    context = multiprocessing.get_context("fork")
    summary = Summary(files=sum(len(g.files) for g in groups))
    rows: List[dict] = []
    with tempfile.TemporaryDirectory(prefix="mstail-parse-") as folder:
        progress = context.Array("q", len(groups), lock=False)
        _JOB = _Job(groups, formats, forced, to, with_events, folder, progress)
        pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_init)
        bar = None
        index = 0
        try:
            # The biggest chains first: the last worker to finish then has the least left.
            order = sorted(range(len(groups)), key=lambda i: -sizes[i])
            futures = {i: pool.submit(_parse_in_worker, i) for i in order}
            bar = _progress_bar(sum(sizes))  # after the workers forked: tqdm may start a thread
            for index, group in enumerate(groups):  # written in the chains' order, as each is ready
                future = futures[index]
                while not future.done():
                    wait([future], timeout=_POLL_S if bar else None, return_when=FIRST_COMPLETED)
                    if bar:
                        bar.update(sum(progress) - bar.n)
                try:
                    part = future.result()
                except (FileNotFoundError, BrokenProcessPool):
                    raise
                except Exception as exc:  # noqa: BLE001 - one clear line, not the worker's traceback
                    raise ParseError(f"{group.source}: {type(exc).__name__}: {exc}") from None
                _add(summary, group, part)
                if to == "jsonl":
                    _copy(os.path.join(folder, f"{index}.jsonl"), out)
                else:
                    rows += part.rows or []
            if bar:
                bar.update(sum(sizes) - bar.n)
        except BrokenProcessPool as exc:  # killed (the OOM killer, a signal): which chain it held is not known
            unfinished = ", ".join(group.source for group in groups[index:])
            raise ParseError(f"a parse worker process died ({exc}); not parsed: {unfinished}") from None
        except BaseException:  # an error, Ctrl-C: workers still parsing are stopped, not waited for
            _stop(pool)
            raise
        finally:
            _JOB = None
            if bar:
                bar.close()
            pool.shutdown(wait=True)
    if to == "csv":
        _write_csv(rows, out)
    return summary


def _copy(path: str, out: TextIO) -> None:
    """A worker's JSONL (UTF-8, "\\n" line ends) onto `out`, as the serial run would have written it: bytes as they
    are onto an `open_output` stream (UTF-8, no newline translation), else as text."""
    if isinstance(out, _Output):
        import shutil

        out.flush()
        with open(path, "rb") as handle:
            shutil.copyfileobj(handle, out.buffer, READ_CHUNK)
        return
    with open(path, encoding="utf-8", newline="") as handle:
        for chunk in iter(lambda: handle.read(READ_CHUNK), ""):
            out.write(chunk)


def _stop(pool) -> None:  # type: ignore[no-untyped-def]
    """Cancel what has not started and terminate the workers (ProcessPoolExecutor has no public way before 3.14)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join()


def _write_csv(rows: List[dict], out: TextIO) -> None:
    columns: Dict[str, None] = {}
    for row in rows:
        columns.update((key, None) for key in row)
    writer = csv.DictWriter(out, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({key: ("" if value is None else finite_or_name(value)) for key, value in row.items()})


def _progress_bar(total: int):  # type: ignore[no-untyped-def]
    if total < PROGRESS_MIN_BYTES:
        return None
    isatty = getattr(sys.stderr, "isatty", None)
    if isatty is not None and not isatty():
        return None  # what tqdm's disable=None does, without importing tqdm (about 70 ms)
    from tqdm import tqdm

    # tqdm turns itself off when stderr is not a terminal (disable=None), so pipes and CI stay clean.
    return tqdm(total=total, unit="B", unit_scale=True, desc="parsing", file=sys.stderr, disable=None)


class _Output(io.TextIOWrapper):
    """The output of `mstail parse`: UTF-8, "\\n" written as it is (so a worker's bytes can be copied onto it)."""


def open_output(path: Optional[str]) -> TextIO:
    if path is None or path == "-":
        return _Output(sys.stdout.buffer, encoding="utf-8", newline="\n", write_through=False)
    return _Output(open(path, "wb"), encoding="utf-8", newline="")
