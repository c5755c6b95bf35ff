"""Thresholds, not only verdicts: the tokens per step at which a plan overtakes baseline.

A plan that trades a collective for less repeated compute (or the reverse) wins only above (or
below) some batch size; an engine should fall back below it. For each layer kind and plan this
prices one layer at a grid of prefill batch sizes with the cost model (`predict_plan`, context 0)
and finds where the plan's time crosses the baseline's, interpolated in log(tokens). Used by the
memo and by `tpplan audit --crossover` (docs/audit-json.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpplan.audit import Audits
from tpplan.cost.topology import Topology
from tpplan.layout.plan import Plan
from tpplan.mesh import Mesh
from tpplan.models.graph import ModelGraph
from tpplan.plans.named import make_plan

TOKENS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
WHOLE = "whole model"


@dataclass(frozen=True)
class Crossover:
    """Where `plan` beats baseline for one layer kind (or the whole model) over the token grid."""

    plan: str
    kind: str
    tokens: tuple[int, ...]
    plan_s: tuple[float, ...]
    base_s: tuple[float, ...]
    faster_at_start: bool  # faster than baseline at the grid's smallest batch
    overtakes_at: float | None  # tokens where it becomes faster (None: faster from the start, or never)
    stops_at: float | None  # tokens where it stops being faster (None: up to the grid's end, or never)

    @property
    def ever_faster(self) -> bool:
        return self.faster_at_start or self.overtakes_at is not None

    def describe(self) -> str:
        """One phrase, e.g. 'faster from 3,100 to 40,000 tokens'."""
        lo, hi = self.tokens[0], self.tokens[-1]
        if not self.ever_faster:
            return f"never faster ({lo:,}-{hi:,} tokens)"
        start = f"{lo:,}" if self.faster_at_start else f"{self.overtakes_at:,.0f}"
        end = f"{hi:,}" if self.stops_at is None else f"{self.stops_at:,.0f}"
        if self.faster_at_start and self.stops_at is None:
            return f"always faster ({lo:,}-{hi:,} tokens)"
        if self.faster_at_start:
            return f"faster up to {end} tokens"
        if self.stops_at is None:
            return f"faster from {start} tokens"
        return f"faster from {start} to {end} tokens"

    def to_json(self) -> dict[str, object]:
        return {
            "plan": self.plan,
            "kind": self.kind,
            "faster_at_start": self.faster_at_start,
            "overtakes_at_tokens": None if self.overtakes_at is None else round(self.overtakes_at),
            "stops_at_tokens": None if self.stops_at is None else round(self.stops_at),
            "summary": self.describe(),
            "points": [
                {"tokens": t, "plan_s": p, "baseline_s": b}
                for t, p, b in zip(self.tokens, self.plan_s, self.base_s, strict=True)
            ],
        }


def log_crossing(t0: int, t1: int, d0: float, d1: float) -> float:
    """Tokens where the difference d (baseline - plan) crosses zero, linear in log(tokens)."""
    f = d0 / (d0 - d1)
    return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))


def crossing(plan: str, kind: str, tokens: tuple[int, ...], plan_s: list[float], base_s: list[float]) -> Crossover:
    """The first interval of the grid on which `plan` is faster than baseline."""
    d = [b - p for p, b in zip(plan_s, base_s, strict=True)]  # > 0: plan faster
    start = d[0] > 0
    up = down = None
    for i in range(1, len(d)):
        if up is None and not start and d[i - 1] <= 0 < d[i]:
            up = log_crossing(tokens[i - 1], tokens[i], d[i - 1], d[i])
        elif (start or up is not None) and d[i - 1] > 0 >= d[i]:
            down = log_crossing(tokens[i - 1], tokens[i], d[i - 1], d[i])
            break
    return Crossover(plan, kind, tokens, tuple(plan_s), tuple(base_s), start, up, down)


def crossovers(
    graph: ModelGraph,
    plans: list[Plan],
    topology: Topology,
    *,
    mesh: Mesh,
    dtype: str = "bf16",
    expert_dtype: str | None = None,
    tokens: tuple[int, ...] | None = None,
    audits: Audits | None = None,
) -> list[Crossover]:
    """Per plan (other than baseline) and layer kind, plus the whole model: where it beats baseline on `mesh`
    (TP alone: the thresholds are per layer, one stage; `audits`, of `graph`: the plans' audits when the
    caller has them)."""
    from tpplan.cost.predict import predict_plan

    grid = tuple(sorted(set(tokens or TOKENS)))
    kept = audits if audits is not None and audits.graph is graph else Audits(graph)
    tp = mesh.tp
    if topology.world_size < tp:
        topology = topology.with_nodes(math.ceil(tp / topology.gpus_per_node))

    def times(plan: Plan) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for t in grid:
            p = predict_plan(graph, plan, topology, mesh=mesh, tokens=t, dtype=dtype, expert_dtype=expert_dtype,
                             audit=kept.of(plan, Mesh(tp), dtype))  # fmt: skip
            for k in p.kinds:
                out.setdefault(k.kind, []).append(float(k.total_s))
            out.setdefault(WHOLE, []).append(float(p.forward_s))
        return out

    base = times(make_plan("baseline", graph, tp))
    result: list[Crossover] = []
    for plan in plans:
        if plan.name == "baseline":
            continue
        mine = times(plan)
        for kind, ts in mine.items():
            if kind in base:
                result.append(crossing(plan.name, kind, grid, ts, base[kind]))
    return result


__all__ = ["TOKENS", "WHOLE", "Crossover", "crossing", "crossovers", "log_crossing"]
