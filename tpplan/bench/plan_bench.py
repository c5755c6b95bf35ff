"""`tpplan bench`: run plans on a model slice with real collectives, time everything, compare with the prediction.

Why: the cost model decides which plan a team should deploy; this module checks it against the
hardware before anyone spends a multi-node reservation. One process group runs every requested
plan in turn (forming the group and initialising NCCL is the slow part):

1. Each rank builds the slice (`model_slice`: real widths, a few layers; as many experts and requests
   as the card holds, `slice_memory`),
   its shard of random bf16 weights (generated on the device, seeded per tensor name, so the
   replicated ones agree across ranks; no checkpoint is read), and a `PlanRunner` (the
   distributed runtime) whose ops, layers and collectives are wrapped with timers.
2. The workload's prefill batches (`cost.workload.schedule`) are run in order: each segment of a
   batch is one request's chunk, run with that request's carried KV cache / recurrent state
   (the first chunk's state is what the second chunk reads). `warmup` batches run untimed first,
   then `iters` timed passes over all batches.
3. Timers: CUDA events on the current stream (perf_counter on CPU) around every collective call,
   every op (collectives inside an op, the MoE all-to-all, are subtracted), every layer and every
   batch. Events are resolved once per batch. The runtime's layout copies around a collective
   (packing rows into per-destination blocks before the all-to-all, interleaving gathered head
   blocks, padding a reduce-scatter input) are steps of their own, timed as ops `pack:<value>` /
   `unpack:<value>` (category "other") beside their predicted `OpTime`s, so a collective's
   interval is the torch.distributed call on the ready buffer.
4. Every distinct collective is then replayed in a tight loop twice, on tensors of the same
   shapes: through the runtime's `Comm` method (`runtime_s`) and as the bare torch.distributed
   call (`direct_s`), timed as `tpplan calibrate` times (events around a batch of back-to-back
   calls, fastest of 3 batches): their ratio is the runtime's overhead.

Combining ranks: ops, layers and batches take the slowest rank (a step ends when its slowest
rank does). A collective takes the fastest rank: it ends at the same moment on every rank, so the
rank that arrived last measures the collective itself and the others add their wait for it.
Then the median over the timed passes (collectives: over every occurrence).

The parent process turns the measurements into a `BenchResults` (docs/bench-json.md) per plan,
with the predictions for the same slice, shapes and topology beside them (`cost.predict`), and
extrapolates the whole model's TTFT on a target topology (see `extrapolate_ttft`).

Modules: `config` (inputs, checked up front), `probe` (the timers: a `runtime.observe` observer),
`worker` (one rank), `replay` (collective replays, ranks combined), `results` (-> BenchResults,
files), `ttft`, `checks` (targets), `markdown`. This module runs them.
"""

from __future__ import annotations

import dataclasses
import os

from tpplan.bench.config import BenchConfig, act_dtype, check_inputs, resolved_workload
from tpplan.bench.results import PlanBench, build_results
from tpplan.bench.worker import worker
from tpplan.cost.workload import Workload
from tpplan.errors import TpplanError


def run_bench(cfg: BenchConfig) -> list[PlanBench] | None:
    """Check inputs, run every plan on a process group, return the results (None on a non-zero torchrun rank)."""
    from tpplan.runtime.group import GroupSpec, resolve_backend, run_group, under_torchrun

    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else cfg.nproc
    if world < 1:
        raise TpplanError(f"nproc={cfg.nproc}", "must be at least 1", "pass the number of GPUs to use")
    backend = resolve_backend(cfg.backend)
    if backend not in ("nccl", "gloo"):
        raise TpplanError(f"backend={cfg.backend}", "unknown backend", "use nccl, gloo or auto")
    if cfg.overhead and backend != "nccl":
        raise TpplanError("overhead=", f"times how long the GPU waits on the host, and this run has no GPU "
                          f"(backend {backend})", "run it on GPUs (backend nccl) or drop overhead=")  # fmt: skip
    wl, _ = check_inputs(cfg, world)
    act_dtype(cfg, backend)
    if backend == "nccl" and not under_torchrun():
        import torch

        have = torch.cuda.device_count()
        if have < world:
            raise TpplanError(f"nproc={world}", f"needs {world} GPUs, {have} visible", "use fewer ranks or gloo")
    spec = GroupSpec(backend, world, cfg.timeout_s)
    raw = run_group(worker, spec, (cfg, wl, backend))
    if raw is None:
        return None
    cfg, wl = with_sized_requests(cfg, wl, raw.get("requests"))
    return build_results(cfg, wl, raw, world, backend)


def with_sized_requests(cfg: BenchConfig, wl: Workload, requests: int | None) -> tuple[BenchConfig, Workload]:
    """The config and workload as run when the card's memory cut the requests (`slice_memory`): the
    recorded command gains `--requests N`, so a re-prediction prices the workload that ran."""
    if requests is None or requests >= wl.total_requests:
        return cfg, wl
    cfg = dataclasses.replace(cfg, requests=requests, command=f"{cfg.command} --requests {requests}")
    return cfg, resolved_workload(cfg)


__all__ = ["run_bench", "with_sized_requests"]
