"""Bounded time per line: every regex that the built-in formats and the parser engine run on a log line takes time
linear in the line, so no line up to the line cap (1 MiB: tailer/inputs/lines.py cuts longer ones) can stall the sidecar.

The regexes are enumerated, not listed: every one a built-in format holds (`Format.regexes`: prefixes, rules, the
pairs' regexes) and every module-level pattern of mstail.parsers, so a new rule or a new helper pattern is covered
without touching this file. Each gets adversarial lines: FILLERS and the regex's own literals repeated to the cap,
alone and after valid beginnings of real lines it matches (sample_logs/, tests/real_logs/, the lines the parser tests
hold), cut at every field boundary; with and without a final "x". Each call must take less than BUDGET_S: the best
of 3, each timed by `time.perf_counter` and by the thread's CPU clock, the smaller counting (on a shared machine a
busy neighbour stretches the wall clock, not the work). A busy neighbour on the other hyperthread of the core slows
the CPU clock too: a call over BUDGET_S is timed again against twice the reference pass (REFERENCE) timed just then,
in the same thread. Every case is tried on short lines first, so a regex that has become quadratic fails in seconds
instead of running for hours at the cap.

A user's regexes are not held to this: they run with a time limit instead (parsers/bounded.py,
tests/hostile/test_regex_freeze.py).
"""

from __future__ import annotations

import ast
import importlib
import itertools
import pkgutil
import re
import time
from functools import lru_cache
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Sequence, Set, Tuple

import pytest

import mstail.parsers
from mstail.parsers import builtin_formats, pyliteral
from mstail.parsers.loader import MAX_PAIR_NAME, MAX_PAIRS, MISSED_CHARS
from mstail.tailer.inputs.lines import LineSplitter

ROOT = Path(__file__).resolve().parents[2]
LINE_CAP = LineSplitter().max_line_bytes  # 1 MiB; the fillers are ASCII, so characters are bytes
#: One backtracking pass of ` *` over 1 MiB of spaces before a `[-+\w.]+` value costs 50-60 ms of CPU in CPython's `re`
#: (each step checks a Unicode class); a regex under twice that touches each character a few times at most. A
#: quadratic one needs hours at the cap.
BUDGET_S = 0.100
REFERENCE = re.compile(r" *[-+\w.]+"), " " * LINE_CAP  # that pass: the budget is 4x it, on a loaded machine too
SCREEN = (4096, 16384, 65536)  # sizes every case is tried at first; over the budget there means hopeless at the cap
AT_CAP = 3  # the slowest cases of a regex at 64 KiB that are tried at the cap, besides those that grew faster than
#             linearly from 16 to 64 KiB or would reach half the budget at the cap if linear
MAX_SHOWN = 10  # a regex with this many cases over the budget is not tried further
#: Patterns that never see a whole line: the longest text they are given. pyliteral._UNSAFE: dict keys of a text
#: parse_pydict takes (64 KiB at most); the generic reader's pairs: its step rule's `_pairs` group, `.{0,4096}` (tried
#: at every word start, that regex costs about 1 s per MiB; tests/parsers/test_generic.py holds the group's bound).
GENERIC_PAIRS_CHARS = 4096
INPUT_CAPS = {"pyliteral._UNSAFE": pyliteral.MAX_CHARS, "generic rule step_line pairs.regex": GENERIC_PAIRS_CHARS,
              "loader._NOT_WORD": MAX_PAIR_NAME,  # a pair's name (with its unit): longer ones are skipped
              "loader._PAIR_LOOKING": MISSED_CHARS}  # the start of a pairs group, where unread pairs are looked for

