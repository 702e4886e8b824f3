"""`mstail parse`: legacy logs -> records as JSONL or CSV, offline; `--explain`: how each line matched."""

from __future__ import annotations

import os
import time
from typing import List, Optional, Sequence, TextIO

from mstail.parsers import Format, SourceParser
from mstail.parsers.explain import Explainer
from mstail.parsers.interleave import InterleavedParser

from .reading import ParseError, Summary, add_part, chain_lines, chains, parse_group
from .output import progress_bar, write_csv
from .parallel import run_parallel, worker_count


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
    workers = worker_count(len(groups), sum(sizes), jobs)
    if workers > 1:
        return run_parallel(groups, sizes, workers, formats, forced, to, out, with_events)
    summary = Summary(files=sum(len(g.files) for g in groups))
    bar = progress_bar(sum(sizes))
    rows: List[dict] = []
    try:
        for group in groups:
            try:
                part = parse_group(group, formats, forced, to, out.write, rows, with_events, bar.update if bar else None)
            except FileNotFoundError:
                raise
            except OSError as exc:  # a log that cannot be read (EIO, EACCES ...): one clear line, as from a worker
                raise ParseError(f"{group.source}: {type(exc).__name__}: {exc}") from None
            add_part(summary, group, part)
    finally:
        if bar:
            bar.close()
    if to == "csv":
        write_csv(rows, out)
    return summary


