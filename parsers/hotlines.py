"""A locked format's step and progress lines, matched as the engine matches them, without the engine's generic work.

The engine matches a line in two steps (`engine._match_format`): the first prefix whose regex matches strips the
logger envelope, then the first rule whose regex matches the message. `HotLines.match` takes the same two steps
for the lines a big log is made of (a record rule's and an attach rule's under a prefix) and hands out what the
engine's record path needs, with no slice of the message, no second dict of groups and no `_Match`:

- the prefix: the first whose envelope (its regex without the `(?P<message>.*)$` tail, which matches any rest of a
  line) matches, so the message starts where the envelope ends;
- the rules, in the format's order, skipped when none of their literals is in the message (as the engine skips
  them); a record or attach rule is matched at the message's start (`match(text, pos)` of its regex without the
  leading `^`: its `search` in the message), any other rule that matches sends the line to the engine.

Rules whose regex could mean something else from a position than in a message of its own (a lookbehind, a word
boundary, `\\A`, another `^`, a top-level `|`, flags other than the default) are not taken here, nor are prefixes
of another shape: the lines they could match go to the engine, as does every line no hot rule takes.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .engine import COUNTER_GROUPS
from .schema import Format, Rule

#: The end every built-in prefix regex has.
_MESSAGE_TAIL = "(?P<message>.*)$"
#: Regex text whose meaning depends on what precedes the match's start (a position is not a string's start).
_CONTEXT = re.compile(r"\(\?<[=!]|\\[bBA]|(?<!\[)\^")
_DEFAULT_FLAGS = re.compile("").flags

#: (rule, its literals or None, the rule's `match` from a position (hot) or None, its `search` (any other rule),
#: the group numbers of its fields in the rule's field order (`_field_numbers`), the names and numbers of the groups
#: the record path reads (`_counters`; None: every group))
_Step = Tuple[Rule, Optional[Tuple[str, ...]], Any, Any, Tuple[int, ...], Optional[Tuple[Tuple[str, ...], Tuple[int, ...]]]]


def _top_level_bar(pattern: str) -> bool:
    """Whether `pattern` has a `|` outside every group (then a leading `^` anchors only its first alternative)."""
    depth, in_class, escaped = 0, False, False
    for index, char in enumerate(pattern):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif in_class:
            in_class = char != "]" or pattern[index - 1] == "["  # "[]...]" holds a "]"
        elif char == "[":
            in_class = True
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "|" and depth == 0:
            return True
    return False


def _anchored_tail(regex: Any) -> Optional[str]:
    """A regex's text without its leading `^`, when matching that from a position is its `search` in the rest of the
    string; else None."""
    pattern = getattr(regex, "pattern", "")
    if not (isinstance(regex, re.Pattern) and regex.flags == _DEFAULT_FLAGS and pattern.startswith("^")):
        return None
    tail = pattern[1:]
    return None if _CONTEXT.search(tail) or _top_level_bar(tail) else tail


class HotLines:
    """The prefixes and rules of one format, ready for `match` (`hot_lines(fmt)` makes it).

    Args:
        prefixes: per prefix, in order up to the first that is not of the usual shape: its envelope's `match`, its time
            parser, whether it has a `time` group.
        steps: every rule of the format, in order (`_Step`).
    """

    def __init__(self, prefixes: List[Tuple[Any, Any, bool]], steps: List[_Step]) -> None:
        self._prefixes = prefixes
        self._steps = steps

    def match(self, text: str) -> Optional[Tuple[Rule, Dict[str, Optional[str]], Any, Optional[str], Any]]:
        """(rule, its groups, the prefix's time parser, the prefix's time text, its field texts: `engine.Texts`, or
        None when it has no fields) when the engine would match `text` (a line with no ANSI escape) to a record or
        attach rule under a prefix; None: ask the engine."""
        for envelope, clock, timed in self._prefixes:  # noqa: B007 - read after the break
            found = envelope(text)
            if found is not None:
                break
        else:
            return None  # no prefix, or one this module does not take
        start = found.end()
        find = text.find
        for rule, literals, hot, search, numbers, counters in self._steps:
            if literals is not None:
                for literal in literals:
                    if find(literal, start) >= 0:
                        break
                else:
                    continue  # as the engine: a rule matches only messages holding one of its literals
            if hot is not None:
                matched = hot(text, start)
                if matched is not None:
                    texts = _texts(matched, numbers) if numbers else None
                    if counters is None:
                        groups = matched.groupdict()
                    else:  # a step line has a dozen groups, of which the record path reads a few counters
                        names, counted = counters
                        groups = dict(zip(names, _texts(matched, counted))) if counted else {}
                    return rule, groups, clock, found["time"] if timed else None, texts
            elif search(text[start:]) is not None:
                return None  # another kind of rule takes the message
        return None


def _texts(matched: "re.Match[str]", numbers: Tuple[int, ...]) -> Sequence[Optional[str]]:
    """The texts of groups `numbers` (one or more) of `matched`, in that order (None for a group that took no part)."""
    return matched.group(*numbers) if len(numbers) > 1 else (matched.group(numbers[0]),)


def _field_numbers(rule: Rule, hot: "re.Pattern[str]") -> Tuple[int, ...]:
    """The group numbers in `hot` (the rule's regex, from a position) of the rule's fields, in `Rule.plan`'s order;
    none when a field names a group the regex lacks (its values are then looked up by name, and are absent)."""
    numbers = tuple(hot.groupindex.get(group, 0) for group, _, _, _ in rule.plan)
    return () if 0 in numbers else numbers


def _counters(rule: Rule, hot: "re.Pattern[str]", numbers: Tuple[int, ...]
              ) -> Optional[Tuple[Tuple[str, ...], Tuple[int, ...]]]:
    """The names and group numbers in `hot` of the step counters it has (`engine.COUNTER_GROUPS`) and of the groups its
    extractors read (their `groups`, as `[rule.pairs]` lists them): all the record path reads of a rule's groups when
    it is handed the field texts (`numbers`) and the rule has no epoch length; else None (it is handed every group)."""
    read = [getattr(extract, "groups", None) for extract in rule.extract]
    if not numbers or rule.epoch_length or None in read:
        return None
    names = tuple(name for name in COUNTER_GROUPS if name in hot.groupindex) + tuple(
        name for groups in read for name in groups if name in hot.groupindex)  # type: ignore[union-attr]  # no None
    return names, tuple(hot.groupindex[name] for name in names)


def hot_lines(fmt: Format) -> Optional[HotLines]:
    """The hot lines of `fmt` (record and attach rules under its prefixes), or None when it has none that can be taken
    exactly (JSONL, the generic reader, a user's regexes, a prefix or rule of another shape)."""
    if fmt.jsonl or fmt.fallback:
        return None
    prefixes = []
    for prefix in fmt.prefixes:
        tail = _anchored_tail(prefix.regex)
        if tail is None or not tail.endswith(_MESSAGE_TAIL):
            break  # lines under this prefix or a later one are the engine's
        prefixes.append((re.compile(tail[:-len(_MESSAGE_TAIL)]).match, prefix.parse_time,
                         "time" in prefix.regex.groupindex))
    steps: List[_Step] = []
    for search, rule, literals in fmt.plan[1]:
        tail = _anchored_tail(rule.regex) if rule.kind in ("record", "attach") else None
        hot = re.compile(tail) if tail is not None else None
        numbers = _field_numbers(rule, hot) if hot is not None else ()
        steps.append((rule, literals, hot.match if hot is not None else None, search, numbers,
                      _counters(rule, hot, numbers) if hot is not None else None))
    if not prefixes or all(hot is None for _, _, hot, _, _, _ in steps):
        return None
    return HotLines(prefixes, steps)
