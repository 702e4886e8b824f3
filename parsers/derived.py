"""Derived series: metrics computed from a record's own metrics, as if the log had printed them.

Built in: perplexity, `exp(loss)`, of the language-model loss only (`loss`, and `lm_loss` where a log prints it beside
the total: `LM_LOSSES`), clipped to the largest float where the exponential overflows (a loss above ~709.78); never of
the other losses a model reports (`load_balancing_loss`, `z_loss`, `mtp_1_loss`: their exponential means nothing). A
loss named `x_loss` gets `x_perplexity`, another name `name_perplexity`. A user declares more in a TOML file
(`--derived FILE`):

    perplexity = true            # the built-in one (default true); false: none; or the losses: ["loss", "eval_loss"]

    [constants]
    seq_length = 4096            # numbers the expressions may use by name

    [series]
    tokens_per_s = "samples_per_s * seq_length"
    tflops_per_card = "throughput_tflops / 8"

An expression is arithmetic over the record's metrics and the constants: numbers, names, `+ - * / **`, unary
minus, parentheses and the functions `exp log log2 log10 sqrt abs min max`. It is parsed once, at load, with
Python's `ast` into a tree of these nodes only and evaluated by walking it: never `eval`, no attribute, no
subscript, no call of anything else. Evaluation follows IEEE arithmetic where Python raises: x/0 is ±inf (0/0
NaN), an overflow is inf, a math domain error (log of a negative) is NaN. A series is
computed when every name it uses is a number in the record (a NaN loss gives a NaN perplexity, which the charts
mark); a record that has the name already keeps its own value. Series are computed in the order declared, so
one may use another, declared before it: a series reading one declared later (or itself, or in a cycle) is an error
at load, as is a constant named like a metric (a series, a perplexity, a built-in format's field), which would
silently replace it in every expression.

Where: `InterleavedParser` applies a `Derived` to what each of its parsers emits (`Deriver`), so the sidecar
(its API, SSE, alerts, `/metrics`) and `mstail parse` (JSONL, CSV) see the same values. A record gets its
derived values when emitted; an `amend` item (values a later line adds to the last record: TimeMonitor, the
progress line) gets those that its values make computable, from the record's values and its own. What records
with one key set get is worked out once, as a function (`Derived._compile`): a format's records share a few.
"""

from __future__ import annotations

import ast
import math
import operator
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Mapping, Optional, Set, Tuple, TypeVar, Union

from .record import MAX_NAME_CHARS, RESERVED, Item, metric_key

EXPRESSION_MAX = 500  # characters of one expression (Python's parser must never see a pathological input)
NODES_MAX = 100  # nodes of one expression tree
PLANS_MAX = 256  # key sets remembered (a format's records have a few)
#: The language-model losses whose perplexity is derived by default: the formats' names for it (Megatron's "lm loss"
#: and MindFormers' are read as `loss`; MindFormers' pipeline stages print `lm_loss` beside the total).
LM_LOSSES = ("loss", "lm_loss")
_LARGEST = sys.float_info.max

Evaluate = Callable[[Mapping[str, float]], float]
T = TypeVar("T")
#: A record -> the derived values it gets (`Derived._compile`).
Compute = Callable[[Mapping[str, Any]], Dict[str, float]]
#: A declared series as a key set computes it: its name, its expression, and each name it reads with whether that
#: is derived before it (else the record's own).
Step = Tuple[str, Evaluate, Tuple[Tuple[str, bool], ...]]


class DerivedError(ValueError):
    """A derived-series file that cannot be used: the file, the series and why, in one line."""


@dataclass(frozen=True)
class Series:
    """One derived series: its name, the names it reads, and its compiled expression."""

    name: str
    text: str
    names: Tuple[str, ...]
    evaluate: Evaluate = field(compare=False)