#: What adversarial lines are made of: what the built-in regexes look for, repeated.
FILLERS = (
    "loss", " loss is", " ", "\t", "0", "a", "_", "[", "]", "{", "}", " }", ", ", ":", ": ", "=", ".", "e-", "nan",
    "a: 1, ", "x ", "\x1b[", "\x1b",
)
#: Where a real line is cut to make a valid beginning: after these (field and value boundaries).
BOUNDARIES = re.compile(r", |: |[\[\](){}|/=:]| (?=\S)")
#: Real renderings the sample logs lack, for the module-level patterns (and the rules, which ignore what they
#: do not match).
EXTRA_SAMPLES = (
    "[rank3]: x", "[default12]:x", "[1,3]<stdout>: x", "\x1b[31mred\x1b[0m", "\x1b]0;title\x07", "1 day, 2:03:04.5",
    "0:28:22", "2026-01-20-03:15:44.908.089", "loss is 2.5", "lm loss: [ 2.5", "{'rouge-1': 0.5}",
    "Checkpoint saved at step 1000 to /out/checkpoint (async=False, remove_redundancy=False)",
    "Epoch 1 finished. Time: 123.45s", "(?<loss>\\S+)",
    "Epoch:[  1/  2], step:[    5/  100], loss:[2.345/2.401], time:512.345 ms, lr:0.0001, overflow cond: False, "
    "loss_scale: 1.0",
    "loss_vs_samples", "learning-rate vs samples",  # tensorboardX's "vs samples" twins of MindFormers' tags
)

Case = Tuple[str, str, str]  # (valid beginning, filler, end)


def builtin_regexes() -> Iterator[Tuple[str, str, "re.Pattern[str]"]]:
    """(where, how it is called, pattern) for every distinct regex a built-in format holds (formats share prefixes
    and rules) and every module-level pattern of mstail.parsers (`sub`, which scans the whole text: each of them is
    used with `sub`, `search` or `match`, none costlier)."""
    seen: Dict[Tuple[str, str], List[str]] = {}
    found: List[Tuple[List[str], str, "re.Pattern[str]"]] = []
    for fmt in builtin_formats():
        for where, how, pattern in fmt.regexes():
            key = (how, pattern.pattern)
            if key not in seen:
                seen[key] = []
                found.append((seen[key], how, pattern))
            seen[key].append(f"{fmt.name} {where}")
    for wheres, how, pattern in found:
        yield " = ".join(wheres), how, pattern
    for info in pkgutil.iter_modules(mstail.parsers.__path__):
        module = importlib.import_module(f"mstail.parsers.{info.name}")
        for name, value in sorted(vars(module).items()):
            if isinstance(value, re.Pattern):
                yield f"{info.name}.{name}", "sub", value


REGEXES = list(builtin_regexes())


def call_of(how: str, pattern: "re.Pattern[str]") -> Callable[[str], object]:
    if how == "finditer":  # the pairs: at most MAX_PAIRS of a line are read
        return lambda text: sum(1 for _ in itertools.islice(pattern.finditer(text), MAX_PAIRS))
    if how == "sub":
        return lambda text: pattern.sub("", text)
    return getattr(pattern, how)


