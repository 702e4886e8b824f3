"""Format files (TOML) -> validated `Format` objects: built-ins, user files, and `--pattern` one-liners.

Every problem is a `FormatError` naming the file, the rule and the reason, raised before anything runs.
"""

from __future__ import annotations

import itertools
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from mstail.platform import per_user_dir, tomllib

from .bounded import compile_bounded
from .kinds import CONVERTERS, NAMED_TIME_FORMATS, PLAIN_BUILTINS, Value, time_parser
from .pyliteral import parse_pydict
from .record import MAX_NAME_CHARS, RESERVED, metric_key
from .schema import RULE_KINDS, STEP_GROUPS, Extractor, Field, Format, FormatError, Prefix, Regex, Rule


BUILTIN_ORIGIN = "built-in"
PATTERN_ORIGIN = "--pattern"
_FORMAT_KEYS = {"name", "description", "priority", "prefix", "rule", "error_levels", "jsonl", "fallback"}
#: `wait_for` (mstail 0.1: hold a record until these attach rules came) is accepted and has no effect: a record is
#: published at its line and a later attach line amends it, so a format written for 0.1 still loads.
_RULE_KEYS = {"name", "kind", "regex", "fields", "wait_for", "event", "multiline", "pairs", "record", "same_step_as",
              "epoch_length", "literal"}
_FIELD_KEYS = {"type", "rename", "unit", "scale", "null"}
_PYDICT_KEYS = {"type", "prefix", "rename"}
_PAIRS_KEYS = {"group", "regex", "type", "names", "prefix", "lower", "fields"}
_PCRE_NAME = re.compile(r"\(\?<(?=[A-Za-z_])")
#: A `[rule.pairs]` reads at most this many pairs of a line (a runaway line is not 100k metrics).
MAX_PAIRS = 1024


def user_formats_dir() -> Path:
    """Where a user's own format files are picked up: `$MSTAIL_FORMATS_DIR`, else
    `$XDG_CONFIG_HOME/mstail/formats` (default `~/.config/mstail/formats`)."""
    return per_user_dir("MSTAIL_FORMATS_DIR", "XDG_CONFIG_HOME", ".config", "formats")


def builtin_formats() -> List[Format]:
    """The formats shipped in parsers/formats/*.toml."""
    folder = resources.files("mstail.parsers") / "formats"
    entries = sorted((entry for entry in folder.iterdir() if entry.name.endswith(".toml")), key=lambda e: e.name)
    return [parse_format(entry.read_text(encoding="utf-8"), BUILTIN_ORIGIN, entry.name[: -len(".toml")]) for entry in entries]


