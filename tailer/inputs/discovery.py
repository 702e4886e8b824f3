"""`--log` paths and quoted globs -> files, source ids, and the directories to watch.

A pattern may name files that do not exist yet (a run that has not started): that is not an error, the
nearest existing ancestor directory is watched until they appear.
"""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
import functools
import glob
import itertools
import os
import re
import stat
from pathlib import Path
from typing import Container, Dict, Iterable, List, Optional, Sequence, Set, Tuple

_GLOB_CHARS = re.compile(r"[*?\[]")
#: A rotated backup's name (`info.log.3`): RotatingFileHandler's numbering.
ROTATED = re.compile(r"^(?P<base>.+)\.(?P<n>\d+)$")
#: File stems that say nothing about which rank or run a file is: the id uses the directory instead.
_GENERIC_STEMS = {"info", "error", "stdout", "stderr", "mindformer", "train", "log", "output", "metrics", "worker"}


#: What `visible` writes for a control character: `\\n`, `\\t`, `\\r`, else `\\xHH` (C0, DEL, C1).
_ESCAPES = {**{code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))},
            0x0A: "\\n", 0x09: "\\t", 0x0D: "\\r"}


def visible(text: str) -> str:
    """`text` (a path, a name found on disk) as the API, the history and a terminal can take it: bytes of a file
    name that are no UTF-8 (Python's surrogate escapes, which no JSON encoder nor SQLite accepts) as `\\xff`,
    control characters (a terminal's escape sequences, newlines that would forge a line on stderr) as `\\x1b`,
    `\\n`. A plain name is returned as it is, and `visible(visible(t)) == visible(t)`."""
    if text.isprintable():
        return text
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace").translate(_ESCAPES)


