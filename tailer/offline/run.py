"""`mstail parse`: legacy logs -> records as JSONL or CSV, offline; `--explain`: how each line matched."""

from __future__ import annotations

import os
import time
from typing import List, Optional, Sequence, TextIO, Union

from mstail.parsers import Format, SourceParser
from mstail.parsers.derived import Derived
from mstail.parsers.explain import Explainer, printable
from mstail.parsers.interleave import InterleavedParser

from mstail.tailer.offline.reading import Chain, ParseError, Summary, add_part, chain_lines, chains, parse_group
from mstail.tailer.offline.output import progress_bar, write_csv
from mstail.tailer.offline.parallel import plan, run_parallel


Inputs = Union[Sequence[str], Sequence[Chain]]


def _chains(inputs: Inputs) -> List[Chain]:
    """Paths and globs grouped into chains, or the chains `chains` made of them already."""
    if all(isinstance(given, Chain) for given in inputs):
        return list(inputs)  # type: ignore[arg-type]  # all Chains: checked just above
    return chains(inputs)  # type: ignore[arg-type]  # paths and globs then


def run_explain(inputs: Inputs, formats: Sequence[Format], forced: Optional[Format], out: TextIO) -> None:
    """`--explain`: how every line matched, per chain, then a count per rule."""
    now = time.time()
    for group in _chains(inputs):
        if group.events is not None:  # frames, not lines: nothing matched a rule
            out.write(f"{printable(group.source)}: event files ({len(group.files)}), read frame by frame, not by "
                      "format rules; `mstail parse` without --explain shows their records\n\n")
            continue
        explainer = Explainer(InterleavedParser(lambda: SourceParser(formats, forced=forced)))
        for path, line in chain_lines(group):
            shown = explainer.explain(path.name, line.number, line.text, now)  # type: ignore[arg-type,union-attr]  # a text log: Lines
            if shown is not None:
                out.write(shown + "\n")
        detected = explainer.parser.format.name if explainer.parser.format else "none"
        out.write(f"\n{printable(group.source)}: format {detected}\n{explainer.summary()}\n\n")


def run_parse(
    inputs: Inputs,
    formats: Sequence[Format],
    forced: Optional[Format],
    to: str,
    out: TextIO,
    with_events: bool = False,
    jobs: Optional[int] = None,
    derived: Optional[Derived] = None,
) -> Summary:
    """Parse every chain (of paths/globs, or as `chains` grouped them) and write records (and events, if asked)
    to `out` as `to` ("jsonl" or "csv").

    Chains are independent: with more than one, they are parsed in worker processes (at most `jobs`, default
    one per usable CPU; inputs under PARALLEL_MIN_BYTES stay in this process unless `jobs` is given) and written
    in their order, exactly as one process would. With fewer chains than workers, a big file is parsed in pieces,
    joined at checked seams (`split`), again exactly as one process would. `jobs=1` parses here. A worker's failure raises ParseError
    (a missing file still raises FileNotFoundError). `derived`: series added to the records (default none)."""
    groups = _chains(inputs)
    sizes = [sum(os.path.getsize(f) for f in g.files) for g in groups]
    units, workers = plan(groups, sizes, jobs)
    if workers > 1:
        return run_parallel(groups, units, sizes, workers, formats, forced, to, out, with_events, derived)
    summary = Summary(files=sum(len(g.files) for g in groups))
    bar = progress_bar(sum(sizes))
    rows: List[dict] = []
    try:
        for group in groups:
            try:
                part = parse_group(group, formats, forced, to, out.write, rows, with_events, bar.update if bar else None,
                                   derived=derived)
            except (FileNotFoundError, BrokenPipeError):  # a log gone; the reader of stdout gone (`| head`)
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


