"""The rules of a format that can match a message, told by its first character.

A format's rules are tried in order on every line, and most lines match a late rule (an `ignore` one) or none,
so most of those regex calls fail on the very first character. A rule anchored at the start whose every
top-level alternative begins with a literal character (`^\\{ Epoch`, `^Traceback`, `^Epoch...|^embedding...`)
can only match a message that starts with one of those characters; it is not tried on the others. A rule that
does not show its first character that plainly (`^\\s*\\d+`, a group or a class first, no `^`, any flag) is tried
on every message. The order of the rules is kept, so the first rule that matches is the same.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Dict, FrozenSet, Optional, Sequence, Tuple

if TYPE_CHECKING:
    from .schema import Rule  # schema imports this module

#: The parts of a pattern that nesting is made of (a parenthesis, a bar), with escapes and character classes
#: consumed whole so that nothing inside them counts.
_PARTS = re.compile(r"\\.|\[\^?\]?(?:\\.|[^\]\\])*\]|[()|]", re.DOTALL)
_SPECIAL = frozenset(".^$*+?{}[]\\|()")
_PLAIN_FLAGS = re.compile("").flags


class RuleIndex:
    def __init__(self, rules: Sequence[Rule]) -> None:
        starts = [_first_chars(rule.regex) for rule in rules]
        #: Rules to try on a message whose first character no rule names (or an empty message).
        self.others: Tuple[Rule, ...] = tuple(rule for rule, chars in zip(rules, starts) if chars is None)
        #: Rules to try on a message that starts with this character.
        self.by_first_char: Dict[str, Tuple[Rule, ...]] = {
            char: tuple(rule for rule, chars in zip(rules, starts) if chars is None or char in chars)
            for char in frozenset().union(*(chars for chars in starts if chars))
        }


def _first_chars(regex: "re.Pattern[str]") -> Optional[FrozenSet[str]]:
    """The characters a match of `regex` must start with, or None when the pattern does not show them plainly."""
    pattern = regex.pattern
    if regex.flags != _PLAIN_FLAGS or "(?#" in pattern:
        return None
    starts, depth = [0], 0
    for part in _PARTS.finditer(pattern):
        if part.group() == "(":
            depth += 1
        elif part.group() == ")":
            depth -= 1
        elif part.group() == "|" and depth == 0:
            starts.append(part.end())  # a top-level alternative
    chars = set()
    for start in starts:
        head = pattern[start : start + 4]
        if head[1:2] == "\\" and head[2:3] and not head[2].isalnum():
            char, after = head[2], head[3:4]  # an escaped punctuation character: "\{"
        elif head[1:2] and head[1] not in _SPECIAL:
            char, after = head[1], head[2:3]
        else:
            return None
        if not head.startswith("^") or after in ("*", "?", "{"):  # not anchored, or the character may be absent
            return None
        chars.add(char)
    return frozenset(chars)
