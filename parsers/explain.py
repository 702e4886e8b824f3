"""`mstail parse LOG --explain`: line by line, which rule matched and what it extracted.

The tool for writing a format: every line a rule matched is shown with its format, rule, kind and typed
values; a line that matched nothing but looks like a metric (`loss: 2.3`, `loss is nan`) is flagged, so a
missing or too strict rule stands out, and so is a line on which a regex of the user's ran out of time (`bounded`).
Other lines (config dumps, warnings) are only counted.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Dict, Optional

from .bounded import BUDGET_S
from .interleave import InterleavedParser
from .schema import STEP_GROUPS

MAX_SHOWN_CHARS = 160

#: Terminal escape sequences, removed whole: CSI (colours, clear screen, cursor moves) and the string ones (OSC: window
#: title, hyperlinks; DCS, SOS, PM, APC) up to BEL or ST. Each begins with ESC and a fixed second character, so a line
#: full of ESCs costs one quick failed try each (tests/parsers/test_regex_bounds.py).
_CSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
_STRINGS = re.compile(r"\x1b[]P^_X][^\x07\x1b]*(?:\x07|\x1b\\)")
#: What else a terminal acts on, deleted: C0 controls but tab, DEL, C1 controls (the ESC of an unfinished sequence too).
_CONTROL_CHARS = dict.fromkeys([*range(0x09), *range(0x0a, 0x20), *range(0x7f, 0xa0)])


def printable(text: str) -> str:
    """`text` without what a terminal would act on (escape sequences, control characters): a log copied to the
    screen must not clear it, retitle the window or hide what follows."""
    if "\x1b" in text:
        text = _STRINGS.sub("", _CSI.sub("", text))
    return text.translate(_CONTROL_CHARS)


class Explainer:
    """Feeds lines to `parser` (so detection, steps and multi-line grouping behave as in a real parse) and
    describes how each one matched; a launcher-tagged line (`[rank3]: `) is explained as its rank's parser saw it."""

    def __init__(self, parser: InterleavedParser) -> None:
        self.parser = parser
        self.rules: Counter = Counter()  # "format/rule (kind)" -> lines
        self.unmatched = 0
        self.flagged = 0
        self.slow = 0  # lines on which a user's regex ran out of time

    def explain(self, where: str, number: int, text: str, now: float) -> Optional[str]:
        """One line of explanation without control characters (`printable`), or None for a line no rule is
        about (counted)."""
        shown = self._explain(where, number, text, now)
        return None if shown is None else printable(shown)

    def _explain(self, where: str, number: int, text: str, now: float) -> Optional[str]:
        part, parser, text = self.parser.route(text)
        if part is not None:
            where = f"{where}[{part}]"
        counts = parser.counts
        flagged_before, errors_before = counts["unmatched_metric_lines"], counts["field_errors"]
        records_before, amends_before = counts["records"], counts["amends"]
        parser.feed(text, number, now)
        errors = parser.counts["field_errors"] - errors_before
        bad = f"  ({errors} field error{'s' if errors != 1 else ''}: a value that did not convert, or beyond 64 bits " \
              "or the float range: left out)" if errors else ""
        match = parser.last_match
        if match is not None and match.obj is not None:
            self.rules[f"{match.fmt.name} (json)"] += 1
            return f"{where}:{number}  {match.fmt.name}  json  {_show(match.obj)}{bad}"
        slow = ", ".join(parser.last_slow)
        if match is None or match.rule is None:
            if slow:
                self.slow += 1
                return f"{where}:{number}  SKIPPED FOR TIME ({slow} took over {BUDGET_S:g} s): {text[:MAX_SHOWN_CHARS]}"
            if parser.counts["unmatched_metric_lines"] > flagged_before:
                self.flagged += 1
                return f"{where}:{number}  NO RULE MATCHED, but it looks like a metric: {text[:MAX_SHOWN_CHARS]}"
            self.unmatched += 1
            return None
        rule = match.rule
        label = f"{match.fmt.name}/{rule.name} ({rule.kind})"
        if match.fmt.fallback and rule.kind == "record":  # say that the generic reader took it, and what it made
            made = "record" if counts["records"] > records_before else \
                "amend of the last record" if counts["amends"] > amends_before else \
                "nothing: no metric, or only values the last record has"
            label = f"{match.fmt.name}/{rule.name} (GENERIC READER: {made})"
        self.rules[label] += 1
        found: Dict[str, Any] = {k: v for k, v in match.groups.items() if k in STEP_GROUPS and v is not None}
        found.update(parser.values(rule, match.groups))
        parser.counts["field_errors"] = errors_before + errors  # `values` again above must not count them twice
        prefix = "prefixed" if match.prefixed else "bare"
        shown = f"{where}:{number}  {label}  {prefix}  {_show(found)}{bad}"
        if parser.last_slow:  # a rule tried before this one, or this one's pairs
            self.slow += 1
            return f"{shown}  (skipped for time: {', '.join(parser.last_slow)})"
        return shown

    def summary(self) -> str:
        lines = [f"{count:>9}  {printable(label)}" for label, count in self.rules.most_common()]
        lines.append(f"{self.unmatched:>9}  lines no rule is about")
        lines.append(f"{self.flagged:>9}  lines that look like metrics but matched no rule")
        if self.slow:
            lines.append(f"{self.slow:>9}  lines a regex of yours gave up on after {BUDGET_S:g} s (skipped for it)")
        return "\n".join(lines)


def _show(values: Dict[str, Any]) -> str:
    return " ".join(f"{key}={value!r}" for key, value in values.items())
