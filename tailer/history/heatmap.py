"""One metric of many sources as a rows x columns matrix: the page's step-time heatmap in one small answer
(`/api/heatmap`), instead of every source's series (1,024 ranks: 2.2 MB and 1.6 s of the event loop per zoom).

Columns: the distinct steps logged in the range (by any source), in order, cut into at most `columns` runs of
consecutive steps, so every column holds a step some source logged: no empty column at any logging stride or
number of points. A cell is the mean of a source's values in the column, divided by the median of the sources'
means in that column (stragglers are above 1). Rows: one per source in natural order (rank_2 before rank_10);
beyond `rows` sources, one per group of neighbouring sources, showing the group's highest ratio and which source
it is (a straggler among 1,024 ranks still makes its group's row hot).

The input is an `aggregate.Points` snapshot (copies of the store's arrays, taken on the event loop), so `heatmap`
may run in a worker thread.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from mstail.tailer.history.aggregate import Points, step_index

_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> List[Any]:
    """Sort key putting rank_2 before rank_10: runs of digits compared as numbers, the rest without case."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part.lower()) for part in _DIGITS.split(name) if part]


def heatmap(points: Points, start: Optional[int], end: Optional[int], columns: int, rows: int) -> Dict[str, Any]:
    """The matrix of `points` between steps `start` and `end` (inclusive; None = open), at most `columns` columns
    and `rows` rows.

    Returns `{"ids", "per", "columns", "ratio", "value", "source"}`: `ids`, the sources in natural order; `per`,
    how many neighbouring sources share a row (1: a row each); `columns`, the last step of each column; `ratio`
    and `value`, one list per row with a number per column (None where no source of the row logged a finite value
    there): the row's highest ratio to the column's median and the mean behind it; `source`, the index in `ids`
    of the source each cell shows."""
    import numpy as np

    finite = np.isfinite(points.values)
    if start is not None:
        finite &= points.steps >= start
    if end is not None:
        finite &= points.steps <= end
    steps, values, owner = points.steps[finite], points.values[finite], points.owner[finite]
    order = sorted(range(len(points.sources)), key=lambda i: natural_key(points.sources[i]))
    ids = [points.sources[i] for i in order]
    per = max(1, -(-len(ids) // max(1, rows)))
    out: Dict[str, Any] = {"ids": ids, "per": per, "columns": [], "ratio": [], "value": [], "source": []}
    if not len(steps):
        return out
    distinct, position = step_index(steps, np)
    cols = min(columns, len(distinct))
    column_of_step = np.arange(len(distinct)) * cols // len(distinct)
    col = column_of_step[position]
    out["columns"] = distinct[np.searchsorted(column_of_step, np.arange(cols), side="right") - 1].tolist()
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))  # a source's row position in natural order
    cell = rank[owner] * cols + col
    size = len(ids) * cols
    count = np.bincount(cell, minlength=size)
    with np.errstate(invalid="ignore", divide="ignore"):  # a source without a value in a column: NaN there
        mean = (np.bincount(cell, weights=values, minlength=size) / count).reshape(len(ids), cols)
        median = np.nanmedian(mean, axis=0)  # every column holds some source's finite value: never all NaN
        ratio = mean / median
    ratio[~np.isfinite(ratio)] = np.nan
    groups = -(-len(ids) // per)
    pad = groups * per - len(ids)
    shaped = np.concatenate([ratio, np.full((pad, cols), np.nan)]).reshape(groups, per, cols)
    ranked = np.where(np.isnan(shaped), -np.inf, shaped)
    pick = ranked.argmax(axis=1)  # per row and column: which of the row's sources is highest
    which = np.arange(groups)[:, None] * per + pick
    best = np.take_along_axis(shaped, pick[:, None, :], axis=1)[:, 0, :]
    padded_mean = np.concatenate([mean, np.full((pad, cols), np.nan)])
    shown = padded_mean[which, np.arange(cols)[None, :]]
    empty = np.isnan(best).tolist()

    def rows_of(matrix: Any) -> List[List[Any]]:
        return [[None if e else v for v, e in zip(row, gaps)] for row, gaps in zip(matrix.tolist(), empty)]

    out["ratio"], out["value"], out["source"] = rows_of(np.round(best, 3)), rows_of(np.round(shown, 3)), rows_of(which)
    return out
