"""ARCHITECTURE.md is a map of the tree as it is: every file, module, name, route and option it mentions in
backticks exists. Read from the sources (ast), importing nothing, so the check is fast and needs no optional
dependency. Also the documents' size bounds: the map at most 15 KiB, the README at most 300 lines."""
from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

ROOT = Path(__file__).resolve().parents[1]
MAP = ROOT / "ARCHITECTURE.md"
PACKAGE_FOLDERS = ("mstail", "tailer", "parsers", "web")  # installed as mstail, mstail.tailer, ...
FILE_SUFFIXES = (".py", ".js", ".md", ".toml", ".json", ".sh", ".css", ".html", ".yml")
MAX_MAP_BYTES = 15 * 1024
MAX_README_LINES = 300

_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_SPAN = re.compile(r"`([^`\n]+)`")
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = re.compile(rf"{_IDENTIFIER}(?:\.{_IDENTIFIER})+")
_CLASS_OR_CONSTANT = re.compile(r"[A-Z][A-Za-z0-9_]*")


class Module:
    """What one module defines at its top level, and the members of each of its classes."""

    def __init__(self, path: Path) -> None:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        self.names: Set[str] = set()
        self.classes: Dict[str, Set[str]] = {}
        for node in tree.body:
            self.names |= _defined(node)
            if isinstance(node, ast.ClassDef):
                self.classes[node.name] = _members(node)


def _defined(node: ast.stmt) -> Set[str]:
    """The names a statement binds: `def NAME`, `class NAME`, `NAME = ...`, `NAME: type = ...`."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return {name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name)}


def _members(cls: ast.ClassDef) -> Set[str]:
    """A class's methods and class-level fields, and the attributes its methods set on `self`."""
    members: Set[str] = set()
    for node in cls.body:
        members |= _defined(node)
    for node in ast.walk(cls):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name) and node.value.id == "self"):
            members.add(node.attr)
    return members


@lru_cache(maxsize=None)
def modules() -> Dict[str, Module]:
    """Every module of the package by its dotted name, as the repository spells it (`tailer.inputs.follower`) and
    as it is installed (`mstail.tailer.inputs.follower`)."""
    found: Dict[str, Module] = {}
    for folder in PACKAGE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            module = Module(path)
            found[".".join(parts)] = module
            if parts[0] != "mstail":
                found[".".join(("mstail",) + parts)] = module
    return found


def module_named(dotted: str) -> Optional[Module]:
    """The module a dotted name means: its full name, or the one module whose name ends with it (`alerts.engine`)."""
    everything = modules()
    if dotted in everything:
        return everything[dotted]
    ending = [module for name, module in everything.items() if name.endswith("." + dotted)]
    return ending[0] if len(set(map(id, ending))) == 1 else None


def name_exists(dotted: str) -> bool:
    """`module`, `module.NAME`, `module.Class.member` or `Class.member`, where the name is defined."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = module_named(".".join(parts[:cut]))
        if module is None:
            continue
        rest = parts[cut:]
        if not rest:
            return True
        if len(rest) == 1:
            return rest[0] in module.names
        return len(rest) == 2 and rest[1] in module.classes.get(rest[0], set())
    if len(parts) == 2:  # Class.member, the class defined in any module
        return any(parts[1] in module.classes.get(parts[0], set()) for module in modules().values())
    return False


def top_level_name_exists(name: str) -> bool:
    return any(name in module.names for module in modules().values())


def path_exists(text: str) -> bool:
    """A path from the repository's root (a glob matches something); a bare file name exists in the package."""
    if "/" not in text:
        return any(True for folder in PACKAGE_FOLDERS for _ in (ROOT / folder).rglob(text))
    return any(True for _ in ROOT.glob(text.rstrip("/"))) if "*" in text else (ROOT / text).exists()


@lru_cache(maxsize=None)
def sources_of(folder: str) -> str:
    return "\n".join(path.read_text(encoding="utf-8") for path in sorted((ROOT / folder).rglob("*.py")))


