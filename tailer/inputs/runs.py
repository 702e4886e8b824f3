"""Folders as runs: `mstail DIR`, `--logdir DIR`, `mstail parse DIR` find the runs' files below a folder.

A walk below each folder (bounded in depth and entries; symlinked folders followed once, so a link loop ends;
hidden folders skipped) keeps the files of the input kinds mstail reads, each named by its run and rank:

    exp1/output/log/rank_3/info.log          -> exp1/rank_3   (MindFormers; rotated info.log.N join it)
    exp2/output/msrun_log/worker_0.log       -> exp2/worker_0 (msrun; scheduler.log holds no steps: left out)
    exp3/output/metrics/rank_0.jsonl         -> exp3/rank_0   (mstail.callback's JSON lines)
    exp4/tensorboard/rank_0/events.out.tfevents.*  -> exp4/rank_0 (TensorBoard, MindSpore summary files: one source
                                                               per folder of them, its first file stands for it)
    exp5/train.log, exp6/nohup.out, megatron.log   -> exp5/train ... (any other text log a format recognises in its
                                                               first 64 KiB: `_HeadJudge`; the others said once)

In a walk, a link whose real path leaves the folder given (a file, or a run folder linked from elsewhere) is not
opened, and said once, unless `follow_symlinks` (`--follow-symlinks`): a shared job folder must not make mstail read
and serve another file of the machine.

The run is the folder that holds a run's files: the file's folder without its rank folder and without the
layout folders MindFormers and msrun put between (`output`, `log`, `msrun_log`, `metrics`, `summary`,
`tensorboard`, ...), named by its path below DIR, or by DIR's own name when DIR is the run.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

from mstail.parsers import Format

from mstail.tailer.inputs.discovery import ROTATED, visible, within
from mstail.tailer.inputs.frames import event_file_kind
from mstail.tailer.inputs.kind import InputSpec, items_of
from mstail.tailer.inputs.textlog import TEXT

log = logging.getLogger("mstail.runs")

#: folders deeper than this below DIR are not looked into (MindFormers' deepest layout is
#: `DIR/<group>/<run>/output/log/rank_N/info.log`: 6 levels).
MAX_DEPTH = 8
#: directory entries looked at per walk at most, so a walk stays bounded however big DIR is: 13,000 entries (50
#: runs x 8 ranks with checkpoints) take 0.2-0.3 s on a loaded 2-core machine (tests/bench/folder_walk.py).
MAX_ENTRIES = 100_000
#: files kept per walk at most (each becomes a source).
MAX_FILES = 4096
#: bytes of a `.jsonl` file read to tell mstail.callback's records from other JSON lines (a data set), and of a
#: text log named by no convention to tell whether a format recognises it.
JSONL_HEAD_BYTES = HEAD_BYTES = 64 << 10
#: how long a walk of the sidecar may spend judging text logs' heads (64 KiB of prose no format recognises: 0.1 s on
#: a loaded machine); those left are judged by the next walks. A head is read again only when it changed while too
#: short to judge.
HEADS_TIME_S = 0.5
#: a text log too short to judge yet is looked at again when a file event names it at most this often
RECHECK_S = 1.0
#: unrecognised logs named in one notice at most (the rest counted)
MAX_NAMED = 10
#: a verdict not given yet (`_HeadJudge`: the walk spent its HEADS_TIME_S)
LATER = "later"

#: one line per input kind, for `mstail formats` (the README lists the same).
INPUT_KINDS: Tuple[Tuple[str, str], ...] = (
    ("text", "log lines in one of the text formats listed below (info.log, worker_N.log, stdout): --log PATH"),
    ("jsonl", "JSON lines written by mstail.callback: --jsonl PATH, or *.jsonl below a folder"),
    ("tensorboard", "TensorBoard event files (events.out.tfevents.*), as tensorboardX writes them for MindFormers"),
    ("summary", "MindSpore summary files (events.out.events.summary.*) of SummaryRecord / SummaryCollector"),
    ("folder", "a folder of runs: mstail DIR, --logdir DIR, mstail parse DIR find the kinds above below it (text logs "
               "by their names, or by a format recognising their first 64 KiB)"),
    ("peer", "a node mstail's stream, for one page of many nodes: --peer [NAME=]URL (docs/many-nodes.md)"),
)

#: what a folder is looked through for, said while none is found yet
NOTHING_YET = ("output/log/rank_N/info.log, worker_N.log, mstail.callback's *.jsonl, event files, or a *.log, *.out, "
               "*.txt a format recognises")

_RANK_DIR = re.compile(r"^(?:rank|device|worker)[_.-]?\d+$")
_LAYOUT_DIR = re.compile(
    r"^(?:output|logs?|log_.+|msrun_log(?:_.+)?|metrics|summary|summaries|tensorboard(?:_.+)?|tb)$")
_WORKER_LOG = re.compile(r"^worker_.+\.log$")
#: a text log by its name, whose head is looked at for a format: `train.log`, `nohup.out`, `slurm-42.err`, `log.txt`,
#: `stdout` (not a rotated backup, `train.log.1`: part of its live file's chain)
_TEXT_LOG = re.compile(r"(?:\.(?:log|out|err|txt)|^(?:stdout|stderr|output))$", re.IGNORECASE)
#: logs a run keeps beside its step log that hold no steps: MindFormers' `rank_N/error.log`, msrun's `scheduler.log`
_NO_STEPS = frozenset({"error.log", "scheduler.log"})
#: the first line of what mstail writes itself: `mstail parse` JSON lines and CSV, its stderr (`2> runs/mstail.log`)
_MSTAIL_OUTPUT = re.compile(rb'^(?:\{"source":|source,step,|mstail: )')


@dataclass(frozen=True)
class RunFile:
    """A file found below a folder: its kind (`text`, `jsonl`, `events`), its run's name, and the names it may
    take as a source, best first (`exp1/rank_3`, then with its layout folders, then its whole path in the run), and
    the folder its files must stay in."""

    path: Path
    kind: str
    run: str
    names: Tuple[str, ...]
    #: the real path of the folder given, which the files read for it must stay in (`FileFollower.confine`); None
    #: with `follow_symlinks`
    confine: Optional[str] = None


class FolderError(Exception):
    """A folder given to follow or parse that is missing or is no folder: one line for the user."""


def check_folder(folder: str) -> Path:
    """`folder` as a Path when it is a folder; FolderError (a one-line reason) when it is missing or a file."""
    path = Path(os.path.expanduser(folder))
    if not path.exists():
        raise FolderError(f"no such folder: {folder}")
    if not path.is_dir():
        raise FolderError(f"{folder} is a file, not a folder: follow it with --log {folder}")
    return path


def _kind(path: str) -> Optional[str]:
    """The kind of a file by its name and folder (`jsonl` still needs its head looked at), or None. Strings, not
    Paths: a walk asks this of every file (checkpoints, strategy files), and pathlib would be most of its time."""
    folder, name = os.path.split(path)
    if (name == "info.log" and _RANK_DIR.match(os.path.basename(folder))) or _WORKER_LOG.match(name):
        return "text"
    if name.endswith(".jsonl"):
        return "jsonl"
    if event_file_kind(name) is not None:  # by name only: a walk does not open every file it passes
        return "events"
    return None


def _text_log(name: str) -> bool:
    """Whether a file not named by a convention is a text log by its name (its head is looked at then)."""
    return bool(_TEXT_LOG.search(name)) and name not in _NO_STEPS and not name.startswith(".") \
        and not ROTATED.match(name)


def recognised(head: bytes, formats: Sequence[Format], forced: Optional[Format] = None) -> Optional[bool]:
    """Whether the first bytes of a text log make a record with `formats` (`forced`: that one only), read as the
    sidecar reads them (the text kind's splitter and parser); binary data (a NUL in the first 8 KiB) never does;
    None for mstail's own output (no run's log, and no log to say is unrecognised either)."""
    if _MSTAIL_OUTPUT.match(head.lstrip()):
        return None
    if b"\x00" in head[:8192]:
        return False
    spec = InputSpec(Path(), formats=formats, forced=forced)
    parser = TEXT.parser(spec)
    for line in TEXT.splitter(spec).feed(head):
        if any(item.kind == "record" for item in items_of(parser, line, 0.0)):
            return True
    return any(item.kind == "record" for item in parser.flush(0.0, force=True))


class _HeadJudge:
    """Which text logs named by no convention are a run's: those whose first HEAD_BYTES a format recognises. A verdict
    is kept per file: a recognised file is never read for it again; an unrecognised one only when it was too short to
    judge (a run's stdout before its first step) and has grown, or when it was replaced (another inode)."""

    def __init__(self, formats: Sequence[Format], forced: Optional[Format], time_s: Optional[float]) -> None:
        self.formats, self.forced, self.time_s = formats, forced, time_s
        #: path -> (inode, size judged, verdict (`recognised`), monotonic time judged)
        self._seen: Dict[str, Tuple[int, int, Optional[bool], float]] = {}
        self._until = math.inf  # judging ends at this monotonic time in the walk in progress

    def start_walk(self) -> None:
        self._until = math.inf if self.time_s is None else time.monotonic() + self.time_s

    def __call__(self, path: str, info: os.stat_result, confine: Optional[str]) -> Union[bool, None, str]:
        """The verdict on a file (`info`: its stat; `recognised`; `confine`: the folder its real path must stay in,
        `open_confined`), or LATER when this walk's time for it is over."""
        known = self._seen.get(path)
        judged = min(info.st_size, HEAD_BYTES)
        if known is not None and known[0] == info.st_ino and (known[2] is not False or known[1] == judged):
            return known[2]
        if time.monotonic() >= self._until:
            return LATER
        try:
            head = _head(path, HEAD_BYTES, confine)
        except OSError:
            return False
        verdict = recognised(head, self.formats, self.forced)
        if len(self._seen) < 100_000 or known is not None:
            self._seen[path] = (info.st_ino, min(len(head), HEAD_BYTES), verdict, time.monotonic())
        return verdict

    def settled(self, path: str) -> bool:
        """Whether a file event naming `path` cannot change its verdict: judged whole, or judged less than
        RECHECK_S ago (a growing stdout is looked at again at most that often, and at every periodic walk)."""
        known = self._seen.get(path)
        return known is not None and (known[2] is not False or known[1] >= HEAD_BYTES
                                      or time.monotonic() - known[3] < RECHECK_S)


def _head(path: Union[str, Path], size: int, confine: Optional[str]) -> bytes:
    """The first `size` bytes of a file found by the walk, opened as its follower would (`open_confined`: a file
    swapped for a link out, or for a FIFO, since it was listed is not read, and never blocks the walk)."""
    from mstail.tailer.inputs.follower import open_confined  # here: `mstail parse` of a file walks no folder and imports no follower

    fd = open_confined(path, confine)
    try:
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)


