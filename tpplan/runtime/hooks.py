"""Collective hooks: the runtime's one seam for code outside it to see each collective before it runs.

Every collective a rank issues through the runtime (`make_comm`'s traced calls, the MoE
dispatch, the calibration and collective-check sweeps) first calls `before_collective(rank,
kind)`, which runs the registered hooks in order. A hook may raise (the collective is not run)
or block. The tests use it to make one rank fail or hang (tests/fault_injection.py); nothing in
tpplan registers one, so production runs call an empty list.

Ranks are separate processes (spawned, or started by torchrun), so a hook registered in the
parent does not reach them. tpplan imports no module its environment names (the former
`TPPLAN_RANK_HOOKS` did, in every rank: issue 35); the tests register theirs from a
`sitecustomize` module they put on the ranks' PYTHONPATH (tests/rank_hooks/, `fault_injection.fault_env`).

Watching a run (timing its layers, ops and collectives) is the other seam,
`tpplan.runtime.observe`: an observer belongs to one `PlanRunner` and sees spans; a hook is
process-wide and acts before each collective (docs/design.md, "Layers and their rules").
"""

from __future__ import annotations

from collections.abc import Callable

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


__all__ = ["CollectiveHook", "add_collective_hook", "before_collective"]
