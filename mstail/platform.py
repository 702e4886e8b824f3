"""What differs by Python version and by user, shared by every package: the TOML reader and per-user folders."""

from __future__ import annotations

import os
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.9/3.10
    import tomli as tomllib

__all__ = ["per_user_dir", "tomllib"]


def per_user_dir(override_var: str, xdg_var: str, xdg_default: str, leaf: str) -> Path:
    """A per-user folder of mstail's: `$override_var` when set, else `$xdg_var/mstail/leaf`, where `$xdg_var`
    defaults to `~/xdg_default` (the XDG base directory rules)."""
    explicit = os.environ.get(override_var)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get(xdg_var) or os.path.join(os.path.expanduser("~"), xdg_default)
    return Path(base) / "mstail" / leaf if leaf else Path(base) / "mstail"
