"""The literals the built-in formats declare (`literal` in a rule) are held by every line their rule matches, on every
line the tests know: the sample and real logs, the chunk-boundary log, and every text in the parser tests. A wrong
literal would make `mstail parse` and the catch-up skip lines a rule matches (`parsers.blocks`)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mstail.parsers import FormatError, load_format_file
from mstail.parsers.blocks import finder_for
from mstail.parsers.interleave import _TAG, TAG_TEXTS, part_of
from mstail.parsers.prefilter import LineFinder

from tests.parsers.support import FORMATS, ROOT, SAMPLES

TESTS = ROOT / "tests"


def corpus() -> Iterator[str]:
    for path in sorted(SAMPLES.iterdir()) + sorted((TESTS / "real_logs").glob("*.log")):
        if path.suffix in (".log", ".jsonl"):
            yield from path.read_text(encoding="utf-8", errors="replace").splitlines()
    for path in sorted((TESTS / "parsers").glob("test_*.py")) + [TESTS / "tailer" / "test_offline_chains.py"]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                yield from node.value.splitlines()
    from tests.tailer.test_offline_chains import mixed_log

    yield from mixed_log()


def test_every_line_a_built_in_rule_matches_holds_its_literal() -> None:
    matched: Dict[str, int] = {}
    for text in set(corpus()):
        for fmt in FORMATS:
            if fmt.jsonl or fmt.fallback:  # a fallback format never locks a file: the fast path never runs for it
                continue
            messages = [text] + [m["message"] for m in (p.regex.match(text) for p in fmt.prefixes) if m is not None]
            for rule in fmt.rules:
                if rule.kind == "ignore":
                    continue
                for message in messages:
                    if rule.regex.search(message):
                        assert any(literal in message for literal in rule.literal), (fmt.name, rule.name, message)
                        matched[f"{fmt.name} {rule.name}"] = matched.get(f"{fmt.name} {rule.name}", 0) + 1
    declared = {f"{fmt.name} {rule.name}" for fmt in FORMATS for rule in fmt.rules if rule.literal}
    assert len(matched) >= len(declared) - 3, sorted(declared - set(matched))  # nearly every rule met lines


def test_every_built_in_text_format_can_skip_lines() -> None:
    for fmt in FORMATS:
        assert (finder_for(fmt) is None) == (fmt.jsonl or fmt.fallback), fmt.name


def test_a_user_format_takes_every_line(tmp_path: Path) -> None:
    """A user's regexes run with a time limit that may count a line in `slow_lines` whatever it holds."""
    path = tmp_path / "mine.toml"
    path.write_text("[[rule]]\nname = 's'\nregex = '^step (?P<step>\\d+)'\nliteral = 'step '\n", encoding="utf-8")
    assert finder_for(load_format_file(path)) is None


@pytest.mark.parametrize("value", ["''", "3", "['a', '']", '"a\\nb"'])
def test_a_bad_literal_is_one_error(tmp_path: Path, value: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(f"[[rule]]\nname = 's'\nregex = '^step (?P<step>\\d+)'\nliteral = {value}\n", encoding="utf-8")
    with pytest.raises(FormatError, match="rule 's': literal must be"):
        load_format_file(path)


def test_the_finder_finds_every_line_holding_a_text_in_any_case_where_asked() -> None:
    block = b"a\nxx needle\nNEEDLE\nloss\nLoSs: 1\nlo\xc5\xbfs\nplain\n"
    finder = LineFinder([b"needle"], [b"loss"])
    lines = block.split(b"\n")
    starts = [sum(len(line) + 1 for line in lines[:i]) for i in (1, 3, 4)]
    assert finder.starts(block) == starts
    assert LineFinder([b"needle", "\u017f".encode()], [b"loss"]).starts(block) == starts + [starts[-1] + 8]


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.text(alphabet="abLOSsx[{: \u017f", max_size=12), min_size=1, max_size=30),
       exact=st.lists(st.text(alphabet="abLOSsx[{: ", min_size=1, max_size=4), max_size=5),
       skip=st.integers(min_value=0, max_value=30))
def test_the_finder_finds_the_lines_a_search_line_by_line_finds(lines, exact, skip) -> None:  # type: ignore[no-untyped-def]
    """All texts in one pass (overlapping texts, one a prefix of another, several on a line, case variants), from any
    line start on: the lines that hold one of them, each once, in order."""
    block = "".join(line + "\n" for line in lines).encode("utf-8")
    needles = [text.encode("utf-8") for text in exact] + [b"\xc5\xbf"]
    pos = sum(len(line.encode("utf-8")) + 1 for line in lines[:skip])
    want, at = [], 0
    for line in block.split(b"\n")[:-1]:
        if at >= pos and (any(needle in line for needle in needles) or b"los" in line.lower()):
            want.append(at)
        at += len(line) + 1
    assert LineFinder(needles, [b"los"]).starts(block, pos) == want


@pytest.mark.parametrize("line", ["[rank3]: x", "[default12]:x", "[1,3]<stdout>: x", "[0,15]<stderr>:x", "[rank0]:"])
def test_every_launcher_tag_holds_a_tag_text(line: str) -> None:
    """Tagged lines go to another part's parser, so the fast path must feed them: it finds them by `TAG_TEXTS`."""
    assert part_of(line) is not None
    assert any(text.decode() in line for text in TAG_TEXTS)


@settings(max_examples=500, deadline=None)
@given(st.from_regex(_TAG, fullmatch=False))
def test_every_line_a_tag_matches_holds_a_tag_text(line: str) -> None:
    assume(part_of(line) is not None)
    assert any(text.decode() in line for text in TAG_TEXTS)
