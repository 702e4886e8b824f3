"""Several chains at once, or one big file in pieces: each parsed in its own forked worker process, written in the
chains' order (a file's pieces joined at checked seams, `split`).

The formats (compiled regexes, closures) cannot be pickled, so workers inherit what they need through fork
from `_JOB`, set just before the pool starts and cleared after: the one module global, and the reason this
needs the `fork` start method (Linux; elsewhere `worker_count` keeps parsing in one process).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, List, MutableSequence, Optional, Sequence, TextIO, Tuple, Union

from mstail.parsers import Format
from mstail.parsers.derived import Derived

from mstail.tailer.offline import reading, split
from mstail.tailer.offline.reading import Chain, ParseError, Summary, _Part, add_part, parse_group
from mstail.tailer.offline.output import copy_jsonl, progress_bar, write_csv
from mstail.tailer.offline.split import Piece, PieceResult, copy_piece, joined_part, parse_piece, pieces, shift_rows, stitch

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

#: Below this many bytes in all, chains are parsed in this process: starting workers would cost more than it saves.
PARALLEL_MIN_BYTES = 4 << 20
_POLL_S = 0.2  # how often the parent updates the progress bar while workers parse
_PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the CPUs this process may run on
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


#: What one worker parses: the index of a chain, and one piece of it (None: all of it).
Unit = Tuple[int, Optional[Piece]]


def worker_count(chains_: int, total_bytes: int, jobs: Optional[int]) -> int:
    if chains_ < 2 or jobs == 1 or not _can_fork():
        return 1
    if jobs is None:
        if total_bytes < PARALLEL_MIN_BYTES:
            return 1
        jobs = _usable_cpus()
    return max(1, min(chains_, jobs))


def plan(groups: List[Chain], sizes: List[int], jobs: Optional[int]) -> Tuple[List[Unit], int]:
    """The units the chains are parsed in, and how many workers parse them (1: in this process). With fewer chains
    than workers could take, a one-file chain of at least SPLIT_MIN_BYTES is cut into pieces, at most one per worker
    (a piece waits for the next one's start, so all of a file's pieces must be able to run at once)."""
    cpus = jobs if jobs is not None else _usable_cpus()
    units: List[Unit] = []
    for index, (group, size) in enumerate(zip(groups, sizes)):
        if 1 < cpus and len(groups) < cpus and len(group.files) == 1 and size >= split.SPLIT_MIN_BYTES and _can_fork() \
                and group.events is None:  # an event file's frames have no seams to check: read whole
            units += [(index, piece) for piece in pieces(group, size, cpus)]
        else:
            units.append((index, None))
    return units, worker_count(len(units), sum(sizes), jobs)


def _can_fork() -> bool:
    # Workers inherit the formats (compiled regexes, closures: not picklable) by fork. multiprocessing offers "fork"
    # exactly where os.fork exists; asked of os, a parse that stays in one process does not import multiprocessing.
    return hasattr(os, "fork")


@dataclass
class _Job:
    """What every worker needs, inherited through fork (set before the workers start)."""

    groups: List[Chain]
    units: List[Unit]
    formats: Sequence[Format]
    forced: Optional[Format]
    to: str
    with_events: bool
    derived: Optional[Derived]
    folder: str
    progress: "MutableSequence[int]"  # a shared array: bytes read so far, per unit
    now: float  # the read time of lines without a timestamp: one for all, as in one process


_JOB: Optional[_Job] = None


def _worker_init(parent: int) -> None:
    """In each worker: signals as the parent wants them, and an end with the parent (`parent`: its pid)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops the workers
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # what the parent's `terminate` means, whatever it set for itself
    # A parent that dies without stopping its workers (kill -9, the OOM killer, a signal while a worker was being
    # forked) would leave them blocked on the pool's queues forever: Linux kills them with it (PR_SET_PDEATHSIG).
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the parent's own `_stop` is all there is
        pass
    if os.getppid() != parent:  # it died before the request took hold
        os._exit(1)


