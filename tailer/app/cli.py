"""The `mstail` command: a thin layer from argv to `Config` and the functions that do the work.

    mstail --log PATH [--log PATH ...]   follow logs and serve the page (same as `mstail serve`)
    mstail DIR [DIR ...]                 follow the runs below folders (same as --logdir DIR)
    mstail parse LOG|DIR... --to jsonl|csv   legacy logs, offline
    mstail formats                       list the input kinds and the formats, and where each came from
    mstail demo                          a simulated training, followed and served
    mstail state list|prune              the kept histories (state files), and removing old ones
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import math
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Iterator, List, NoReturn, Optional, Sequence, Tuple

from mstail.parsers import Format, FormatError, format_table, load_formats
from mstail.parsers.derived import DerivedError, load_derived

from mstail.tailer.config import Config
from mstail.tailer.inputs.discovery import visible
from mstail.tailer.notices import no_format_hint

if TYPE_CHECKING:
    from mstail.tailer.alerts.engine import AlertRules
    from mstail.tailer.history.statedirs import State
    from mstail.tailer.outbound.webhooks import Target

COMMANDS = ("serve", "parse", "formats", "demo", "state")

#: the log files `mstail state list` shows of each state (then a count of the others)
STATE_LOGS_SHOWN = 3

#: `mstail demo --ranks` at most (a writer thread each)
DEMO_RANKS_MAX = 1024

#: `mstail parse`'s exit status when a log with lines in it matched no format (the others are parsed all the same)
UNRECOGNISED = 3


class _VisibleFormatter(logging.Formatter):
    """Messages as `discovery.visible` shows them: a path or a name from disk holding escape sequences or newlines
    must not act on the terminal or forge a line of its own on stderr (a traceback after a message stays as is)."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # logging's name
        record.message = visible(record.message)
        return super().formatMessage(record)


class UsageError(Exception):
    """A mistake on the command line: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose mistakes (a bad option value, an unknown option) are one line and exit status 2
    rather than the whole usage and then the line that matters."""

    #: the command whose --help the error points to (the top parser's own errors are about the command's options)
    command = ""

    def error(self, message: str) -> "NoReturn":
        prog = f"{self.prog} {self.command}" if self.command else self.prog
        self.exit(2, f"mstail: error: {visible(message)} (see `{prog} --help`)\n")


def main(argv: Optional[Sequence[str]] = None) -> int:
    if os.environ.get("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION") == "python" and "google.protobuf" not in sys.modules:
        # MindSpore's import sets this for its whole process and the processes it starts; event files decoded by
        # protobuf's pure-Python code cost tens of times its C code's CPU, beyond the bounds crafted files are held to
        del os.environ["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"]
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or args_list[0] not in COMMANDS + ("-h", "--help", "--version"):
        args_list.insert(0, "serve")  # `mstail --log FILE` means `mstail serve --log FILE`
    parser = _build_parser()
    parser.command = args_list[0] if args_list[0] in COMMANDS else ""
    args = parser.parse_args(args_list)
    logging.basicConfig(level=logging.WARNING, format="mstail: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.setFormatter(_VisibleFormatter("mstail: %(message)s"))
    logging.getLogger("mstail").setLevel(logging.INFO)  # mstail's own notices show too: a file found, its format
    try:
        return args.run(args)
    except (UsageError, FormatError, DerivedError) as exc:
        print(f"mstail: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `mstail parse LOG | head`: the reader left; that is not an error. Silence the final flush too.
        sys.stdout = open(os.devnull, "w")
        return 0


# -- commands ---------------------------------------------------------------------------------------------
def _serve(args: argparse.Namespace) -> int:
    from mstail.tailer.inputs.runs import FolderError, check_folder

    folders = tuple(args.folders or ()) + _flat(args.logdir)
    try:
        for folder in folders:
            check_folder(folder)
    except FolderError as exc:
        raise UsageError(str(exc)) from None
    for given in _flat(args.log) + _flat(args.jsonl):  # (`--log a.log DIR`: argparse hands DIR to --log)
        if os.path.isdir(os.path.expanduser(given)):
            raise UsageError(f"{given} is a folder: follow the runs below it with `mstail {given}` (before any --log) "
                             f"or --logdir {given}, or give the logs in it, e.g. --log '{given}/*.log'")
    config = _config(args, logs=_flat(args.log), jsonl=_flat(args.jsonl), format=args.format, logdirs=folders)
    config = dataclasses.replace(config, follow_symlinks=args.follow_symlinks,
                                 peers=_peers(args.peer or (), args.peers), peer_token=_peer_token(args.peer_token_file))
    if not config.logs and not config.jsonl and not config.logdirs and not config.peers:
        raise UsageError("nothing to follow: give a folder of runs (mstail DIR), or --log PATH (a file or a quoted "
                         "glob such as 'output/log/rank_*/info.log'), or node mstails with --peer URL")
    return _run_server(config, _formats(args, config.format))


def _demo(args: argparse.Namespace) -> int:
    import shutil
    import tempfile

    from mstail.tailer.app.demo import start_demo

    if not 1 <= args.ranks <= DEMO_RANKS_MAX:
        raise UsageError(f"--ranks needs a whole number from 1 to {DEMO_RANKS_MAX}")
    _positive(args.step_time, "--step-time")
    with _sigterm_as_exit():
        folder = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="mstail-demo-"))
        trainings: list = []
        try:
            log_dir = folder / "output" / "log"
            config = _config(args, logs=(str(log_dir / "rank_*" / "info.log"),))
            if not args.dir and not args.state_dir:
                config = dataclasses.replace(config, persist=False)  # a new folder every run: nothing to resume
            formats = _formats(args, None)
            trainings = start_demo(log_dir, ranks=args.ranks, step_s=args.step_time)
            kept = "" if args.dir else " (a temporary folder, removed on exit; --dir DIR keeps the logs)"
            print(f"mstail: demo training writes {log_dir}/rank_*/info.log{kept}", file=sys.stderr)
            return _run_server(config, formats)
        finally:
            for training in trainings:
                training.stop()
            if not args.dir:  # Ctrl-C, SIGTERM, an error: the temporary folder goes, every time
                shutil.rmtree(folder, ignore_errors=True)


