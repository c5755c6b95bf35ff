"""A public hook for watching a `PlanRunner` run: spans around layers, ops, layout copies and collectives.

Why: a benchmark (`tpplan bench`) must time every step of a plan's run without changing what runs;
overriding the runner's private methods or patching `Comm` ties it to internals that change. The
runner and its `Comm` call an observer instead, when one is given (`PlanRunner(..., observer=o)`):

- `o.open(kind, layer, name)` before a step and `o.close(token)` after it, where `kind` is
  "layer" (name ""), "op" (the graph op's name), "copy" (a layout copy beside a collective,
  `pack:<value>` / `unpack:<value>`; `layer` may be the number of layers for the copy before the
  final norm) or "collective" (name = the `Comm` method);
- for a collective, `close` also gets a `CollectiveSite`: the method, its arguments and the
  `CollectiveCall` the tracer recorded (None with one rank, where nothing moves).

Spans nest (a MoE op's all-to-alls open inside the op). `open` may return None to skip a span;
`close` is still called with it. With no observer the runner pays one attribute test per step.

This seam only watches one run. Acting on collectives process-wide, before they run (the tests'
fault injection), is `tpplan.runtime.hooks`; a traced collective runs those hooks first, then
opens its span here, so a hook that blocks is not timed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import wraps
from typing import Any, Protocol, TypeVar


@dataclass(frozen=True)
class CollectiveSite:
    """One traced collective call as the observer sees it."""

    method: str  # the Comm method: all_reduce, reduce_scatter, all_gather_tokens, ...
    args: tuple[Any, ...]
    kw: dict[str, Any] = field(default_factory=dict)
    call: Any = None  # tpplan.layout.schedule.CollectiveCall recorded for it; None when nothing moved


class RunObserver(Protocol):
    """What `PlanRunner` and `Comm` call around each step (see the module docstring)."""

    def open(self, kind: str, layer: int, name: str) -> Any: ...

    def close(self, token: Any, site: CollectiveSite | None = None) -> None: ...


F = TypeVar("F", bound=Callable[..., Any])


def observed_collective(fn: F) -> F:
    """Decorate a traced `Comm` method: report it to `self.observer` as a "collective" span."""
    method = fn.__name__

    @wraps(fn)
    def wrapper(self: Any, *args: Any, **kw: Any) -> Any:
        obs = self.observer
        if obs is None:
            return fn(self, *args, **kw)
        calls = self.tracer.calls
        before = len(calls)
        token = obs.open("collective", self.tracer.layer, method)
        out = fn(self, *args, **kw)
        obs.close(token, CollectiveSite(method, args, dict(kw), calls[-1] if len(calls) > before else None))
        return out

    return wrapper  # type: ignore[return-value]


__all__ = ["CollectiveSite", "RunObserver", "observed_collective"]
