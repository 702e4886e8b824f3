"""The page's JavaScript copy of the record contract (web/static/util.js) equals the Python owner
(mstail.parsers.record): the same reserved keys, and every non-finite name read back as its number."""

from __future__ import annotations

import json
import re
from pathlib import Path

from mstail.parsers.record import NON_FINITE, RESERVED

UTIL_JS = Path(__file__).resolve().parents[2] / "web" / "static" / "util.js"


def test_the_page_reserves_exactly_the_record_keys() -> None:
    found = re.search(r"export const RESERVED = new Set\((\[[^\]]*\])\);", UTIL_JS.read_text(encoding="utf-8"))
    assert found, "util.js no longer declares RESERVED as `new Set([...])`"
    assert set(json.loads(found.group(1))) == RESERVED


def test_the_page_reads_every_non_finite_name() -> None:
    body = re.search(r"export function num\(value\) \{(.*?)\n\}", UTIL_JS.read_text(encoding="utf-8"), re.S)
    assert body, "util.js no longer has num(value)"
    read = dict(re.findall(r'if \(value === "([^"]+)"\) return (-?\w+);', body.group(1)))
    # JavaScript spells the numbers NaN, Infinity and -Infinity exactly as their JSON names.
    assert read == {name: name for name in NON_FINITE}
