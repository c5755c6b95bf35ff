"""Every engine citation tpplan holds, and what each is pinned to.

A fact about an engine is worth what its citation lets the next reader check, so every `Source` names a
release or a commit (`kind`): a release as "0.5.23 (PyPI wheel)" or "sglang-router 0.3.2 (PyPI sdist, ...)",
a commit as "commit 4eb3ad5a", or an open pull request's description as "PR #34059 description 2026-08-08"
(no release or commit has that code yet). A fact nobody read says so (`Source.unread`, with why). `held`
walks the records (`ENGINES` and every module-level value of the engine packages) for the `Source`s they
hold; `unread_calls` finds every `Source.unread(...)` in the code, including those built per call, for
docs/engines.md's list of what remains unread; tests/engines/test_citations.py refuses any other citation."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Literal

from tpplan.engines.schema import Source

Kind = Literal["release", "commit", "pull request", "unread"]

_KINDS: tuple[tuple[Kind, re.Pattern[str]], ...] = (
    ("commit", re.compile(r"^commit [0-9a-f]{7,40}\b")),
    ("release", re.compile(r"^(?:[A-Za-z][\w.-]* )?v?\d+\.\d+(?:\.\d+)?(?:\.?post\d+)? \(.+\)$")),
    ("pull request", re.compile(r"^PR #\d+ description \d{4}-\d{2}-\d{2}\b")),
)
PACKAGES = ("tpplan.engines", "tpplan.simulate")  # where engine records live


def kind(source: Source) -> Kind | None:
    """What `source` is pinned to; None: nothing a reader could check out (a moving branch, an unnamed copy)."""
    if not source.read:
        return "unread"
    return next((k for k, pattern in _KINDS if pattern.match(source.ref)), None)


def _modules(packages: Iterable[str]) -> Iterator[object]:
    for name in packages:
        package = importlib.import_module(name)
        yield package
        for info in pkgutil.walk_packages(package.__path__, f"{name}."):
            yield importlib.import_module(info.name)


def _walk(value: object, where: str, out: dict[Source, str], seen: set[int]) -> None:
    """Every `Source` inside `value` (dataclasses, tuples, lists, sets, dict values), first place found kept."""
    if isinstance(value, Source):
        out.setdefault(value, where)
        return
    if id(value) in seen or isinstance(value, (str, bytes, int, float, type)):
        return
    seen.add(id(value))
    if is_dataclass(value):
        for f in fields(value):
            _walk(getattr(value, f.name), where, out, seen)
    elif isinstance(value, (tuple, list, set, frozenset)):
        for item in value:
            _walk(item, where, out, seen)
    elif isinstance(value, dict):
        for item in value.values():
            _walk(item, where, out, seen)


def sources_of(value: object) -> tuple[Source, ...]:
    """Every `Source` inside one record (an `EngineVersion`, a `Mode`, ...)."""
    out: dict[Source, str] = {}
    _walk(value, "", out, set())
    return tuple(out)


def held(packages: Iterable[str] = PACKAGES) -> dict[Source, str]:
    """Every `Source` the engine records hold: each engine version's, and every module-level value's of
    `packages`, with the module and name it was first found under."""
    from tpplan.engines import ENGINES

    out: dict[Source, str] = {}
    seen: set[int] = set()
    for key, version in ENGINES.items():
        _walk(version, f"ENGINES[{key!r}]", out, seen)
    for module in _modules(packages):
        for name, value in vars(module).items():
            if not name.startswith("__"):
                _walk(value, f"{getattr(module, '__name__', '?')}.{name}", out, seen)
    return out


@dataclass(frozen=True)
class UnreadCall:
    """One `Source.unread(...)` in the code: where, what it says was not read, and why."""

    path: str  # relative to the package's parent ("tpplan/engines/fused_moe.py")
    function: str  # the enclosing function or class ("" at module level)
    what: str  # the `what` argument as written (an f-string shows its placeholders)
    why: str | None  # the `why` argument if a plain string, else None


def _enclosing(tree: ast.AST) -> dict[ast.AST, str]:
    """Each node's innermost enclosing function or class (`ast.walk` meets outer definitions first)."""
    owner: dict[ast.AST, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            owner.update((inner, node.name) for inner in ast.walk(node) if inner is not node)
    return owner


def _is_unread(node: ast.AST) -> bool:
    func = node.func if isinstance(node, ast.Call) else None
    return isinstance(func, ast.Attribute) and func.attr == "unread" and ast.unparse(func.value) == "Source"


def unread_calls(root: Path | None = None) -> tuple[UnreadCall, ...]:
    """Every `Source.unread(...)` call under `root` (default: the tpplan package), in file order."""
    base = root or Path(__file__).resolve().parents[1]
    out: list[tuple[str, int, UnreadCall]] = []
    for path in sorted(base.rglob("*.py")):
        text = path.read_text()
        if "Source.unread(" not in text:  # parse only the few files that cite anything unread
            continue
        tree = ast.parse(text, str(path))
        owner = _enclosing(tree)
        calls = (n for n in ast.walk(tree) if isinstance(n, ast.Call) and _is_unread(n))
        for node in calls:
            what = node.args[2] if len(node.args) > 2 else None
            why = next((k.value for k in node.keywords if k.arg == "why"), None)
            where = str(path.relative_to(base.parent))
            call = UnreadCall(where, owner.get(node, ""), _text(what), _literal(why))
            out.append((where, node.lineno, call))
    return tuple(call for _, _, call in sorted(out, key=lambda t: t[:2]))


def _text(node: ast.AST | None) -> str:
    """A string argument as a reader would say it: a plain string's value, an f-string with its `{...}`."""
    if node is None:
        return ""
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(v.value) if isinstance(v, ast.FormattedValue) else str(_literal(v)) for v in node.values)
    return _literal(node) or "{" + ast.unparse(node) + "}"


def _literal(node: ast.AST | None) -> str | None:
    """A plain string (or implicit concatenation of plain strings) as written, else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


__all__ = ["PACKAGES", "Kind", "UnreadCall", "held", "kind", "sources_of", "unread_calls"]
