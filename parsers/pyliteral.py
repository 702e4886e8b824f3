"""Numbers out of a printed Python dict (`str(dict)`), without evaluating it: the `pydict` field type.

MindFormers logs `Eval result: {'PerplexityMetric': {'loss': 2.93, 'PPL': 18.7}}, ...` and MindSpore
`Eval result: epoch 2, metrics: {'accuracy': 0.9375}`. The text is parsed with `ast.parse` and only literal
shapes are read (never `eval`, not even `ast.literal_eval`, which refuses the renderings real logs hold):
`nan`/`inf` (a float's `str`), `np.float64(2.93)` (numpy >= 2 scalars), `Tensor(shape=[], dtype=Float32,
value= 2.93)`, `array(2.93, dtype=float32)`, `[2.93]` (a one-element list), booleans (0/1) and `None` (null).
Anything else (strings, longer lists) is left out.

Naming: nested dicts are flattened to their leaf key (`{'PerplexityMetric': {'loss': 2.93}}` -> `loss`), so a
metric keeps the name users know whatever class wraps it; when two leaves share a key, those leaves are named by
their whole path joined with `_` (`PerplexityMetric_loss`). Characters other than letters, digits and `_` become
`_` (`'rouge-1'` -> `rouge_1`), so every name is usable in a query or an alert rule.
"""

from __future__ import annotations

import ast
import math
import re
from typing import Any, Dict, List, Optional, Tuple, Union

Number = Union[int, float, None]

#: Longer texts are not parsed (a dict of eval metrics is short; a runaway line is not one).
MAX_CHARS = 64 * 1024
_NON_FINITE = {"nan": math.nan, "NaN": math.nan, "inf": math.inf, "Infinity": math.inf}
_NOT_A_NUMBER = object()
_UNSAFE = re.compile(r"\W+")


def parse_pydict(text: str) -> Dict[str, Number]:
    """`{'a': {'loss': 2.5, 'PPL': nan}}` -> {'loss': 2.5, 'PPL': nan}; ValueError if the text is not a dict."""
    text = text.strip()
    if len(text) > MAX_CHARS:
        raise ValueError("dict text too long")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ValueError(f"not a Python dict: {text[:80]!r}") from None
    if not isinstance(tree.body, ast.Dict):
        raise ValueError(f"not a Python dict: {text[:80]!r}")
    leaves: List[Tuple[Tuple[str, ...], Number]] = []
    try:
        _walk(tree.body, (), leaves)
    except RecursionError:
        raise ValueError("dict nested too deeply") from None
    counts: Dict[str, int] = {}
    for path, _ in leaves:
        counts[path[-1]] = counts.get(path[-1], 0) + 1
    out: Dict[str, Number] = {}
    for path, value in leaves:
        name = path[-1] if counts[path[-1]] == 1 else "_".join(path)
        name = _UNSAFE.sub("_", name).strip("_") or "value"
        out.setdefault(name, value)
    return out


def _walk(node: ast.Dict, path: Tuple[str, ...], leaves: List[Tuple[Tuple[str, ...], Number]]) -> None:
    for key_node, value_node in zip(node.keys, node.values):
        if not (isinstance(key_node, ast.Constant) and isinstance(key_node.value, (str, int, float))):
            continue  # `**other` or an exotic key
        key = path + (str(key_node.value),)
        if isinstance(value_node, ast.Dict):
            _walk(value_node, key, leaves)
            continue
        value = _number(value_node)
        if value is not _NOT_A_NUMBER:
            leaves.append((key, value))


def _number(node: ast.AST) -> Any:
    """The number a literal-looking node renders, or _NOT_A_NUMBER."""
    if isinstance(node, ast.Constant):
        value = node.value
        if value is None or isinstance(value, bool):
            return None if value is None else int(value)
        if isinstance(value, (int, float)):
            return value
        return _NOT_A_NUMBER
    if isinstance(node, ast.Name):
        return _NON_FINITE.get(node.id, _NOT_A_NUMBER)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _number(node.operand)
        if isinstance(inner, (int, float)):
            return -inner if isinstance(node.op, ast.USub) else inner
        return _NOT_A_NUMBER
    if isinstance(node, (ast.List, ast.Tuple)):
        return _number(node.elts[0]) if len(node.elts) == 1 else _NOT_A_NUMBER
    if isinstance(node, ast.Call) and _dotted(node.func):
        # np.float64(2.93), float32(nan), array(2.93, dtype=float32), Tensor(shape=[], dtype=Float32, value= 2.93)
        for keyword in node.keywords:
            if keyword.arg == "value":
                return _number(keyword.value)
        if node.args:
            return _number(node.args[0])
    return _NOT_A_NUMBER


def _dotted(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None
