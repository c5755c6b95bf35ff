"""The layers' import rules (docs/design.md, "Layers and their rules"), checked two ways: a static
scan of every import statement (also those inside functions), and real imports in a subprocess
where torch cannot be imported."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "tpplan"

# The planner: plans, audits, prices and searches without torch, and imports nothing above it.
PLANNER = (
    "models", "layout", "plans", "engines", "audit", "cost", "search", "errors", "dtypes", "bench_results", "inputs"
)
ABOVE_PLANNER = ("report", "runtime", "bench", "commands", "cli", "explain")


def _modules() -> dict[str, Path]:
    out = {}
    for f in sorted(ROOT.rglob("*.py")):
        parts = f.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


MODULES = _modules()


def _imports(path: Path, eager_only: bool = False) -> set[str]:
    """tpplan modules that `path` imports anywhere (top level, functions, TYPE_CHECKING blocks), or
    with `eager_only` the ones its module-level statements import."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if eager_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & MODULES.keys()
            found |= subs or {node.module}  # `from pkg import submodule` imports the submodule
    return {m for m in found if m == "tpplan" or m.startswith("tpplan.")}


GRAPH = {mod: _imports(path) - {mod} for mod, path in MODULES.items()}


def _layer(mod: str) -> str:
    return mod.split(".")[1] if "." in mod else mod


def _in(mod: str, layers: tuple[str, ...]) -> bool:
    return _layer(mod) in layers


def test_the_scan_sees_imports() -> None:
    """Guard against a scan that finds nothing (and so passes every rule below)."""
    assert "tpplan.layout.propagate" in GRAPH["tpplan.audit"]
    assert "tpplan.runtime.distributed" in GRAPH["tpplan.runtime.run"]  # imported inside a function
    assert len(MODULES) > 50


def test_planner_never_imports_report_runtime_or_bench() -> None:
    bad = {
        mod: sorted(m for m in deps if _in(m, ABOVE_PLANNER))
        for mod, deps in GRAPH.items()
        if _in(mod, PLANNER)
    }
    assert not {m: d for m, d in bad.items() if d}


def test_runtime_never_imports_bench_report_or_commands() -> None:
    bad = {
        mod: sorted(m for m in deps if _in(m, ("bench", "report", "commands", "cli")))
        for mod, deps in GRAPH.items()
        if _in(mod, ("runtime",))
    }
    assert not {m: d for m, d in bad.items() if d}


def test_no_cycles_between_top_level_packages() -> None:
    """Package A imports B and B imports A (directly or through others): none."""
    edges: dict[str, set[str]] = {}
    for mod, deps in GRAPH.items():
        edges.setdefault(_layer(mod), set()).update(_layer(d) for d in deps if "." in d and _layer(d) != _layer(mod))

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    cycles = sorted((a, b) for a, bs in edges.items() for b in bs if a in reach(b))
    assert not cycles, f"package cycles (A imports B, B reaches A): {cycles}"


def test_no_import_cycle_at_import_time() -> None:
    """No cycle of module-level imports: every module can be imported first. (An import inside a
    function may point back; it runs after both modules are loaded.)"""
    eager = {mod: _imports(path, eager_only=True) & MODULES.keys() - {mod} for mod, path in MODULES.items()}
    done: set[str] = set()

    def cycle_from(path: list[str]) -> list[str] | None:
        for dep in sorted(eager[path[-1]]):
            if dep in path:
                return [*path[path.index(dep) :], dep]
            if dep not in done and (found := cycle_from([*path, dep])):
                return found
        done.add(path[-1])
        return None

    for mod in sorted(eager):
        found = cycle_from([mod]) if mod not in done else None
        assert found is None, f"import cycle: {' -> '.join(found)}"


BLOCK_TORCH = (
    "import sys\n"
    "class _NoTorch:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name == 'torch' or name.startswith('torch.'):\n"
    "            raise ImportError('torch is blocked in this test')\n"
    "sys.meta_path.insert(0, _NoTorch())\n"
)


def test_planner_imports_without_torch() -> None:
    """Every planner module imports in a process where `import torch` fails."""
    planner = sorted(m for m in MODULES if _in(m, PLANNER))
    assert "tpplan.cost.predict" in planner and "tpplan.search" in planner
    code = BLOCK_TORCH + "".join(f"import {m}\n" for m in planner) + "print(len(sys.modules))\n"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT.parent)
    assert res.returncode == 0, res.stderr[-3000:]


def test_the_torch_block_works() -> None:
    """The block above really stops torch (else the previous test proves nothing)."""
    pytest.importorskip("torch")
    code = BLOCK_TORCH + "import tpplan.runtime.kernels\n"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT.parent)
    assert res.returncode != 0 and "torch is blocked" in res.stderr


# docs/design.md, "Layers and their rules", bottom up; a module imports only from its own rank or below.
LAYERS = [
    ("errors", "dtypes", "placement", "bench_results", "outputs", "progress", "inputs"),
    ("models",),
    ("layout",),
    ("plans", "engines"),
    ("audit",),
    ("cost",),
    ("search",),
    ("report", "explain"),
    ("runtime",),
    ("bench",),
    ("cli", "commands", "__main__"),
]
RANK = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def test_every_module_imports_only_its_own_layer_or_below() -> None:
    unknown = {_layer(m) for m in MODULES if m != "tpplan"} - RANK.keys()
    assert not unknown, f"packages missing from LAYERS (and docs/design.md): {sorted(unknown)}"
    upward = sorted(
        (mod, dep)
        for mod, deps in GRAPH.items()
        if mod != "tpplan"
        for dep in deps
        if dep != "tpplan" and RANK[_layer(dep)] > RANK[_layer(mod)]
    )
    assert not upward, f"imports from a higher layer: {upward}"