def _callback_jsonl(path: Path, confine: Optional[str]) -> Optional[bool]:
    """Whether a `.jsonl` file holds mstail.callback records: its first line is a JSON object with a `step` or a
    `kind`. None while it has no whole first line yet (a run just started: asked again at the next walk)."""
    try:
        head = _head(path, JSONL_HEAD_BYTES, confine)
    except OSError:
        return None
    end = head.find(b"\n")
    if end < 0:
        return None if len(head) < JSONL_HEAD_BYTES else False
    try:
        first = json.loads(head[:end])
    except ValueError:
        return False
    # (`mstail parse` output holds steps too, but each row names its source)
    return isinstance(first, dict) and ("step" in first or "kind" in first) and "source" not in first


def _entry_name(entry: "os.DirEntry[str]") -> str:
    return entry.name


def _run_file(root: Path, label: str, path: Path, parts: Tuple[str, ...], kind: str,
              confine: Optional[str]) -> RunFile:
    """Name a file below `root` (its `parts` there) by its run and rank (see the module's docstring)."""
    folders, name = list(parts[:-1]), parts[-1]
    if _RANK_DIR.match(path.parent.name):
        rank = path.parent.name  # (its folder, or the root itself when the root is the rank's folder)
        folders = folders[:-1]
    elif kind == "events":
        rank = ""  # TensorBoard's own layout: the folder holding event files is the run
    else:
        rank = os.path.splitext(name)[0]
    layout: List[str] = []
    while folders and _LAYOUT_DIR.match(folders[-1]):
        layout.insert(0, folders.pop())
    run = "/".join(folders) or label
    tail = [rank] if rank else []
    names = ["/".join([run, *tail]), "/".join([run, *layout, *tail]), "/".join([run, *parts[len(folders):]])]
    return RunFile(path=path, kind=kind, run=visible(run), names=tuple(dict.fromkeys(map(visible, names))),
                   confine=confine)