def load_format_file(path: "str | os.PathLike[str]") -> Format:
    """Read and validate one format file; its name defaults to the file stem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise FormatError(str(path), f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise FormatError(str(path), "not UTF-8 text") from None
    return parse_format(text, str(path), path.stem)


def load_formats(
    files: Sequence["str | os.PathLike[str]"] = (),
    patterns: Sequence[str] = (),
    user_dir: Optional[Path] = None,
) -> List[Format]:
    """All formats in detection order: `--pattern`s, `--formats` files, the user folder, then built-ins.

    Args:
        files: format files given with `--formats` (each must load, else FormatError).
        patterns: ad hoc regexes given with `--pattern`; their named groups become metrics.
        user_dir: the per-user formats folder; None means `user_formats_dir()`.
    """
    found: List[Format] = [pattern_format(p, i) for i, p in enumerate(patterns)]
    found += [load_format_file(f) for f in files]
    folder = user_formats_dir() if user_dir is None else user_dir
    if folder.is_dir():
        found += [load_format_file(f) for f in sorted(folder.glob("*.toml"))]
    builtins = sorted(builtin_formats(), key=lambda f: -f.priority)
    taken = {f.name for f in found}
    # A user format with a built-in's name replaces it, as a copied-and-edited file should. Fallback formats (the
    # generic step-line reader) come after every other, whatever their priority.
    ordered = found + [f for f in builtins if f.name not in taken]
    return [f for f in ordered if not f.fallback] + [f for f in ordered if f.fallback]


def pattern_format(regex: str, index: int = 0) -> Format:
    """A one-rule format from `--pattern REGEX`: named groups become float metrics; without a `step`
    group the step counts the matching lines."""
    name = "pattern" if index == 0 else f"pattern{index + 1}"
    compiled = _compile(regex, PATTERN_ORIGIN, name)
    if not compiled.groupindex:
        raise FormatError(PATTERN_ORIGIN, "the regex has no named groups (write (?P<loss>...) for a metric)", name)
    rule = Rule(name=name, kind="record", regex=compiled, fields=_fields({}, compiled, PATTERN_ORIGIN, name))
    return Format(name=name, origin=PATTERN_ORIGIN, description=f"--pattern {regex}", priority=100, rules=(rule,))


def parse_format(text: str, origin: str, default_name: str) -> Format:
    """Validate TOML text as a format; `origin` names it in errors and in `mstail formats`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise FormatError(origin, f"not valid TOML: {exc}") from None
    _reject_unknown(data, _FORMAT_KEYS, origin, None, "top-level key")
    name = data.get("name", default_name)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise FormatError(origin, f"name must be letters, digits, '_', '.', '-': {name!r}")
    jsonl = _typed(data, "jsonl", bool, False, origin, None)
    prefixes = tuple(_prefix(p, origin, i) for i, p in enumerate(_table_list(data, "prefix", origin)))
    rules = tuple(_rule(r, origin, i) for i, r in enumerate(_table_list(data, "rule", origin)))
    if not rules and not jsonl:
        raise FormatError(origin, "no [[rule]] tables: a format needs at least one record rule")
    if not jsonl and not any(r.kind == "record" for r in rules):
        raise FormatError(origin, "no rule with kind = \"record\": nothing would become a step record")
    names = [r.name for r in rules]
    for rule in rules:
        if names.count(rule.name) > 1:
            raise FormatError(origin, "two rules share this name", rule.name)
    levels = _typed(data, "error_levels", list, [], origin, None)
    fallback = _typed(data, "fallback", bool, False, origin, None)
    if fallback and jsonl:
        raise FormatError(origin, "a fallback format reads text lines: fallback and jsonl exclude each other")
    return Format(
        name=name,
        origin=origin,
        description=_typed(data, "description", str, "", origin, None),
        priority=_typed(data, "priority", int, 0, origin, None),
        prefixes=prefixes,
        rules=rules,
        error_levels=tuple(str(level) for level in levels),
        jsonl=jsonl,
        fallback=fallback,
    )


def _prefix(data: Mapping[str, Any], origin: str, index: int) -> Prefix:
    name = str(data.get("name", f"prefix{index + 1}"))
    _reject_unknown(data, {"name", "regex", "time_format"}, origin, name, "prefix key")
    regex = _compile(_required_str(data, "regex", origin, name), origin, name)
    if "message" not in regex.groupindex:
        raise FormatError(origin, "a prefix regex needs a (?P<message>...) group for the text after it", name)
    time_format = data.get("time_format")
    if "time" in regex.groupindex and not isinstance(time_format, str):
        raise FormatError(
            origin, f"a (?P<time>...) group needs time_format (strptime, or one of {sorted(NAMED_TIME_FORMATS)})", name
        )
    return Prefix(name=name, regex=regex, parse_time=time_parser(time_format) if "time" in regex.groupindex else None)  # type: ignore[arg-type]  # a str: checked above


