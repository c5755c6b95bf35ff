"""One rank of `tpplan bench`: build the slice and its random weights, run every plan's batches under the probe.

Each rank builds the slice (`model_slice`: real widths, a few layers, as many experts as fit),
its shard of random weights (generated on the device, seeded per tensor name, so replicated ones
agree across ranks; no checkpoint is read) and a `PlanRunner` observed by a `Probe`. The
workload's prefill batches run in order, each segment with its request's carried KV cache /
recurrent state; `warmup` batches untimed, then `iters` timed passes. Rank 0 returns the
combined measurements (`replay.combine`); the parent turns them into results (`results`).
"""

from __future__ import annotations

import gc
import platform
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from tpplan.bench.config import BenchConfig, act_dtype
from tpplan.bench.host_ahead import HostAhead, summary
from tpplan.bench.model_slice import ModelSlice, build_slice
from tpplan.bench.probe import Clock, Probe, Span
from tpplan.bench.replay import combine, replay_collectives
from tpplan.cost.workload import PrefillBatch, Workload, schedule

if TYPE_CHECKING:
    from tpplan.layout.plan import Plan


class RandomSource:
    """Random weights generated on the device, seeded per tensor name (replicated tensors agree
    across ranks); the same initialisation rules as `runtime.weights.random_weights`."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], seed: int, device: Any, dtype: Any, offset: float) -> None:
        self.shapes, self.seed, self.device, self.dtype, self.offset = shapes, seed, device, dtype, offset

    def get(self, name: str, cut: Any) -> Any:
        import torch

        from tpplan.runtime.weights import _is_norm

        shape = self.shapes[name]
        gen = torch.Generator(device=self.device).manual_seed(self.seed * 1_000_003 + zlib.crc32(name.encode()))
        kw: dict[str, Any] = {"generator": gen, "device": self.device}
        if name.endswith("A_log"):
            t = torch.empty(shape, device=self.device).uniform_(1.0, 16.0, generator=gen).log()
        elif name.endswith("dt_bias"):
            t = torch.empty(shape, device=self.device).uniform_(-4.0, -1.0, generator=gen)
        elif name.endswith("e_score_correction_bias"):
            t = torch.randn(shape, **kw) * 0.01
        elif _is_norm(name) or name.endswith("res_norm.weight"):
            base = 0.0 if (self.offset and _is_norm(name) and "linear_attn.norm" not in name) else 1.0
            t = base + 0.1 * torch.randn(shape, **kw)
        elif name.endswith("conv1d.weight"):
            t = torch.randn(shape, **kw) * 0.3
        elif name.endswith("res_proj.weight"):
            t = torch.randn(shape, **kw) * 0.5
        elif name == "model.embed_tokens.weight":
            t = torch.randn(shape, dtype=self.dtype, **kw)
        else:
            t = torch.randn(shape, dtype=self.dtype, **kw) * 0.02
        if cut.full:
            return t
        parts = [t.narrow(cut.dim, lo, hi - lo) for lo, hi in cut.ranges]
        return (parts[0] if len(parts) == 1 else torch.cat(parts, dim=cut.dim)).clone()


def _sized(
    cfg: BenchConfig, wl: Workload, world: int, device: Any, dtype_bytes: int
) -> tuple[int | None, Workload, str]:
    """Routed experts and the workload this run keeps on this card (`slice_memory.fit_slice`: every
    weight, the requests' KV caches, a reserve), the smallest any rank can hold; what was given keeps."""
    import torch
    import torch.distributed as dist

    from tpplan.bench.slice_memory import fit_slice

    mem = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 2 * 2**30
    fit = fit_slice(cfg.model, cfg.layers, wl, world, float(mem), dtype_bytes)
    experts = cfg.experts if cfg.experts is not None else fit.experts
    requests = cfg.requests if cfg.requests is not None else fit.requests
    agreed = torch.tensor([experts or 0, requests], device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    experts, requests = (int(agreed[0]) or None), int(agreed[1])
    if requests < wl.total_requests:
        wl = wl.with_overrides("requests", num_requests=requests)
    return experts, wl, fit.note if (cfg.experts is None or cfg.requests is None) else ""


def _request_ids(wl: Workload, vocab: int, seed: int) -> dict[int, Any]:
    import torch

    out = {}
    for rid in range(wl.total_requests):
        gen = torch.Generator().manual_seed(seed * 7919 + rid + 1)
        out[rid] = torch.randint(0, vocab, (wl.prompt_len(rid),), generator=gen)
    return out


def worker(rank: int, world: int, device: Any, payload: tuple[BenchConfig, Workload, str]) -> dict[str, Any] | None:
    import torch

    from tpplan.bench import serving_kernels

    cfg, wl, backend = payload
    if device.type == "cpu":
        torch.set_num_threads(1)  # ranks share the cores
    dtype_name = act_dtype(cfg, backend)
    tdtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    experts, wl, fit_note = _sized(cfg, wl, world, device, torch.empty(0, dtype=tdtype).element_size())
    sl = build_slice(cfg.model, cfg.layers, experts)
    batches = schedule(wl)
    ids = _request_ids(wl, sl.graph.spec.vocab, cfg.seed)
    progress = _progress(cfg.progress and rank == 0)
    per_plan = cfg.warmup + cfg.iters * len(batches)
    out: dict[str, Any] = {
        "experts": sl.experts,
        "requests": wl.total_requests,
        "fit_note": fit_note,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "gpu_uuids": _uuids(device),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "nccl_version": _nccl_version() if backend == "nccl" else None,
        "dtype": dtype_name,
        "plans": {},
    }
    with progress, serving_kernels.installed(cfg.kernels == "fast"):
        for name in cfg.plans:
            task = progress.add_task(f"{name}: weights", total=per_plan + 1)
            res = _bench_plan(cfg, name, sl, wl, batches, ids, rank, world, device, tdtype, progress, task)
            if rank == 0:
                out["plans"][name] = res
            gc.collect()  # the plan's weights and caches go before the next plan's are made
            if device.type == "cuda":
                torch.cuda.empty_cache()
            progress.update(task, description=f"{name}: done", completed=per_plan + 1)
    out["grouped_gemm"] = serving_kernels.grouped_gemm_used().get(device.type)
    out["impls"] = implementations(
        cfg.kernels, device, out["grouped_gemm"], serving_kernels.sync_free_routing_used(),
        serving_kernels.attention_variants_used(), serving_kernels.expert_variants_used(),
        serving_kernels.indexer_variants_used(),
    )  # fmt: skip
    return out if rank == 0 else None


def implementations(
    kernels: str, device: Any, grouped: bool | None, sync_free: bool = False, attention: Sequence[str] = (),
    experts_with: Sequence[str] = (), indexer: Sequence[str] = (),
) -> dict[str, str]:  # fmt: skip
    """What ran for each kernel family (`config.impl_class`) in this process: the runtime's fast paths
    apply on CUDA unless TPPLAN_FAST_KERNELS=0 (fla's where it imports), the bench's `--kernels fast`
    adds SDPA off CUDA, grouped expert GEMMs and the batched torch delta rule where fla is missing.

    `attention`: the attention variants that ran (`serving_kernels.attention_variants_used`: "causal"
    on the serving path, a window or chunk by SDPA, top-k or sinks by the reference), listed after the
    serving path, or alone when no plain causal call ran; `experts_with`: the family variants the
    routed experts ran with (biases, ...); `indexer`: DSA's indexer kernels that ran
    (`serving_kernels.indexer_variants_used`; "reference" when none is recorded)."""
    import os

    from tpplan.runtime import fast_kernels as RF

    rt = device.type == "cuda" and RF.fast_enabled()
    fla = rt and RF.fla_available()
    fast = kernels == "fast"
    torch_delta = "tpplan batched chunked delta rule (torch)" if fast else "reference"
    sdpa = "torch SDPA, causal lower-right"
    cascade = "flash x2 (KV-cache prefix + causal chunk, merged by log-sum-exp)"
    pad = ", v zero-padded to the q/k head dim"
    cascaded = fast and device.type == "cuda" and os.environ.get("TPPLAN_CASCADE_ATTN", "0") == "1"
    conv = "torch conv1d (runtime fast path)"
    if rt and RF.fla_enabled(RF.FLA_CONV, "TPPLAN_FLA_CONV"):
        conv = "fla.causal_conv1d"
    attnres = "torch, fp32 rows in one pass"
    if rt and RF.fla_enabled(RF.FLA_ATTNRES, "TPPLAN_FLA_ATTNRES"):
        attnres = "fla.fused_attnres (bank snapshots copied contiguous)"
    experts = ("torch._grouped_mm" if grouped else "per-expert GEMM loop") + (
        ", routed without a host sync" if sync_free else ""
    )
    experts += "".join(f", {v}" for v in experts_with)
    masked = [a for a in attention if a != "causal"] if fast else []

    def attention_impl(serving: str) -> str:  # the serving path unless only masked variants ran, then those
        return "; ".join(([serving] if not masked or "causal" in attention else []) + masked)

    norm = "fla fused rms_norm" if fla and os.environ.get("TPPLAN_FLA_NORMS", "1") != "0" else "torch rms_norm (fp32)"
    return {
        "gemm": "cuBLAS matmul" if device.type == "cuda" else "torch matmul",
        "mla": attention_impl(
            (cascade + pad if cascaded else sdpa + (pad if rt else "")) if rt or fast else "reference"
        ),
        "mla_dsa": attention_impl(sdpa + (pad if rt else "") if rt or fast else "reference"),
        "dsa_indexer": "; ".join(indexer) or "reference",
        "gqa": attention_impl((cascade if cascaded else sdpa) if rt or fast else "reference"),
        "kda": "fla.chunk_kda" if fla else torch_delta,
        "gdn": "fla.chunk_gated_delta_rule" if fla else torch_delta,
        "short_conv": (conv if rt else "reference"),
        "experts": experts if fast else "reference",
        "norm": norm if rt else "reference",
        "attn_res": (attnres if rt else "reference"),
        "layout": "torch copy",
        "other": "torch",
    }


def _uuids(device: Any) -> list[str]:
    """Every visible GPU's UUID (rank 0 reports; the ranks share one host), empty off CUDA."""
    import torch

    if device.type != "cuda":
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        u = getattr(torch.cuda.get_device_properties(i), "uuid", None)
        if u is not None:
            out.append(str(u))
    return out


def _nccl_version() -> str | None:
    try:
        import torch

        v = torch.cuda.nccl.version()
        return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:  # version is optional metadata
        return None


def _progress(enabled: bool) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from tpplan.progress import progress

    return progress(
        enabled, TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
    )


def _bench_plan(
    cfg: BenchConfig,
    name: str,
    sl: ModelSlice,
    wl: Workload,
    batches: list[PrefillBatch],
    ids: dict[int, Any],
    rank: int,
    world: int,
    device: Any,
    tdtype: Any,
    progress: Any,
    task: Any,
) -> dict[str, Any] | None:
    """Run one plan on this rank: its warm-up batches untimed, `cfg.iters` timed passes, the runtime overhead
    where asked (CUDA), the first pass's collectives replayed; rank 0 returns every rank's measurements combined."""
    import torch.distributed as dist

    plan, run = _plan_run(cfg, name, sl, wl, ids, rank, world, device, tdtype, progress, task)
    run.clock.sync()
    dist.barrier()
    progress.update(task, advance=1, description=f"{name}: warm-up")
    states: dict[int, Any] = {}
    for i, b in enumerate(batches[: cfg.warmup]):  # a line per batch in a log: fla's autotune shows here
        progress.update(task, description=f"{name}: warm-up batch {i + 1}/{cfg.warmup}")
        run.batch(b, states)
        progress.update(task, advance=1)
    run.clock.sync()
    ahead = _host_ahead(cfg, run, batches)
    records, trace0 = _timed_passes(cfg, run, batches, ahead)
    fallbacks = [e.detail for e in run.runner.tracer.events]
    overhead = _overhead(run, batches, device) if cfg.overhead and device.type == "cuda" else None
    progress.update(task, description=f"{name}: replaying collectives")
    replay = replay_collectives(records[0], rank, world, device, cfg, run.clock)
    return _combined(records, replay, overhead, trace0, fallbacks, plan, rank, world, ahead)


@dataclass
class _PlanRun:
    """One plan's runner on this rank under the probe, the prompts it feeds and the progress bar it reports to:
    what every pass (warm-up, timed, overhead) runs its batches with."""

    name: str
    runner: Any  # runtime.distributed.PlanRunner
    probe: Probe
    clock: Clock
    ids: dict[int, Any]  # each request's prompt tokens
    wl: Workload
    device: Any
    progress: Any
    task: Any

    def batch(self, b: PrefillBatch, states: dict[int, Any]) -> None:
        """One prefill batch, each segment with its request's carried KV cache / recurrent state (`states`,
        request id -> [RunState, chunk index]); a finished request's is freed."""
        from tpplan.runtime.executor import RunState

        probe, runner = self.probe, self.runner
        probe.batch = b.index
        brec = probe.open("batch", -1, str(b.index))
        for j, s in enumerate(b.segments):
            probe.seg = j
            st = states.setdefault(s.request_id, [RunState(), 0])
            runner.state, runner.chunk_index = st[0], st[1]
            runner.forward_chunk(self.ids[s.request_id][s.start_pos : s.start_pos + s.n_tokens].to(self.device))
            st[1] = runner.chunk_index
            if s.start_pos + s.n_tokens >= self.wl.prompt_len(s.request_id):
                states.pop(s.request_id)  # finished: free its KV cache / state
        probe.close(brec)


def _plan_run(
    cfg: BenchConfig,
    name: str,
    sl: ModelSlice,
    wl: Workload,
    ids: dict[int, Any],
    rank: int,
    world: int,
    device: Any,
    tdtype: Any,
    progress: Any,
    task: Any,
) -> tuple[Plan, _PlanRun]:
    """The named plan on the slice, and its runner on this rank: this rank's shard of random weights
    (`RandomSource`), the communicator, observed by a fresh probe."""
    from tpplan.plans.named import make_plan
    from tpplan.runtime.distributed import PlanRunner, make_comm
    from tpplan.runtime.executor import numerics_for
    from tpplan.runtime.weights import expected_params

    graph = sl.graph
    nu = numerics_for(sl.full)
    plan = make_plan(name, graph, world)
    clock = Clock(device)
    probe = Probe(clock, len(graph.layer_kinds))
    comm = make_comm(rank, world)
    source = RandomSource(expected_params(graph, nu), cfg.seed, device, tdtype, nu.norm_offset)
    runner = PlanRunner(graph, plan, world, rank, source, comm=comm, numerics=nu, device=device, dtype=tdtype,
                        observer=probe)  # fmt: skip
    return plan, _PlanRun(name, runner, probe, clock, ids, wl, device, progress, task)


def _host_ahead(cfg: BenchConfig, run: _PlanRun, batches: list[PrefillBatch]) -> HostAhead:
    """How this plan's timed batches are issued (`host_ahead`). Host-ahead: the prompts staged on the device
    (a pageable copy per segment would wait for the GPU), then one untimed pass under the probe whose host time
    per batch, the longest of any rank, sizes each batch's sleep."""
    import torch
    import torch.distributed as dist

    ahead = HostAhead.for_device(cfg.timing, run.device.type == "cuda")
    if not ahead.sleeping:
        return ahead
    run.ids = {rid: t.to(run.device) for rid, t in run.ids.items()}
    ahead.calibrate()
    states: dict[int, Any] = {}
    host = []
    run.probe.enabled = True
    for b in batches:
        run.progress.update(run.task, description=f"{run.name}: host-ahead sizing, batch {b.index + 1}")
        t0 = time.perf_counter()
        run.batch(b, states)
        host.append(time.perf_counter() - t0)
        run.probe.resolve()
    run.probe.enabled = False
    longest = torch.tensor(host, device=run.device, dtype=torch.float64)
    dist.all_reduce(longest, op=dist.ReduceOp.MAX)
    ahead.size({b.index: float(x) for b, x in zip(batches, longest.tolist(), strict=True)})
    return ahead


def _timed_passes(
    cfg: BenchConfig, run: _PlanRun, batches: list[PrefillBatch], ahead: HostAhead
) -> tuple[list[list[Span]], list[Any]]:
    """`cfg.iters` passes over the batches under the probe, each from empty caches, each batch issued by
    `ahead` (behind its sleep when host-ahead): every pass's intervals, and the first pass's traced calls (the
    collectives the plan made, which the results check)."""
    records: list[list[Span]] = []
    trace0: list[Any] = []
    runner, probe, progress, task, name = run.runner, run.probe, run.progress, run.task, run.name
    for it in range(cfg.iters):
        states: dict[int, Any] = {}
        runner.tracer.calls.clear()
        runner.tracer.events.clear()
        probe.enabled = True
        recs: list[Span] = []
        for k, b in enumerate(batches):
            progress.update(task, description=f"{name}: pass {it + 1}/{cfg.iters}, batch {k + 1}/{len(batches)}")
            ahead.issue(b.index, partial(run.batch, b, states))
            new = probe.resolve()
            ahead.settle(sum(r.gap_s for r in new if r.kind == "op"))
            recs += new
            progress.update(task, advance=1)
        probe.enabled = False
        records.append(recs)
        if it == 0:
            trace0 = list(runner.tracer.calls)
    return records, trace0


def _overhead(run: _PlanRun, batches: list[PrefillBatch], device: Any) -> Any:
    """The runtime's overhead over one pass (`bench.overhead.measure`, which runs the pass twice: timed, then
    profiled)."""
    from tpplan.bench.overhead import measure

    passes = iter(("timed", "profiled"))

    def one_pass() -> None:
        run.progress.update(run.task, description=f"{run.name}: runtime overhead, {next(passes, 'another')} pass")
        states: dict[int, Any] = {}
        for b in batches:
            run.batch(b, states)

    return measure(one_pass, device.index or 0)


def _combined(
    records: list[list[Span]],
    replay: Any,
    overhead: Any,
    trace0: list[Any],
    fallbacks: list[str],
    plan: Plan,
    rank: int,
    world: int,
    ahead: HostAhead,
) -> dict[str, Any] | None:
    """Every rank's seconds gathered by position (every rank ran the same sequence of intervals) with its
    replayed collectives, overhead and timed batches' issue rows; rank 0 combines them, the slowest rank's
    overhead pass kept, every rank's issue rows summarised per batch (`host_ahead.summary`)."""
    import torch.distributed as dist

    mine = [[r.seconds for r in recs] for recs in records]
    mine_comm = [[r.comm_s for r in recs] for recs in records]
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (mine, mine_comm, replay, overhead, ahead.runs))
    if rank != 0:
        return None
    out = combine(records, gathered, trace0, fallbacks, plan)
    ranks = [g[3] for g in gathered if g[3] is not None]
    out["overhead"] = max(ranks, key=lambda o: o["pass_s"]) if ranks else None  # the slowest rank's pass
    out["timing"] = summary(ahead.mode, [row for g in gathered for row in g[4]])
    return out
