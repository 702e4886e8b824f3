"""The URL mstail prints is one a browser opens, and `--open` says when no browser could be opened: a real mstail,
bound to all addresses or not, with and without a browser to start."""

from __future__ import annotations

import os
import re
import socket
import stat
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import wait_until

LOG_LINE = "epoch: 1 step: 1, loss is 2.5\n"


def _log(tmp_path: Path) -> Path:
    log = tmp_path / "train.log"
    log.write_text(LOG_LINE)
    return log


def _headless() -> dict:
    """This environment with no graphical display and no $BROWSER."""
    return {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER")}


def test_bound_to_all_addresses_the_urls_printed_are_ones_that_open(mstail_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = mstail_server(_log(tmp_path), args=("--host", "0.0.0.0"))
    stdout = server.stdout_path.read_text()
    serving = re.search(r"mstail: serving (http://127\.0\.0\.1:(\d+)/\?token=(\S+))", stdout)
    assert serving, stdout  # the loopback URL, never http://0.0.0.0:...
    url, port, token = serving.groups()
    assert httpx.get(url, timeout=10).status_code == 200
    elsewhere = re.search(r"^mstail: from other machines: (.+)$", stdout, re.M)
    assert elsewhere, stdout
    urls = elsewhere.group(1).split(", ")
    named = not socket.gethostname().startswith("localhost")  # a name other machines may know it by
    assert not named or urls[0] == f"http://{socket.gethostname()}:{port}/?token={token}"
    for other in urls[named:]:  # this machine's own addresses: each answers
        host = re.match(r"http://\[?([^\]/]+?)\]?:\d+/", other).group(1)  # type: ignore[union-attr]
        assert not host.startswith(("127.", "0.")) and host != "::1"
        assert httpx.get(other, timeout=10).status_code == 200, other
    assert "0.0.0.0" not in stdout


def test_open_without_a_display_says_so_with_the_url(mstail_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = mstail_server(_log(tmp_path), args=("--open",), env=_headless())
    said = wait_until(lambda: re.search(r"mstail: could not open a browser \((.+)\); open (\S+) by hand", server.stderr),
                      15, message="the no-browser line")
    assert "DISPLAY" in said.group(1) and said.group(2).startswith(server.url)
    assert httpx.get(said.group(2), timeout=10).status_code == 200
    assert "from other machines" not in server.stdout_path.read_text()  # bound to loopback: one URL


def _browser(tmp_path: Path, body: str) -> str:
    script = tmp_path / "browser.sh"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_open_with_a_browser_that_fails_says_so(mstail_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env = {**_headless(), "BROWSER": _browser(tmp_path, "exit 1")}
    server = mstail_server(_log(tmp_path), args=("--open",), env=env)
    said = wait_until(lambda: re.search(r"mstail: could not open a browser \((.+)\); open (\S+) by hand", server.stderr),
                      15, message="the no-browser line")
    assert said.group(2).startswith(server.url)


def test_open_starts_the_browser_on_a_url_it_can_open(mstail_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    opened = tmp_path / "opened.txt"
    env = {**_headless(), "BROWSER": _browser(tmp_path, f'echo "$1" > {opened}')}
    server = mstail_server(_log(tmp_path), args=("--open", "--host", "0.0.0.0"), env=env)
    wait_until(lambda: opened.exists() and opened.read_text().strip(), 15, message="the browser started")
    assert opened.read_text().strip().startswith(server.url + "/?token=")  # loopback, not http://0.0.0.0
    assert httpx.get(opened.read_text().strip(), timeout=10).status_code == 200
    assert "could not open a browser" not in server.stderr


if sys.platform != "linux":  # pragma: no cover - the suite runs on Linux
    pytestmark = pytest.mark.skip("the display rule is checked on Linux")