def _parse(args: argparse.Namespace) -> int:
    from mstail.tailer.offline import InputError, OutputError, ParseError, chains, output, run_explain, run_parse

    formats = _formats(args, args.format)
    forced = format_table(formats)[args.format] if args.format else None
    try:
        with _sigterm_as_exit():
            groups = chains(args.logs, formats, forced, args.follow_symlinks)
            # -o is checked against every file read (rotated backups too) before it is opened; it is written to a
            # temporary file renamed over OUT at the end, so an error, Ctrl-C or SIGTERM leaves no partial OUT.
            with output(args.output, inputs=[path for group in groups for path in group.files]) as out:
                if args.explain:
                    run_explain(groups, formats, forced, out)
                    return 0
                summary = run_parse(groups, formats, forced, args.to, out, with_events=args.events,
                                    derived=load_derived(args.derived))
    except FileNotFoundError as exc:
        raise UsageError(f"no such log file: {exc.filename or exc.args[0]}") from None
    except (InputError, OutputError) as exc:
        raise UsageError(str(exc)) from None
    except ParseError as exc:  # a worker process failed: one line, its chain named
        print(f"mstail: {exc}", file=sys.stderr)
        return 1
    detected = ", ".join(f"{source}: {fmt}" for source, fmt in summary.formats.items())
    print(
        f"mstail: {summary.files} file(s), {summary.records} records, {summary.events} events, "
        f"{summary.unmatched} unmatched metric-looking lines ({detected})",
        file=sys.stderr,
    )
    for source, (path, unmatched) in summary.unrecognised.items():
        print(f"mstail: {visible(source)}: {visible(no_format_hint(path, unmatched))}", file=sys.stderr)
    return UNRECOGNISED if summary.unrecognised else 0


def _list_formats(args: argparse.Namespace) -> int:
    from mstail.tailer.inputs.runs import INPUT_KINDS

    print("input kinds:")
    for kind, what in INPUT_KINDS:
        print(f"  {kind:<22} {what}")
    print("text formats:")
    for fmt in _formats(args, None):
        print(f"  {fmt.name:<22} {fmt.origin:<12} {fmt.description}")
    return 0


