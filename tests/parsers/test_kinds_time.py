"""Timestamps: logging's clock read without strptime gives what strptime gives, for every text."""

from __future__ import annotations

import datetime
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from mstail.parsers.kinds import parse_local_time


def by_strptime(text: str) -> float:
    parsed = datetime.datetime.strptime(text.strip(), "%Y-%m-%d %H:%M:%S")
    return time.mktime(parsed.timetuple()) + parsed.microsecond / 1e6


def outcome(read, text: str) -> object:  # type: ignore[no-untyped-def]
    try:
        return read(text)
    except ValueError:
        return ValueError


@settings(max_examples=1000, deadline=None)
@given(st.one_of(
    st.from_regex(r"\A[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\Z"),  # padded: out-of-range fields too
    st.builds("{:04d}-{:02d}-{:02d} {:02d}:{:02d}:{:02d}".format, st.integers(1, 9999), st.integers(1, 12),
              st.integers(1, 31), st.integers(0, 23), st.integers(0, 59), st.integers(0, 61)),
    st.from_regex(r"\A ?[0-9٠-٩ ]{1,4}-[0-9 ]{1,2}-[0-9]{1,2} [0-9 ]{1,2}:[0-9]{1,2}:[0-9]{1,2} ?\Z"),  # unpadded, odd
))
def test_logging_seconds_read_without_strptime_as_strptime_reads_them(text: str) -> None:
    assert outcome(lambda t: parse_local_time(t, "%Y-%m-%d %H:%M:%S"), text) == outcome(by_strptime, text)
