"""The rooms of the package call in one direction (ARCHITECTURE.md, Layout): a module imports only from its own room
and the rooms below it in `ORDER`, under TYPE_CHECKING and inside functions too, so there is no import cycle
between rooms and a change to a lower room never needs a higher one."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the rooms, lowest first: each may import from itself and those before it
ORDER = ("mstail", "parsers", "callback", "tailer.notices", "tailer.inputs", "tailer.history", "tailer.alerts", "tailer.outbound",
         "tailer.config", "tailer.offline", "tailer.live", "web", "tailer.app", "__main__")
#: where each top-level folder installs (pyproject.toml's package-dir)
FOLDERS = {"mstail": "mstail", "parsers": "mstail.parsers", "tailer": "mstail.tailer", "web": "mstail.web"}


def modules() -> Dict[str, Path]:
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def room(module: str) -> str:
    """The room a dotted module name belongs to ("mstail.tailer.history.db" -> "tailer.history")."""
    parts = module.split(".")[1:]
    if not parts:
        return "mstail"
    if parts[0] in ("callback", "__main__"):
        return parts[0]  # the MindSpore callback (on the record's definition); `python -m mstail` (on the CLI)
    if parts[0] == "tailer" and len(parts) > 1:
        return f"tailer.{parts[1]}"
    return parts[0] if parts[0] in ("parsers", "web", "tailer") else "mstail"


def imports(path: Path, known: Dict[str, Path]) -> Iterator[Tuple[int, str]]:
    """(line, module) of every import of an mstail module in a file, wherever it stands."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names if alias.name.startswith("mstail"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mstail") and not node.level:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                yield node.lineno, name if name in known else node.module


def test_every_room_is_in_the_order():
    assert {room(module) for module in modules()} - {"tailer"} <= set(ORDER)


def test_no_module_imports_from_a_room_above_its_own():
    known = modules()
    rank = {name: index for index, name in enumerate(ORDER)}
    upward: List[str] = []
    for module, path in known.items():
        own = room(module)
        if own == "tailer":
            continue  # the package's docstring only
        for line, target in imports(path, known):
            if room(target) != own and rank.get(room(target), -1) > rank[own]:
                upward.append(f"{path.relative_to(ROOT)}:{line} ({own}) imports {target} ({room(target)})")
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize("module, expected", [("mstail.tailer.history.db", "tailer.history"),
                                              ("mstail.tailer.config", "tailer.config"),
                                              ("mstail.parsers.record", "parsers"), ("mstail.web.sse", "web"),
                                              ("mstail.platform", "mstail"),
                                              ("mstail.callback", "callback")])
def test_room_names_a_module_s_room(module, expected):
    assert room(module) == expected