def _parse_in_worker(index: int) -> Union[_Part, PieceResult]:
    job = _JOB
    assert job is not None, "a parse worker started without its job"
    (group_index, piece), progress = job.units[index], job.progress
    group = job.groups[group_index]

    def advance(n_bytes: int) -> None:
        progress[index] += n_bytes

    def parse(write: Callable[[str], object]) -> Union[_Part, PieceResult]:
        if piece is None:
            return parse_group(group, job.formats, job.forced, job.to, write, rows, job.with_events, advance, job.now,
                               job.derived)
        return parse_piece(piece, job.formats, job.forced, job.to, write, rows, job.with_events, advance, job.now,
                           job.folder, job.derived)

    rows: List[dict] = []
    if job.to == "jsonl":
        with open(_output(job.folder, index), "w", encoding="utf-8", newline="") as handle:
            return parse(handle.write)
    result = parse(_no_write)
    (result if isinstance(result, _Part) else result.part).rows = rows
    return result


def _output(folder: str, index: int) -> str:
    return os.path.join(folder, f"{index}.jsonl")


def _no_write(text: str) -> None:  # pragma: no cover - CSV output is collected as rows
    raise AssertionError("CSV rows are not written line by line")


def run_parallel(
    groups: List[Chain], units: List[Unit], sizes: List[int], workers: int, formats: Sequence[Format],
    forced: Optional[Format], to: str, out: TextIO, with_events: bool, derived: Optional[Derived] = None,
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
        progress = context.Array("q", len(units), lock=False)
        _JOB = _Job(groups, units, formats, forced, to, with_events, derived, folder, progress, reading.time.time())
        pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_init, initargs=(os.getpid(),))
        bar = None
        index = 0
        try:
            # The biggest chains first: the last worker to finish then has the least left. A file's pieces go in
            # their order, one after the other (each waits for the next one's start).
            order = sorted(range(len(units)), key=lambda i: (-sizes[units[i][0]], units[i][0], i))
            futures = {i: pool.submit(_parse_in_worker, i) for i in order}
            bar = progress_bar(sum(sizes))  # after the workers forked: tqdm may start a thread
            for index, group in enumerate(groups):  # written in the chains' order, as each is ready
                mine = [i for i, (group_index, _) in enumerate(units) if group_index == index]
                results = []
                for unit in mine:
                    future = futures[unit]
                    while not future.done():
                        wait([future], timeout=_POLL_S if bar else None, return_when=FIRST_COMPLETED)
                        if bar:
                            bar.update(min(sum(progress), bar.total) - bar.n)
                    try:
                        results.append(future.result())
                    except (FileNotFoundError, BrokenProcessPool):
                        raise
                    except Exception as exc:  # noqa: BLE001 - one clear line, not the worker's traceback
                        raise ParseError(f"{group.source}: {type(exc).__name__}: {exc}") from None
                if len(results) == 1 and isinstance(results[0], _Part):
                    part = results[0]
                    if to == "jsonl":
                        copy_jsonl(_output(folder, mine[0]), out)
                    else:
                        rows += part.rows or []
                else:
                    part = _joined(group, mine, results, folder, formats, forced, to, out, rows, with_events, _JOB.now,  # type: ignore[arg-type]  # several: PieceResults
                                   derived)
                add_part(summary, group, part)
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
        write_csv(rows, out)
    return summary


def _joined(
    group: Chain, units: List[int], results: List[PieceResult], folder: str, formats: Sequence[Format],
    forced: Optional[Format], to: str, out: TextIO, rows: List[dict], with_events: bool, now: float,
    derived: Optional[Derived],
) -> _Part:
    """A file's pieces written as one process would have written the file; parsed again here, whole (with the
    `derived` series the pieces had), when a seam was not found."""
    joins = stitch(results)
    if joins is None:
        return parse_group(group, formats, forced, to, out.write, rows, with_events, None, now, derived)
    for unit, result, join in zip(units, results, joins):
        if to == "jsonl":
            copy_piece(_output(folder, unit), join["skip"], join["segment"], out)
        else:
            rows += shift_rows(result.part.rows or [], join["skip"], join["segment"])
    return joined_part(results)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Cancel what has not started and terminate the workers (ProcessPoolExecutor has no public way before 3.14)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join()
