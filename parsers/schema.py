"""The compiled shape of a format file (see the README section "Formats" for the TOML schema)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

from .kinds import Value

#: Group names the engine reads to compute the global step (they never become metrics):
#: `step` (already global), or `epoch` + `step_in_epoch` [+ `steps_per_epoch`, else inferred]; `epochs`
#: (total epochs) and `total_steps` tell how long the run is.
STEP_GROUPS = frozenset({"step", "epoch", "step_in_epoch", "steps_per_epoch", "epochs", "total_steps"})

RULE_KINDS = ("record", "attach", "event", "ignore")

#: A multi-valued field (`type = "pydict"`, a rule's `[rule.pairs]`): the regex groups -> (values, errors, missed:
#: the `name: number` pairs its text holds that it did not read). One that uses regexes of its own lists them in a
#: `regexes` attribute, as `Format.regexes` does.
Extractor = Callable[[Dict[str, Optional[str]]], Tuple[Dict[str, Value], int, int]]

#: A compiled regex: a built-in format's `re.Pattern`, or a user's `bounded.BoundedPattern` (same attributes and
#: calls, which raise TimeoutError past their time budget).
Regex = Any


class FormatError(ValueError):
    """A format file is unusable; the message names the file, the rule and the reason."""

    def __init__(self, origin: str, reason: str, rule: Optional[str] = None) -> None:
        where = f"{origin}: rule '{rule}'" if rule else origin
        super().__init__(f"{where}: {reason}")
        self.origin, self.rule, self.reason = origin, rule, reason


@dataclass(frozen=True)
class Field:
    """How one named group becomes a value: `type` converter, output `name`, `unit` suffix to strip,
    `scale` factor for numbers."""

    group: str
    name: str
    convert: Callable[[str, str], Value]
    unit: str = ""
    scale: Optional[float] = None
    #: A builtin giving the same value as `value()` for every text it accepts (`float` for a plain float field):
    #: tried first, since most texts are plain numbers.
    fast: Optional[Callable[[str], Value]] = None

    def value(self, text: str) -> Value:
        result = self.convert(text, self.unit)
        if self.scale is not None and isinstance(result, (int, float)):
            result = result * self.scale
            if isinstance(result, float) and math.isfinite(result):
                # 12 significant digits: "1.005" s * 1000 is 1005.0 ms, not 1004.9999999999999
                result = float("%.12g" % result)
        return result


@dataclass(frozen=True)
class Rule:
    """One regex tried against a line's message.

    kind: `record` starts a step record, `attach` adds its fields to the last record (the MindFormers progress
    line, MindSpore's TimeMonitor; the record was emitted at its own line, so this is an amend), `event` emits an
    event of kind `event`, `ignore` marks a known line that is deliberately not a record (it is not counted as an
    unmatched metric-looking line).
    multiline: following lines that carry no prefix and match no rule are appended to the event's message.
    extract: multi-valued fields (pydict fields, pairs), run after `fields`.
    record: (event rules) the event's values also become metrics of the current step (eval results).
    same_step_as: (event rules) the event takes the step of the last event of this kind (a checkpoint's
        completion line, logged steps after an async save started).
    epoch_length: (attach rules) two metric names whose quotient is the number of steps in the epoch
        (MindSpore's TimeMonitor: epoch time / per-step time); it replaces the learnt epoch length.
    literal: texts of which every line the regex matches holds one (declared in the format file, like lnav's and
        Fluent Bit's prefilters); when every record, attach and event rule of a format declares some, the lines
        holding none of them are only counted (`parsers.prefilter`). Empty: not declared.
    """

    name: str
    kind: str
    regex: Regex
    fields: Tuple[Field, ...]
    event: str = ""
    multiline: bool = False
    extract: Tuple[Extractor, ...] = ()
    record: bool = False
    same_step_as: str = ""
    epoch_length: Tuple[str, ...] = ()
    literal: Tuple[str, ...] = ()
    #: For the engine's hot path, made once: (group, name, fast, value) per field (not compared, hashed or shown).
    plan: Tuple[Tuple[str, str, Any, Callable[[str], Value]], ...] = field(
        default=(), init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "plan", tuple((f.group, f.name, f.fast, f.value) for f in self.fields))


@dataclass(frozen=True)
class Prefix:
    """A logger envelope around the message: groups `message` (required), `time`, `level`."""

    name: str
    regex: Regex
    parse_time: Optional[Callable[[str], float]] = None


@dataclass(frozen=True)
class Format:
    """A parsed and validated format file."""

    name: str
    origin: str  # "built-in", a file path, or "--pattern"
    description: str = ""
    priority: int = 0
    prefixes: Tuple[Prefix, ...] = ()
    rules: Tuple[Rule, ...] = ()
    error_levels: Tuple[str, ...] = ()
    jsonl: bool = False
    #: The generic step-line reader's kind of format: tried after every other format, only on lines none of them
    #: recognises, and it never locks a file (a specific format's step line still can). See `SourceParser._generic`.
    fallback: bool = False
    #: For the engine's hot path, made once: (regex.match, parse_time, prefix) per prefix, (regex.search, rule,
    #: literals) per rule. `literals`: the rule's declared `literal` texts when its regex is a built-in's `re` pattern
    #: (trusted as the prefilter trusts them; tests/parsers/test_prefilter.py checks each is in every message the rule
    #: matches), so a message holding none of them skips the search; None (always searched) for a rule without them
    #: and for a user's regex.
    plan: Tuple[Tuple[Tuple[Any, Any, Prefix], ...], Tuple[Tuple[Any, Rule, Optional[Tuple[str, ...]]], ...]] = field(
        default=((), ()), init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "plan", (
            tuple((prefix.regex.match, prefix.parse_time, prefix) for prefix in self.prefixes),
            tuple((rule.regex.search, rule, rule.literal if rule.literal and isinstance(rule.regex, re.Pattern) else None)
                  for rule in self.rules),
        ))

    def regexes(self) -> Iterator[Tuple[str, str, Regex]]:
        """Every compiled regex of the format, as (where, how it is called on a line, regex): each prefix's is
        `match`ed on the line, each rule's `search`ed in the message, and a rule's extractors list their own (the
        pairs' `finditer` in a group, `fullmatch` on a name). tests/parsers/test_regex_bounds.py times them all."""
        for prefix in self.prefixes:
            yield f"prefix {prefix.name}", "match", prefix.regex
        for rule in self.rules:
            yield f"rule {rule.name}", "search", rule.regex
            for extract in rule.extract:
                for what, how, pattern in getattr(extract, "regexes", ()):
                    yield f"rule {rule.name} {what}", how, pattern