@dataclass(frozen=True)
class Derived:
    """The derived series to add to records.

    Attributes:
        perplexity: the losses whose `exp` is added (`perplexity_name`), as a tuple of metric names; True (the default)
            gives `LM_LOSSES`, False none.
        series: user-declared series, in the order they are computed.
        constants: the TOML's `[constants]` the series were compiled with, as (name, value) pairs.
    """

    perplexity: Union[bool, Tuple[str, ...]] = True
    series: Tuple[Series, ...] = ()
    constants: Tuple[Tuple[str, float], ...] = ()
    _computers: Dict[Tuple[str, ...], Compute] = field(
        default_factory=dict, compare=False, repr=False)  # key set -> its values' function (`_compile`)
    _readers: Dict[Tuple[str, ...], bool] = field(
        default_factory=dict, compare=False, repr=False)  # an amend's key set -> `reads_any` of it
    _inputs: FrozenSet[str] = field(default=frozenset(), init=False, compare=False, repr=False)  # what series read

    def __post_init__(self) -> None:
        if isinstance(self.perplexity, bool):
            object.__setattr__(self, "perplexity", LM_LOSSES if self.perplexity else ())
        object.__setattr__(self, "_inputs", frozenset(
            [name for s in self.series for name in s.names] + list(self._losses)))

    @property
    def _losses(self) -> Tuple[str, ...]:
        """`perplexity` as `__post_init__` leaves it: the losses, a tuple."""
        return self.perplexity  # type: ignore[return-value]  # a bool is made a tuple in __post_init__

    def values(self, record: Mapping[str, Any]) -> Dict[str, float]:
        """The derived values computable from `record`'s metrics that it does not have yet, in order."""
        keys = tuple(record)
        compute = self._computers.get(keys)
        if compute is None:
            compute = self._compile(keys)
        return compute(record)

    def _compile(self, keys: Tuple[str, ...]) -> Compute:
        """The function giving `values` of records with these keys (a format's records share a few key sets): the
        perplexities of their losses, then the declared series they lack, in order; remembered for the key set."""
        losses: List[Tuple[str, str]] = []  # (perplexity's name, the loss it is of)
        names = set(keys)  # the record's and those computed before: a name computed once only
        for key in keys:
            if key in self._losses:
                name = perplexity_name(key)
                if name not in names:
                    losses.append((name, key))
                    names.add(name)
        # A declared series is computed when each name it reads is a number: of the record (its keys), or derived
        # before it here. One that reads anything else never is, for this key set: left out.
        steps: List[Step] = []
        derived, own = {name for name, _ in losses}, frozenset(keys)
        for s in self.series:
            if s.name not in names and all(used in derived or used in own for used in s.names):
                steps.append((s.name, s.evaluate, tuple((used, used in derived) for used in s.names)))
                derived.add(s.name)
            names.add(s.name)  # computed here or not, a later series of that name is not
        if steps:
            compute = _with_series(losses, steps)
        elif losses:
            compute = _perplexities(losses)
        else:
            compute = _nothing
        return _remember(self._computers, keys, compute)

    def describe(self) -> List[str]:
        """What decides the values this adds, one line each (the state file's fingerprint: another `--derived`
        file gives another history)."""
        return ([f"derived perplexity of {' '.join(self._losses) or 'nothing'}"]
                + [f"derived constant {k} {v!r}" for k, v in self.constants]
                + [f"derived series {s.name} {s.text}" for s in self.series])

    def reads_any(self, keys: Iterable[str]) -> bool:
        """Whether a series reads one of these metrics (a loss, for perplexity): values a record gains can make
        a series computable only then (the answer is remembered per key set: an amend's keys repeat)."""
        keys = tuple(keys)
        known = self._readers.get(keys)
        if known is None:
            known = _remember(self._readers, keys, any(key in self._inputs for key in keys))
        return known

    @property
    def empty(self) -> bool:
        return not self.perplexity and not self.series


def perplexity_name(loss: str) -> str:
    """The name of `loss`'s perplexity: "eval_loss" -> "eval_perplexity", "loss" -> "perplexity", "nll" ->
    "nll_perplexity"."""
    if loss.endswith("loss"):
        return loss[: -len("loss")] + "perplexity"
    return loss + "_perplexity"