@lru_cache(maxsize=None)
def routes() -> Set[str]:
    """The paths the web app serves: each module's route decorators, under its router's prefix."""
    served = set()
    for path in (ROOT / "web").glob("*.py"):
        text = path.read_text(encoding="utf-8")
        prefix = re.search(r'APIRouter\([^)]*prefix="([^"]*)"', text)
        for route in re.findall(r'@\w+\.(?:get|post|put|delete|api_route)\("([^"]+)"', text):
            served.add((prefix.group(1) if prefix else "") + route)
    return served


def mentions(text: str) -> List[str]:
    """The text of every inline code span outside fenced blocks."""
    return _SPAN.findall(_FENCE.sub("", text))


def check(span: str) -> Tuple[Optional[str], bool]:
    """(what kind of mention, whether it exists); (None, True) for a span that names nothing checkable (a key, a
    value, a command line)."""
    if span.startswith("/"):
        if "*" in span:
            return None, True
        return "route", span.split("?")[0] in routes()
    if span.startswith("--") and re.fullmatch(r"--[a-z][a-z-]*", span):
        return "option", f'"{span}"' in sources_of("tailer")
    if "/" in span or span.endswith(FILE_SUFFIXES):
        if " " in span:
            return None, True
        return "file", path_exists(span)
    if _DOTTED.fullmatch(span):
        return "name", name_exists(span)
    if _CLASS_OR_CONSTANT.fullmatch(span):
        return "name", top_level_name_exists(span)
    return None, True


def missing_from(text: str) -> Tuple[List[str], int]:
    """The mentions that name nothing in the tree, and how many mentions were checked."""
    missing, checked = [], 0
    for span in dict.fromkeys(mentions(text)):
        kind, exists = check(span)
        if kind is None:
            continue
        checked += 1
        if not exists:
            missing.append(f"{kind} `{span}`")
    return missing, checked


def test_every_mention_of_the_map_exists() -> None:
    missing, checked = missing_from(MAP.read_text(encoding="utf-8"))
    assert checked >= 100, f"only {checked} mentions checked: is the map's markup still `code`?"
    assert not missing, "ARCHITECTURE.md mentions what the tree does not have:\n" + "\n".join(missing)


def test_every_module_is_on_the_map() -> None:
    """A module added without its line on the map is caught: its path or its file name is mentioned."""
    spans = set(mentions(MAP.read_text(encoding="utf-8")))
    named = {span.rsplit("/", 1)[-1] for span in spans}
    absent = [str(path.relative_to(ROOT)) for folder in PACKAGE_FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))
              if path.name != "__init__.py" and path.name not in named]
    assert not absent, "modules missing from ARCHITECTURE.md's layout: " + ", ".join(absent)


def test_a_wrong_mention_is_caught() -> None:
    """The checker itself: each kind of mention that does not exist is found, each that does passes."""
    wrong = ("`tailer/inputs/nowhere.py` `web/static/nowhere.js` `docs/nowhere.md` `tailer.history.nowhere` "
             "`history.store.Store.nowhere` `Store.nowhere` `store.nowhere` `NoSuchClass` `/api/nowhere` "
             "`--no-such-option` `nowhere.py`")
    missing, checked = missing_from(wrong)
    assert checked == 11 and len(missing) == 11, missing
    right = ("`tailer/live/sidecar.py` `web/static/app.js` `docs/performance.md` `parsers/formats/*.toml` "
             "`tailer.history.store` `mstail.tailer.history.store.Store` `history.store.Store.add` `Store.add` "
             "`Config.pass_time_s` `Tailer.alerts` `Store` `PART_KEY` `/api/series` `--poll` `record.py`")
    assert missing_from(right) == ([], 15)


def test_the_map_is_short() -> None:
    size = len(MAP.read_bytes())
    assert size <= MAX_MAP_BYTES, f"ARCHITECTURE.md is {size} bytes, over {MAX_MAP_BYTES}: a map, not a manual"


def test_the_readme_is_short() -> None:
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines, over {MAX_README_LINES}: details go to docs/"