def _rule(data: Mapping[str, Any], origin: str, index: int) -> Rule:
    name = str(data.get("name", f"rule{index + 1}"))
    _reject_unknown(data, _RULE_KEYS, origin, name, "rule key")
    kind = data.get("kind", "record")
    if kind not in RULE_KINDS:
        raise FormatError(origin, f"kind must be one of {', '.join(RULE_KINDS)}, not {kind!r}", name)
    regex = _compile(_required_str(data, "regex", origin, name), origin, name)
    fields_table = data.get("fields", {})
    if not isinstance(fields_table, dict):
        raise FormatError(origin, "fields must be a table", name)
    fields = _fields(fields_table, regex, origin, name)
    extract = _pydict_fields(fields_table, regex, origin, name)
    if "pairs" in data:
        pairs = _pairs(data["pairs"], regex, origin, name)
        extract += (pairs,)
        fields = tuple(f for f in fields if f.group not in pairs.groups)  # the pairs' text is no metric
    if kind == "record" and not ({"step", "step_in_epoch"} & set(regex.groupindex)):
        raise FormatError(
            origin, "no step source: a record rule needs a (?P<step>...) or (?P<step_in_epoch>...) group", name
        )
    event = data.get("event", "")
    if kind == "event" and not (isinstance(event, str) and event):
        raise FormatError(origin, "an event rule needs event = \"<kind>\" (checkpoint, eval, error, end, start ...)", name)
    record = _typed(data, "record", bool, False, origin, name)
    same_step_as = _typed(data, "same_step_as", str, "", origin, name)
    if (record or same_step_as) and kind != "event":
        raise FormatError(origin, "record and same_step_as are options of event rules (kind = \"event\")", name)
    epoch_length = data.get("epoch_length", [])
    if epoch_length:
        outputs = {f.name for f in fields}
        if kind != "attach":
            raise FormatError(origin, "epoch_length is an option of attach rules (kind = \"attach\")", name)
        if not (isinstance(epoch_length, list) and len(epoch_length) == 2 and all(n in outputs for n in epoch_length)):
            raise FormatError(
                origin, f"epoch_length must name two metrics of this rule (numerator, denominator): {sorted(outputs)}", name
            )
    literal = data.get("literal", [])
    literal = [literal] if isinstance(literal, str) else literal
    if not (isinstance(literal, list) and all(isinstance(text, str) and text and "\n" not in text for text in literal)):
        raise FormatError(origin, "literal must be a non-empty text, or a list of them, that every matching line holds", name)
    return Rule(
        name=name,
        kind=kind,
        regex=regex,
        fields=fields,
        event=event,
        multiline=bool(data.get("multiline", False)),
        extract=extract,
        record=record,
        same_step_as=same_step_as,
        epoch_length=tuple(epoch_length),
        literal=tuple(literal),
    )


def _fields(table: Mapping[str, Any], regex: Regex, origin: str, rule: str) -> tuple:
    """One Field per named group that is not a step group; undeclared groups are floats."""
    for group in table:
        if group not in regex.groupindex:
            raise FormatError(origin, f"fields.{group} names no (?P<{group}>...) group of the regex", rule)
    fields = []
    for group in regex.groupindex:
        if group in STEP_GROUPS or group.startswith("_"):
            continue
        spec = _field_spec(table, group, origin, rule)
        if spec.get("type") == "pydict":
            continue  # a multi-valued field: see _pydict_fields
        fields.append(_field(group, spec, f"fields.{group}", origin, rule))
    return tuple(fields)


