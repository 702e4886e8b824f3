"""Is anybody still writing this file? Asked of /proc before a silent log is called hung.

A training that exits leaves its log as it was: no line says it ended (a plain MindSpore script's LossMonitor
prints none). What tells an ended run from a hung one is the writer: a process that still holds the file open
for writing and writes nothing is hung; when no process holds it, the run is over. That can be seen only on
this machine, and only of the processes this user may look at; elsewhere (a network filesystem written from
other nodes, no /proc) the answer is None and the time bound alone decides.
"""

from __future__ import annotations

import os
from typing import Dict, Optional, Set, Tuple

PROC = "/proc"
_WRITE = os.O_WRONLY | os.O_RDWR


def held_for_writing(identity: Tuple[int, int], proc: str = PROC) -> Optional[bool]:
    """True when a process on this machine has the file `identity` (device, inode) open for writing; False when
    none has and every process could be looked at; None when some could not (another user's, no /proc), so a
    writer may be out of sight. Costs one `stat` per open file descriptor on the machine: ask rarely."""
    return writers_of({identity}, proc)[identity]


def writers_of(identities: Set[Tuple[int, int]], proc: str = PROC) -> Dict[Tuple[int, int], Optional[bool]]:
    """`held_for_writing` for many files with one look at /proc (1,024 ranks cost what one does)."""
    try:
        pids = [name for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return dict.fromkeys(identities)
    held: Set[Tuple[int, int]] = set()
    blind = False
    for pid in pids:
        fd_dir = f"{proc}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except FileNotFoundError:
            continue  # the process has just ended
        except OSError:
            blind = True  # not ours to see
            continue
        for fd in fds:
            try:
                st = os.stat(f"{fd_dir}/{fd}")
            except OSError:
                continue
            identity = (st.st_dev, st.st_ino)
            if identity not in identities or identity in held:
                continue
            try:
                with open(f"{proc}/{pid}/fdinfo/{fd}", encoding="ascii") as info:
                    flags = next((int(line.split()[1], 8) for line in info if line.startswith("flags:")), 0)
            except (OSError, ValueError, IndexError):
                blind = True
                continue
            if flags & _WRITE:
                held.add(identity)
    return {identity: True if identity in held else None if blind else False for identity in identities}
