"""The page and the Python code share one definition of the record, parsers/record.schema.json: the app serves it
beside the page's files, the page's reserved keys (web/static/util.js) are the schema's, read from it in the
browser, and the page reads every non-finite name back as its number."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from mstail.parsers.record import NON_FINITE, RESERVED
from tests.record_schema import SCHEMA, SCHEMA_PATH

from .browser import Watched

UTIL_JS = Path(__file__).resolve().parents[2] / "web" / "static" / "util.js"
PAGE_RESERVED = "async () => [...(await import('/static/util.js')).RESERVED].sort()"


def _page_on(watched: Watched, mstail_server: Any, tmp_path: Path) -> Any:
    log = tmp_path / "train.log"
    log.write_text("".join(f"epoch: 1 step: {s}, loss is {3 - s / 10:.4f}\n" for s in range(1, 4)), encoding="utf-8")
    server = mstail_server(log)
    server.wait_records(3)
    watched.page.goto(server.url + "/", wait_until="load")
    watched.wait_live()
    watched.wait_chart("loss", "points", 3)
    return server


@pytest.mark.browser
@pytest.mark.timeout(60)
def test_the_page_reserves_the_keys_of_the_schema_it_is_served(watched: Watched, mstail_server: Any,
                                                               tmp_path: Path) -> None:
    server = _page_on(watched, mstail_server, tmp_path)
    served = watched.page.request.get(server.url + "/static/record.schema.json")
    assert served.ok and served.headers["content-type"].startswith("application/json")
    assert served.body() == SCHEMA_PATH.read_bytes()
    assert watched.page.evaluate(PAGE_RESERVED) == sorted(RESERVED)
    watched.assert_clean()  # the preloaded schema is the one util.js reads: no warning of a preload left unused


@pytest.mark.browser
@pytest.mark.timeout(60)
def test_the_page_takes_its_reserved_keys_from_the_schema_not_a_copy(watched: Watched, mstail_server: Any,
                                                                     tmp_path: Path) -> None:
    changed = json.loads(json.dumps(SCHEMA))
    changed["$defs"]["reserved"]["properties"]["zz_new_key"] = {"type": "string"}
    watched.page.context.route("**/static/record.schema.json",
                               lambda route: route.fulfill(status=200, content_type="application/json",
                                                           body=json.dumps(changed)))
    _page_on(watched, mstail_server, tmp_path)
    assert watched.page.evaluate(PAGE_RESERVED) == sorted(RESERVED | {"zz_new_key"})
    watched.assert_clean()


def test_the_page_reads_every_non_finite_name() -> None:
    body = re.search(r"export function num\(value\) \{(.*?)\n\}", UTIL_JS.read_text(encoding="utf-8"), re.S)
    assert body, "util.js no longer has num(value)"
    read = dict(re.findall(r'if \(value === "([^"]+)"\) return (-?\w+);', body.group(1)))
    # JavaScript spells the numbers NaN, Infinity and -Infinity exactly as their JSON names.
    assert read == {name: name for name in NON_FINITE}
