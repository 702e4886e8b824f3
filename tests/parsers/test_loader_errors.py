"""Bad format files fail before anything runs, with one message naming the file, the rule and the reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from mstail.parsers import FormatError, SourceParser, load_format_file, load_formats, pattern_format

ROOT = Path(__file__).resolve().parents[2]

GOOD_RULE = """
[[rule]]
name = "step_line"
regex = 'step (?P<step>\\d+) loss (?P<loss>\\S+)'
"""

# (id, TOML text, rule named in the message or None, a fragment of the reason)
BAD = [
    ("malformed TOML", "name = \"x\"\n[[rule]\nregex = 'a'\n", None, "not valid TOML"),
    ("bad regex", "[[rule]]\nname = \"step_line\"\nregex = 'step (?P<step>\\d+'\n", "step_line", "bad regex"),
    ("bad regex in a prefix", "[[prefix]]\nname = \"envelope\"\nregex = '(?P<message>.*'\n" + GOOD_RULE, "envelope",
     "bad regex"),
    ("unknown type",
     "[[rule]]\nname = \"step_line\"\nregex = 'step (?P<step>\\d+) loss (?P<loss>\\S+)'\nfields.loss = \"decimal\"\n",
     "step_line", "unknown type 'decimal'"),
    ("no step source", "[[rule]]\nname = \"loss_only\"\nregex = 'loss (?P<loss>\\S+)'\n", "loss_only",
     "no step source"),
    ("reserved metric name (rename)",
     "[[rule]]\nname = \"step_line\"\nregex = 'step (?P<step>\\d+) at (?P<t>\\S+)'\n"
     "fields.t = { type = \"float\", rename = \"time\" }\n", "step_line", "'time' is a reserved name"),
    ("reserved metric name (group)", "[[rule]]\nname = \"step_line\"\nregex = 'step (?P<step>\\d+) (?P<source>\\S+)'\n",
     "step_line", "'source' is a reserved name"),
    ("reserved metric name (segment)",
     "[[rule]]\nname = \"step_line\"\nregex = 'step (?P<step>\\d+) (?P<segment>\\d+)'\n", "step_line",
     "'segment' is a reserved name"),
    ("unknown top-level key", "nmae = \"x\"\n" + GOOD_RULE, None, "unknown top-level key 'nmae'"),
    ("unknown rule key",
     "[[rule]]\nname = \"step_line\"\nregex = 'step (?P<step>\\d+)'\nwaitfor = [\"progress\"]\n", "step_line",
     "unknown rule key 'waitfor'"),
    ("unknown field key",
     "[[rule]]\nname = \"step_line\"\nregex = 'step (?P<step>\\d+) loss (?P<loss>\\S+)'\n"
     "fields.loss = { type = \"float\", renme = \"x\" }\n", "step_line", "unknown key of fields.loss 'renme'"),
    ("unknown prefix key",
     "[[prefix]]\nname = \"envelope\"\nregex = '(?P<message>.*)'\nformat = \"x\"\n" + GOOD_RULE, "envelope",
     "unknown prefix key 'format'"),
    ("unknown kind", "[[rule]]\nname = \"step_line\"\nkind = \"records\"\nregex = 'step (?P<step>\\d+)'\n", "step_line",
     "kind must be one of"),
    ("fields names a missing group",
     "[[rule]]\nname = \"step_line\"\nregex = 'step (?P<step>\\d+)'\nfields.loss = \"float\"\n", "step_line",
     "fields.loss names no (?P<loss>...) group"),
    ("two rules with one name", GOOD_RULE + GOOD_RULE, "step_line", "two rules share this name"),
    ("event rule without an event kind",
     GOOD_RULE + "[[rule]]\nname = \"done\"\nkind = \"event\"\nregex = 'finished'\n", "done", "needs event ="),
    ("prefix without a message group", "[[prefix]]\nname = \"envelope\"\nregex = '^\\S+ '\n" + GOOD_RULE, "envelope",
     "(?P<message>...)"),
    ("prefix time without time_format", "[[prefix]]\nname = \"envelope\"\nregex = '^(?P<time>\\S+) (?P<message>.*)'\n"
     + GOOD_RULE, "envelope", "needs time_format"),
    ("no record rule", "[[rule]]\nname = \"done\"\nkind = \"event\"\nevent = \"end\"\nregex = 'finished'\n", None,
     "no rule with kind = \"record\""),
    ("no rules at all", "description = \"empty\"\n", None, "no [[rule]] tables"),
    ("bad name", "name = \"my format\"\n" + GOOD_RULE, None, "name must be"),
    # keys added for the PyNative / eval / checkpoint formats
    ("unknown type lists pydict",
     "[[rule]]\nname = \"step_line\"\nregex = 'step (?P<step>\\d+) (?P<x>\\S+)'\nfields.x = \"dict\"\n", "step_line",
     "(use float, int, bool, str, duration, pydict)"),
    ("null is not a list",
     "[[rule]]\nname = \"step_line\"\nregex = 'step (?P<step>\\d+) (?P<x>\\S+)'\nfields.x = { null = \"NaN\" }\n",
     "step_line", "null must be a list of strings"),
    ("pydict with a unit",
     "[[rule]]\nname = \"step_line\"\nregex = 'step (?P<step>\\d+) (?P<x>\\{.*\\})'\n"
     "fields.x = { type = \"pydict\", unit = \"y\" }\n", "step_line", "unknown key of fields.x (type pydict) 'unit'"),
    ("pydict with a rename that is no table",
     "[[rule]]\nname = \"step_line\"\nregex = 'step (?P<step>\\d+) (?P<x>\\{.*\\})'\n"
     "fields.x = { type = \"pydict\", rename = \"y\" }\n", "step_line", "fields.x: rename must be a table of names"),
    ("pairs field with an unknown type",
     "[[rule]]\nname = \"step_line\"\nregex = 'step (?P<step>\\d+)(?P<_rest>.*)'\n"
     "[rule.pairs]\ngroup = \"_rest\"\nregex = ' (?P<name>\\w+)=(?P<value>\\S+)'\nfields.lr = { type = \"number\" }\n",
     "step_line", "pairs.fields.lr: unknown type 'number'"),
    ("fallback jsonl",
     "fallback = true\njsonl = true\n", None, "fallback and jsonl exclude each other"),
    ("pydict prefix not a name",
     "[[rule]]\nname = \"step_line\"\nregex = 'step (?P<step>\\d+) (?P<x>\\{.*\\})'\n"
     "fields.x = { type = \"pydict\", prefix = \"eval-\" }\n", "step_line", "prefix must be letters"),
    ("pairs group missing",
     "[[rule]]\nname = \"step_line\"\nregex = 'step (?P<step>\\d+)(?P<_tail>.*)'\n"
     "pairs = { group = \"tail\", regex = '(?P<name>\\w+): (?P<value>\\S+)' }\n", "step_line", "pairs.group must name"),
    ("pairs regex without name/value",
     "[[rule]]\nname = \"step_line\"\nregex = 'step (?P<step>\\d+)(?P<_tail>.*)'\n"
     "pairs = { group = \"_tail\", regex = '(?P<key>\\w+): (?P<value>\\S+)' }\n", "step_line",
     "(?P<name>...) and (?P<value>...)"),
    ("pairs unknown key",
     "[[rule]]\nname = \"step_line\"\nregex = 'step (?P<step>\\d+)(?P<_tail>.*)'\n"
     "pairs = { group = \"_tail\", regex = '(?P<name>\\w+): (?P<value>\\S+)', rename = \"x\" }\n", "step_line",
     "unknown key of pairs 'rename'"),
    ("pairs bad regex",
     "[[rule]]\nname = \"step_line\"\nregex = 'step (?P<step>\\d+)(?P<_tail>.*)'\n"
     "pairs = { group = \"_tail\", regex = '(?P<name>\\w+' }\n", "step_line", "bad regex"),
    ("record on a record rule",
     "[[rule]]\nname = \"step_line\"\nrecord = true\nregex = 'step (?P<step>\\d+)'\n", "step_line",
     "record and same_step_as are options of event rules"),
    ("record not a bool", GOOD_RULE + "[[rule]]\nname = \"ev\"\nkind = \"event\"\nevent = \"eval\"\nrecord = \"yes\"\nregex = 'x'\n", "ev", "record must be a bool"),
    ("epoch_length on an event rule", GOOD_RULE + "[[rule]]\nname = \"ev\"\nkind = \"event\"\nevent = \"eval\"\nepoch_length = [\"a\", \"b\"]\nregex = '(?P<a>\\d+) (?P<b>\\d+)'\n",
     "ev", "epoch_length is an option of attach rules"),
    ("epoch_length names no metric",
     GOOD_RULE + "[[rule]]\nname = \"tm\"\nkind = \"attach\"\nepoch_length = [\"epoch_ms\", \"step_ms\"]\n"
     "regex = 'epoch (?P<epoch_ms>\\S+) step (?P<step_time_ms>\\S+)'\n", "tm", "epoch_length must name two metrics"),
]


@pytest.mark.parametrize("text,rule,reason", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_format_file_names_file_rule_and_reason(
    tmp_path: Path, text: str, rule: Optional[str], reason: str
) -> None:
    path = tmp_path / "my_format.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(FormatError) as info:
        load_format_file(path)
    message = str(info.value)
    assert message.startswith(str(path) + ": "), message
    assert reason in message, message
    if rule is not None:
        assert f"rule '{rule}'" in message, message
        assert info.value.rule == rule
    assert info.value.origin == str(path)
    assert "\n" not in message


@pytest.mark.parametrize("text,rule,reason", [b[1:] for b in BAD[:6]], ids=[b[0] for b in BAD[:6]])
def test_bad_files_fail_load_formats_too(tmp_path: Path, text: str, rule: Optional[str], reason: str) -> None:
    """--formats FILE and a file in the user folder fail the same way, before anything runs."""
    bad = tmp_path / "bad.toml"
    bad.write_text(text, encoding="utf-8")
    with pytest.raises(FormatError, match=reason.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        load_formats(files=[bad], user_dir=tmp_path / "empty")
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "bad.toml").write_text(text, encoding="utf-8")
    with pytest.raises(FormatError) as info:
        load_formats(user_dir=folder)
    assert str(info.value).startswith(str(folder / "bad.toml"))


def test_unreadable_and_non_utf8_files(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="cannot read"):
        load_format_file(tmp_path / "missing.toml")
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b"description = \"caf\xe9\"\n")
    with pytest.raises(FormatError, match="not UTF-8") as info:
        load_format_file(latin)
    assert str(info.value).startswith(str(latin))


@pytest.mark.parametrize(
    "regex,reason",
    [
        ("step (\\d+) loss (\\S+)", "no named groups"),
        ("step (?P<step>\\d+", "bad regex"),
        ("(?P<step>\\d+) (?P<time>\\S+)", "'time' is a reserved name"),
    ],
)
def test_pattern_errors_name_the_pattern(regex: str, reason: str) -> None:
    with pytest.raises(FormatError) as info:
        pattern_format(regex)
    assert str(info.value).startswith("--pattern: rule 'pattern': ")
    assert reason in str(info.value)


def test_a_good_user_format_loads_and_replaces_a_builtin_of_its_name(tmp_path: Path) -> None:
    """The positive control for the cases above: the same shapes, valid, parse lines."""
    path = tmp_path / "mindspore.toml"
    path.write_text(
        "description = \"my trainer\"\npriority = 50\n"
        "[[prefix]]\nname = \"stamp\"\nregex = '^(?P<time>\\d+\\.\\d+) (?P<level>\\w+) (?P<message>.*)$'\n"
        "time_format = \"unix\"\n"
        "[[rule]]\nname = \"step_line\"\nregex = 'step (?P<step>\\d+) loss (?P<loss>\\S+) took (?P<ms>\\S+)'\n"
        "fields.ms = { type = \"float\", rename = \"step_time_ms\", unit = \"s\", scale = 1000 }\n",
        encoding="utf-8",
    )
    formats = load_formats(files=[path], user_dir=tmp_path / "none")
    assert [f.name for f in formats].count("mindspore") == 1
    assert formats[0].origin == str(path)
    parser = SourceParser(formats)
    items = parser.feed("1764672000.25 INFO step 7 loss nan took 0.5s", 1, 0.0)
    items += parser.flush(0.0, force=True)
    assert len(items) == 1 and items[0].kind == "record"
    record = items[0].data
    assert record["step"] == 7 and record["time"] == 1764672000.25 and record["step_time_ms"] == 500.0
    assert record["loss"] != record["loss"]  # NaN kept


@pytest.mark.slow  # runs `python -m mstail`
def test_cli_reports_a_bad_format_file_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        "[[rule]]\nname = \"step_line\"\nregex = 'step (?P<step>\\d+) (?P<x>\\S+)'\nfields.x = \"decimal\"\n",
        encoding="utf-8",
    )
    log = tmp_path / "train.log"
    log.write_text("step 1 loss 2.0\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "mstail", "parse", str(log), "--formats", str(bad)],
        capture_output=True, text=True, cwd=str(ROOT), timeout=60,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(bad) in lines[0] and "rule 'step_line'" in lines[0] and "unknown type 'decimal'" in lines[0]
    assert "Traceback" not in result.stderr