def _state_list(args: argparse.Namespace) -> int:
    from mstail.tailer.history.statedirs import human_size, log_gone

    folder, states = _states(args)
    print(f"state folder: {folder} ({len(states)} state{'s' if len(states) != 1 else ''})")
    for state in states:
        status = f"set aside ({state.aside})" if state.aside else "in use" if state.in_use else "idle"
        print(f"{_when(state.last_use)}  {human_size(state.size):>9}  {status:<22}  {visible(state.path.name)}")
        logs = state.logs or []
        for log in logs[:STATE_LOGS_SHOWN]:
            where = "  (gone)" if log_gone(log) else "" if os.path.isabs(log) else "  (relative to where mstail ran)"
            print(f"    {visible(log)}{where}")
        if len(logs) > STATE_LOGS_SHOWN:
            print(f"    ... and {len(logs) - STATE_LOGS_SHOWN} more")
        if state.logs is None:
            print("    (its logs cannot be read from it)")
    return 0


def _state_prune(args: argparse.Namespace) -> int:
    from mstail.tailer.history.statedirs import StateDirError, human_size, parse_age, remove, to_prune

    if args.older_than is None and not args.missing_logs:
        raise UsageError("say which states to remove: --older-than AGE (e.g. 30d), --missing-logs, or both")
    try:
        older_than = parse_age(args.older_than) if args.older_than is not None else None
    except StateDirError as exc:
        raise UsageError(str(exc)) from None
    folder, states = _states(args)
    chosen = to_prune(states, older_than, args.missing_logs)
    freed, failed = 0, 0
    for state in chosen:
        why = "its logs are gone" if args.missing_logs and state.logs_gone else f"last used {_when(state.last_use)}"
        if args.dry_run:
            print(f"would remove {visible(state.path.name)} ({human_size(state.size)}; {why})")
            continue
        removed, problem = remove(state)
        if removed:
            freed += state.size
            print(f"removed {visible(state.path.name)} ({human_size(state.size)}; {why})")
        else:
            failed += 1
            print(f"mstail: kept {visible(state.path.name)}: {problem}", file=sys.stderr)
    held = sum(1 for state in states if state.in_use)
    done = f"{len(chosen)} state(s) would be removed" if args.dry_run else \
        f"{len(chosen) - failed} state(s) removed, {human_size(freed)} freed"
    print(f"mstail: {done} from {folder}" + (f"; {held} in use by a running mstail kept" if held else ""),
          file=sys.stderr)
    return 1 if failed else 0


def _states(args: argparse.Namespace) -> Tuple[Path, List["State"]]:
    """The state folder (--state-dir, else the default) and the states in it."""
    from mstail.tailer.app.state import default_state_dir
    from mstail.tailer.history.statedirs import StateDirError, find_states

    folder = (Path(args.state_dir).expanduser() if args.state_dir else default_state_dir()).absolute()
    try:
        return folder, find_states(folder)
    except StateDirError as exc:
        raise UsageError(str(exc)) from None


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))