def load_derived(path: Optional[str]) -> Derived:
    """The built-in perplexity plus the series a TOML file declares (None: the built-in only). DerivedError, naming
    the file and the entry, for what cannot be used: a series reading one declared after it (or itself), a constant
    named like a metric."""
    if path is None:
        return Derived()
    from mstail.platform import tomllib

    try:
        with open(path, "rb") as handle:
            table = tomllib.load(handle)
    except OSError as exc:
        raise DerivedError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise DerivedError(f"{path}: not valid TOML ({exc})") from None
    unknown = set(table) - {"perplexity", "constants", "series"}
    if unknown:
        raise DerivedError(f"{path}: unknown key(s) {', '.join(sorted(unknown))} (perplexity, constants, series)")
    perplexity = table.get("perplexity", True)
    if isinstance(perplexity, list) and all(isinstance(name, str) and metric_key(name) == name and name not in RESERVED
                                            for name in perplexity):
        perplexity = tuple(dict.fromkeys(perplexity))
    elif not isinstance(perplexity, bool):
        raise DerivedError(f"{path}: perplexity must be true, false or a list of loss names (\"loss\", \"eval_loss\")")
    constants = table.get("constants", {})
    series = table.get("series", {})
    if not isinstance(constants, dict) or not isinstance(series, dict):
        raise DerivedError(f"{path}: [constants] and [series] must be tables")
    for name, value in constants.items():
        _check_name(path, "constant", name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not _fits(value):
            raise DerivedError(f"{path}: constant {name}: must be a number")
    losses = LM_LOSSES if perplexity is True else perplexity or ()
    _check_constants(path, constants, series, losses)
    compiled: List[Series] = []
    for name, text in series.items():
        _check_name(path, "series", name)
        if name in RESERVED:
            raise DerivedError(f"{path}: series {name}: a reserved key ({', '.join(sorted(RESERVED))})")
        if not isinstance(text, str):
            raise DerivedError(f"{path}: series {name}: the expression must be a string")
        try:
            compiled.append(compile_expression(name, text, {k: float(v) for k, v in constants.items()}))
        except ValueError as exc:
            raise DerivedError(f"{path}: series {name}: {exc}") from None
        _check_order(path, compiled[-1], series)
    return Derived(perplexity=perplexity, series=tuple(compiled),
                   constants=tuple(sorted((k, float(v)) for k, v in constants.items())))


def _check_name(path: str, kind: str, name: str) -> None:
    """A series' name is a metric's, kept as it is (`metric_key`, as a format's field names are), and so is a
    constant's (it may stand where a metric's name does)."""
    if metric_key(name) != name:
        raise DerivedError(f"{path}: {kind} {name!r}: cannot be a metric name (blank, over {MAX_NAME_CHARS} "
                           "characters, control characters, or a name the page's objects cannot hold)")


def _check_order(path: str, declared: Series, series: Mapping[str, Any]) -> None:
    """A series reads only metrics and series declared before it: one declared at or after it is never computed (series
    are computed in order), and in a cycle none is."""
    later = list(series)[list(series).index(declared.name):]
    for used in declared.names:
        if used == declared.name:
            raise DerivedError(f"{path}: series {used}: it reads itself")
        if used in later:
            raise DerivedError(f"{path}: series {declared.name}: reads {used}, declared after it (series are computed "
                               f"in the order declared: declare {used} first, and no cycle)")


def _check_constants(path: str, constants: Mapping[str, Any], series: Mapping[str, Any], losses: Iterable[str]) -> None:
    """No constant is named like a metric: in every expression it would replace that metric's value."""
    metrics = {**dict.fromkeys(_format_metrics(), "a metric of the built-in formats"),
               **{perplexity_name(loss): "a perplexity" for loss in losses}, **dict.fromkeys(losses, "a loss"),
               **dict.fromkeys(series, "a series of this file"), **dict.fromkeys(RESERVED, "a reserved key")}
    for name in constants:
        if name in metrics:
            raise DerivedError(f"{path}: constant {name}: named like {metrics[name]}, which it would replace in every "
                               f"expression; give it another name")


def _format_metrics() -> FrozenSet[str]:
    """The metric names the built-in formats' fields and pairs give (`loss`, `lr`, `grad_norm`, `step_time_ms`...)."""
    from .loader import builtin_formats

    names: Set[str] = set()
    for fmt in builtin_formats():
        for rule in fmt.rules:
            names.update(spec.name for spec in rule.fields)
            for extract in rule.extract:  # pairs: their renamed fields (`lm_loss` -> `loss`)
                prefix = getattr(extract, "prefix", "")
                names.update(prefix + spec.name for spec in getattr(extract, "fields", {}).values())
    return frozenset(names)


_BINARY: Dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: lambda a, b: _divide(a, b),
    ast.Pow: operator.pow,
}
_FUNCTIONS: Dict[str, Callable[..., float]] = {
    "exp": math.exp, "log": math.log, "log2": math.log2, "log10": math.log10, "sqrt": math.sqrt, "abs": abs,
    "min": min, "max": max,
}