def _field(group: str, spec: Mapping[str, Any], where: str, origin: str, rule: str) -> Field:
    """One Field from its table (`type`, `rename`, `unit`, `scale`, `null`); `where` names the table in errors."""
    _reject_unknown(spec, _FIELD_KEYS, origin, rule, f"key of {where}")
    type_name = spec.get("type", "float")
    if type_name not in CONVERTERS:
        types = ", ".join(list(CONVERTERS) + ["pydict"])
        raise FormatError(origin, f"{where}: unknown type {type_name!r} (use {types})", rule)
    out = spec.get("rename", group)
    if not isinstance(out, str) or not out:
        raise FormatError(origin, f"{where}: rename must be a non-empty string", rule)
    if out in RESERVED:
        raise FormatError(origin, f"{where}: {out!r} is a reserved name and cannot be a metric", rule)
    if metric_key(out) != out:
        raise FormatError(origin, f"{where}: {out!r} cannot be a metric name (blank, over {MAX_NAME_CHARS} characters, "
                          "control characters, or a name the page's objects cannot hold)", rule)
    scale = spec.get("scale")
    if scale is not None and not isinstance(scale, (int, float)):
        raise FormatError(origin, f"{where}: scale must be a number", rule)
    unit = spec.get("unit", "")
    if not isinstance(unit, str):
        raise FormatError(origin, f"{where}: unit must be a string", rule)
    convert = CONVERTERS[type_name]
    null = spec.get("null", [])
    if not isinstance(null, list) or not all(isinstance(word, str) for word in null):
        raise FormatError(origin, f"{where}: null must be a list of strings", rule)
    if null:
        convert = _null_words(convert, frozenset(null))
    fast = PLAIN_BUILTINS.get(convert) if not unit and scale is None else None
    return Field(group=group, name=out, convert=convert, unit=unit, scale=scale, fast=fast)


def _field_spec(table: Mapping[str, Any], group: str, origin: str, rule: str) -> Dict[str, Any]:
    spec = table.get(group, "float")
    if isinstance(spec, str):
        spec = {"type": spec}
    if not isinstance(spec, dict):
        raise FormatError(origin, f"fields.{group} must be a type name or a table", rule)
    return spec


def _null_words(convert: Callable[[str, str], Value], words: frozenset) -> Callable[[str, str], Value]:
    """A converter for which these exact renderings (after stripping spaces; case matters) mean null."""

    def converted(text: str, unit: str) -> Value:
        return None if text.strip() in words else convert(text, unit)

    return converted


def _pydict_fields(table: Mapping[str, Any], regex: Regex, origin: str, rule: str) -> Tuple[Extractor, ...]:
    """`type = "pydict"` fields: the group holds a printed Python dict whose numbers become `prefix` + key."""
    found = []
    for group in regex.groupindex:
        spec = _field_spec(table, group, origin, rule) if group in table else {}
        if spec.get("type") != "pydict":
            continue
        _reject_unknown(spec, _PYDICT_KEYS, origin, rule, f"key of fields.{group} (type pydict)")
        prefix = spec.get("prefix", "")
        if not isinstance(prefix, str) or not re.fullmatch(r"\w*", prefix):
            raise FormatError(origin, f"fields.{group}: prefix must be letters, digits or '_'", rule)
        found.append(_pydict_extractor(group, prefix, _renames(spec.get("rename", {}), f"fields.{group}", origin, rule)))
    return tuple(found)


def _renames(table: Any, where: str, origin: str, rule: str) -> Dict[str, str]:
    """A `rename` table of a pydict field: key as read -> metric name (`learning_rate = "lr"`)."""
    if not (isinstance(table, dict) and all(isinstance(v, str) and re.fullmatch(r"\w+", v) for v in table.values())):
        raise FormatError(origin, f"{where}: rename must be a table of names (key = \"metric\")", rule)
    return dict(table)


def _pydict_extractor(group: str, prefix: str, rename: Dict[str, str]) -> Extractor:
    def extract(groups: Dict[str, Optional[str]]) -> Tuple[Dict[str, Value], int, int]:
        text = groups.get(group)
        if text is None:
            return {}, 0, 0
        try:
            numbers = parse_pydict(text)
        except ValueError:
            return {}, 1, 0
        named = ((prefix + rename.get(k, k), v) for k, v in numbers.items())
        return {k: v for k, v in named if k not in RESERVED}, 0, 0

    return extract