# -- helpers ----------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """SIGTERM ends the command the way Ctrl-C does, through every `finally` (temporary files and folders go),
    with exit status 143 (while a server runs, `serve` gives SIGTERM Ctrl-C's path itself)."""

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():  # only the main thread may set a handler
        yield
        return
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _flat(groups: Optional[Sequence[Sequence[str]]]) -> Tuple[str, ...]:
    """`--log a b --log c` -> (a, b, c): several paths after one option are what an unquoted glob becomes."""
    return tuple(path for group in groups or () for path in group)


def _formats(args: argparse.Namespace, wanted: Optional[str]) -> List[Format]:
    formats = load_formats(files=args.formats or (), patterns=args.pattern or ())
    if wanted and wanted not in format_table(formats):
        names = ", ".join(f.name for f in formats)
        raise UsageError(f"unknown format {wanted!r} (known: {names}; see `mstail formats`)")
    return formats


def _config(args: argparse.Namespace, logs: Tuple[str, ...], jsonl: Tuple[str, ...] = (),
            format: Optional[str] = None, logdirs: Tuple[str, ...] = ()) -> Config:
    """The server options of `serve` and `demo` (their own options come as arguments), checked and resolved:
    alert rules loaded and webhook targets parsed here, once, so a mistake is one line before anything starts."""
    from mstail.web.access import is_loopback_host

    if args.poll is not None:
        _positive(args.poll, "--poll")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port} is out of range: give 1 to 65535, or 0 for any free port")
    token = _token(args.token)
    if "*" in (args.cors_origin or ()) and token is None and is_loopback_host(args.host):
        raise UsageError("--cors-origin '*' without a token lets any web page read this server's data: give --token "
                         "TOKEN (or $MSTAIL_TOKEN) too, or name the origin, e.g. --cors-origin https://grafana.example:3000")
    config = Config(
        logs=logs,
        jsonl=jsonl,
        logdirs=logdirs,
        format=format,
        format_files=tuple(args.formats or ()),
        patterns=tuple(args.pattern or ()),
        derived=load_derived(args.derived),
        host=args.host,
        port=args.port,
        open_browser=args.open,
        poll_s=args.poll,
        token=token,
        cors_origins=tuple(args.cors_origin or ()),
        send_timeout_s=_positive(args.send_timeout, "--send-timeout"),
        state_dir=args.state_dir,
        persist=not args.no_state,
        alert_rules=None if args.no_alerts else _alert_rules(args.alerts),
        webhooks=_webhook_targets(args.webhook or (), args.webhook_file or (), args.webhook_env or ()),
        remote_write=_url("--remote-write", args.remote_write, args.remote_write_file, "MSTAIL_REMOTE_WRITE"),
        alertmanager=_alertmanagers(args.alertmanager or (), args.alertmanager_file),
        alertmanager_repost_s=_positive(args.alertmanager_interval, "--alertmanager-interval"),
        node=args.node,
        max_connections=args.max_connections,
        max_streams=args.max_streams,
        header_timeout_s=_positive(args.header_timeout, "--header-timeout"),
    )
    return _auto_poll(config)


def _auto_poll(config: Config) -> Config:
    """Logs on a network filesystem (NFS, CIFS, Lustre, ...): file events miss what other nodes write, so
    read on a timer, as `--poll 1` would (an explicit --poll wins). Says which paths and why on stderr."""
    from mstail.tailer.inputs.netfs import network_paths

    found = network_paths(config.logs + config.jsonl + config.logdirs) if config.poll_s is None else []
    if not found:
        return config
    for pattern, fstype in found:
        print(f"mstail: {pattern} is on a network filesystem ({fstype})", file=sys.stderr)
    print(f"mstail: reading every {config.network_poll_s:g} s on a timer: file events miss writes from other "
          "nodes (--poll SECONDS sets the interval)", file=sys.stderr)
    return dataclasses.replace(config, poll_s=config.network_poll_s)


def _alert_rules(path: Optional[str]) -> "AlertRules":
    from mstail.tailer.alerts.engine import AlertConfigError, load_alert_rules

    try:
        return load_alert_rules(path)
    except AlertConfigError as exc:
        raise UsageError(f"alerts file {exc}") from None


def _webhook_targets(values: Sequence[str], files: Sequence[str] = (), env_names: Sequence[str] = ()) -> Tuple["Target", ...]:
    from mstail.tailer.outbound.webhooks import WebhookError, read_targets

    try:
        return read_targets(values, files, env_names)
    except WebhookError as exc:
        raise UsageError(str(exc)) from None


def _url(option: str, value: Optional[str], path: Optional[str] = None, env: Optional[str] = None) -> Optional[str]:
    from mstail.tailer.outbound.remotewrite import UrlError, read_url

    try:
        return read_url(option, value, path, env)
    except UrlError as exc:
        raise UsageError(str(exc)) from None


def _alertmanagers(values: Sequence[str], path: Optional[str]) -> Tuple[str, ...]:
    """The `--alertmanager` URLs, else the one of `--alertmanager-file` or $MSTAIL_ALERTMANAGER."""
    if values:
        return tuple(_url("--alertmanager", value) or "" for value in values)
    url = _url("--alertmanager", None, path, "MSTAIL_ALERTMANAGER")
    return (url,) if url else ()


