"""The history room (`mstail.tailer.history`) is a layer: it imports only the parsers, the checkpoint's data type and
itself (never the configuration, the inputs' discovery or anything above it), and its SQLite file's module never
imports the store that uses it. Read from the source, imports inside functions and type-checking blocks included."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Set

import mstail.tailer.history as history

ALLOWED = ("mstail.parsers", "mstail.tailer.inputs.checkpoint", "mstail.tailer.history")


def _imports() -> Dict[str, Set[str]]:
    """Module file name -> the mstail modules it imports."""
    out: Dict[str, Set[str]] = {}
    for path in sorted(Path(history.__file__).parent.glob("*.py")):
        found: Set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert node.level == 0, f"{path.name}: a relative import"
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        out[path.name] = {name for name in found if name == "mstail" or name.startswith("mstail.")}
    return out


def test_the_history_imports_only_the_parsers_the_checkpoint_and_itself_and_its_file_never_the_store() -> None:
    imports = _imports()
    assert {"store.py", "db.py", "columns.py"} <= set(imports)
    outside = {name: sorted(m for m in found if not any(m == a or m.startswith(a + ".") for a in ALLOWED))
               for name, found in imports.items()}
    assert {name: found for name, found in outside.items() if found} == {}
    assert "mstail.tailer.history.db" in imports["store.py"]
    assert "mstail.tailer.history.store" not in imports["db.py"]