def _root_labels(roots: Sequence[Path]) -> List[str]:
    """The name of each folder given as a run: its own, or the nearest above its rank and layout folders
    (`exp1/output/log` -> `exp1`); two alike are told apart by the folder as given."""
    labels = []
    for root in roots:
        resolved = root.resolve()
        while (_LAYOUT_DIR.match(resolved.name) or _RANK_DIR.match(resolved.name)) and resolved.parent != resolved:
            resolved = resolved.parent
        labels.append(resolved.name or str(resolved))
    return [label if labels.count(label) == 1 else str(root).rstrip("/") or label
            for label, root in zip(labels, roots)]


class RunFinder:
    """The run files below some folders, found again on every `find()` (new runs and ranks appear while training).

    Args:
        folders: the folders given (`mstail DIR`, `--logdir`); each must exist (`check_folder`) when the CLI starts.
        formats, forced: what text logs named by no convention are looked at with (`recognised`; `forced`: the
            `--format` one); none (default) = only the files named by a convention are found.
        heads_time_s: how long one `find()` may judge such logs (HEADS_TIME_S for the sidecar); None (default) =
            no limit (`mstail parse DIR`: every one is judged).
        follow_symlinks: open links whose real path leaves the folder (default False: said once, left out).
        max_depth, max_entries, max_files: the walk's bounds (MAX_DEPTH, MAX_ENTRIES, MAX_FILES); a walk a bound
            cut is said once on stderr.
    """

    def __init__(self, folders: Sequence[str], formats: Sequence[Format] = (), forced: Optional[Format] = None,
                 follow_symlinks: bool = False, heads_time_s: Optional[float] = None, max_depth: int = MAX_DEPTH,
                 max_entries: int = MAX_ENTRIES, max_files: int = MAX_FILES) -> None:
        self.roots = [Path(os.path.abspath(os.path.expanduser(f))) for f in folders]
        self._resolved = [root.resolve() for root in self.roots]  # file events name paths below either form
        self._judge = _HeadJudge(formats, forced, heads_time_s) if formats else None
        self.follow_symlinks = follow_symlinks
        self._unrecognised: List[str] = []  # text logs no format recognised, found by the walk in progress
        self._labels = _root_labels(self.roots)
        self.max_depth, self.max_entries, self.max_files = max_depth, max_entries, max_files
        self._not_callback: Set[Path] = set()  # .jsonl files seen holding other JSON (a data set): never again
        self._left_out: Set[Path] = set()  # info.log files of runs read through their worker logs
        self._said: Set[Tuple[str, str]] = set()
        #: the folders the last `find()` found no run file below (the page says it waits for them)
        self.empty: List[Path] = []

    def watch_roots(self) -> Set[Tuple[Path, bool]]:
        """(folder, recursive) pairs for the file watcher: every given folder, recursively."""
        return {(root.resolve(), True) for root in self.roots if root.is_dir()}

    def may_name(self, path: str) -> bool:
        """Whether a path a file event names may be a new run file, or a new folder that may hold one."""
        candidate = Path(path)
        if candidate in self._left_out or candidate in self._not_callback:
            return False  # written all along, never followed: its events must not make the tailer walk again
        if not any(root == candidate or root in candidate.parents for root in self.roots + self._resolved):
            return False
        if self._judge is not None and _text_log(candidate.name):
            return not self._judge.settled(path)
        return _kind(path) is not None or os.path.isdir(path)

    def find(self) -> List[RunFile]:
        """Every run file below the folders now, in a stable order (folder by folder, names sorted). A run with
        msrun worker logs is read through them, not through its MindFormers `rank_*/info.log`: the worker log
        holds the same step lines (stdout) plus what only stdout and stderr get (tracebacks since MindFormers 1.6,
        LossMonitor prints, C++ errors), and msrun creates it before the training creates info.log."""
        found: List[RunFile] = []
        budget = [self.max_entries]
        self.empty = []
        if self._judge is not None:
            self._judge.start_walk()
        for root, label in zip(self.roots, self._labels):
            before = len(found)
            confine = None if self.follow_symlinks else os.path.realpath(root)
            event_folders: Set[Tuple[str, ...]] = set()
            for parts, kind in self._walk(root, budget):
                if len(found) >= self.max_files:
                    self._say("files", str(root), f"more than {self.max_files} run files below {root}: the others are "
                              "not followed (give a folder closer to the runs)")
                    break
                path = root.joinpath(*parts)
                if (kind == "jsonl" and not self._is_callback(path, confine)
                        or kind == "events" and parts[:-1] in event_folders):
                    continue  # (a folder of event files is one source: each writer's new file continues it)
                if kind == "events":
                    event_folders.add(parts[:-1])
                found.append(_run_file(root, label, path, parts, kind, confine))
            if len(found) == before:
                self.empty.append(root)
        self._say_unrecognised()
        with_workers = {f.run for f in found if _WORKER_LOG.match(f.path.name)}
        kept = [f for f in found if not (f.run in with_workers and f.path.name == "info.log")]
        if len(self._left_out) < 100_000:
            self._left_out.update(f.path for f in found if f.run in with_workers and f.path.name == "info.log")
        for run in sorted(with_workers.intersection(f.run for f in found if f.path.name == "info.log")):
            self._say("workers", run, f"{run}: read through its msrun worker_*.log; its rank_*/info.log repeat the "
                      "same steps and are left out (--log PATH follows one too)", logging.INFO)
        return kept

    def _is_callback(self, path: Path, confine: Optional[str]) -> bool:
        if path in self._not_callback:
            return False
        verdict = _callback_jsonl(path, confine)
        if verdict is False and len(self._not_callback) < 100_000:
            self._not_callback.add(path)
        return bool(verdict)

    def _say_unrecognised(self) -> None:
        """The text logs the walk found no format for, each said once, in one notice per walk."""
        new = [path for path in self._unrecognised if ("unrecognised", path) not in self._said]
        self._unrecognised = []
        if not new or len(self._said) >= 100_000:  # (bounded: past that many, no more are named)
            return
        for path in new:
            self._said.add(("unrecognised", path))
        more = f" and {len(new) - MAX_NAMED} more" if len(new) > MAX_NAMED else ""
        log.warning("not followed, no format recognises a step in the first 64 KiB of %s%s (a shorter one is looked "
                    "at again as it grows; see why: `mstail parse FILE --explain`, or give --pattern 'REGEX' with "
                    "named groups)", ", ".join(map(visible, new[:MAX_NAMED])), more)

    def _kind_of(self, entry: "os.DirEntry[str]", real_root: str) -> Optional[str]:
        """`_kind`, or `text` for a text log named by no convention whose head a format recognises (read only below
        `real_root`, unless `follow_symlinks`)."""
        kind = _kind(entry.path)
        if kind is not None or self._judge is None or not _text_log(entry.name):
            return kind
        try:
            verdict = self._judge(entry.path, entry.stat(), None if self.follow_symlinks else real_root)
        except OSError:
            return None
        if verdict is LATER:
            self._say("heads", "", "many text logs to look at for a format: some are looked at in the next walks "
                      "(every 10 s)", logging.INFO)
        elif verdict is False and len(self._unrecognised) < 100_000:
            self._unrecognised.append(entry.path)
        return "text" if verdict is True else None

    def _leaves(self, entry: "os.DirEntry[str]", real_root: str) -> bool:
        """Whether an entry is a link whose real path leaves the folder given (said once; False with
        `follow_symlinks`)."""
        if self.follow_symlinks or not entry.is_symlink():
            return False
        target = os.path.realpath(entry.path)
        if within(target, real_root):
            return False
        self._say("outside", entry.path, f"{visible(entry.path)} is a link to {visible(target)}, outside "
                  f"{visible(real_root)}: not opened (--follow-symlinks opens such links)")
        return True

    def _walk(self, root: Path, budget: List[int]) -> Iterator[Tuple[Tuple[str, ...], str]]:
        """(path below `root` as parts, kind) of the run files, depth first in name order; symlinked folders once (by
        device and inode), links out of `root` only with `follow_symlinks`."""
        seen: Set[Tuple[int, int]] = set()
        real_root = os.path.realpath(root)
        stack: List[Tuple[str, Tuple[str, ...]]] = [(str(root), ())]
        while stack:
            folder, below = stack.pop()
            try:
                info = os.stat(folder)
                if (info.st_dev, info.st_ino) in seen:
                    continue  # a link back up (a loop) or a second link to a folder already walked
                seen.add((info.st_dev, info.st_ino))
                with os.scandir(folder) as listing:
                    entries = sorted(listing, key=_entry_name)
            except FileNotFoundError:
                continue  # gone since it was listed (a run folder removed)
            except OSError as exc:
                self._say("unreadable", folder, f"cannot look into {folder} ({exc.strerror or exc}); skipped")
                continue
            budget[0] -= len(entries)
            if budget[0] < 0:
                self._say("entries", str(root), f"stopped looking below {root} after {self.max_entries} entries: "
                          "some runs may be missing (give a folder closer to the runs)")
                return
            folders = []
            for entry in entries:
                try:
                    if self._leaves(entry, real_root):
                        continue
                    is_folder = entry.is_dir()  # through a symlink: a linked run folder is walked (once)
                    is_file = not is_folder and entry.is_file()
                except OSError:
                    continue
                if is_folder:
                    if entry.name.startswith("."):
                        continue
                    if len(below) + 1 > self.max_depth:
                        self._say("depth", str(root), f"folders more than {self.max_depth} levels below {root} are not "
                                  "looked into (give a folder closer to the runs)")
                        continue
                    folders.append((entry.path, below + (entry.name,)))
                elif is_file:
                    kind = self._kind_of(entry, real_root)
                    if kind is not None:
                        yield below + (entry.name,), kind
            stack.extend(reversed(folders))

    def _say(self, what: str, where: str, message: str, level: int = logging.WARNING) -> None:
        """Say a bound, an unreadable folder or a choice once (per kind and folder) on stderr."""
        if (what, where) not in self._said and len(self._said) < 10_000:
            self._said.add((what, where))
            log.log(level, "%s", message)

