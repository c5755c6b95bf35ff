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
    "models",
    "layout",
    "plans",
    "engines",
    "engines.recipes",
    "audit",
    "lower",
    "cost",
    "search",
    "simulate",
    "errors",
    "dtypes",
    "bench_results",
    "inputs",
    "units",
    "signals",
    "mesh",
)
ABOVE_PLANNER = ("report", "runtime", "bench", "commands", "cli", "explain")


def _modules() -> dict[str, Path]:
    out = {}
    for f in sorted(ROOT.rglob("*.py")):
        parts = f.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    """tpplan modules that `path` imports anywhere (top level, functions, TYPE_CHECKING blocks)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & MODULES.keys()
            found |= subs or {node.module}  # `from pkg import submodule` imports the submodule
    return {m for m in found if m == "tpplan" or m.startswith("tpplan.")}


GRAPH = {mod: _imports(path) - {mod} for mod, path in MODULES.items()}


# Subpackages that are a layer of their own: the engines' launch lines classify a plan by the named plans'
# decisions (`tpplan.plans.named`), which read the engine data below them, so they sit above `plans`.
SUBLAYERS = ("engines.recipes",)


def _layer(mod: str) -> str:
    parts = mod.split(".")[1:]
    return next((s for s in SUBLAYERS if parts[: s.count(".") + 1] == s.split(".")), parts[0] if parts else mod)


def _in(mod: str, layers: tuple[str, ...]) -> bool:
    return _layer(mod) in layers


def test_the_scan_sees_imports() -> None:
    """Guard against a scan that finds nothing (and so passes every rule below)."""
    assert "tpplan.layout.propagate" in GRAPH["tpplan.audit"]
    assert "tpplan.runtime.distributed" in GRAPH["tpplan.runtime.run"]  # imported inside a function
    assert len(MODULES) > 50
    assert (_layer("tpplan.engines.recipes.sglang"), _layer("tpplan.engines.sglang")) == ("engines.recipes", "engines")


def test_planner_never_imports_report_runtime_or_bench() -> None:
    bad = {mod: sorted(m for m in deps if _in(m, ABOVE_PLANNER)) for mod, deps in GRAPH.items() if _in(mod, PLANNER)}
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

    cycles = sorted((a, b) for a, bs in edges.items() for b in bs if a in _reach(edges, b))
    assert not cycles, f"package cycles (A imports B, B reaches A): {cycles}"


def _reach(edges: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `edges`: each set of modules that reach one another, sorted."""
    reach = {mod: _reach(edges, mod) for mod in edges}
    circles = {tuple(sorted(m for m in reach if m in reach[mod] and mod in reach[m]))
               for mod in reach if mod in reach[mod]}  # fmt: skip
    return sorted(list(c) for c in circles)


def test_the_circle_finder_finds_circles() -> None:
    """Guard: a circle through three modules (and one hanging off it) is found, a chain is not."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_circles_inside_packages_or_between_them() -> None:
    """No module reaches itself through tpplan imports, counting every import statement: module
    level, `TYPE_CHECKING` blocks and function bodies. A function-level import that points back is
    still a circle in the design (it only moves the failure from import time to call time), so the
    shared piece belongs in a module both sides import. Lazy imports of optional dependencies (torch,
    fla, aiconfigurator) are not tpplan modules and are not edges; `tpplan.models.families` loads its
    family modules by `importlib` (a plugin registry), which this scan does not see."""
    edges = {mod: deps & MODULES.keys() for mod, deps in GRAPH.items()}
    circles = _circles(edges)
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


BLOCK_TORCH = (
    "import sys\n"
    "class _NoTorch:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name == 'torch' or name.startswith('torch.'):\n"
    "            raise ImportError('torch is blocked in this test')\n"
    "sys.meta_path.insert(0, _NoTorch())\n"
)


# Everything but the runtime and the bench: the planner, and the report and CLI above it (the README's
# first venv has no torch; the runtime commands then name the extra, tests/test_no_torch.py).
TORCH_FREE = (*PLANNER, "placement", "outputs", "progress", "report", "explain", "cli", "commands", "__main__")


def test_everything_but_runtime_and_bench_imports_without_torch() -> None:
    """Every planner, report and CLI module imports in a process where `import torch` fails."""
    modules = sorted(m for m in MODULES if m != "tpplan" and _in(m, TORCH_FREE) and m != "tpplan.__main__")
    assert {"tpplan.cost.predict", "tpplan.search", "tpplan.report.memo", "tpplan.cli"} <= set(modules)
    code = BLOCK_TORCH + "".join(f"import {m}\n" for m in modules) + "print(len(sys.modules))\n"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT.parent)
    assert res.returncode == 0, res.stderr[-3000:]


def test_planner_and_report_work_never_imports_torch() -> None:
    """The static scan above cannot see what running does: an audit of Kimi K3 at TP32, its batch
    schedule, and a whole memo (analysis with its search, predictions and plots) leave torch
    unimported. Not blocked here: an optional `try: import torch` would be caught too."""
    code = (
        "import sys\n"
        "from tpplan.audit import audit\n"
        "from tpplan.cost.topology import load_topology\n"
        "from tpplan.cost.workload import load_workload\n"
        "from tpplan.lower.schedule import predict_schedule\n"
        "from tpplan.models.config import load_model\n"
        "from tpplan.models.graph import build_model_graph\n"
        "from tpplan.plans.named import make_plan\n"
        "from tpplan.report.analysis import analyse\n"
        "from tpplan.report.memo_ask import MemoAsk\n"
        "from tpplan.search.grid import MeshAsk\n"
        "from tpplan.report.memo import build_memo\n"
        "import tpplan.cli, tpplan.explain\n"
        "audit('kimi-k3', 32)\n"
        "g = build_model_graph(load_model('kimi-k3'))\n"
        "predict_schedule(g, make_plan('gate-aware', g, 32), 32, 8192, chunk=4096)\n"
        "ask = MemoAsk(MeshAsk(tp=2))\n"
        "build_memo(analyse('tiny-kimi-k3', load_topology('h200x2'), [load_workload('seed-c8')], ask))\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
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
    ("errors", "dtypes", "placement", "bench_results", "outputs", "progress", "inputs", "units", "signals", "text"),
    ("mesh",),
    ("models",),
    ("layout",),
    ("plans", "engines"),
    ("engines.recipes",),
    ("audit",),
    ("lower",),
    ("cost",),
    ("simulate",),
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
