"""Several chains at once: each parsed in its own forked worker process, written in the chains' order.

The formats (compiled regexes, closures) cannot be pickled, so workers inherit what they need through fork
from `_JOB`, set just before the pool starts and cleared after: the one module global, and the reason this
needs the `fork` start method (Linux; elsewhere `worker_count` keeps parsing in one process).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, TextIO

from mstail.parsers import Format
from mstail.parsers.derived import Derived

from .reading import Chain, ParseError, Summary, _Part, add_part, parse_group
from .output import copy_jsonl, progress_bar, write_csv

#: Below this many bytes in all, chains are parsed in this process: starting workers would cost more than it saves.
PARALLEL_MIN_BYTES = 4 << 20
_POLL_S = 0.2  # how often the parent updates the progress bar while workers parse


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))  # type: ignore[attr-defined]  # the CPUs this process may run on
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def worker_count(chains_: int, total_bytes: int, jobs: Optional[int]) -> int:
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
    derived: Optional[Derived]
    folder: str
    progress: "Sequence[int]"  # a shared array: bytes read so far, per chain


_JOB: Optional[_Job] = None


def _worker_init() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops the workers
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # what the parent's `terminate` means, whatever it set for itself


def _parse_in_worker(index: int) -> _Part:
    job = _JOB
    assert job is not None, "a parse worker started without its job"
    group, progress = job.groups[index], job.progress

    def advance(n_bytes: int) -> None:
        progress[index] += n_bytes

    rows: List[dict] = []
    if job.to == "jsonl":
        with open(os.path.join(job.folder, f"{index}.jsonl"), "w", encoding="utf-8", newline="") as handle:
            part = parse_group(group, job.formats, job.forced, job.to, handle.write, rows, job.with_events, advance,
                                   job.derived)
    else:
        part = parse_group(group, job.formats, job.forced, job.to, _no_write, rows, job.with_events, advance,
                           job.derived)
        part.rows = rows
    return part


def _no_write(text: str) -> None:  # pragma: no cover - CSV output is collected as rows
    raise AssertionError("CSV rows are not written line by line")


def run_parallel(
    groups: List[Chain], sizes: List[int], workers: int, formats: Sequence[Format], forced: Optional[Format], to: str,
    out: TextIO, with_events: bool, derived: Optional[Derived] = None,
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
        _JOB = _Job(groups, formats, forced, to, with_events, derived, folder, progress)
        pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_init)
        bar = None
        index = 0
        try:
            # The biggest chains first: the last worker to finish then has the least left.
            order = sorted(range(len(groups)), key=lambda i: -sizes[i])
            futures = {i: pool.submit(_parse_in_worker, i) for i in order}
            bar = progress_bar(sum(sizes))  # after the workers forked: tqdm may start a thread
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
                add_part(summary, group, part)
                if to == "jsonl":
                    copy_jsonl(os.path.join(folder, f"{index}.jsonl"), out)
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
        write_csv(rows, out)
    return summary


def _stop(pool) -> None:  # type: ignore[no-untyped-def]
    """Cancel what has not started and terminate the workers (ProcessPoolExecutor has no public way before 3.14)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join()
