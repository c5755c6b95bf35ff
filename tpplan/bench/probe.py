"""Timers for `tpplan bench`: CUDA events (perf_counter on CPU) around every step the runtime reports.

`Probe` is the bench's `tpplan.runtime.observe.RunObserver`: the `PlanRunner` and its `Comm` open
and close a span around every layer, op, layout copy and collective; the probe records an event
at each end (nothing is synchronised while the plan runs) and `resolve` turns them into seconds
once per batch, charging each collective's time to the op and layer it ran inside (so an op's
compute time excludes the MoE all-to-all it issues). Disabled (`enabled = False`) during warm-up.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tpplan.runtime.observe import CollectiveSite


class Clock:
    """CUDA events on the current stream, or perf_counter on CPU (where every op is synchronous)."""

    def __init__(self, device: Any) -> None:
        import torch

        self.torch = torch
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if self.cuda:
            ev = self.torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def seconds(self, a: Any, b: Any) -> float:
        return float(a.elapsed_time(b)) / 1e3 if self.cuda else float(b - a)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()


@dataclass
class Span:
    """One timed interval: what (kind, layer, name) and where (batch, segment) it ran."""

    kind: str  # batch | layer | op | coll
    layer: int
    name: str
    batch: int
    seg: int
    start: Any = None
    end: Any = None
    parents: list[Span] = field(default_factory=list)
    comm_s: float = 0.0
    seconds: float = 0.0
    after: Any = None  # an outermost op's: the end mark of the op before it in its batch (`gap_s`)
    gap_s: float = 0.0  # GPU time from that mark to this op's start: the GPU waiting for the host, or unspanned work
    meta: dict[str, Any] = field(default_factory=dict)


class Probe:
    """A stack of open intervals; `enabled` off during warm-up. `layers`: the slice's layer count
    (the layout copy before the final norm, reported at layer `layers`, belongs to no layer: it is
    counted in its batch only)."""

    def __init__(self, clock: Clock, layers: int) -> None:
        self.clock = clock
        self.layers = layers
        self.enabled = False
        self.stack: list[Span] = []
        self.pending: list[Span] = []
        self.batch = -1
        self.seg = 0
        self.last_op_end: Any = None

    def open(self, kind: str, layer: int, name: str) -> Span | None:
        """A span of the runtime's kinds (layer, op, copy, collective) or the bench's own (batch)."""
        if not self.enabled:
            return None
        if kind == "copy":  # timed as an op `pack:<value>` / `unpack:<value>`
            if layer >= self.layers:
                return None
            kind = "op"
        elif kind == "collective":
            kind = "coll"
        if kind == "batch":
            self.last_op_end = None
        rec = Span(kind, layer, name, self.batch, self.seg, parents=list(self.stack))
        outermost = kind == "op" and not any(p.kind == "op" for p in self.stack)
        rec.after = self.last_op_end if outermost else None
        self.stack.append(rec)
        rec.start = self.clock.mark()
        return rec

    def close(self, rec: Span | None, site: CollectiveSite | None = None) -> None:
        if rec is None:
            return
        rec.end = self.clock.mark()
        if rec.kind == "op":
            self.last_op_end = rec.end
        popped = self.stack.pop()
        assert popped is rec
        if site is not None:
            rec.meta = {"method": site.method, "args": argspec(site.args), "kw": site.kw, "call": site.call}
        self.pending.append(rec)

    def resolve(self) -> list[Span]:
        """Wait for the device, turn marks into seconds, charge collectives to their enclosing op/layer."""
        self.clock.sync()
        out = self.pending
        for r in out:
            r.seconds = self.clock.seconds(r.start, r.end)
            if r.after is not None:
                r.gap_s = max(0.0, self.clock.seconds(r.after, r.start))
        for r in out:
            r.start = r.end = r.after = None
        for r in out:
            if r.kind == "coll":
                for p in r.parents:
                    p.comm_s += r.seconds
        self.pending = []
        return out


def argspec(args: Sequence[Any]) -> tuple[Any, ...]:
    """Tensors as ("tensor", shape, dtype), lists as int tuples: what a replay needs to rebuild the call."""
    import torch

    out: list[Any] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(("tensor", tuple(a.shape), str(a.dtype).removeprefix("torch.")))
        elif isinstance(a, list | tuple):
            out.append(tuple(int(x) for x in a))
        else:
            out.append(a)
    return tuple(out)
