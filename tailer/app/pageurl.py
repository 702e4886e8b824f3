"""The page's addresses as a browser can open them, and opening one.

Bound to all addresses (`--host 0.0.0.0` or `::`), `http://0.0.0.0:6150` is no address a browser opens (and none
another machine can use): the page is at the loopback address here, and at the machine's name and its own addresses
from elsewhere.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import logging
import os
import socket
import struct
import sys
import webbrowser
from typing import List, Union

log = logging.getLogger("mstail")
_Address = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]

#: what `bind` is given, or `getsockname` says, for "every address of this machine"
WILDCARDS = ("", "0.0.0.0", "::")
#: addresses listed at most (a machine with many interfaces: containers' bridges, several networks)
MAX_ADDRESSES = 8
_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


def page_url(host: str, port: int) -> str:
    """The URL a browser on this machine opens for a server on `host:port`: loopback for a wildcard `host`."""
    if host in WILDCARDS:
        host = "::1" if host == "::" else "127.0.0.1"
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def other_urls(host: str, port: int) -> List[str]:
    """For a wildcard `host`, the URLs other machines may use: the machine's name (unless it is `localhost...`),
    then its addresses other than loopback and link-local (IPv6 ones only when bound to `::`); none for any other
    host."""
    if host not in WILDCARDS:
        return []
    name = socket.gethostname()
    names = ([] if name.startswith("localhost") else [name]) + [str(a) for a in _own_addresses(with_v6=host == "::")]
    return [page_url(name, port) for name in dict.fromkeys(n for n in names if n)]


def _own_addresses(with_v6: bool) -> List[_Address]:
    found = _interface_v4() or _routed(socket.AF_INET, "192.0.2.1")  # (TEST-NET: nothing is sent to it)
    if with_v6:
        found += _interface_v6() or _routed(socket.AF_INET6, "2001:db8::1")
    kept = [a for a in found if not (a.is_loopback or a.is_link_local or a.is_unspecified)]
    return list(dict.fromkeys(kept))[:MAX_ADDRESSES]


def _interface_v4() -> List[_Address]:
    """Every interface's IPv4 address (Linux; [] elsewhere, or when the interfaces cannot be read)."""
    if not sys.platform.startswith("linux"):
        return []
    found = []
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _index, name in socket.if_nameindex():
            with contextlib.suppress(OSError):  # an interface without an IPv4 address
                packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
                found.append(ipaddress.ip_address(packed[20:24]))
    return found


def _interface_v6() -> List[_Address]:
    """Every interface's IPv6 address (Linux: /proc/net/if_inet6; [] elsewhere)."""
    try:
        with open("/proc/net/if_inet6", encoding="ascii") as table:
            return [ipaddress.ip_address(bytes.fromhex(line.split()[0])) for line in table if line.strip()]
    except (OSError, ValueError):
        return []


def _routed(family: int, remote: str) -> List[_Address]:
    """The address this machine would send from to `remote` (a UDP connect sends nothing): the main one."""
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((remote, 9))
            return [ipaddress.ip_address(probe.getsockname()[0].split("%")[0])]
    except (OSError, ValueError):
        return []


def open_page(url: str) -> bool:
    """Open `url` in a browser; when none can be opened, say so once on stderr with the URL to open by hand.
    Without a graphical display (Linux, BSD: no $DISPLAY nor $WAYLAND_DISPLAY) only a $BROWSER is tried: a text
    browser would take over the terminal mstail runs in."""
    reason = "" if os.environ.get("BROWSER") else _no_display()
    if not reason:
        try:
            if webbrowser.open(url):
                return True
            reason = "no browser found, or it failed to start"
        except Exception as exc:  # noqa: BLE001 - webbrowser.Error, an OSError starting the command: said, never fatal
            reason = f"{type(exc).__name__}: {exc}"
    log.warning("could not open a browser (%s); open %s by hand", reason, url)
    return False


def _no_display() -> str:
    if sys.platform in ("darwin", "win32", "cygwin") or os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        return ""
    return "no graphical display: $DISPLAY is not set"
