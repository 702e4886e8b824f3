"""Every test here trains with real MindSpore (`mindspore`, hence `slow`); most modules import it at their top."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pytest
from _pytest.mark.expression import Expression

#: The markers every test of this folder carries (tests/conftest.py adds `slow` to `mindspore` tests).
_MARKERS = {"mindspore", "slow"}


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> Optional[bool]:
    """When `-m` deselects these tests anyway (the fast tier, `-m "not slow"`), their modules are not imported: the
    fast tier starts without MindSpore installed, and without paying for its import. Otherwise they are collected
    as usual, and a missing MindSpore is a collection error."""
    if collection_path.name.startswith("test_") and not selected_by_markers(config.getoption("markexpr")):
        return True
    return None


def selected_by_markers(markexpr: str) -> bool:
    """Whether `-m markexpr` keeps a test carrying exactly `_MARKERS`."""
    if not markexpr:
        return True
    return Expression.compile(markexpr).evaluate(lambda name, **kwargs: name in _MARKERS)
