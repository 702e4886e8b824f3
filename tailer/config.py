"""Every setting of the sidecar, with its default written once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

DEFAULT_PORT = 6150


@dataclass(frozen=True)
class Config:
    """What `mstail --log ...` runs with (the CLI builds it; tests build it directly).

    Attributes:
        logs: paths or quoted globs to follow (`output/log/rank_*/info.log`); they may not exist yet.
        jsonl: paths or globs of JSONL files written by `tailer.callback` (read with the `jsonl` format).
        format: a format name to use for every `logs` file instead of auto-detection; None = detect per file.
        format_files: extra format TOML files (`--formats`), tried before the built-ins.
        patterns: ad hoc regexes (`--pattern`) whose named groups become metrics.
        host: address to bind; default loopback.
        port: TCP port; 0 picks a free one. Default 6150.
        open_browser: open the page in a browser once serving.
        poll_s: read on this timer only and ignore file-system events (NFS, where inotify sees nothing
            from other nodes); None = events plus a safety timer.
        safety_poll_s: with events on, read anyway this often (events are hints and can be missed); 1 s.
        watch_step_ms: watchfiles' `step`: delay before reporting a change; latency is 1-2x this. 10 ms.
        read_budget_bytes: bytes read per file per pass, so a flooding file cannot starve the others; 1 MiB.
        max_line_bytes: longer lines are cut and counted; 1 MiB.
        grace_s: how long a step record waits for its progress line before it is published anyway; 0.5 s.
        idle_after_s: a source with no new line for this long is shown as "idle"; 60 s.
        shutdown_timeout_s: how long open streams may delay exit on Ctrl-C; 1 s.
    """

    logs: Tuple[str, ...] = ()
    jsonl: Tuple[str, ...] = ()
    format: Optional[str] = None
    format_files: Tuple[str, ...] = ()
    patterns: Tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    open_browser: bool = False
    poll_s: Optional[float] = None
    safety_poll_s: float = 1.0
    watch_step_ms: int = 10
    read_budget_bytes: int = 1 << 20
    max_line_bytes: int = 1 << 20
    grace_s: float = 0.5
    idle_after_s: float = 60.0
    shutdown_timeout_s: float = 1.0