def within(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or below it (both real paths: links resolved)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def has_glob(pattern: str) -> bool:
    return bool(_GLOB_CHARS.search(pattern))


def expand(pattern: str, known: Container[str] = ()) -> List[Path]:
    """Existing files a pattern names now (a plain path: itself, whether it exists or not); a name in `known` (as
    this gives it: a file followed already) is taken without looking at it again."""
    expanded = os.path.expanduser(pattern)
    if not has_glob(expanded):
        return [Path(expanded)]
    # Rotated backups (info.log.1) are read as part of their live file's history, never as sources of their own.
    # Anything but a folder: a FIFO or a device a glob names is shown as unreadable rather than left out unsaid.
    return [Path(p) for p in sorted(glob.glob(expanded, recursive=True))
            if p in known or (not os.path.isdir(p) and not ROTATED.match(os.path.basename(p)))]


def glob_free_prefix(path: Path) -> Path:
    """The leading parts of `path` before the first one holding a wildcard (`a/*/b` -> `a`; `.` if none)."""
    static_parts: List[str] = []
    for part in path.parts:
        if has_glob(part):
            break
        static_parts.append(part)
    return Path(*static_parts) if static_parts else Path(".")


def watch_roots(patterns: Iterable[str]) -> Set[Tuple[Path, bool]]:
    """(directory, recursive) pairs to watch so every file a pattern may name is seen when it changes.

    The parent directory is watched, never the file itself: an inotify watch on a file dies when the file
    is renamed by rotation (watchfiles #127/#235). A glob in a directory part, or a directory that does not
    exist yet, needs a recursive watch of the nearest existing ancestor.
    """
    return WatchRoots(patterns)()


class WatchRoots:
    """`watch_roots(patterns)` worked out again and again (the tailer loop looks every second for folders that appeared),
    cheaply: a folder's resolved path is kept while a `stat` of it shows the same folder (device, inode), so a thousand
    `--log` paths cost a stat each, not a `realpath` each (a stat per part of the path: most of what such an idle
    mstail did). A link on the way pointed elsewhere, or a folder made again, shows another inode and is resolved
    again; a folder renamed in place keeps the path it had (its inotify watch follows it anyway, and `PatternFilter`'s
    forms keep theirs too).

    Args:
        patterns: the `--log`/`--jsonl` paths and globs.
    """

    def __init__(self, patterns: Iterable[str]) -> None:
        parents = {Path(os.path.expanduser(pattern)).parent for pattern in patterns}
        #: each pattern's folder cut before its first wildcard, and whether it was cut (a recursive watch), once each
        self._parents = {(glob_free_prefix(parent), glob_free_prefix(parent) != parent) for parent in parents}
        self._resolved: Dict[Path, Tuple[Tuple[int, int], Path]] = {}  # folder -> (its identity, its resolved path)

    def __call__(self) -> Set[Tuple[Path, bool]]:
        roots: Set[Tuple[Path, bool]] = set()
        for static, recursive in self._parents:
            try:
                st = os.stat(static)
            except (OSError, ValueError):
                st = None
            if st is None or not stat.S_ISDIR(st.st_mode):  # not there yet: its nearest existing ancestor, recursively
                while not static.is_dir() and static.parent != static:
                    static = static.parent
                roots.add((static.resolve(), True))
                continue
            identity = (st.st_dev, st.st_ino)
            known = self._resolved.get(static)
            if known is None or known[0] != identity:
                known = self._resolved[static] = (identity, static.resolve())
            roots.add((known[1], recursive))
        return roots


class PatternFilter:
    """Whether a path a file event names may be a file the patterns name, or a folder on the way to one: most
    events name neither (another log in a rank's folder, a checkpoint) and need no new look for files. Errs on
    the side of yes (`*` also matches a leading dot; a `**` pattern takes any path).

    Args:
        patterns: the `--log`/`--jsonl` paths and globs. Each is matched as written (made absolute) and with
            its folder's links resolved, as the watched roots are (`watch_roots`).
    """

    def __init__(self, patterns: Iterable[str]) -> None:
        self._forms: Set[Tuple[str, ...]] = set()
        for pattern in patterns:
            absolute = Path(os.path.abspath(os.path.expanduser(pattern)))
            static = glob_free_prefix(absolute)
            rest = absolute.parts[len(static.parts):]
            for root in (static, Path(os.path.realpath(static))):
                self._forms.add(root.parts + rest)

    def __call__(self, path: str) -> bool:
        parts = Path(path).parts
        return any("**" in form or (len(parts) <= len(form) and all(map(fnmatch.fnmatchcase, parts, form)))
                   for form in self._forms)


#: folder entries `nearest_file` compares at most (a typo'd name in a folder of a million files costs milliseconds)
NEAREST_MAX_ENTRIES = 2000


def nearest_file(path: Path, folders: bool = False) -> Optional[str]:
    """The name of the file (or, with `folders`, the file or folder) in `path`'s folder closest to its name
    (difflib's similarity: a typo, a wrong rank or extension), among the first NEAREST_MAX_ENTRIES entries; None
    when the folder holds none."""
    names = []
    try:
        with os.scandir(path.parent) as listing:
            for entry in itertools.islice(listing, NEAREST_MAX_ENTRIES):
                with contextlib.suppress(OSError):
                    if entry.is_file() or (folders and entry.is_dir()):
                        names.append(entry.name)
    except OSError:
        return None
    best = difflib.get_close_matches(path.name, names, n=1, cutoff=0.0)
    return visible(best[0]) if best else None


def nearest_path(pattern: str) -> Optional[Path]:
    """Where a glob that matches nothing stops matching: down its parts while each names something (a wildcard part:
    its first match), then the entry nearest to the first part that names nothing (`out/log/rnak_*/info.log` ->
    `out/log/rank_0`); None when that folder is empty."""
    parts = Path(os.path.expanduser(pattern)).parts
    current = Path(parts[0]) if os.path.isabs(parts[0]) else Path(".")
    for part in parts[1:] if os.path.isabs(parts[0]) else parts:
        found = sorted(glob.glob(os.path.join(glob.escape(str(current)), part)))[:1] if has_glob(part) else (
            [str(current / part)] if (current / part).exists() else [])
        if not found:
            nearest = nearest_file(current / part, folders=True)
            return current / nearest if nearest else None
        current = Path(found[0])
    return None


def rotated_backups(path: Path) -> List[Path]:
    """RotatingFileHandler's backups of `path` (`info.log.5` ... `info.log.1`), oldest first."""
    numbered = []
    try:
        for entry in os.scandir(path.parent):
            found = ROTATED.match(entry.name)
            if found and found.group("base") == path.name and entry.is_file():
                numbered.append((int(found.group("n")), Path(entry.path)))
    except OSError:
        return []
    return [backup for _, backup in sorted(numbered, reverse=True)]


def _key(path: Path) -> Path:
    """A file's key among the ids: its absolute path as the history keeps it (`visible`), so a restart finds it."""
    return Path(visible(str(path.absolute())))


#: the rank a source id names: `rank_3`, `exp1/rank_3`, `worker_3`, `device-7`, `npu3`, `ID/rank3` or `ID/default3`
#: of a launcher-tagged part (`#2`: a second file of that name)
_RANK = re.compile(r"(?:^|[/_.-])(?:(?:rank|device|worker|npu|gpu|card)[_.-]?|default)(\d+)(?:#\d+)?$", re.IGNORECASE)


@functools.lru_cache(maxsize=1 << 14)  # asked for every source at every alert tick and remote write batch
def rank_of(source: str) -> Optional[str]:
    """The rank a source id names, as a number's text (`rank_03` -> `3`), else None (`exp/lr1e-4`: a log of its own,
    maybe of another experiment)."""
    found = _RANK.search(source)
    return str(int(found.group(1))) if found else None


class SourceNamer:
    """Short, stable, unique source ids: `output/log/rank_3/info.log` -> `rank_3`, `worker_3.log` -> `worker_3`.

    A file named for what it holds (`worker_3.log`) is its stem; a file with a generic name (`info.log`,
    `train.log`, `metrics.jsonl`) is its folder, or its folder and stem (`run/train`, `run/metrics`) when other
    followed files share that folder. An id, once given, never changes (a restart adopts the old ones); a later
    file whose id is taken gets more of its path.
    """

    def __init__(self) -> None:
        self._by_path: Dict[Path, str] = {}
        self._taken: Set[str] = set()

    def adopt(self, path: Path, source: str) -> None:
        """Keep the id a source had before a restart (ids must not depend on the order files turn up)."""
        self._by_path[_key(path)] = source
        self._taken.add(source)

    def name(self, path: Path, followed: Iterable[Path] = ()) -> str:
        """The id of `path`; `followed` are the other files followed now (the folder's other files among
        them make a generic name specific)."""
        return self.names([path], followed)[0]

    def names(self, paths: Sequence[Path], followed: Iterable[Path] = ()) -> List[str]:
        """The ids of `paths`, in order, as `name` gives them one by one; `followed` is looked at once for all
        (a thousand new rank files cost a thousand lookups, not a million comparisons)."""
        by_folder: Dict[Path, Set[Path]] = {}
        for other in followed:
            absolute = _key(other)
            by_folder.setdefault(absolute.parent, set()).add(absolute)
        return [self._name(_key(path), by_folder) for path in paths]

    def claim(self, path: Path, wanted: Sequence[str]) -> str:
        """The id of a file found below a folder (`runs.RunFile.names`): its id if it has one, else the first of
        `wanted` not taken, else the last one numbered (`exp1/rank_0#2`)."""
        key = _key(path)
        if key not in self._by_path:
            free = [name for name in wanted if name not in self._taken]
            source = free[0] if free else next(f"{wanted[-1]}#{n}" for n in range(2, len(self._taken) + 3)
                                               if f"{wanted[-1]}#{n}" not in self._taken)
            self._by_path[key] = source
            self._taken.add(source)
        return self._by_path[key]

    def _name(self, key: Path, by_folder: Dict[Path, Set[Path]]) -> str:
        if key in self._by_path:
            return self._by_path[key]
        parts = list(key.parts)
        stem = Path(parts[-1]).stem
        shared = bool(by_folder.get(key.parent, set()) - {key})
        words = [stem] if stem.lower() not in _GENERIC_STEMS else [parts[-2], stem] if shared and len(parts) > 2 else []
        depth = len(parts) - (3 if words[:1] == [parts[-2]] else 2)
        while not words or "/".join(words) in self._taken:
            if depth <= 0:
                words = [str(key)]
                break
            words.insert(0, parts[depth])
            depth -= 1
        source = "/".join(words)
        self._by_path[key] = source
        self._taken.add(source)
        return source
