"""Is a path on a network filesystem? (Then file events miss writes made by other machines: read on a timer.)

inotify only reports changes made through the local kernel, so a rank on another node writing through NFS,
CIFS, Lustre, GPFS, CephFS ... raises no event here (GNU `tail` turns inotify off on remote filesystems for
the same reason). The filesystem type comes from /proc/self/mountinfo: the mount whose mount point is the
longest prefix of the path (or, for a path that does not exist yet, of its nearest existing ancestor).

    network_fs("/nfs/job/output/log/rank_*/info.log")  ->  "nfs4"   (None when local or unknown)
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable, List, Optional, Tuple, Union

from mstail.tailer.inputs.discovery import glob_free_prefix

MOUNTINFO = "/proc/self/mountinfo"

#: filesystem types (mountinfo's field after " - ") whose files other hosts write to.
NETWORK_TYPES = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ncpfs", "afs", "coda", "9p", "virtiofs",
    "lustre", "gpfs", "ceph", "glusterfs", "beegfs", "panfs", "wekafs", "orangefs", "pvfs2", "gfs2", "ocfs2",
    "fuse.sshfs", "sshfs", "fuse.glusterfs", "fuse.cephfs", "fuse.ceph-fuse", "fuse.s3fs", "fuse.gcsfuse",
    "fuse.juicefs", "juicefs", "fuse.rclone", "fuse.goofys", "fuse.mfs", "fuse.alluxio-fuse", "fuse.cvmfs2",
})

_ESCAPE = re.compile(r"\\([0-7]{3})")

Mount = Tuple[str, str]  # (mount point, filesystem type)


def parse_mountinfo(text: str) -> List[Mount]:
    """(mount point, fstype) of every well-formed line of a mountinfo text, in file order."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        try:
            dash = fields.index("-", 6)  # optional fields (shared:N, master:N ...) sit between 6 and " - "
            point, fstype = fields[4], fields[dash + 1]
        except (ValueError, IndexError):
            continue
        mounts.append((_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), point), fstype))
    return mounts


def is_network_type(fstype: str) -> bool:
    return fstype in NETWORK_TYPES or fstype.startswith(("nfs", "fuse.nfs"))


def existing_ancestor(pattern: Union[str, "os.PathLike[str]"]) -> Path:
    """The nearest existing directory (or file) on the way to what a path or glob names."""
    probe = glob_free_prefix(Path(os.path.abspath(os.path.expanduser(os.fspath(pattern)))))
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return probe


def filesystem_of(pattern: Union[str, "os.PathLike[str]"], mounts: Optional[Iterable[Mount]] = None) -> Optional[str]:
    """The filesystem type holding a path (or its nearest existing ancestor); None if mountinfo is unreadable.

    The path is resolved (symlinks followed) and matched against mount points by longest prefix; the last
    mount of a point wins (mounts stacked on the same directory)."""
    if mounts is None:
        try:
            with open(MOUNTINFO, encoding="utf-8", errors="replace") as handle:
                mounts = parse_mountinfo(handle.read())
        except OSError:
            return None
    target = os.path.realpath(existing_ancestor(pattern))
    best, best_len = None, -1
    for point, fstype in mounts:
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best_len:
            best, best_len = fstype, len(point)
    return best


def network_fs(pattern: Union[str, "os.PathLike[str]"], mounts: Optional[Iterable[Mount]] = None) -> Optional[str]:
    """The network filesystem type a path or glob lives on, or None when it is local (or unknown)."""
    fstype = filesystem_of(pattern, mounts)
    return fstype if fstype is not None and is_network_type(fstype) else None


def network_paths(patterns: Iterable[str], mounts: Optional[Iterable[Mount]] = None) -> List[Tuple[str, str]]:
    """(pattern, fstype) for each pattern on a network filesystem."""
    mounts = list(mounts) if mounts is not None else None
    found = []
    for pattern in patterns:
        fstype = network_fs(pattern, mounts)
        if fstype is not None:
            found.append((pattern, fstype))
    return found
