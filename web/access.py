"""Who may reach the sidecar: loopback classification of a bind address and access tokens.

Kept in `tailer` (not `web`) so the CLI can decide, before serving, whether a token is needed; the web
middleware that enforces it (`web/security.py`) imports it from here.
"""

from __future__ import annotations

import ipaddress
import secrets

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def is_loopback_host(host: str) -> bool:
    """True when `host` names this machine only: 127.0.0.0/8, ::1 (also as ::ffff:127.x), or localhost.

    Anything else — a LAN address, a public one, 0.0.0.0 / :: (every interface), any other name — is not,
    and binding there needs a token.
    """
    name = host.strip().strip("[]").rstrip(".").lower()
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def new_token() -> str:
    """A fresh random access token (32 characters, URL-safe, 192 bits)."""
    return secrets.token_urlsafe(24)
