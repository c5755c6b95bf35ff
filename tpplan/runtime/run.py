"""Run a plan without the reference: time a sharded prefill and report its collectives.

`run_plan(RunCase(...), backend=..., nproc=N)` spawns N ranks (or runs under torchrun), builds each
rank's `PlanRunner` from its shard, and times `warmup + repeat` prefills (the slowest rank's wall
time per prefill, CUDA-synchronised). Numbers are checked by `tpplan verify`, not here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpplan.layout.schedule import CollectiveCall


@dataclass(frozen=True)
class RunCase:
    model: str
    plan: str
    tokens: int = 64
    chunk: int | None = None
    seed: int = 0
    dtype: str = "bf16"
    weights: str | None = None
    repeat: int = 3
    warmup: int = 1


@dataclass
class RunResult:
    case: RunCase
    n: int
    seconds: list[float] = field(default_factory=list)  # per timed prefill, slowest rank
    calls: list[CollectiveCall] = field(default_factory=list)  # rank 0, one prefill
    fallback_chunks: list[int] = field(default_factory=list)
    shard_elements: int = 0  # weights rank 0 holds


def _worker(rank: int, world: int, device: Any, case: RunCase) -> RunResult | None:
    import torch
    import torch.distributed as dist

    from tpplan.dtypes import dtype_name
    from tpplan.runtime.distributed import PlanRunner, make_comm
    from tpplan.runtime.executor import numerics_for
    from tpplan.runtime.shard import DictSource, SafetensorsSource
    from tpplan.runtime.verify import _graph, _plan, _random

    if device.type == "cpu":
        torch.set_num_threads(1)
    graph = _graph(case.model)
    nu = numerics_for(graph)
    source: Any = SafetensorsSource(Path(case.weights), graph, nu) if case.weights else DictSource(
        _random(case.model, case.seed))  # fmt: skip
    runner = PlanRunner(graph, _plan(case.model, case.plan, world), world, rank, source, comm=make_comm(rank, world),
                        numerics=nu, device=device, dtype=getattr(torch, dtype_name(case.dtype)))  # fmt: skip
    ids = torch.randint(0, graph.spec.vocab, (case.tokens,), generator=torch.Generator().manual_seed(case.seed + 1))
    out = RunResult(case, world, shard_elements=runner.shard.numel())
    for it in range(case.warmup + case.repeat):
        runner.reset()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()
        t0 = time.perf_counter()
        runner.prefill(ids, case.chunk)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        if it >= case.warmup:
            out.seconds.append(float(dt.item()))
    out.calls = list(runner.tracer.calls)
    out.fallback_chunks = [e.chunk for e in runner.tracer.events]
    return out if rank == 0 else None


def run_plan(case: RunCase, *, backend: str = "auto", nproc: int = 2, timeout_s: float = 300.0) -> RunResult | None:
    """Time `case` on `nproc` ranks; rank 0's result (None on other torchrun ranks)."""
    from tpplan.runtime.group import GroupSpec, resolve_backend, run_group

    return run_group(_worker, GroupSpec(resolve_backend(backend), nproc, timeout_s), case)


__all__ = ["RunCase", "RunResult", "run_plan"]
