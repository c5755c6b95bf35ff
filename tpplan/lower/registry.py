"""The lowering passes, one module each, applied in a defined order: a new axis or rewrite is one module.

A pass rewrites one layer's steps (`layer`), the whole program (`program`: stages, micro-batches,
what crosses layers), or both. `lower` applies every registered pass's `layer` hook to every layer in
`order`, then every `program` hook in `order`. `lower_outline` runs the program hooks over layers
without steps (the cost model prices stage sends and the final reduction from it), so a program hook
places those from the context and the layers' indices, never from the layers' steps. The built-in
passes register themselves when `tpplan.lower.passes` is imported (`tpplan.lower.lowering` does); a
test may add one for a while (`added`), and every reader of the program (the cost model, the
runtime's expected trace) picks it up without an edit elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpplan.errors import TpplanError

if TYPE_CHECKING:
    from tpplan.lower.context import Lowering
    from tpplan.lower.program import LayerProgram, Program

LayerHook = Callable[["Lowering", "LayerProgram"], "LayerProgram"]
ProgramHook = Callable[["Lowering", "Program"], "Program"]


@dataclass(frozen=True)
class Pass:
    """One lowering pass: its name, its place in the order, what it owns (one line, docs/design.md)."""

    name: str
    order: int
    owns: str
    layer: LayerHook | None = None
    program: ProgramHook | None = None


_PASSES: dict[str, Pass] = {}
_GENERATION = [0]  # bumped on every change, so caches of lowered programs can tell


def register(p: Pass) -> Pass:
    """Add a pass (once per name)."""
    if p.name in _PASSES:
        raise TpplanError(f"lowering pass {p.name!r}", "is registered already", "give the pass a new name")
    _PASSES[p.name] = p
    _GENERATION[0] += 1
    return p


def unregister(name: str) -> None:
    """Remove a pass (what `added` does on leaving)."""
    _PASSES.pop(name, None)
    _GENERATION[0] += 1


@contextmanager
def added(p: Pass) -> Iterator[Pass]:
    """The pass registered for the duration of a `with` block (tests: a toy axis)."""
    register(p)
    try:
        yield p
    finally:
        unregister(p.name)


def passes() -> list[Pass]:
    """The registered passes in the order `lower` applies them."""
    return sorted(_PASSES.values(), key=lambda p: (p.order, p.name))


def generation() -> int:
    """A number that changes whenever the set of passes does (a key for caches of lowered programs)."""
    return _GENERATION[0]


__all__ = ["LayerHook", "Pass", "ProgramHook", "added", "generation", "passes", "register", "unregister"]