def _pairs(spec: Any, regex: Regex, origin: str, rule: str) -> "_Pairs":
    """`[rule.pairs]`: `name: value` pairs found repeatedly in one group, or in each of a list of groups (parts of a
    line between the fields a rule names: MindFormers' `mtp_1_loss: 6.74, ...`)."""
    if not isinstance(spec, dict):
        raise FormatError(origin, "pairs must be a table ([rule.pairs])", rule)
    _reject_unknown(spec, _PAIRS_KEYS, origin, rule, "key of pairs")
    group = spec.get("group")
    groups = tuple(group) if isinstance(group, list) and group else (group,)
    if not all(isinstance(name, str) and name in regex.groupindex for name in groups):
        raise FormatError(origin, f"pairs.group must name a group of the rule's regex (or a list of them), not "
                          f"{group!r}", rule)
    pattern = _compile(_required_str(spec, "regex", origin, rule), origin, rule)
    if not {"name", "value"} <= set(pattern.groupindex):
        raise FormatError(origin, "pairs.regex needs (?P<name>...) and (?P<value>...) groups", rule)
    type_name = spec.get("type", "float")
    if type_name not in CONVERTERS:
        raise FormatError(origin, f"pairs: unknown type {type_name!r} (use {', '.join(CONVERTERS)})", rule)
    names = _compile(spec["names"], origin, rule) if isinstance(spec.get("names"), str) else None
    if "names" in spec and names is None:
        raise FormatError(origin, "pairs.names must be a regex string", rule)
    prefix = spec.get("prefix", "")
    if not isinstance(prefix, str):
        raise FormatError(origin, "pairs.prefix must be a string", rule)
    lower = _typed(spec, "lower", bool, False, origin, rule)
    table = spec.get("fields", {})
    if not isinstance(table, dict):
        raise FormatError(origin, "pairs.fields must be a table (name = \"type\" or a field table)", rule)
    fields = {name: _field(name, _field_spec(table, name, origin, rule), f"pairs.fields.{name}", origin, rule)
              for name in table}
    return _Pairs(groups, pattern, names, CONVERTERS[type_name], prefix, lower, fields)


#: What a pair's name becomes a metric name by: each run of other characters than letters, digits and `_` is one `_`
#: ("elapsed time per iteration (ms)" -> "elapsed_time_per_iteration_ms"). A longer name is no metric name: skipped.
_NOT_WORD = re.compile(r"\W+")
#: Where a `name: number` or `name=number` pair starts (a word, ":" or "=", a number, "[1.5]" too): a pairs group's
#: text holding one that its pairs regex did not take has a field mstail does not read (`_Pairs`, `missed`). Looked
#: for in a group's first MISSED_CHARS characters (a step line's numbers fit), which bounds its work on a 1 MiB line.
MISSED_CHARS = 4096
_PAIR_LOOKING = re.compile(r"(?<![\w.\-])[A-Za-z_]\w{0,63}\s?[:=]\s{0,8}\[?\s{0,8}[-+]?\.?\d")
MAX_PAIR_NAME = 256