def _peers(values: Sequence[str], path: Optional[str]) -> Tuple[Tuple[str, str], ...]:
    """(name, URL) of each node mstail: `--peer [NAME=]URL` and the lines of `--peers FILE` (# comments); a node
    without a name is called by its host:port."""
    from mstail.tailer.inputs.peer import peer_name

    given = [(value, "--peer") for value in values]
    if path is not None:
        try:
            text = Path(path).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--peers {path}: cannot read it ({exc})") from None
        lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
        given += [(line, f"--peers {path}") for line in lines if line]
    out: Dict[str, str] = {}
    for value, where in given:
        name, _, url = value.partition("=") if "=" in value.split("://", 1)[0] else ("", "", value)
        name, url = name.strip(), url.strip()  # (`node-3 = http://...` in a file)
        if not re.fullmatch(r"https?://[^/\s]+/?", url):
            raise UsageError(f"{where} {value!r}: give a node mstail's base URL, e.g. http://node-3:6150 "
                             "(optionally NAME=URL)")
        name = name or peer_name(url)
        if not re.fullmatch(r"[A-Za-z0-9._:-]{1,64}", name):
            raise UsageError(f"{where} {value!r}: a node's name takes 1 to 64 of A-Z a-z 0-9 . _ : - (its sources "
                             "are NAME/<id>)")
        if name in out:
            raise UsageError(f"{where}: two nodes named {name!r}; name them, e.g. node-3={url}")
        out[name] = url.rstrip("/")
    return tuple(out.items())


def _peer_token(path: Optional[str]) -> Optional[str]:
    """The node mstails' token: the first line of `--peer-token-file`, else $MSTAIL_PEER_TOKEN (never an option's
    value: `ps` would show it)."""
    if path is None:
        return _token(os.environ.get("MSTAIL_PEER_TOKEN"), "$MSTAIL_PEER_TOKEN")
    try:
        lines = Path(path).expanduser().read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--peer-token-file {path}: cannot read it ({exc})") from None
    token = _token(lines[0].strip() if lines else "", f"--peer-token-file {path}")
    if token is None:
        raise UsageError(f"--peer-token-file {path} is empty: its first line is the node mstails' token")
    return token


def _positive(value: float, option: str) -> float:
    if not (value > 0 and math.isfinite(value)):  # (nan and inf parse as floats too)
        raise UsageError(f"{option} needs a positive number of seconds")
    return value


def _token(token: Optional[str], where: str = "--token") -> Optional[str]:
    if not token:
        return None
    if not re.fullmatch(r"[A-Za-z0-9._~+/=-]{16,512}", token):
        raise UsageError(f"{where} needs 16 to 512 characters from A-Z a-z 0-9 . _ ~ + / = - "
                         "(leave it out on a non-loopback --host and mstail makes one)")
    return token


def with_token(config: Config) -> Tuple[Config, bool]:
    """A host other than loopback never serves without a token: one is made if none was given.
    Returns the config to run and whether its token was made here (then it is printed in the URL)."""
    from mstail.web.access import is_loopback_host, new_token

    if config.token is None and not is_loopback_host(config.host):
        return dataclasses.replace(config, token=new_token()), True
    return config, False


def _run_server(config: Config, formats: Sequence[Format]) -> int:
    import asyncio  # here, not at the top: `mstail parse` and `formats` start faster without it

    from mstail.tailer.app.state import open_state
    from mstail.tailer.history.db import StateError

    config, generated = with_token(config)
    try:
        state = open_state(config, formats)  # its integrity check runs while the server's modules are imported
    except StateError as exc:
        raise UsageError(str(exc)) from None
    from mstail.tailer.inputs.discovery import expand
    from mstail.tailer.app.pageurl import other_urls
    from mstail.tailer.app.serve import ServeError, bind, serve, url_of

    try:
        sock = bind(config.host, config.port)
    except ServeError as exc:
        state.close()
        raise UsageError(str(exc)) from None
    patterns = config.logs + config.jsonl
    found = sum(1 for p in patterns for f in expand(p) if f.is_file())
    files = f"{found} file{'s' if found != 1 else ''}"
    if config.logdirs:  # walked by the tailer's first pass, which says what it finds (or that it waits)
        following = f"following {files + ' and ' if patterns else ''}the runs below {', '.join(config.logdirs)}"
    else:
        following = f"following {files}" + ("" if found else ", waiting for the files to appear")
    if config.peers:
        nodes = f"{len(config.peers)} node mstail{'s' if len(config.peers) != 1 else ''}"
        following = following.replace("following ", f"following {nodes} and ", 1) if patterns or config.logdirs \
            else f"following {nodes}"

    address = url_of(sock)
    elsewhere = other_urls(*sock.getsockname()[:2])  # bound to all addresses: the machine's name and addresses
    announced: List[bool] = []  # once, by the first server that starts: one that starts over (below) serves the same address

    def announce() -> None:
        if announced:
            return
        announced.append(True)
        query = f"/?token={config.token}" if generated else ""
        if generated:
            following_ = f"{following}; every request needs this token, or 'Authorization: Bearer TOKEN'"
        else:
            following_ = following + ("; token required" if config.token else "")
        print(f"mstail: serving {address}{query}  ({following_})", flush=True)
        if elsewhere:
            print(f"mstail: from other machines: {', '.join(url + query for url in elsewhere)}", flush=True)
        if state.path is not None:
            print(f"mstail: history kept in {state.path} (--no-state: keep none)", file=sys.stderr, flush=True)

    try:
        again = asyncio.run(serve(config, formats, sock, on_started=announce, state=state))
        # The state failed its check after its history was served: the same address, over a fresh state (which is
        # closed clean, so trusted by the next opening), the browser not opened twice.
        config = dataclasses.replace(config, open_browser=False)
        while again is not None:
            again = asyncio.run(serve(config, formats, again, on_started=announce))
    except KeyboardInterrupt:
        pass
    return 0


