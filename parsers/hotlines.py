"""A locked format's step and progress lines matched by one regex each: the prefix and the rule at once.

The engine matches a line in two steps (`engine._match_format`): the first prefix whose regex matches strips the
logger envelope, then the first rule whose regex matches the message. For the lines a big log is made of (a record
rule's and an attach rule's), `HotLines.match` does it in one `re` call per line, through a regex per (prefix, rule)
made of the two, and hands out the groups the engine would have: the same matches, made to be the same by
construction and checked where construction cannot tell.

- The prefix part is matched atomically, `(?=(?P<_pre>...))(?P=_pre)`: the envelope ends where the prefix's own regex
  ends it (its `(?P<message>.*)$` always matches the rest of a line), never retried shorter or longer to suit the rule.
- The rule's regex is anchored at the message's start (`^`): matching it there is its `search` in the message. Rules
  whose regex could look past the message's start or shift group numbers (a lookbehind, a word boundary, a numbered
  back-reference, an alternative outside any group) are left to the engine, as are flags other than the default.
- Rules are tried in the format's order and, for each, the prefixes in theirs. A hit is checked for what the engine
  would have found first: an earlier prefix that matches the line (the engine strips that one), an earlier rule of
  another kind whose literal is in the message. Either sends the line to the engine.

Lines no hot rule takes go to `SourceParser.feed` as before.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .schema import Format, Prefix, Rule

#: The end every prefix regex has (`loader` requires a `message` group; the built-ins end it so).
_MESSAGE_TAIL = "(?P<message>.*)$"
#: Regex text that makes a pattern's meaning depend on what surrounds it (kept for the engine).
_CONTEXT = re.compile(r"\(\?<[=!]|\\[bBAZ]|\\[1-9]|\(\?\(")
_DEFAULT_FLAGS = re.compile("").flags

#: (prefix index, rule, combined `match`, the prefix's time parser, whether the prefix has a `time` group)
_Combo = Tuple[int, Rule, Any, Any, bool]


def _top_level_bar(pattern: str) -> bool:
    """Whether `pattern` has a `|` outside every group (then `^` anchors only its first alternative)."""
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


def _plain(regex: Any) -> bool:
    return isinstance(regex, re.Pattern) and regex.flags == _DEFAULT_FLAGS and not _CONTEXT.search(regex.pattern)


def _envelope(prefix: Prefix) -> Optional[str]:
    """The prefix regex without its `^` and its message tail, or None when it does not have that shape."""
    pattern = prefix.regex.pattern
    if not (_plain(prefix.regex) and pattern.startswith("^") and pattern.endswith(_MESSAGE_TAIL)):
        return None
    body = pattern[1:-len(_MESSAGE_TAIL)]
    return None if _top_level_bar(body) else body


def _hot(rule: Rule) -> bool:
    pattern = rule.regex.pattern
    return (rule.kind in ("record", "attach") and bool(rule.literal) and _plain(rule.regex) and pattern.startswith("^")
            and not _top_level_bar(pattern[1:]))


class HotLines:
    """The combined regexes of one format (`hot_lines(fmt)` makes it).

    Args:
        fmt: the format.
        rules: per hot rule, in the format's order: the combos to try, in the prefixes' order.
    """

    def __init__(self, fmt: Format, rules: Sequence[Tuple[Rule, List[_Combo]]]) -> None:
        self.fmt = fmt
        self._prefixes = [prefix.regex.match for prefix in fmt.prefixes]
        #: per hot rule: its literals, its combos, and the earlier rules that are not hot (as `Format.plan` has them)
        self._rules: List[Tuple[Tuple[str, ...], List[_Combo], List[Tuple[Any, Optional[Tuple[str, ...]]]]]] = []
        hot = {id(rule) for rule, _ in rules}
        for rule, combos in rules:
            earlier = []
            for search, other, literals in fmt.plan[1]:
                if other is rule:
                    break
                if id(other) not in hot:
                    earlier.append((search, literals))
            self._rules.append((rule.literal, combos, earlier))

    def match(self, text: str) -> Optional[Tuple[Rule, Dict[str, Optional[str]], Any, Optional[str]]]:
        """(rule, its groups and the prefix's, the prefix's time parser, the prefix's time text) when the engine would
        match `text` (a line with no ANSI escape) to a hot rule under a prefix; None: ask the engine."""
        for literals, combos, earlier in self._rules:
            for literal in literals:
                if literal in text:
                    break
            else:
                continue  # the engine skips the rule too: its literal is in no message it matches
            for index, rule, combined, clock, timed in combos:
                found = combined(text)
                if found is None:
                    continue
                if index and any(match(text) for match in self._prefixes[:index]):
                    return None  # an earlier prefix takes the line: its message is another
                if earlier:
                    message = text[found.end("_pre"):]
                    for search, literals_before in earlier:
                        if literals_before is None or any(lit in message for lit in literals_before):
                            if search(message) is not None:
                                return None  # an earlier rule takes the message
                groups = found.groupdict()
                return rule, groups, clock, groups["time"] if timed else None
        return None


def hot_lines(fmt: Format) -> Optional[HotLines]:
    """The combined regexes of `fmt`'s hot rules (record and attach rules with a literal) under its prefixes, or None
    when it has none that can be combined exactly (JSONL, the generic reader, a user's regexes). Prefixes are
    combined up to the first that cannot be (with any hot rule): a line under it or a later one is the engine's."""
    if fmt.jsonl or fmt.fallback:
        return None
    hot = [rule for rule in fmt.rules if _hot(rule)]
    table: List[List[_Combo]] = [[] for _ in hot]
    for index, prefix in enumerate(fmt.prefixes):
        envelope = _envelope(prefix)
        if envelope is None:
            break
        try:
            row = [re.compile(f"(?=(?P<_pre>{envelope}))(?P=_pre)(?:{rule.regex.pattern[1:]})").match for rule in hot]
        except re.error:  # a group named in both (`time`): this prefix's lines and the later ones' are the engine's
            break
        timed = "time" in prefix.regex.groupindex
        for combos, rule, combined in zip(table, hot, row):
            combos.append((index, rule, combined, prefix.parse_time, timed))
    rules = [(rule, combos) for rule, combos in zip(hot, table) if combos]
    return HotLines(fmt, rules) if rules else None