@lru_cache(maxsize=None)
def sample_texts() -> Tuple[str, ...]:
    """Real lines, the messages the built-in prefixes leave of them, and the string constants of the parser tests."""
    lines: Set[str] = set(EXTRA_SAMPLES)
    for path in sorted([*ROOT.glob("sample_logs/*.log"), *ROOT.glob("tests/real_logs/*.log")]):
        lines.update(path.read_text(encoding="utf-8", errors="replace").splitlines())
    for path in sorted(ROOT.glob("tests/parsers/test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and 8 <= len(node.value) <= 2000:
                lines.update(node.value.splitlines())
    messages = set(lines)
    for fmt in builtin_formats():
        for prefix in fmt.prefixes:
            for line in lines:
                found = prefix.regex.match(line)
                if found is not None:
                    messages.add(found["message"])
    return tuple(sorted(messages))


def literals(pattern: str) -> Set[str]:
    """Runs of two or more literal characters in a regex's source (`{ Epoch:[`, `, per_step_time:`)."""
    found, run, i = set(), "", 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern) and not pattern[i + 1].isalnum():
            run, i = run + pattern[i + 1], i + 2
            continue
        if char not in "\\.^$*+?{}|()[]":
            run, i = run + char, i + 1
            continue
        if len(run) >= 2:
            found.add(run)
        run = ""
        if char == "[":  # a class: skip it whole
            i += 2 if pattern[i + 1:i + 2] == "]" else 1
            while i < len(pattern) and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
        elif char == "(" and pattern[i + 1:i + 2] == "?":  # a group's header: (?P<name>, (?:, (?=, (?<!
            header = re.match(r"\(\?(?:P<\w+>|<[=!]|[:=!]|[a-zA-Z]+\)|P=\w+\))", pattern[i:])
            i += len(header.group(0)) - 1 if header else 0
        elif char == "\\":
            i += 1
        i += 1
    if len(run) >= 2:
        found.add(run)
    return found


def cases(how: str, pattern: "re.Pattern[str]") -> List[Case]:
    """Valid beginnings (the real text it matches with the most groups taking part, cut after every boundary) x
    fillers (and the regex's literals) x ends."""
    beginnings = {""}
    found = sample(how, pattern)
    if found is not None:
        text, end = found
        beginnings.update(text[:cut.end()] for cut in BOUNDARIES.finditer(text, 0, end))
        beginnings.add(text[:end])
    fillers = sorted(set(FILLERS) | literals(pattern.pattern))
    return [(begin, filler, end) for begin in sorted(beginnings) for filler in fillers for end in ("", "x")]


def sample(how: str, pattern: "re.Pattern[str]") -> "Tuple[str, int] | None":
    """The sample text the pattern matches with the most groups taking part (then the shortest match, then the first),
    and where that match ends; None if it matches none."""
    test = pattern.match if how == "match" else pattern.search
    best = None
    for text in sample_texts():
        found = test(text)
        if found is not None:
            rank = (sum(group is not None for group in found.groups()), found.start() - found.end())
            if best is None or rank > best[0]:
                best = (rank, text, found.end())
    return None if best is None else (best[1], best[2])


def line(case: Case, size: int) -> str:
    begin, filler, end = case
    return begin + filler * max(1, (size - len(begin) - len(end)) // len(filler)) + end


def timed(call: Callable[[str], object], text: str, tries: int = 3, enough: float = BUDGET_S) -> float:
    """The best of up to `tries` timings (the first under `enough` is enough), each the smaller of the wall clock
    (`perf_counter`) and the thread's CPU time."""
    best = float("inf")
    for _ in range(tries):
        wall, cpu = time.perf_counter(), time.thread_time()
        call(text)
        best = min(best, time.perf_counter() - wall, time.thread_time() - cpu)
        if best < enough:
            break
    return best


def budget_now() -> float:
    """BUDGET_S, or 4x the reference pass (best of 3) if the machine's load makes that longer now: a neighbour on
    the other core (an SMT sibling) slows a 1 MiB line's linear pass by half again, and a line near the budget when
    quiet (about 100 ns a character) went over it; a backtracking regex takes seconds there, whatever the load."""
    pattern, text = REFERENCE
    return max(BUDGET_S, 4 * timed(pattern.match, text, enough=0.0))


def over_budget(call: Callable[[str], object], text: str) -> bool:
    """Whether `call` takes the budget or longer on `text`: best of 3, then against the budget as the load allows."""
    return timed(call, text) >= BUDGET_S and timed(call, text) >= budget_now()


def slowest(call: Callable[[str], object], all_cases: Sequence[Case], cap: int = LINE_CAP) \
        -> List[Tuple[float, int, Case]]:
    """(seconds, size, case), slowest first: every case at the SCREEN sizes (a case over the budget there stops at
    that size), then at the cap the AT_CAP slowest at the last screen, those that grew faster than linearly, and
    those that would reach half the budget at the cap even if linear."""
    over, screened = [], []
    sizes = [size for size in SCREEN if size < cap]
    if len(sizes) < 2:  # a small cap (GENERIC_PAIRS_CHARS): screen at a sixteenth and a quarter of it
        sizes = [cap // 16, cap // 4]
    for case in all_cases:
        took = {}
        for size in sizes:
            took[size] = timed(call, line(case, size), tries=1)
            if took[size] >= BUDGET_S and over_budget(call, line(case, size)):
                over.append((took[size], size, case))
                break
        else:
            screened.append((took, case))
        if len(over) >= MAX_SHOWN:
            return sorted(over, reverse=True)
    small, large = sizes[-2:]
    screened.sort(key=lambda entry: entry[0][large], reverse=True)
    results = []
    faster_than_linear = 1.5 * large / small
    for rank, (took, case) in enumerate(screened):
        grew = took[large] / max(took[small], 1e-6) > faster_than_linear
        if grew:  # timings this short are noisy: ask again, best of 3
            grew = timed(call, line(case, large)) / max(timed(call, line(case, small)), 1e-6) > faster_than_linear
        if rank < AT_CAP or grew or took[large] * cap / large >= BUDGET_S / 2:
            results.append((timed(call, line(case, cap)), cap, case))
        else:
            results.append((took[large], large, case))
    return sorted(over + results, reverse=True)


def describe(took: float, size: int, case: Case) -> str:
    begin, filler, end = case
    return f"{took * 1000:8.2f} ms  {size // 1024:5d} KiB  {begin[-40:]!r} + {filler!r} * n + {end!r}"


@pytest.mark.parametrize("where,how,pattern", REGEXES, ids=[where for where, _, _ in REGEXES])
def test_each_builtin_regex_takes_linear_time_up_to_the_line_cap(where: str, how: str, pattern: "re.Pattern[str]") \
        -> None:
    call = call_of(how, pattern)
    results = slowest(call, cases(how, pattern), INPUT_CAPS.get(where, LINE_CAP))
    print(f"\n{where} ({how}, {len(results)} cases), slowest:")
    for result in results[:3]:
        print(describe(*result))
    over = [describe(*result) for result in results
            if result[0] >= BUDGET_S and over_budget(call, line(result[2], result[1]))]
    assert not over, f"{where}: {len(over)} lines over {BUDGET_S * 1000:g} ms:\n" + "\n".join(over[:10])


def test_every_kind_of_regex_is_enumerated() -> None:
    """The enumeration reaches prefixes, rules, pairs (finditer and names) and the engine's own patterns."""
    hows: Dict[str, Set[str]] = {}
    for where, how, _ in REGEXES:
        hows.setdefault(how, set()).add(where)
    assert {"match", "search", "finditer", "fullmatch", "sub"} <= set(hows)
    names = {where for where, _, _ in REGEXES}
    assert {"engine._METRIC_LOOKING", "engine._ANSI", "interleave._TAG"} <= names and set(INPUT_CAPS) <= names
    assert any("pairs.regex" in where for where in names) and any("pairs.names" in where for where in names)
    assert len([where for where in names if " rule " in where]) >= 25  # distinct ones: formats share some


@pytest.mark.parametrize("where,how,pattern", REGEXES, ids=[where for where, _, _ in REGEXES])
def test_each_regex_has_a_real_sample(where: str, how: str, pattern: "re.Pattern[str]") -> None:
    """Valid beginnings come from real texts the regex matches: a rule without one would only be tried with
    fillers. Add a line to EXTRA_SAMPLES (or a sample log) for a new rule."""
    assert sample(how, pattern) is not None, f"{where}: no sample text matches {pattern.pattern!r}"


def test_a_line_through_the_whole_parser_stays_bounded() -> None:
    """End to end, detection over every built-in format, the issue's lines: a run of ' loss is', and a MindFormers
    step line whose loss_scale is followed by 64 Ki spaces and an `x` (42 s each before)."""
    from mstail.parsers import SourceParser, load_formats

    formats = load_formats(user_dir=ROOT / "no-such-dir")
    step = ("{ Epoch:[  1/  2], step:[    2/  400], loss:[4.849680/4.872238], per_step_time: 512ms, "
            "lr: 4e-05, overflow cond: False, loss_scale: 1")
    for text in (" loss is" * (LINE_CAP // 8), step + " " * 65536 + "x", step + " " * (LINE_CAP - len(step) - 1) + "x",
                 "[INFO] 2024-04-02 09:13:51,110 [a.py:1] f: " + "loss: " * (LINE_CAP // 6)):
        parser = SourceParser(formats)
        took = timed(lambda line: parser.feed(line, 1, 0.0), text, tries=1)
        assert took < 10 * BUDGET_S or took < 10 * budget_now(), f"{took:.3f} s for {text[:60]!r}..."


# -- A user's regexes: not proved linear, so bounded by a time limit (parsers/bounded.py) -----------------------------
BACKTRACKS = "(?P<x>a|aa)+b$"  # exponential on a run of `a`s not followed by `b`, in `re` and in `regex`
RESERVED_KEYS = {"step", "epoch", "time", "estimated", "segment", "line"}
USER_FORMAT = """
[[prefix]]
regex = '^(?P<message>.*?)(?:x|xx)+y$'
[[rule]]
name = "step"
regex = '^step (?P<step>\\d+) (?P<_rest>.*)$'
[rule.pairs]
group = "_rest"
regex = '(?P<name>(?:a|aa)+)=(?P<value>\\d+)'
[[rule]]
name = "slow"
kind = "event"
event = "odd"
regex = '""" + BACKTRACKS + """'
"""


def user_parser(text: str = USER_FORMAT):  # type: ignore[no-untyped-def]
    from mstail.parsers import SourceParser
    from mstail.parsers.loader import parse_format

    return SourceParser([parse_format(text, "mine.toml", "mine")], source="run1")


def test_a_user_regex_that_backtracks_gives_up_and_the_line_is_counted_once(caplog: pytest.LogCaptureFixture) -> None:
    from mstail.parsers import engine

    engine._WARNED.clear()
    parser = user_parser()
    began = time.process_time()  # the clock the time limit reads: a loaded machine stretches the wall clock
    with caplog.at_level("WARNING", logger="mstail.parser"):
        for number in range(1, 4):
            assert parser.feed("a" * 40, number, 0.0) == []
    took = time.process_time() - began
    assert took < 3 * 10 * 0.1, f"{took:.2f} s of CPU for three lines"  # each: one rule, 0.1 s of CPU at most
    assert parser.counts["slow_lines"] == 3 and parser.last_slow == ["mine rule 'slow'"]
    warned = [r.getMessage() for r in caplog.records if r.name == "mstail.parser"]
    assert len(warned) == 1 and "\n" not in warned[0], warned
    assert warned[0].startswith("run1: format 'mine' (mine.toml), rule 'slow': a line took longer than 0.1 s")
    items = parser.feed("step 7 x", 4, 0.0) + parser.flush(0.0, force=True)  # the next lines parse as ever
    assert [(i.kind, i.data["step"]) for i in items] == [("record", 7)] and parser.last_slow == []


def test_a_user_prefix_or_pairs_regex_that_gives_up_skips_only_itself() -> None:
    parser = user_parser()
    items = parser.feed("step 3 " + "x" * 30, 1, 0.0)  # the prefix gives up; the rule still sees the line
    items += parser.feed("step 4 " + "a" * 40 + "!=1 aa=2", 2, 0.0)  # the pairs give up: the record has no pairs
    items += parser.flush(0.0, force=True)
    assert [(i.data["step"], sorted(k for k in i.data if k not in RESERVED_KEYS)) for i in items] == [(3, []), (4, [])]
    assert parser.counts["slow_lines"] == 2
    assert parser.snapshot().counts["slow_lines"] == 2


def test_user_regexes_keep_python_re_syntax_and_errors() -> None:
    from mstail.parsers import FormatError, pattern_format
    from mstail.parsers.bounded import BoundedPattern

    fmt = pattern_format(r"^(?!skip)step (?<step>\d+) (?P<word>\w+) (?P=word) loss=(?P<loss>\S+)(?<=\d)")
    rule = fmt.rules[0]
    assert isinstance(rule.regex, BoundedPattern) and set(rule.regex.groupindex) == {"step", "word", "loss"}
    assert rule.regex.search("step 5 ab ab loss=1.5").groupdict() == {"step": "5", "word": "ab", "loss": "1.5"}
    assert rule.regex.search("skip 5 ab ab loss=1.5") is None
    with pytest.raises(FormatError, match=r"^--pattern: rule 'pattern': bad regex: missing \), unterminated"):
        pattern_format("(?P<loss>x")
    assert all(isinstance(p, re.Pattern) for fmt in builtin_formats() for _, _, p in fmt.regexes())  # built-ins: `re`


def test_a_checkpoint_from_before_slow_lines_restores() -> None:
    from mstail.parsers.engine import ParserState

    saved = ParserState().to_json()
    del saved["counts"]["slow_lines"]
    assert ParserState.from_json(saved).counts["slow_lines"] == 0