class _Version(argparse.Action):
    """`--version`: the version looked up only when asked (importlib.metadata costs every command 40 ms to start)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show program's version number and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: object, values: object,
                 option_string: Optional[str] = None) -> None:
        from mstail import __version__

        sys.stdout.write(f"mstail {__version__}\n")
        parser.exit()


def _build_parser() -> _Parser:
    parser = _Parser(
        prog="mstail",
        description="Live curves from MindSpore/MindFormers training logs. "
        "`mstail --log output/log/rank_0/info.log` follows the log and serves a dashboard.",
        epilog="Without a command, `serve` is meant: see `mstail serve --help` for --log, --port, --poll and the rest.",
    )
    parser.add_argument("--version", action=_Version)
    commands = parser.add_subparsers(dest="command", metavar="{serve,parse,formats,demo,state}")

    def format_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--formats", action="append", metavar="FILE.toml", help="load a format file (repeatable); "
                       "files in ~/.config/mstail/formats/ are loaded too")
        p.add_argument("--pattern", action="append", metavar="REGEX", help="ad hoc format: a regex whose named "
                       "groups become metrics, e.g. 'step (?P<step>\\d+) loss (?P<loss>\\S+)' (repeatable)")

    def derived_option(p: argparse.ArgumentParser) -> None:
        p.add_argument("--derived", metavar="FILE.toml", help="derived series computed from each record's metrics, "
                       "e.g. tokens_per_s = \"samples_per_s * seq_length\" (see README, Derived series); perplexity = "
                       "exp(loss) is built in")

    def server_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--host", default=Config.host, help=f"address to listen on (default: {Config.host}, this "
                       "machine only)")
        p.add_argument("--port", type=int, default=Config.port, help=f"port (default: {Config.port}; 0 = any free port)")
        p.add_argument("--open", action="store_true", help="open the page in a browser")
        p.add_argument("--token", default=os.environ.get("MSTAIL_TOKEN") or None, metavar="TOKEN",
                       help="access token every request must carry (Authorization: Bearer, or ?token= once in the "
                       "browser); default $MSTAIL_TOKEN; on a non-loopback --host a random one is made and printed")
        p.add_argument("--send-timeout", type=float, default=Config.send_timeout_s, metavar="SECONDS",
                       help=f"drop a live-stream client that accepts no data for this long (default: {Config.send_timeout_s:g})")
        p.add_argument("--cors-origin", action="append", metavar="ORIGIN", help="let this origin "
                       "(e.g. https://grafana.example:3000) read the API from its pages (repeatable; default: none)")
        p.add_argument("--alerts", metavar="FILE.toml", help="alert rules overriding the built-ins (per rule; "
                       "`enabled = false` switches one off); see README, Alerts")
        p.add_argument("--no-alerts", action="store_true", help="run no alert rules")
        p.add_argument("--webhook", action="append", metavar="[FORMAT=]URL", help="POST alerts here (repeatable); "
                       "FORMAT: generic (default), feishu, dingtalk, wecom, slack (guessed from the host)")
        p.add_argument("--webhook-file", action="append", metavar="PATH", help="webhooks from a file, one [FORMAT=]URL "
                       "a line, # comments (repeatable): their secret tokens stay off the command line `ps` shows")
        p.add_argument("--webhook-env", action="append", metavar="NAME", help="webhooks from this environment variable, "
                       "whitespace-separated [FORMAT=]URL values (repeatable; default: $MSTAIL_WEBHOOKS when set)")
        p.add_argument("--remote-write", metavar="URL", help="send every record's metrics to this Prometheus remote "
                       "write endpoint (e.g. http://prometheus:9090/api/v1/write); see README, Many nodes")
        p.add_argument("--remote-write-file", metavar="PATH", help="the --remote-write URL from a file (its first "
                       "line; default: $MSTAIL_REMOTE_WRITE when set): a secret in it stays off the command line")
        p.add_argument("--alertmanager", action="append", metavar="URL", help="post alerts to this Alertmanager "
                       "(e.g. http://alertmanager:9093; repeatable for every member of a cluster)")
        p.add_argument("--alertmanager-file", metavar="PATH", help="the --alertmanager URL from a file (its first "
                       "line; default: $MSTAIL_ALERTMANAGER when set)")
        p.add_argument("--alertmanager-interval", type=float, default=Config.alertmanager_repost_s, metavar="SECONDS",
                       help="post firing alerts to Alertmanager again this often (default: "
                       f"{Config.alertmanager_repost_s:g}; keep it below Alertmanager's resolve_timeout)")
        p.add_argument("--node", metavar="NAME", help="this node's name in remote write samples and Alertmanager "
                       "labels (default: the host's name)")

        def count(text: str) -> int:
            if not text.isdigit() or int(text) < 1:
                raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
            return int(text)

        p.add_argument("--max-connections", type=count, default=Config.max_connections, metavar="N",
                       help=f"open connections at most; one more closes the one idle longest (default: "
                       f"{Config.max_connections}, lowered to fit the open-file limit)")
        p.add_argument("--max-streams", type=count, default=Config.max_streams, metavar="N",
                       help=f"live-stream clients at most; one more gets a 503 (default: {Config.max_streams})")
        p.add_argument("--header-timeout", type=float, default=Config.header_timeout_s, metavar="SECONDS",
                       help="close a connection that has not sent a whole request line and headers this long after "
                       f"connecting or after its previous answer (default: {Config.header_timeout_s:g})")
        p.add_argument("--state-dir", metavar="DIR", help="where the history and read positions are kept, so a "
                       "restarted mstail resumes with nothing lost or repeated (default: $MSTAIL_STATE_DIR or "
                       "~/.local/state/mstail; local disk, outside the log folders)")
        p.add_argument("--no-state", action="store_true", help="keep no history across restarts (a restart "
                       "reads the logs from the start again)")
        p.add_argument("--poll", type=float, metavar="SECONDS", help="read on a timer only, ignoring file events "
                       "(for NFS/shared storage written from other nodes)")
        format_options(p)
        derived_option(p)

    serve_p = commands.add_parser("serve", help="follow logs and serve the dashboard (the default command)",
                                  description="Follow training logs from the start (history) and then live; serve the page.")
    serve_p.add_argument("folders", nargs="*", metavar="DIR", help="folders of runs: the MindFormers, msrun, JSONL "
                         "and event files below each, runs that appear later included (same as --logdir DIR)")
    serve_p.add_argument("--logdir", action="append", nargs="+", metavar="DIR", help="a folder of runs (repeatable)")
    serve_p.add_argument("--log", action="append", nargs="+", metavar="PATH", help="log files or quoted globs "
                         "('output/log/rank_*/info.log'); files may appear later; repeatable")
    serve_p.add_argument("--jsonl", action="append", nargs="+", metavar="PATH", help="JSONL files written by "
                         "mstail.callback (repeatable)")
    serve_p.add_argument("--format", metavar="NAME", help="use this format for every --log file instead of detecting it")
    serve_p.add_argument("--follow-symlinks", action="store_true", help="below a folder of runs, also open links "
                         "whose real path leaves the folder (default: said once, not opened)")
    serve_p.add_argument("--peer", action="append", metavar="[NAME=]URL", help="follow a node mstail through its "
                         "stream (repeatable): its sources are NAME/<id> here (NAME: default its host:port)")
    serve_p.add_argument("--peers", metavar="FILE", help="node mstails to follow, one [NAME=]URL a line (# comments)")
    serve_p.add_argument("--peer-token-file", metavar="PATH", help="the node mstails' token (its first line; "
                         "default: $MSTAIL_PEER_TOKEN when set)")
    server_options(serve_p)
    serve_p.set_defaults(run=_serve)

    parse_p = commands.add_parser("parse", help="parse finished logs to JSONL or CSV",
                                  description="Parse logs offline. Rotated chains (info.log.5 ... info.log) are read "
                                  "oldest first as one source; a folder gives the runs below it, each file named by "
                                  "its run and rank. A summary goes to stderr.",
                                  epilog=f"Exit status: 0 when every log was parsed; {UNRECOGNISED} when a log with "
                                  "lines in it matched no format (the others are parsed all the same, and a line on "
                                  "stderr names it with what to try); 1 when a log could not be read; 2 for a mistake "
                                  "on the command line.")
    parse_p.add_argument("logs", nargs="+", metavar="LOG", help="log files, globs or folders of runs")
    parse_p.add_argument("--format", metavar="NAME", help="format name (default: detect per file)")
    parse_p.add_argument("--follow-symlinks", action="store_true", help="below a folder of runs, also read links "
                         "whose real path leaves the folder (default: said once, not read)")
    parse_p.add_argument("--to", choices=("jsonl", "csv"), default="jsonl", help="output format (default: jsonl)")
    parse_p.add_argument("-o", "--output", metavar="OUT", help="output file, replaced only once the parse has "
                         "succeeded; never one of the LOGs (default: stdout)")
    parse_p.add_argument("--events", action="store_true", help="also write events (checkpoint, error, end ...)")
    parse_p.add_argument("--explain", action="store_true", help="instead of records: line by line, which rule matched "
                         "and what it extracted, and lines that look like metrics but matched nothing")
    format_options(parse_p)
    derived_option(parse_p)
    parse_p.set_defaults(run=_parse)

    formats_p = commands.add_parser("formats", help="list the input kinds and the formats, and where each came from")
    format_options(formats_p)
    formats_p.set_defaults(run=_list_formats)

    demo_p = commands.add_parser("demo", help="watch a simulated training live (no training needed)",
                                 description="A simulated MindFormers training writes real-format logs; mstail follows and serves them.")
    demo_p.add_argument("--dir", help="where the simulated run writes output/log, kept (default: a new temporary "
                        "folder, removed on exit)")
    demo_p.add_argument("--ranks", type=int, default=2, help="simulated ranks (default: 2)")
    demo_p.add_argument("--step-time", type=float, default=0.2, metavar="SECONDS", help="seconds per step (default: 0.2)")
    server_options(demo_p)
    demo_p.set_defaults(run=_demo)
    _state_parser(commands)
    return parser


def _state_parser(commands: "argparse._SubParsersAction") -> None:
    state_p = commands.add_parser("state", help="list the kept histories (state files), or remove old ones",
                                  description="The history and read positions mstail keeps per set of followed logs "
                                  "(see --state-dir). A state a running mstail holds is never removed.")
    actions = state_p.add_subparsers(dest="action", metavar="{list,prune}")
    actions.required = True

    def folder_option(p: argparse.ArgumentParser) -> None:
        p.add_argument("--state-dir", metavar="DIR", help="the state folder (default: $MSTAIL_STATE_DIR or "
                       "~/.local/state/mstail)")

    list_p = actions.add_parser("list", help="each state: last use, size, in use or not, the logs it is of",
                                description="Each state, least recently used first: when it was last written, its "
                                "size, whether a running mstail holds it, and the log files it holds the history of.")
    folder_option(list_p)
    list_p.set_defaults(run=_state_list)
    prune_p = actions.add_parser("prune", help="remove states unused for a while, or whose logs are gone",
                                 description="Remove the states matching --older-than or --missing-logs (either "
                                 "suffices), except those a running mstail holds.")
    prune_p.add_argument("--older-than", metavar="AGE", help="states last written longer ago than AGE: 30d, 12h, "
                         "90m, 2w (a number alone: days)")
    prune_p.add_argument("--missing-logs", action="store_true", help="states whose log files all no longer exist")
    prune_p.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    folder_option(prune_p)
    prune_p.set_defaults(run=_state_prune)