def compile_expression(name: str, text: str, constants: Mapping[str, float]) -> Series:
    """`text` as a `Series` named `name`; ValueError (with the reason) for anything outside the language."""
    if len(text) > EXPRESSION_MAX:
        raise ValueError(f"longer than {EXPRESSION_MAX} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ValueError(f"not an expression ({getattr(exc, 'msg', exc)})") from None
    if sum(1 for _ in ast.walk(tree)) > NODES_MAX:
        raise ValueError(f"more than {NODES_MAX} parts")
    names: List[str] = []

    def build(node: ast.AST) -> Evaluate:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            value = float(node.value)
            return lambda _v: value
        if isinstance(node, ast.Name):
            if node.id in constants:
                value = constants[node.id]
                return lambda _v: value
            if node.id in _FUNCTIONS:
                raise ValueError(f"{node.id} is a function: call it, {node.id}(...)")
            names.append(node.id)
            key = node.id
            return lambda v: v[key]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            op, left, right = _BINARY[type(node.op)], build(node.left), build(node.right)
            return lambda v: op(left(v), right(v))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            inner = build(node.operand)
            return (lambda v: -inner(v)) if isinstance(node.op, ast.USub) else inner
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
                and not node.keywords and node.args):
            function, args = _FUNCTIONS[node.func.id], [build(a) for a in node.args]
            if node.func.id not in ("min", "max") and len(args) != 1:
                raise ValueError(f"{node.func.id}() takes one argument")
            return lambda v: function(*(a(v) for a in args))
        raise ValueError(f"`{ast.unparse(node)[:60]}` is not allowed (numbers, metric names, + - * / **, "
                         f"{', '.join(_FUNCTIONS)})")

    body = build(tree.body)

    def evaluate(values: Mapping[str, float]) -> float:
        try:
            return float(body(values))
        except OverflowError:  # exp, ** (Python raises where IEEE gives inf; * and + give inf by themselves)
            return math.inf
        except (ValueError, ZeroDivisionError):
            return math.nan
        except TypeError:  # a complex result (a negative number to a fractional power)
            return math.nan

    return Series(name, text, tuple(dict.fromkeys(names)), evaluate)


def _remember(cache: Dict[Tuple[str, ...], T], keys: Tuple[str, ...], value: T) -> T:
    """`value`, kept in `cache` for `keys` (emptied first when it holds PLANS_MAX key sets)."""
    if len(cache) >= PLANS_MAX:
        cache.clear()
    cache[keys] = value
    return value


def _nothing(_record: Mapping[str, Any]) -> Dict[str, float]:
    return {}


def _perplexities(losses: List[Tuple[str, str]]) -> Compute:
    """Each (name, loss) of `losses`: name = exp(the record's loss), when that is a number."""
    def compute(record: Mapping[str, Any]) -> Dict[str, float]:
        out: Dict[str, float] = {}
        for name, loss in losses:
            value = record[loss]
            if value.__class__ is not float:  # most losses are floats: the others as `_number` says
                value = _number(value)
                if value is None:
                    continue
            out[name] = _exp(value)
        return out
    return compute


def _with_series(losses: List[Tuple[str, str]], steps: List[Step]) -> Compute:
    """The perplexities of `losses`, then each series of `steps` whose names are all numbers, in order."""
    perplexities = _perplexities(losses) if losses else _nothing

    def compute(record: Mapping[str, Any]) -> Dict[str, float]:
        out = perplexities(record)
        for name, evaluate, uses in steps:
            numbers = {}
            for used, derived in uses:
                value = out.get(used) if derived else record[used]  # derived: absent where it was no number
                if value.__class__ is not float:
                    value = _number(value)
                    if value is None:
                        break
                numbers[used] = value
            else:
                out[name] = evaluate(numbers)
        return out
    return compute


def _divide(a: float, b: float) -> float:
    """a / b, and for b == 0 what IEEE says: ±inf, or NaN for 0/0 (Python raises)."""
    if b:
        return a / b
    if a == 0 or a != a:
        return math.nan
    return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _exp(value: float) -> float:
    try:
        return math.exp(value)
    except OverflowError:
        return _LARGEST


def _fits(value: Any) -> bool:
    return _number(value) is not None


def _number(value: Any) -> Optional[float]:
    """A metric's value as a float; None for what is not a number (text, None) or does not fit a float."""
    if not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:  # an int of 400 digits
        return None


class Deriver:
    """Applies a `Derived` to one parser's items, remembering the last record's metrics for its amends."""

    def __init__(self, derived: Derived) -> None:
        self.derived = derived
        self._last: Dict[str, Any] = {}  # the last record's values, amends folded in

    def apply(self, items: List[Item]) -> List[Item]:
        values, reads_any = self.derived.values, self.derived.reads_any
        last = self._last
        for kind, data in items:
            if kind == "record":
                data.update(values(data))
                self._last = last = dict(data)  # our own copy: an amend's values join it in place
            elif kind == "amend" and data.get("step") == last.get("step"):
                last.update(data)  # an amend adds new keys only
                if reads_any(data):  # else nothing `last` lacked became computable
                    added = values(last)  # only what `last` lacks
                    data.update(added)
                    last.update(added)
        return items
