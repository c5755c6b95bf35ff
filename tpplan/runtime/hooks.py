"""Collective hooks: the runtime's one seam for code outside it to see each collective before it runs.

Every collective a rank issues through the runtime (`make_comm`'s traced calls, the MoE
dispatch, the calibration and collective-check sweeps) first calls `before_collective(rank,
kind)`, which runs the registered hooks in order. A hook may raise (the collective is not run)
or block. The tests use it to make one rank fail or hang (tests/fault_injection.py); nothing in
tpplan registers one, so production runs call an empty list.

Ranks are separate processes (spawned, or started by torchrun), so a hook registered in the
parent does not reach them: `TPPLAN_RANK_HOOKS` names modules (dotted names, or paths to .py
files, comma-separated) that `tpplan.runtime.group` imports in every rank before the work
starts; importing one registers its hooks.

Watching a run (timing its layers, ops and collectives) is the other seam,
`tpplan.runtime.observe`: an observer belongs to one `PlanRunner` and sees spans; a hook is
process-wide and acts before each collective (docs/design.md, "Layers and their rules").
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

HOOKS_ENV = "TPPLAN_RANK_HOOKS"

CollectiveHook = Callable[[int, str], None]
"""Called as hook(rank, kind) before a collective; kind is a `cost.topology.COLLECTIVE_KINDS` name."""

_hooks: list[CollectiveHook] = []


def add_collective_hook(hook: CollectiveHook) -> Callable[[], None]:
    """Register `hook`; returns a function that removes it again."""
    _hooks.append(hook)
    return lambda: _hooks.remove(hook)


def before_collective(rank: int, kind: str) -> None:
    """Run every registered hook for this rank's next collective of `kind`."""
    for hook in list(_hooks):
        hook(rank, kind)


def load_env_hooks() -> None:
    """Import the modules `TPPLAN_RANK_HOOKS` names (once each), so that they register their hooks."""
    for entry in filter(None, (e.strip() for e in os.environ.get(HOOKS_ENV, "").split(","))):
        if entry in _loaded:
            continue
        _loaded.add(entry)
        if entry.endswith(".py"):
            path = Path(entry)
            spec = importlib.util.spec_from_file_location(f"tpplan_rank_hook_{path.stem}", path)
            if spec is None or spec.loader is None:
                raise ImportError(f"{HOOKS_ENV}: cannot load {entry}")
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
        else:
            importlib.import_module(entry)


_loaded: set[str] = set()

__all__ = ["HOOKS_ENV", "CollectiveHook", "add_collective_hook", "before_collective", "load_env_hooks"]
