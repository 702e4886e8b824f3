"""Is anybody still writing this file? Asked of /proc: a run's writer leaving is how most runs end.

A training that exits leaves its log as it was: no line says it ended (a plain MindSpore script's LossMonitor
prints none, a SIGKILL or an OOM kill leaves no time to). What tells an ended run from a hung one is the writer: a
process that still holds the file open for writing and writes nothing is hung; when no process holds it, the run
is over. That can be seen only on this machine, and only of the processes this user may look at; elsewhere (a
network filesystem written from other nodes, no /proc) the answer is None and the time bound alone decides.

A full look (`holders_of`) costs one `stat` per open file descriptor on the machine; whether the processes it found
are still running (`running`) costs one small read per process: the tailer does the first rarely and the second
often, so a writer's exit is seen within a second or two at a bounded cost.
"""

from __future__ import annotations

import os
from typing import Dict, FrozenSet, Iterable, Optional, Set, Tuple

PROC = "/proc"
_WRITE = os.O_WRONLY | os.O_RDWR

#: a process: (pid, its start time in clock ticks since boot), so that a pid the kernel hands out again is another
ProcId = Tuple[int, int]
Identity = Tuple[int, int]  # a file: (device, inode)


def holders_of(identities: Set[Identity], proc: str = PROC) -> Tuple[Dict[Identity, FrozenSet[ProcId]], bool]:
    """The processes holding each file open for writing, with one look at /proc; and whether some process could
    not be looked at (blind: a writer may be out of sight; everything is blind without /proc)."""
    found: Dict[Identity, Set[ProcId]] = {identity: set() for identity in identities}
    try:
        pids = [name for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return {identity: frozenset() for identity in identities}, True
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
            holders = found.get((st.st_dev, st.st_ino))
            if holders is None:
                continue
            try:
                with open(f"{proc}/{pid}/fdinfo/{fd}", encoding="ascii") as info:
                    flags = next((int(line.split()[1], 8) for line in info if line.startswith("flags:")), 0)
            except (OSError, ValueError, IndexError):
                blind = True
                continue
            if flags & _WRITE:
                started = _start_time(pid, proc)
                if started is not None:
                    holders.add((int(pid), started))
    return {identity: frozenset(holders) for identity, holders in found.items()}, blind


def running(procs: Iterable[ProcId], proc: str = PROC) -> Set[ProcId]:
    """Those of `procs` still running: not exited, not a zombie waiting for its parent (whose files are closed),
    and not another process given the same pid since. One read of /proc/PID/stat each."""
    return {one for one in procs if _start_time(str(one[0]), proc) == one[1]}


def _start_time(pid: str, proc: str) -> Optional[int]:
    """A running process's start time (/proc/PID/stat field 22), or None when it has exited or is a zombie."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as handle:
            text = handle.read()
    except OSError:
        return None
    fields = text[text.rfind(b")") + 2:].split()  # after the command name, which may hold spaces and parentheses
    try:
        return None if fields[0] in (b"Z", b"X") else int(fields[19])
    except (IndexError, ValueError):
        return None
