"""Dev script: the package's long functions and big modules, as the developers' guide counts them.

`python -m tools.code_size` lists every function (methods and nested functions too) over
`FUNCTION_LINES` lines and every module over `MODULE_LINES` lines of `tpplan/`, longest first;
`tests/test_code_size.py` holds the counts to a ceiling that may only go down.

A function's length is its `def` line to its last line (decorators not counted; a nested function's
lines count in the function around it as well). A function may be long where its docstring says why, in
a sentence starting `Long because` (e.g. a typer command whose options are its signature); those are
listed apart and not held to the ceiling.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

FUNCTION_LINES = 60
MODULE_LINES = 600
EXCUSE = "Long because"
PACKAGE = Path(__file__).resolve().parents[1] / "tpplan"


@dataclass(frozen=True)
class Long:
    """One function or module over its limit: where it is and how many lines it has."""

    where: str  # path relative to the package's parent, with `:line:name` for a function
    lines: int
    excused: bool = False  # its docstring says why it is long


def _functions(path: Path, root: Path) -> list[Long]:
    tree = ast.parse(path.read_text())
    rel = path.relative_to(root).as_posix()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > FUNCTION_LINES:
                doc = ast.get_docstring(node) or ""
                found.append(Long(f"{rel}:{node.lineno}:{node.name}", lines, EXCUSE in doc))
    return found


def long_functions(package: Path = PACKAGE) -> list[Long]:
    """Every function of `package` over `FUNCTION_LINES` lines, longest first."""
    found = [f for p in sorted(package.rglob("*.py")) for f in _functions(p, package.parent)]
    return sorted(found, key=lambda f: (-f.lines, f.where))


def big_modules(package: Path = PACKAGE) -> list[Long]:
    """Every module of `package` over `MODULE_LINES` lines, longest first."""
    found = []
    for p in sorted(package.rglob("*.py")):
        lines = len(p.read_text().splitlines())
        if lines > MODULE_LINES:
            found.append(Long(p.relative_to(package.parent).as_posix(), lines))
    return sorted(found, key=lambda m: (-m.lines, m.where))


def main() -> int:
    fns, mods = long_functions(), big_modules()
    for m in mods:
        print(f"module   {m.lines:4d}  {m.where}")
    for f in fns:
        print(f"function {f.lines:4d}  {f.where}{'  (docstring says why)' if f.excused else ''}")
    held = sum(not f.excused for f in fns)
    print(f"{held} functions over {FUNCTION_LINES} lines (+{len(fns) - held} that say why), "
          f"{len(mods)} modules over {MODULE_LINES} lines")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
