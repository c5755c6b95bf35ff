"""No function below `commands/` takes the deployment as loose integers: it takes a `tpplan.mesh.Mesh`
(or an object holding one). Issue 30.

The rule, exactly: in every module of `tpplan/` except `tpplan/commands/` and `tpplan/cli.py`, no function,
method or lambda has a parameter (positional, keyword-only, `*args` or `**kwargs`) named in `LOOSE`. The
CLI reads the options and builds the one `Mesh`; everything below passes it on, checked once
(`Mesh.check`), so a new axis is a field of one class and not a parameter threaded through 70 signatures.

The names, and why these:
- the axes' sizes: `tp`, `pp`, `cp`, `replicas` (`Mesh`'s fields), `ep` and `ep_size` (EP inside TP: the
  mesh's `ep`, and the plan's `ep_size` where a function takes it loose), `dp` and `attn_dp` (data-parallel
  and DP-attention sizes, derived from the mesh and the plan);
- the CP options: `cp_layers`, `cp_recurrence`, `cp_kv` (`Mesh`'s fields: they decide the CP groups and the
  KV a CP rank keeps).
Not listed: `nodes` and `gpus_per_node` (the cluster's, not the mesh's: `Fabric`), `dp_attention` (a flag
of the plan, `Plan.dp_attention`, which holds it), `chunk` (the scheduler's). Dataclass fields are not
parameters and are not scanned; a record that carries the sizes should hold a `Mesh` all the same.

A parameter that is a different concept but shares a name (an op kind's number of shards, the ranks a
zigzag split deals over) is renamed to say what it is (`shards`, `ranks`), not hidden from the scan.

`PENDING` holds, per module, how many such parameters it still has; the count may only go down (lower
it in the commit that converts them, drop the entry at zero). The goal is an empty `PENDING`.
"""

from __future__ import annotations

import ast
from pathlib import Path

from ratchet import assert_ratchet

PACKAGE = Path(__file__).resolve().parents[1] / "tpplan"
LOOSE = frozenset(
    {"tp", "pp", "cp", "replicas", "ep", "ep_size", "dp", "attn_dp", "cp_layers", "cp_recurrence", "cp_kv"}
)

PENDING = {  # module: parameters named in LOOSE it still has (2026-12-06: 202 in 47 modules)
}


def loose_parameters(source: str) -> list[tuple[int, str, str]]:
    """(line, function, parameter) for each parameter of `source`'s functions named in `LOOSE`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(p for p in (a.vararg, a.kwarg) if p)]
            name = getattr(node, "name", "<lambda>")
            found += [(p.lineno, name, p.arg) for p in params if p.arg in LOOSE]
    return sorted(found)


def library_modules() -> list[Path]:
    return [
        p
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.relative_to(PACKAGE).parts[0] != "commands" and p.relative_to(PACKAGE).as_posix() != "cli.py"
    ]


def test_no_loose_mesh_integers_below_commands():
    hits = [
        (rel, f"{rel}:{line}: {func}({param})")
        for path in library_modules()
        for rel in [path.relative_to(PACKAGE).as_posix()]
        for line, func, param in loose_parameters(path.read_text())
    ]
    assert_ratchet(
        hits, PENDING, "pass a tpplan.mesh.Mesh (or an object holding one), not its sizes", "loose parameters"
    )


def test_the_scan_sees_every_kind_of_parameter():
    """Positional, keyword-only, *args/**kwargs, methods, nested functions and lambdas; not other names."""
    source = (
        "def f(tp, /, pp, *cp, replicas=1, **cp_kv): pass\n"
        "class C:\n"
        "    async def g(self, mesh, *, ep_size=None):\n"
        "        def h(dp): pass\n"
        "        return lambda attn_dp: 0\n"
        "def ok(mesh, nodes, chunk, tp_mesh, shards): pass\n"
    )
    assert [(line, param) for line, _, param in loose_parameters(source)] == [
        (1, "cp"), (1, "cp_kv"), (1, "pp"), (1, "replicas"), (1, "tp"), (3, "ep_size"), (4, "dp"), (5, "attn_dp"),
    ]  # fmt: skip
