"""Where `mstail parse` writes: UTF-8 JSONL or CSV on stdout or a file, and a progress bar on a terminal."""

from __future__ import annotations

import csv
import io
import sys
from typing import Dict, List, Optional, TextIO

from mstail.parsers.record import finite_or_name

from .reading import READ_CHUNK

PROGRESS_MIN_BYTES = 8 << 20  # smaller inputs parse too fast for a progress bar to help


def write_csv(rows: List[dict], out: TextIO) -> None:
    columns: Dict[str, None] = {}
    for row in rows:
        columns.update((key, None) for key in row)
    writer = csv.DictWriter(out, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({key: ("" if value is None else finite_or_name(value)) for key, value in row.items()})


def copy_jsonl(path: str, out: TextIO) -> None:
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


class _Output(io.TextIOWrapper):
    """The output of `mstail parse`: UTF-8, "\\n" written as it is (so a worker's bytes can be copied onto it)."""


def open_output(path: Optional[str]) -> TextIO:
    if path is None or path == "-":
        return _Output(sys.stdout.buffer, encoding="utf-8", newline="\n", write_through=False)
    return _Output(open(path, "wb"), encoding="utf-8", newline="")


def progress_bar(total: int):  # type: ignore[no-untyped-def]
    if total < PROGRESS_MIN_BYTES:
        return None
    isatty = getattr(sys.stderr, "isatty", None)
    if isatty is not None and not isatty():
        return None  # what tqdm's disable=None does, without importing tqdm (about 70 ms)
    from tqdm import tqdm

    # tqdm turns itself off when stderr is not a terminal (disable=None), so pipes and CI stay clean.
    return tqdm(total=total, unit="B", unit_scale=True, desc="parsing", file=sys.stderr, disable=None)
