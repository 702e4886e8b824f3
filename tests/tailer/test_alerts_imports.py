"""The alerts room's modules depend on each other one way: none imports a module that imports it back, not even under
`TYPE_CHECKING` or inside a function (every import statement in their source counts)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Set

import mstail.tailer.alerts as alerts

ROOM = Path(alerts.__file__).parent
PACKAGE = "mstail.tailer.alerts"


def _imports() -> Dict[str, Set[str]]:
    """Each module of the room -> the room's modules it imports."""
    modules = {f"{PACKAGE}.{path.stem}": path for path in ROOM.glob("*.py") if path.stem != "__init__"}
    edges: Dict[str, Set[str]] = {}
    for name, path in modules.items():
        named: Set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                named.add(node.module)
                named.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                named.update(alias.name for alias in node.names)
        edges[name] = {target for target in named if target in modules and target != name}
    return edges


def _reachable(edges: Dict[str, Set[str]], start: str) -> Set[str]:
    seen: Set[str] = set()
    todo = [start]
    while todo:
        for target in edges[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_no_alerts_module_imports_one_that_imports_it_back() -> None:
    edges = _imports()
    assert f"{PACKAGE}.engine" in edges  # the room was read
    assert [module for module in edges if module in _reachable(edges, module)] == []
