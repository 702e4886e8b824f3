"""Which state file a configuration opens: the app's part of the history's opening.

The history's file (`mstail.tailer.history.db.StateDB`) takes plain facts (its path, the fingerprint it must carry,
whether it lies on a network filesystem); what they are made of (the followed patterns, the formats' rules, the
mstail version, where the state folder is) is the configuration's, so it is decided here, above the history.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Sequence

from mstail import __version__
from mstail.parsers import Format
from mstail.platform import per_user_dir
from mstail.tailer.config import Config
from mstail.tailer.history.db import SCHEMA_VERSION, StateDB, StateError, fingerprint, state_file
from mstail.tailer.inputs.discovery import watch_roots
from mstail.tailer.inputs.netfs import network_fs


def default_state_dir() -> Path:
    """`$MSTAIL_STATE_DIR`, else `$XDG_STATE_HOME/mstail`, else `~/.local/state/mstail`."""
    return per_user_dir("MSTAIL_STATE_DIR", "XDG_STATE_HOME", os.path.join(".local", "state"), "")


def open_state(config: Config, formats: Sequence[Format]) -> StateDB:
    """The state for this configuration: a file named by what is followed and how it is parsed (another
    `--log` set, format or mstail version gets a fresh one), or a temporary database with `persist` off."""
    if not config.persist:
        return StateDB(None)
    state_dir = Path(config.state_dir).expanduser() if config.state_dir else default_state_dir()
    state_dir = state_dir.absolute()
    roots = watch_roots(config.logs + config.jsonl) | {(Path(d).expanduser().resolve(), True) for d in config.logdirs}
    for root, recursive in roots:
        if state_dir == root or (recursive and root in state_dir.parents):
            raise StateError(
                f"the state folder {state_dir} is inside the followed log folder {root}: mstail would wake itself "
                "with every write; pick a folder outside the logs with --state-dir"
            )
    digest = fingerprint(_history_parts(config, formats))
    given = config.logs + config.jsonl + config.logdirs + tuple(f"peers-{name}" for name, _ in config.peers)
    label = given[0] if given else "state"
    return StateDB(state_file(state_dir, label, digest), expected=digest, network=network_fs(state_dir) is not None)


def _history_parts(config: Config, formats: Sequence[Format]) -> List[str]:
    """What decides the history, as the fingerprint's parts: followed patterns (absolute) and parsing options."""
    parts = [f"mstail {__version__}", f"schema {SCHEMA_VERSION}", f"format {config.format}"]
    parts += sorted(f"log {os.path.abspath(os.path.expanduser(p))}" for p in config.logs)
    parts += sorted(f"jsonl {os.path.abspath(os.path.expanduser(p))}" for p in config.jsonl)
    parts += sorted(f"logdir {os.path.abspath(os.path.expanduser(p))}" for p in config.logdirs)
    parts += sorted(f"peer {name} {url}" for name, url in config.peers)
    for fmt in formats:  # a changed rule may parse the same lines differently: such a history is not reused
        parts += [f"{fmt.name} {p.regex.pattern}" for p in fmt.prefixes]
        parts += [f"{fmt.name} {r.name} {r.regex.pattern} {[f.name for f in r.fields]}" for r in fmt.rules]
    if config.derived is not None:  # derived values are stored in the records
        parts += config.derived.describe()
    return parts
