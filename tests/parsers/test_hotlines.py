"""`parsers.hotlines` matches a line to a record or attach rule in one regex call only where the engine's two steps
(first matching prefix, then first matching rule in the message) find that same rule with the same groups: on every
line the tests know, for every built-in format, and on the lines built to catch each way the two could differ."""

from __future__ import annotations

import json
from typing import Optional

import pytest

from mstail.parsers.engine import COUNTER_GROUPS, SourceParser, _match_format
from mstail.parsers.hotlines import _top_level_bar, hot_lines
from mstail.parsers.loader import parse_format
from mstail.parsers.schema import Format

from tests.parsers.support import FORMATS
from tests.parsers.test_prefilter import corpus


def engine(fmt: Format, text: str):  # type: ignore[no-untyped-def]
    match = _match_format(fmt, text, [])
    return match if match is not None and match.rule is not None else None


def agree(fmt: Format, text: str) -> Optional[bool]:
    """True: the hot match is the engine's; None: the hot path left the line to the engine; False: they differ."""
    hot = hot_lines(fmt)
    taken = hot.match(text) if hot is not None else None
    if taken is None:
        return None
    rule, groups, clock, stamp, _ = taken
    found = engine(fmt, text)
    if found is None or found.rule is not rule or found.stamp != stamp or found.clock is not clock:
        return False
    # every group, or (a rule whose fields are handed by number) the step counters the regex has and the groups its
    # extractors read: the same texts
    read = set(COUNTER_GROUPS).union(*(extract.groups for extract in rule.extract))  # type: ignore[attr-defined]
    wanted = found.groups if len(groups) == len(found.groups) else \
        {name: value for name, value in found.groups.items() if name in read}
    return groups == wanted


def test_every_known_line_is_matched_as_the_engine_matches_it() -> None:
    lines = sorted({line for line in corpus() if "\x1b" not in line})
    taken = 0
    for fmt in FORMATS:
        for text in lines:
            verdict = agree(fmt, text)
            assert verdict is not False, (fmt.name, text)
            if verdict is None:
                found = engine(fmt, text)
                # what the hot path leaves to the engine is a line it would not take: no prefix, or another kind
                assert found is None or found.rule.kind not in ("record", "attach") or not found.prefixed \
                    or hot_lines(fmt) is None, (fmt.name, text)
            taken += verdict is True
    assert taken > 100  # the step and progress lines of the sample and real logs


TWO_PREFIXES = '''
[[prefix]]
name = "first"
regex = '^(?P<time>\\d\\d:\\d\\d) .+?: (?P<message>.*)$'
time_format = "%H:%M"
[[prefix]]
name = "second"
regex = '^(?P<time>\\d\\d:\\d\\d) (?P<message>.*)$'
time_format = "%H:%M"
[[rule]]
name = "skip"
kind = "event"
event = "note"
regex = '^note: step (?P<step>\\d+)'
literal = 'note: '
[[rule]]
name = "step"
kind = "record"
regex = '^(?:note: )?step (?P<step>\\d+) loss (?P<loss>[\\d.]+)'
literal = 'step '
'''


@pytest.mark.parametrize("text, why", [
    ("10:01 a: step 3 loss 1.5", "the first prefix and the rule"),
    ("10:01 step 3 loss 1.5", "the first prefix does not match: the second's"),
    ("10:01 a: b: step 3 loss 1.5", "the first prefix ends at the first ': ', whose message the rule refuses"),
    ("10:01 a:b step 3 loss 1.5", "the first prefix matches nowhere, the second does"),
    ("10:01 x: note: step 3 loss 1.5", "an earlier rule (an event) takes the message"),
    ("10:01 step 3 loss 1.5 x: step 4 loss 2", "the first prefix's message is a step too"),
    ("10:01 step 3 loss 1.5 x: junk", "the first prefix matches, its message is no step; the second's would be"),
])
def test_the_lines_where_one_regex_could_match_otherwise(text: str, why: str) -> None:
    fmt = parse_format(TWO_PREFIXES, "built-in", "two")
    assert hot_lines(fmt) is not None
    assert agree(fmt, text) is not False, why
    found = engine(fmt, text)
    hot = hot_lines(fmt).match(text)  # type: ignore[union-attr]
    assert (hot[0].name if hot else None) in (None, found.rule.name if found else None), why
    if found is not None and found.rule.kind == "event":
        assert hot is None, why


