"""`mstail parse LOG --explain`: line by line, which rule matched and what it extracted.

The tool for writing a format: every line a rule matched is shown with its format, rule, kind and typed
values; a line that matched nothing but looks like a metric (`loss: 2.3`, `loss is nan`) is flagged, so a
missing or too strict rule stands out. Other lines (config dumps, warnings) are only counted.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Dict, Optional

from .interleave import InterleavedParser
from .schema import STEP_GROUPS

MAX_SHOWN_CHARS = 160


class Explainer:
    """Feeds lines to `parser` (so detection, steps and multi-line grouping behave as in a real parse) and
    describes how each one matched; a launcher-tagged line (`[rank3]: `) is explained as its rank's parser saw it."""

    def __init__(self, parser: InterleavedParser) -> None:
        self.parser = parser
        self.rules: Counter = Counter()  # "format/rule (kind)" -> lines
        self.unmatched = 0
        self.flagged = 0

    def explain(self, where: str, number: int, text: str, now: float) -> Optional[str]:
        """One line of explanation, or None for a line no rule is about (counted)."""
        part, parser, text = self.parser.route(text)
        if part is not None:
            where = f"{where}[{part}]"
        flagged_before = parser.counts["unmatched_metric_lines"]
        parser.feed(text, number, now)
        match = parser.last_match
        if match is not None and match.obj is not None:
            self.rules[f"{match.fmt.name} (json)"] += 1
            return f"{where}:{number}  {match.fmt.name}  json  {_show(match.obj)}"
        if match is None or match.rule is None:
            if parser.counts["unmatched_metric_lines"] > flagged_before:
                self.flagged += 1
                return f"{where}:{number}  NO RULE MATCHED, but it looks like a metric: {text[:MAX_SHOWN_CHARS]}"
            self.unmatched += 1
            return None
        rule = match.rule
        label = f"{match.fmt.name}/{rule.name} ({rule.kind})"
        self.rules[label] += 1
        found: Dict[str, Any] = {k: v for k, v in match.groups.items() if k in STEP_GROUPS and v is not None}
        found.update(parser.values(rule, match.groups))
        prefix = "prefixed" if match.prefixed else "bare"
        return f"{where}:{number}  {label}  {prefix}  {_show(found)}"

    def summary(self) -> str:
        lines = [f"{count:>9}  {label}" for label, count in self.rules.most_common()]
        lines.append(f"{self.unmatched:>9}  lines no rule is about")
        lines.append(f"{self.flagged:>9}  lines that look like metrics but matched no rule")
        return "\n".join(lines)


def _show(values: Dict[str, Any]) -> str:
    return " ".join(f"{key}={value!r}" for key, value in values.items())