class _Pairs:
    """The extractor of a `[rule.pairs]` table (an `Extractor`): the first MAX_PAIRS pairs of each of its `groups`
    (a name read in an earlier group is not read again); `regexes` lists its regexes as `Format.regexes` does. A
    user's regex that runs out of time raises TimeoutError through it (the engine counts the line).

    A pair's metric name: its `name` text (lower-cased with `lower`), and its `unit` group's text if the regex has one
    and it took part ("step time" + "s" -> "step time s"), each run of characters other than letters, digits and `_`
    made one `_` ("step_time_s"); then `fields` (that name -> a field table: type, rename, unit, scale, null) says how
    its value converts and what it is called; names not there convert with the pairs' `type`. `prefix` comes first."""

    def __init__(self, groups: Tuple[str, ...], pattern: Regex, names: Optional[Regex],
                 convert: Callable[[str, str], Value], prefix: str, lower: bool = False,
                 fields: Optional[Dict[str, Field]] = None) -> None:
        self.groups, self.pattern, self.names, self.convert, self.prefix = groups, pattern, names, convert, prefix
        self.lower, self.fields, self.unit = lower, fields or {}, "unit" in pattern.groupindex
        self.regexes = (("pairs.regex", "finditer", pattern),) + (
            (("pairs.names", "fullmatch", names),) if names is not None else ())

    def __call__(self, groups: Dict[str, Optional[str]]) -> Tuple[Dict[str, Value], int, int]:
        values: Dict[str, Value] = {}
        errors = missed = 0
        for group in self.groups:
            text = groups.get(group)
            if text:
                failed, taken = self._read(text, values)
                errors += failed
                missed += _missed(text, taken)
        return values, errors, missed

    def _read(self, text: str, values: Dict[str, Value]) -> Tuple[int, List[Tuple[int, int]]]:
        """The pairs of one group's `text` into `values`: how many failed to convert, and the spans the pairs regex
        took (`_missed`)."""
        errors = 0
        names, fields = self.names, self.fields
        taken: List[Tuple[int, int]] = []
        for found in itertools.islice(self.pattern.finditer(text), MAX_PAIRS):
            taken.append(found.span())
            printed = found.group("name")
            if names is not None and not names.fullmatch(printed):
                continue
            if self.unit and found.group("unit"):
                printed = f"{printed} {found.group('unit')}"
            if len(printed) > MAX_PAIR_NAME:
                continue
            key = _NOT_WORD.sub("_", printed.lower() if self.lower else printed).strip("_")
            spec = fields.get(key)
            name = self.prefix + (spec.name if spec is not None else key)
            if not key or name in RESERVED or name in values:
                continue
            try:
                values[name] = spec.value(found.group("value")) if spec is not None else \
                    self.convert(found.group("value"), "")
            except (ValueError, OverflowError):
                errors += 1
        return errors, taken


def _missed(text: str, taken: List[Tuple[int, int]]) -> int:
    """How many `name: number` pairs of `text` (`_PAIR_LOOKING`, in its first MISSED_CHARS) start outside the `taken` spans
    (in order): fields a pairs regex leaves unread, counted rather than dropped without a word."""
    missed, spans, span = 0, iter(taken), (-1, -1)
    for found in itertools.islice(_PAIR_LOOKING.finditer(text, 0, MISSED_CHARS), MAX_PAIRS):
        start = found.start()
        while span[1] <= start:
            span = next(spans, (len(text) + 1, len(text) + 1))
        if start < span[0]:
            missed += 1
    return missed


def _compile(pattern: str, origin: str, rule: Optional[str]) -> Regex:
    """A built-in format's regex on `re` (they are written to run in linear time: tests/parsers/test_regex_bounds.py);
    a user's on `regex` with a time budget per call (`bounded`). Either way Python `re` syntax, checked by `re`."""
    # PCRE-style (?<name>...) is common in lnav/fluent-bit formats people copy from; Python needs (?P<name>.
    pattern = _PCRE_NAME.sub("(?P<", pattern)
    try:
        return re.compile(pattern) if origin == BUILTIN_ORIGIN else compile_bounded(pattern)
    except re.error as exc:
        raise FormatError(origin, f"bad regex: {exc}", rule) from None


def _table_list(data: Mapping[str, Any], key: str, origin: str) -> Iterable[Mapping[str, Any]]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise FormatError(origin, f"{key} must be an array of tables ([[{key}]])")
    return value


def _required_str(data: Mapping[str, Any], key: str, origin: str, rule: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise FormatError(origin, f"missing {key} (a string)", rule)
    return value


def _typed(data: Mapping[str, Any], key: str, kind: type, default: Any, origin: str, rule: Optional[str]) -> Any:
    value = data.get(key, default)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise FormatError(origin, f"{key} must be a {kind.__name__}", rule)
    return value


def _reject_unknown(data: Mapping[str, Any], allowed: set, origin: str, rule: Optional[str], what: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise FormatError(origin, f"unknown {what} {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})", rule)


def format_table(formats: Sequence[Format]) -> Dict[str, Format]:
    """Formats by name (the first of a name wins, as in detection order)."""
    table: Dict[str, Format] = {}
    for fmt in formats:
        table.setdefault(fmt.name, fmt)
    return table