def test_rules_and_prefixes_of_another_shape_are_left_to_the_engine() -> None:
    def hot_rules(toml: str) -> list:
        hot = hot_lines(parse_format(toml, "built-in", "shape"))
        return [] if hot is None else [rule.name for rule, _, taken, _, _, _ in hot._steps if taken is not None]

    assert hot_rules(TWO_PREFIXES) == ["step"]
    for pattern in ("(?<!x)step", "\\bstep", "step|other", "(?:^|x)step"):
        assert hot_rules(TWO_PREFIXES.replace("'^(?:note: )?step", f"'^{pattern}")) == [], pattern
    no_tail = TWO_PREFIXES.replace("(?P<message>.*)$'\ntime_format", "(?P<message>.*)'\ntime_format", 1)
    assert no_tail != TWO_PREFIXES and hot_rules(no_tail) == []  # the first prefix has another shape: nothing taken
    assert _top_level_bar("a|b") and not _top_level_bar("(a|b)") and not _top_level_bar("[|]") \
        and not _top_level_bar(r"\|") and not _top_level_bar("[]|]")


STEP = ("[INFO] 2025-11-24 16:00:01,858 [mindformers/core/callback/callback.py:821] print_output_info: {{ Epoch:[  1/ 67], "
        "step:[    {step}/ 1000], loss:[{loss}/11.061410], per_step_time: {ms}ms, lr: {lr}, overflow cond: False, "
        "loss_scale: 65536.0, global_norm: {norm}, train_throughput_per_npu: 132.247T")


@pytest.mark.parametrize("loss,ms,lr,norm", [
    ("11.06", "1859", "1.5e-07", "[1.6582648]"),  # the global norm as an array: the fast converter refuses it
    ("nan", "1859", "None", "1.25"),  # a NaN kept, "None" (no value)
    ("1e400", "99999999999999999999", "inf", "2.5"),  # out of range: field errors, the rest kept
    ("-inf", "0", "N/A", "[nan]"),
])
def test_field_texts_read_by_group_number_give_the_values_read_by_name(loss: str, ms: str, lr: str, norm: str) -> None:
    """The hot path hands a record's field texts by group number (`engine.Texts`) and its step counters alone; a
    parser fed them gives the same records, amends and counts as one that looks the fields up by name in every group
    the engine matched, on lines where each converter path is taken."""
    fmt = next(f for f in FORMATS if f.name == "mindformers")
    hot = hot_lines(fmt)
    assert hot is not None
    by_number, by_name = SourceParser([fmt], forced=fmt), SourceParser([fmt], forced=fmt)
    for step in (1, 2, 3):  # a field the fast converter refused goes to the full one from then on: both ways
        text = STEP.format(step=step, loss=loss, ms=ms, lr=lr, norm=norm)
        rule, groups, clock, stamp, texts = hot.match(text)  # type: ignore[misc]
        assert texts is not None and len(texts) == len(rule.fields)
        # the counters and the parts its pairs read alone
        assert set(groups) == {"epoch", "epochs", "step_in_epoch", "steps_per_epoch", "_extra", "_mid", "_more"}
        got = by_number.feed_hot(rule, groups, clock, stamp, texts, step, 0.0)
        want = by_name.feed_hot(rule, engine(fmt, text).groups, clock, stamp, None, step, 0.0)  # every group
        assert json.dumps(got) == json.dumps(want), text
        assert by_number.counts == by_name.counts == by_name.counts | {"lines": step, "records": step}
        assert got[0].data["loss_scale"] == 65536.0 and str(got[0].data.get("loss", "1e400")) == loss  # read, not lost
    assert by_name.counts["field_errors"] == (6 if ms.startswith("9999") else 0)
