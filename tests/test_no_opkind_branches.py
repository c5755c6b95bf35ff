"""No code outside the op-kind registry and the lowering passes branches on an op's kind. Issue 30.

What an op kind means to a caller (its sharding rule, per-rank shape, cost class, whether it is a
linear, routed experts, a token mixer, K3's attention residual, how the runtime runs it) is stated once,
by its definition in `tpplan/models/opkind_*.py` (`op_kind(op.kind).routed_experts`, `.linear`, ...),
so a new kind is written in one place instead of in every `if op.kind is OpKind.X` across the package.

The rule, exactly: in every module of `tpplan/` outside `tpplan/models/` and `tpplan/lower/passes/`, no
comparison (`is`, `is not`, `==`, `!=`, `in`, `not in`) has an `OpKind.<member>` operand, or a tuple,
list or set literal holding one, and no `match` case names one. Naming a kind as data (building a
graph, a table key) is fine.

`PENDING` holds, per module, how many such comparisons it still has; the count may only go down
(lower it in the commit that converts them, drop the entry at zero). The goal is an empty `PENDING`.
"""

from __future__ import annotations

import ast
from pathlib import Path

from ratchet import assert_ratchet

PACKAGE = Path(__file__).resolve().parents[1] / "tpplan"
ALLOWED = ("models/", "lower/passes/")  # the registry and the lowering passes

PENDING: dict[str, int] = {}  # module: comparisons against OpKind members it still has (2026-12-06: 58 in 22 modules)

_OPS = (ast.Is, ast.IsNot, ast.Eq, ast.NotEq, ast.In, ast.NotIn)


def _names_a_kind(node: ast.expr) -> bool:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "OpKind":
        return True
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_a_kind(e) for e in node.elts)
    return False


def kind_branches(source: str) -> list[int]:
    """Line of each comparison in `source` with an `OpKind.<member>` operand (or a literal collection of them),
    and of each `match` case naming a member."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.MatchValue):
            hit = _names_a_kind(node.value)
        elif isinstance(node, ast.Compare):
            operands = (node.left, *node.comparators)
            hit = any(isinstance(o, _OPS) for o in node.ops) and any(_names_a_kind(e) for e in operands)
        else:
            hit = False
        if hit:
            found.append(node.lineno)
    return sorted(found)


def checked_modules() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if not p.relative_to(PACKAGE).as_posix().startswith(ALLOWED)]


def test_no_opkind_branches_outside_the_registry():
    hits = [
        (rel, f"{rel}:{line}")
        for path in checked_modules()
        for rel in [path.relative_to(PACKAGE).as_posix()]
        for line in kind_branches(path.read_text())
    ]
    assert_ratchet(
        hits, PENDING, "ask the kind's definition (tpplan.models.opkinds.op_kind), not its name", "OpKind branches"
    )


def test_the_scan_sees_every_kind_of_comparison():
    """is / is not / == / != / in / not in, against a member or a literal collection, and match cases;
    not plain data."""
    source = (
        "a = op.kind is OpKind.LINEAR\n"
        "b = op.kind is not OpKind.ADD\n"
        "c = op.kind in (OpKind.LINEAR, OpKind.ROUTER)\n"
        "d = OpKind.EXPERTS == k\n"
        "e = k not in {OpKind.NORM}\n"
        "f = x != [OpKind.SLICE]\n"
        "g = Op('x', OpKind.LINEAR, (), 'y', 'r')\n"
        "h = {OpKind.LINEAR: 1}[k]\n"
        "i = op.kind is kind\n"
        "j = op.split is WeightSplit.COL\n"
        "match op.kind:\n"
        "    case OpKind.ADD: pass\n"
        "    case other: pass\n"
    )
    assert kind_branches(source) == [1, 2, 3, 4, 5, 6, 12]
