"""`tpplan bench`: run plans on a model slice with real collectives, time everything, compare with the prediction.

Why: the cost model decides which plan a team should deploy; this module checks it against the
hardware before anyone spends a multi-node reservation. One process group runs every requested
plan in turn (forming the group and initialising NCCL is the slow part):

1. Each rank builds the slice (`model_slice`: real widths, a few layers, as many experts as fit),
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
"""

from __future__ import annotations

import gc
import json
import math
import os
import platform
import statistics
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tpplan import bench_results as schema
from tpplan.bench.model_slice import ModelSlice, build_slice, experts_that_fit
from tpplan.bench_results import (
    BatchResult,
    BenchMeta,
    BenchResults,
    CollectiveResult,
    LayerResult,
    OpResult,
    TTFTExtrapolation,
    error_summary,
    parse_bench_results,
)
from tpplan.cost.workload import PrefillBatch, Workload, load_workload, schedule, simulate_ttft
from tpplan.errors import TpplanError

DTYPE_SHORT = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "float32": "fp32",
    "float8_e4m3fn": "fp8",
}
COMM_METHODS = (
    "all_reduce",
    "reduce_scatter",
    "all_gather_tokens",
    "all_gather_heads",
    "tokens_to_heads",
    "all_to_all_rows",
    "exchange_counts",
)
SHORT = {"all_reduce": "AR", "reduce_scatter": "RS", "all_gather": "AG", "all_to_all": "A2A", "send_recv": "P2P"}
# Targets of issue 5 (docs/benchmarks.md).
TARGET_COLLECTIVE_MEDIAN = 0.05
TARGET_LAYER = 0.10
TARGET_OVERHEAD = 0.03
TARGET_SAVING = 0.90


@dataclass(frozen=True)
class BenchConfig:
    """Everything a run needs; picklable, sent to every rank."""

    model: str
    plans: tuple[str, ...]
    workload: str
    topology: str = "h200x2-calibrated"
    layers: str | None = None
    experts: int | None = None  # None: as many as fit (GPU), the model's (CPU)
    tokens: int | None = None  # override the workload's prompt length
    chunk: int | None = None  # override the workload's chunk size
    requests: int | None = None  # override the workload's number of requests
    iters: int = 2
    warmup: int = 2
    direct_iters: int = 20
    backend: str = "auto"
    nproc: int = 2
    dtype: str | None = None  # None: bf16 with NCCL, fp32 with gloo
    kernels: str = "fast"  # fast | reference (see bench.serving_kernels)
    target_topology: str | None = None
    target_nodes: int | None = None
    seed: int = 0
    timeout_s: float = 600.0
    progress: bool = True
    command: str = "tpplan bench"


# ----------------------------------------------------------------------------------------------
# Input checks (parent process, before any rank starts)


def resolved_workload(cfg: BenchConfig) -> Workload:
    """The workload with --tokens/--chunk/--requests applied."""
    wl = load_workload(cfg.workload)
    upd: dict[str, Any] = {}
    if cfg.tokens is not None:
        if cfg.tokens < 1:
            raise TpplanError(f"--tokens {cfg.tokens}", "must be at least 1", "pass a positive prompt length")
        upd.update(input_len=cfg.tokens, input_lens=None)
    if cfg.chunk is not None:
        if cfg.chunk < 1:
            raise TpplanError(f"--chunk {cfg.chunk}", "must be at least 1", "pass a positive chunk size")
        upd["chunk_size"] = cfg.chunk
    if cfg.requests is not None:
        if cfg.requests < 1:
            raise TpplanError(f"--requests {cfg.requests}", "must be at least 1", "pass a positive count")
        upd["num_requests"] = cfg.requests
    return wl.model_copy(update=upd) if upd else wl


def act_dtype(cfg: BenchConfig, backend: str) -> str:
    """Activation/weight dtype name: bf16 on NCCL, fp32 on gloo (CPU), unless given."""
    name = cfg.dtype or ("bf16" if backend == "nccl" else "fp32")
    if name not in ("bf16", "fp16", "fp32"):
        raise TpplanError(f"--dtype {name}", "unsupported", "use bf16, fp16 or fp32")
    return name


def check_inputs(cfg: BenchConfig, world: int) -> tuple[Workload, ModelSlice]:
    """Fail fast (TpplanError, exit 2) on a bad model, plan, workload or topology; nothing runs."""
    from tpplan.audit import audit_plan
    from tpplan.cost.topology import load_topology
    from tpplan.plans.named import make_plan

    if not cfg.plans:
        raise TpplanError("--plan", "no plan given", "pass --plan NAME (repeatable)")
    if cfg.iters < 1 or cfg.warmup < 0 or cfg.direct_iters < 1:
        raise TpplanError("--iters/--warmup", "iters must be >= 1 and warmup >= 0", "pass sensible counts")
    if cfg.kernels not in ("fast", "reference"):
        raise TpplanError(f"--kernels {cfg.kernels}", "unknown kernel set", "use fast or reference")
    wl = resolved_workload(cfg)
    topo = load_topology(cfg.topology)
    target = load_topology(cfg.target_topology, cfg.target_nodes) if cfg.target_topology is not None else None
    if world > topo.world_size:
        raise TpplanError(
            f"--topology {cfg.topology}",
            f"has {topo.world_size} GPUs, the run uses {world} ranks",
            "predict on a topology with at least as many GPUs (e.g. a calibrated one from `tpplan calibrate`)",
        )
    sl = build_slice(cfg.model, cfg.layers, cfg.experts)
    for name in cfg.plans:
        plan = make_plan(name, sl.graph, world)
        pa = audit_plan(sl.graph, plan, world, "fp32")
        if not pa.legal:
            first = pa.violations[0].sentence()
            raise TpplanError(
                f"--plan {name} (TP{world})",
                f"the audit calls this plan illegal: {first}",
                "bench legal plans only (`tpplan audit` lists them)",
            )
    if target is not None:  # the whole model must take every plan at the target's TP size
        for name in cfg.plans:
            pa = audit_plan(sl.full, make_plan(name, sl.full, target.world_size), target.world_size, "bf16")
            if not pa.legal:
                raise TpplanError(
                    f"--plan {name} --target-topology {cfg.target_topology}",
                    f"illegal for the whole model at TP{target.world_size}: {pa.violations[0].sentence()}",
                    "pick another target topology or drop --target-topology",
                )
    if cfg.experts is not None and sl.experts is not None and sl.experts % world:
        raise TpplanError(f"--experts {cfg.experts}", f"must be divisible by the {world} ranks", "pick a multiple")
    return wl, sl


# ----------------------------------------------------------------------------------------------
# Worker side: timers, weights, the timed runner


class _Clock:
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
class _Rec:
    """One timed interval: what (kind, layer, name) and where (batch, segment) it ran."""

    kind: str  # batch | layer | op | coll
    layer: int
    name: str
    batch: int
    seg: int
    start: Any = None
    end: Any = None
    parents: list[_Rec] = field(default_factory=list)
    comm_s: float = 0.0
    seconds: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)


class _Probe:
    """A stack of open intervals; `enabled` off during warm-up."""

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock
        self.enabled = False
        self.stack: list[_Rec] = []
        self.pending: list[_Rec] = []
        self.batch = -1
        self.seg = 0

    def open(self, kind: str, layer: int, name: str) -> _Rec | None:
        if not self.enabled:
            return None
        rec = _Rec(kind, layer, name, self.batch, self.seg, parents=list(self.stack))
        self.stack.append(rec)
        rec.start = self.clock.mark()
        return rec

    def close(self, rec: _Rec | None) -> None:
        if rec is None:
            return
        rec.end = self.clock.mark()
        popped = self.stack.pop()
        assert popped is rec
        self.pending.append(rec)

    def resolve(self) -> list[_Rec]:
        """Wait for the device, turn marks into seconds, charge collectives to their enclosing op/layer."""
        self.clock.sync()
        out = self.pending
        for r in out:
            r.seconds = self.clock.seconds(r.start, r.end)
            r.start = r.end = None
        for r in out:
            if r.kind == "coll":
                for p in r.parents:
                    p.comm_s += r.seconds
        self.pending = []
        return out


def _argspec(args: Sequence[Any]) -> tuple[Any, ...]:
    import torch

    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(("tensor", tuple(a.shape), str(a.dtype).removeprefix("torch.")))
        elif isinstance(a, list | tuple):
            out.append(tuple(int(x) for x in a))
        else:
            out.append(a)
    return tuple(out)


def _wrap_comm(comm: Any, probe: _Probe) -> None:
    """Time every traced collective method of this `Comm` instance."""
    for name in COMM_METHODS:
        orig = getattr(comm, name)

        def timed(*args: Any, _orig: Callable[..., Any] = orig, _name: str = name, **kw: Any) -> Any:
            before = len(comm.tracer.calls)
            rec = probe.open("coll", comm.tracer.layer, _name)
            out = _orig(*args, **kw)
            probe.close(rec)
            if rec is not None:
                call = comm.tracer.calls[-1] if len(comm.tracer.calls) > before else None
                rec.meta = {"method": _name, "args": _argspec(args), "kw": dict(kw), "call": call}
            return out

        setattr(comm, name, timed)


def _timed_runner_class() -> type:
    from tpplan.runtime.distributed import PlanRunner

    class TimedRunner(PlanRunner):  # type: ignore[misc]
        """PlanRunner with a timer around each layer and each op (`probe` set after construction)."""

        probe: _Probe

        def _layer(
            self, i: int, lg: Any, res: Any, planned: Any, shard: Any, env: Any, ctx: Any, tokens: int, boundary: bool
        ) -> None:
            rec = self.probe.open("layer", i, "")
            super()._layer(i, lg, res, planned, shard, env, ctx, tokens, boundary)
            self.probe.close(rec)

        def _run(self, op: Any, dec: Any, ins: Any, w: Any, state: Any, ctx: Any, tokens: int) -> Any:
            rec = self.probe.open("op", ctx.layer, op.name)
            out = super()._run(op, dec, ins, w, state, ctx, tokens)
            self.probe.close(rec)
            return out

        def _layout(self, name: str, copy: Any, *args: Any) -> Any:
            """A layout copy around a collective, timed as an op `pack:<value>` / `unpack:<value>` (the
            one before the final norm belongs to no layer: counted in its batch only)."""
            layer = self.tracer.layer
            rec = self.probe.open("op", layer, name) if layer < len(self.graph.layer_kinds) else None
            out = super()._layout(name, copy, *args)
            self.probe.close(rec)
            return out

    return TimedRunner


class _RandomSource:
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


def _batch_segments(batch: PrefillBatch) -> tuple[tuple[int, int], ...]:
    return tuple((s.n_tokens, s.start_pos) for s in batch.segments)


def _request_ids(wl: Workload, vocab: int, seed: int) -> dict[int, Any]:
    import torch

    out = {}
    for rid in range(wl.total_requests):
        gen = torch.Generator().manual_seed(seed * 7919 + rid + 1)
        out[rid] = torch.randint(0, vocab, (wl.prompt_len(rid),), generator=gen)
    return out


def _worker(rank: int, world: int, device: Any, payload: tuple[BenchConfig, Workload, str]) -> dict[str, Any] | None:
    import torch
    import torch.distributed as dist

    from tpplan.bench import serving_kernels

    cfg, wl, backend = payload
    if device.type == "cpu":
        torch.set_num_threads(1)  # ranks share the cores
    dtype_name = act_dtype(cfg, backend)
    tdtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    experts = cfg.experts
    if experts is None:
        probe_sl = build_slice(cfg.model, cfg.layers, None)
        if probe_sl.experts is not None:
            mem = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 2 * 2**30
            experts = experts_that_fit(probe_sl, world, float(mem))
            agreed = torch.tensor([experts], device=device)
            dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
            experts = int(agreed.item())
    sl = build_slice(cfg.model, cfg.layers, experts)
    batches = schedule(wl)
    ids = _request_ids(wl, sl.graph.spec.vocab, cfg.seed)
    progress = _progress(cfg.progress and rank == 0)
    per_plan = cfg.warmup + cfg.iters * len(batches)
    out: dict[str, Any] = {
        "experts": sl.experts,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
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
    return out if rank == 0 else None


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

    return progress(enabled, TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())


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
    """Run one plan on this rank; rank 0 returns the combined measurements."""
    import torch.distributed as dist

    from tpplan.plans.named import make_plan
    from tpplan.runtime.distributed import make_comm
    from tpplan.runtime.executor import RunState, numerics_for
    from tpplan.runtime.weights import expected_params

    graph = sl.graph
    nu = numerics_for(sl.full)
    plan = make_plan(name, graph, world)
    clock = _Clock(device)
    probe = _Probe(clock)
    comm = make_comm(rank, world)
    _wrap_comm(comm, probe)
    source = _RandomSource(expected_params(graph, nu), cfg.seed, device, tdtype, nu.norm_offset)
    runner = _timed_runner_class()(
        graph, plan, world, rank, source, comm=comm, numerics=nu, device=device, dtype=tdtype
    )
    runner.probe = probe
    clock.sync()
    dist.barrier()
    progress.update(task, advance=1, description=f"{name}: warm-up")

    def run_batch(b: PrefillBatch, states: dict[int, Any]) -> None:
        probe.batch = b.index
        brec = probe.open("batch", -1, str(b.index))
        for j, s in enumerate(b.segments):
            probe.seg = j
            st = states.setdefault(s.request_id, [RunState(), 0])
            runner.state, runner.chunk_index = st[0], st[1]
            runner.forward_chunk(ids[s.request_id][s.start_pos : s.start_pos + s.n_tokens].to(device))
            st[1] = runner.chunk_index
            if s.start_pos + s.n_tokens >= wl.prompt_len(s.request_id):
                states.pop(s.request_id)  # finished: free its KV cache / state
        probe.close(brec)

    states: dict[int, Any] = {}
    for b in batches[: cfg.warmup]:
        run_batch(b, states)
        progress.update(task, advance=1)
    clock.sync()
    records: list[list[_Rec]] = []
    trace0: list[Any] = []
    for it in range(cfg.iters):
        states = {}
        runner.tracer.calls.clear()
        runner.tracer.events.clear()
        probe.enabled = True
        recs: list[_Rec] = []
        for b in batches:
            run_batch(b, states)
            recs += probe.resolve()
            progress.update(task, advance=1, description=f"{name}: pass {it + 1}/{cfg.iters}")
        probe.enabled = False
        records.append(recs)
        if it == 0:
            trace0 = list(runner.tracer.calls)
    fallbacks = [e.detail for e in runner.tracer.events]
    progress.update(task, description=f"{name}: replaying collectives")
    replay = _replay(records[0], rank, world, device, cfg, clock)
    # Every rank ran the same sequence of intervals: gather their seconds by position.
    mine = [[r.seconds for r in recs] for recs in records]
    mine_comm = [[r.comm_s for r in recs] for recs in records]
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (mine, mine_comm, replay))
    if rank != 0:
        return None
    return _combine(records, gathered, trace0, fallbacks, plan)


def _replay(recs: list[_Rec], rank: int, world: int, device: Any, cfg: BenchConfig, clock: _Clock) -> dict[int, Any]:
    """Each distinct collective of the first pass, replayed through `Comm` and directly; per-call seconds."""
    import torch
    import torch.distributed as dist

    from tpplan.runtime.distributed import make_comm

    colls = [(i, r) for i, r in enumerate(recs) if r.kind == "coll" and r.meta.get("call") is not None]
    # Distinct by what rank 0 sees; every rank replays its own call at the same position.
    keys: dict[tuple[Any, ...], int] = {}
    for i, r in colls:
        keys.setdefault(_replay_key(r), i)
    chosen = [sorted(keys.values())]
    dist.broadcast_object_list(chosen, src=0)
    out: dict[int, Any] = {}
    fresh = make_comm(rank, world)
    for i in chosen[0]:
        r = recs[i]
        method, args, kw = r.meta["method"], r.meta["args"], r.meta["kw"]
        real = [torch.zeros(a[1], dtype=getattr(torch, a[2]), device=device) if _is_t(a) else a for a in args]

        def via_comm(_m: str = method, _real: list[Any] = real, _kw: dict[str, Any] = kw) -> None:
            getattr(fresh, _m)(*_real, **_kw)
            fresh.tracer.calls.clear()

        direct = _direct_call(method, real, r.meta["call"], world)
        out[i] = (_time_loop(via_comm, clock, cfg), _time_loop(direct, clock, cfg))
    return out


def _replay_key(r: _Rec) -> tuple[Any, ...]:
    """Calls with the same method and argument shapes are the same collective (the value name aside)."""
    return (r.meta["method"], tuple(a for a in r.meta["args"] if not isinstance(a, str)))


def _direct_call(method: str, real: list[Any], call: Any, n: int) -> Callable[[], Any]:
    """The bare torch.distributed call that `Comm.<method>` makes, on preallocated buffers."""
    import torch
    import torch.distributed as dist

    from tpplan.runtime.trace import _AG, _RS, pad_rows

    x = real[0]
    if method == "all_reduce":
        buf = x.clone()
        return lambda: dist.all_reduce(buf)
    if method == "reduce_scatter":
        per = -(-int(real[2]) // n)
        full = pad_rows(x, per * n).contiguous()
        part = full.new_empty(per, *full.shape[1:])
        return lambda: _RS(part, full)
    if method in ("all_gather_tokens", "all_gather_heads"):
        src = x.contiguous()
        dst = x.new_empty(x.shape[0] * n, *x.shape[1:])
        return lambda: _AG(dst, src)
    if method == "tokens_to_heads":
        send = x.new_zeros(call.bytes // x.element_size())
        recv = torch.empty_like(send)
        return lambda: dist.all_to_all_single(recv, send)
    if method == "all_to_all_rows":
        send_rows, recv_rows = list(real[1]), list(real[2])
        out = x.new_empty(sum(recv_rows), *x.shape[1:])
        return lambda: dist.all_to_all_single(out, x, recv_rows, send_rows)
    if method == "exchange_counts":
        got = torch.empty_like(x)
        return lambda: dist.all_to_all_single(got, x)
    raise RuntimeError(f"no direct form for {method}")


def _is_t(a: Any) -> bool:
    return isinstance(a, tuple) and len(a) == 3 and a[0] == "tensor"


def _time_loop(fn: Callable[[], Any], clock: _Clock, cfg: BenchConfig, reps: int = 3) -> float:
    """Seconds per call, nccl-tests style (as `tpplan calibrate` measured the model's constants):
    one interval around `direct_iters` back-to-back calls divided by their number, the fastest of
    `reps` such batches, after 3 warm-up calls and a barrier."""
    import torch.distributed as dist

    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(reps):
        clock.sync()
        dist.barrier()
        a = clock.mark()
        for _ in range(cfg.direct_iters):
            fn()
        b = clock.mark()
        clock.sync()
        best = min(best, clock.seconds(a, b) / cfg.direct_iters)
    return best


def _combine(
    records: list[list[_Rec]], gathered: list[Any], trace0: list[Any], fallbacks: list[str], plan: Any
) -> dict[str, Any]:
    """Rank 0: per interval, the slowest rank (collectives: the fastest), listed over the passes.

    Every pass runs the same batches through the same code, so the n-th interval of one pass is
    the n-th of every other pass and of every rank."""
    iters = len(records)
    sites: list[dict[str, Any]] = []
    for pos, r in enumerate(records[0]):
        entry: dict[str, Any] = {
            "kind": r.kind,
            "batch": r.batch,
            "seg": r.seg,
            "layer": r.layer,
            "name": r.name,
            "pos": pos,
            "seconds": [],
            "comm_s": [],
        }
        for it in range(iters):
            secs = [g[0][it][pos] for g in gathered]
            if r.kind == "coll":
                entry["seconds"].append(min(secs))
                entry["comm_s"].append(0.0)
            else:
                k = max(range(len(secs)), key=lambda j: secs[j])
                entry["seconds"].append(secs[k])
                entry["comm_s"].append(gathered[k][1][it][pos])
        if r.kind == "coll":
            call = r.meta.get("call")
            if call is None:  # one rank: nothing moved
                entry["kind"] = "none"
                sites.append(entry)
                continue
            entry.update(
                method=r.meta["method"],
                value=call.value,
                coll=call.kind,
                shape=tuple(call.shape),
                dtype=call.dtype,
                bytes=call.bytes,
                planned=call.planned,
            )
        sites.append(entry)
    replay = {pos: (min(g[2][pos][0] for g in gathered), min(g[2][pos][1] for g in gathered)) for pos in gathered[0][2]}
    by_key = {_replay_key(records[0][pos]): v for pos, v in replay.items()}
    for entry in sites:
        if entry["kind"] == "coll":
            entry["replay"] = by_key.get(_replay_key(records[0][entry["pos"]]))
    return {"sites": sites, "replay": replay, "trace": trace0, "fallbacks": fallbacks, "iters": iters, "plan": plan}


# ----------------------------------------------------------------------------------------------
# Parent side: predictions, results, markdown, checks


@dataclass
class PlanBench:
    """One plan's results file and what the markdown and the checks need beyond it."""

    plan: str
    results: BenchResults
    runtime_s: dict[int, float]  # collective entry index -> replay through the runtime's Comm
    batch_contexts: dict[int, str]
    fallbacks: list[str]
    trace: list[Any]
    kernels: str = ""


def run_bench(cfg: BenchConfig) -> list[PlanBench] | None:
    """Check inputs, run every plan on a process group, return the results (None on a non-zero torchrun rank)."""
    from tpplan.runtime.group import GroupSpec, resolve_backend, run_group, under_torchrun

    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else cfg.nproc
    if world < 1:
        raise TpplanError(f"--nproc {cfg.nproc}", "must be at least 1", "pass the number of GPUs to use")
    backend = resolve_backend(cfg.backend)
    if backend not in ("nccl", "gloo"):
        raise TpplanError(f"--backend {cfg.backend}", "unknown backend", "use nccl, gloo or auto")
    wl, _ = check_inputs(cfg, world)
    act_dtype(cfg, backend)
    if backend == "nccl" and not under_torchrun():
        import torch

        have = torch.cuda.device_count()
        if have < world:
            raise TpplanError(f"--nproc {world}", f"needs {world} GPUs, {have} visible", "use fewer ranks or gloo")
    spec = GroupSpec(backend, world, cfg.timeout_s)
    raw = run_group(_worker, spec, (cfg, wl, backend))
    if raw is None:
        return None
    return build_results(cfg, wl, raw, world, backend)


def _coll_label(sl: ModelSlice, plan: Any, world: int, layer: int, value: str, kind: str) -> str:
    from tpplan.layout.schedule import layer_results

    n_layers = sl.graph.spec.num_layers
    if layer >= n_layers:
        return f"{SHORT.get(kind, kind)} final[{sl.graph.hidden}]"
    for c in layer_results(sl.graph, plan, world)[layer].comms:
        if c.value == value and c.collective.value == kind:
            return c.label
    return f"{SHORT.get(kind, kind)} {value}"


def _category(op_kind: str, predicted_category: str) -> str:
    """The schema's categories: elementwise ops split into norm and other."""
    if predicted_category != "elementwise":
        return predicted_category
    return "norm" if op_kind in ("NORM", "HEAD_NORM", "ATTN_RES") else "other"


def build_results(cfg: BenchConfig, wl: Workload, raw: dict[str, Any], world: int, backend: str) -> list[PlanBench]:
    """Measurements + predictions for the same slice and shapes -> one `BenchResults` per plan."""
    import socket

    from tpplan.cost.collectives import collective_time
    from tpplan.cost.predict import _predictor
    from tpplan.cost.topology import load_topology

    sl = build_slice(cfg.model, cfg.layers, raw["experts"])
    g = sl.graph
    topo = load_topology(cfg.topology)
    rpn = min(world, topo.gpus_per_node)
    dtype = raw["dtype"]
    batches = {b.index: b for b in schedule(wl)}
    out = []
    for name, pr in raw["plans"].items():
        plan = pr["plan"]
        p = _predictor(g, plan, topo, world, 1, dtype, None)
        results = p.audit.layer_results
        sites = pr["sites"]
        # -- predictions per site
        op_acc: dict[tuple[str, str, int], list[Any]] = defaultdict(list)
        layer_acc: dict[tuple[str, int], list[Any]] = defaultdict(list)
        batch_rows = []
        coll_acc: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
        for s in sites:
            kind = s["kind"]
            if kind == "batch":
                b = batches[s["batch"]]
                segs = tuple((x.n_tokens, x.start_pos) for x in b.segments)
                batch_rows.append((b, statistics.median(s["seconds"]), p.latency(segs)))
                continue
            b = batches[s["batch"]]
            seg = b.segments[s["seg"]]
            segs1 = ((seg.n_tokens, seg.start_pos),)
            if kind == "none" or s.get("dtype") == "int64":
                continue  # identity with one rank; MoE count exchange (int64: not a schema dtype, 8 B per rank)
            if kind == "coll":
                lk = g.layer_kinds[s["layer"]] if s["layer"] < g.spec.num_layers else None
                key = (lk, s["value"], s["coll"], s["shape"], s["dtype"])
                coll_acc[key].append(s)
                continue
            lk = g.layer_kinds[s["layer"]]
            kt = p.kind_time(results[s["layer"]], segs1)
            med = statistics.median(s["seconds"])
            comm = statistics.median(s["comm_s"])
            if kind == "layer":
                layer_acc[(lk, seg.n_tokens)].append((med, comm, kt.total_s))
            else:
                opt = next(o for o in kt.ops if o.op == s["name"])
                op_acc[(lk, s["name"], seg.n_tokens)].append((med - comm, opt))
        ops = []
        for (lk, op_name, tokens), vals in op_acc.items():
            meas = statistics.fmean(max(v[0], 1e-9) for v in vals)
            pred = statistics.fmean(v[1].seconds for v in vals)
            modelled = statistics.fmean(v[1].modelled_s or 0.0 for v in vals)
            o0 = vals[0][1]
            ops.append(
                OpResult(
                    layer_kind=lk,
                    op=op_name,
                    category=_category(_op_kind(g, lk, op_name), o0.category),
                    tokens=tokens,
                    flops=o0.flops_per_rank,
                    measured_s=meas,
                    predicted_s=pred if pred > 0 else None,
                    iters=pr["iters"],
                    kernel=o0.kernel,
                    modelled_s=modelled if modelled > 0 else None,
                )
            )
        layers = []
        for (lk, tokens), vals in layer_acc.items():
            meas = statistics.fmean(v[0] for v in vals)
            comm = statistics.fmean(v[1] for v in vals)
            layers.append(
                LayerResult(
                    layer_kind=lk,
                    tokens=tokens,
                    measured_s=meas,
                    predicted_s=statistics.fmean(v[2] for v in vals),
                    comm_measured_s=comm,
                    compute_measured_s=max(meas - comm, 0.0),
                    iters=pr["iters"],
                )
            )
        colls = []
        runtime_s: dict[int, float] = {}
        for key, group in coll_acc.items():
            lk, value, kind, shape, dt = key
            secs = [x for s in group for x in s["seconds"]]
            nbytes = group[0]["bytes"]
            est = collective_time(kind, float(nbytes), world, topo, ranks_per_node=rpn)
            rep = next((s["replay"] for s in group if s.get("replay")), None)
            colls.append(
                CollectiveResult(
                    kind=kind,
                    label=_coll_label(sl, plan, world, group[0]["layer"], value, kind),
                    layer_kind=lk,
                    shape=list(shape),
                    dtype=DTYPE_SHORT.get(dt, "fp32"),
                    bytes=nbytes,
                    group_size=world,
                    measured_s=max(statistics.median(secs), 1e-9),
                    predicted_s=est.time_s,
                    iters=len(secs),
                    algorithm=est.algorithm,
                    direct_s=max(rep[1], 1e-9) if rep else None,
                    replay_s=max(rep[0], 1e-9) if rep else None,
                )
            )
            if rep:
                runtime_s[len(colls) - 1] = rep[0]
        batch_results = [
            BatchResult(
                index=b.index,
                tokens=b.n_tokens,
                requests=sorted({s.request_id for s in b.segments}),
                measured_s=max(m, 1e-9),
                predicted_s=pred,
                iters=pr["iters"],
            )
            for b, m, pred in sorted(batch_rows, key=lambda x: x[0].index)
        ]
        ttft = []
        if cfg.target_topology is not None:
            ttft.append(extrapolate_ttft(cfg, wl, sl, name, ops, colls))
        meta = BenchMeta(
            machine=socket.gethostname() or "unknown",
            gpu=raw["gpu"] or "unknown",
            gpus=world,
            date=datetime.now(UTC).replace(microsecond=0),
            command=cfg.command,
            torch_version=raw["torch_version"],
            nccl_version=raw["nccl_version"],
            cuda_version=raw["cuda_version"],
            tpplan_version=_version(),
        )
        res = BenchResults(
            schema_version=1,
            meta=meta,
            model=cfg.model,
            plan=name,
            tp=world,
            workload=cfg.workload,
            topology=cfg.topology,
            model_slice=schema.ModelSlice(
                description=sl.description, layer_kinds=g.counts(), experts=sl.experts, hidden=g.hidden
            ),
            collectives=colls,
            ops=ops,
            layers=layers,
            batches=batch_results,
            ttft=ttft,
        )
        contexts = {b.index: ",".join(str(s.start_pos) for s in b.segments) for b in batches.values()}
        out.append(PlanBench(name, res, runtime_s, contexts, pr["fallbacks"], pr["trace"], _kernels_note(cfg, raw)))
    return out


def _kernels_note(cfg: BenchConfig, raw: dict[str, Any]) -> str:
    if cfg.kernels != "fast":
        return "reference kernels (runtime.kernels) throughout"
    moe = {True: "torch._grouped_mm", False: "per-expert GEMM loop (torch._grouped_mm refused)"}.get(
        raw.get("grouped_gemm"), "no MoE"
    )
    return (
        f"attention: SDPA (flash where eligible); routed experts: {moe}; KDA/GDN recurrence: reference chunked kernel"
    )


def _version() -> str | None:
    try:
        from importlib.metadata import version

        return version("tpplan")
    except Exception:  # optional metadata
        return None


# ----------------------------------------------------------------------------------------------
# TTFT extrapolation


TTFT_METHOD = (
    "whole-model TTFT on the target = the chunked-prefill scheduler (cost.workload.simulate_ttft) run with "
    "every batch's predicted time on the target, each predicted op scaled by the slice's measured/predicted "
    "ratio of its category (gemm, attention, recurrence, moe, norm/other) and every predicted collective by "
    "the slice's measured/predicted ratio of all collectives; predicted_mean_s is the unscaled prediction"
)


def category_ratios(ops: Sequence[OpResult], colls: Sequence[CollectiveResult]) -> dict[str, float]:
    """Measured / predicted, summed per op category (and 'comm' for the collectives)."""
    meas: dict[str, float] = defaultdict(float)
    pred: dict[str, float] = defaultdict(float)
    for o in ops:
        # against the roofline estimate: the target topology's predictions carry no kernel profiles
        est = o.estimate_s
        if est:
            meas[o.category or "other"] += o.measured_s * o.iters
            pred[o.category or "other"] += est * o.iters
    for c in colls:
        if c.predicted_s:
            meas["comm"] += c.measured_s * c.iters
            pred["comm"] += c.predicted_s * c.iters
    return {k: meas[k] / pred[k] for k in pred if pred[k] > 0}


def extrapolate_ttft(
    cfg: BenchConfig,
    wl: Workload,
    sl: ModelSlice,
    plan_name: str,
    ops: Sequence[OpResult],
    colls: Sequence[CollectiveResult],
) -> TTFTExtrapolation:
    """See TTFT_METHOD."""
    from tpplan.cost.predict import _predictor, _segments, predict_plan
    from tpplan.cost.topology import load_topology
    from tpplan.plans.named import make_plan

    assert cfg.target_topology is not None
    topo = load_topology(cfg.target_topology, cfg.target_nodes)
    full = sl.full
    tp = topo.world_size
    plan = make_plan(plan_name, full, tp)
    ratios = category_ratios(ops, colls)
    p = _predictor(full, plan, topo, tp, 1, "bf16", None)

    def scaled(batch: PrefillBatch) -> float:
        segs = _segments(batch)
        total = 0.0
        for res in p.audit.layer_results:
            kt = p.kind_time(res, segs)
            for o in kt.ops:
                cat = _category(_op_kind(full, res.kind, o.op), o.category)
                total += o.seconds * ratios.get(cat, 1.0)
            total += kt.comm_s * ratios.get("comm", 1.0)
        return total + p.final_comm(batch.n_tokens) * ratios.get("comm", 1.0)

    got = simulate_ttft(wl, scaled)
    plain = predict_plan(full, plan, topo, tp=tp, workload=wl, tokens=wl.chunk_size)
    name = topo.name + (f" x{cfg.target_nodes} nodes" if cfg.target_nodes else "")
    return TTFTExtrapolation(
        topology=f"{name} (TP{tp})",
        workload=wl.name,
        mean_s=got.mean_s,
        p50_s=got.p50_s,
        max_s=got.max_s,
        predicted_mean_s=plain.ttft.mean_s if plain.ttft else None,
    )


def _op_kind(graph: Any, layer_kind: str, op: str) -> str:
    """The graph op's kind name; "LAYOUT" for the runtime's layout copies (`pack:<value>`, `unpack:<value>`)."""
    return next((o.kind.name for o in graph.kinds[layer_kind].ops if o.name == op), "LAYOUT")


# ----------------------------------------------------------------------------------------------
# Output: files, markdown, checks


def output_paths(out: Path, plans: Sequence[str]) -> dict[str, Path]:
    """One plan: `out` itself; several: `<stem>-<plan><suffix>` beside it (one schema file per plan)."""
    if len(plans) == 1:
        return {plans[0]: out}
    safe = {p: "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in p) for p in plans}
    return {p: out.with_name(f"{out.stem}-{safe[p]}{out.suffix or '.json'}") for p in plans}


def write_atomic(files: dict[Path, str]) -> None:
    """Write every file to a temp file beside it, then rename them all; on any error, none is left."""
    from tpplan.outputs import write_files

    write_files(files)


def results_json(res: BenchResults) -> str:
    """The file's text, validated by the report's parser before it is written."""
    data = json.loads(res.model_dump_json(exclude_none=True))
    parse_bench_results(data, "tpplan bench output")
    return json.dumps(data, indent=1) + "\n"


def _ms(x: float | None) -> str:
    return "" if x is None else f"{x * 1e3:.3f}"


def _us(x: float | None) -> str:
    return "" if x is None else f"{x * 1e6:.1f}"


def _err(meas: float, pred: float | None) -> str:
    return "" if not pred else f"{(pred - meas) / meas:+.1%}"


@dataclass
class Check:
    """One target: its value, the bar, pass/fail (None: not applicable) and what it measured."""

    name: str
    value: str
    bar: str
    ok: bool | None
    detail: str = ""


def checks(benches: Sequence[PlanBench]) -> list[Check]:
    """Issue 5's targets on these results (see the module constants)."""
    out: list[Check] = []
    for pb in benches:
        r = pb.results
        cs = error_summary(list(r.collectives))
        med = cs["median_abs_err"]
        per_call = call_weighted_median_error(r.collectives)
        out.append(
            Check(
                f"{pb.plan}: collective median |error|",
                "" if med is None else f"{med:.1%}",
                f"<= {TARGET_COLLECTIVE_MEDIAN:.0%}",
                None if med is None else med <= TARGET_COLLECTIVE_MEDIAN,
                f"{cs['n']} collectives, worst {cs['max_abs_err'] or 0:.1%}"
                + ("" if per_call is None else f"; median over every call issued {per_call:.1%}"),
            )
        )
        ls = error_summary(list(r.layers))
        worst = ls["max_abs_err"]
        out.append(
            Check(
                f"{pb.plan}: layer |error| (worst)",
                "" if worst is None else f"{worst:.1%}",
                f"<= {TARGET_LAYER:.0%}",
                None if worst is None else worst <= TARGET_LAYER,
                ", ".join(f"{x.layer_kind} {x.rel_error:+.1%}" for x in r.layers if x.rel_error is not None),
            )
        )
        nore = _layers_without(r, "recurrence")
        if nore and " no kernel profiles" in _profiles_note(r):
            w2 = max(abs(e) for _, e in nore)
            out.append(
                Check(
                    f"{pb.plan}: layer |error| without the recurrence kernel",
                    f"{w2:.1%}",
                    f"<= {TARGET_LAYER:.0%}",
                    w2 <= TARGET_LAYER,
                    "the recurrence runs a plain-torch chunked kernel, the model prices an fla-class one; "
                    + ", ".join(f"{k} {e:+.1%}" for k, e in nore),
                )
            )
        timed = [(i, c) for i, c in enumerate(r.collectives) if c.direct_s]
        direct_all = sum(c.direct_s * c.iters for _, c in timed if c.direct_s)
        inplan = sum(c.measured_s * c.iters for _, c in timed)
        if direct_all > 0 and pb.runtime_s:
            # weighted by how often the plan issues each collective
            rt = sum(pb.runtime_s[i] * c.iters for i, c in timed if i in pb.runtime_s)
            dr = sum(c.direct_s * c.iters for i, c in timed if i in pb.runtime_s and c.direct_s)
            ov = rt / dr - 1
            out.append(
                Check(
                    f"{pb.plan}: runtime overhead on collectives",
                    f"{ov:+.1%}",
                    f"<= {TARGET_OVERHEAD:.0%}",
                    ov <= TARGET_OVERHEAD,
                    "same tensors in a tight loop, runtime's Comm vs bare torch.distributed; "
                    f"in the plan's own run the collectives took {inplan / direct_all - 1:+.1%} vs direct",
                )
            )
        elif direct_all > 0:  # from results files: only the in-plan times are kept
            ov = inplan / direct_all - 1
            out.append(
                Check(
                    f"{pb.plan}: collectives in the plan's run vs direct",
                    f"{ov:+.1%}",
                    f"<= {TARGET_OVERHEAD:.0%}",
                    ov <= TARGET_OVERHEAD,
                    "measured_s vs direct_s, weighted by calls (includes the ranks' skew and launch gaps)",
                )
            )
    base = next((pb for pb in benches if pb.plan == "baseline"), None)
    if base is not None:
        bm = sum(b.measured_s for b in base.results.batches)
        bp = sum(b.predicted_s or 0.0 for b in base.results.batches)
        for pb in benches:
            if pb is base:
                continue
            m = sum(b.measured_s for b in pb.results.batches)
            p = sum(b.predicted_s or 0.0 for b in pb.results.batches)
            pred_saving, meas_saving = bp - p, bm - m
            if pred_saving <= 0:
                out.append(
                    Check(
                        f"{pb.plan}: saving vs baseline",
                        f"predicted {pred_saving * 1e3:+.2f} ms",
                        "n/a (not predicted to save)",
                        None,
                        f"measured saving {meas_saving * 1e3:+.2f} ms over the workload",
                    )
                )
                continue
            noise = saving_noise(base.results, pb.results)
            if noise is not None and pred_saving < 2 * noise:
                out.append(
                    Check(
                        f"{pb.plan}: measured / predicted saving vs baseline",
                        f"predicted {pred_saving * 1e3:+.2f} ms",
                        "n/a (below the run's resolution)",
                        None,
                        f"predicted saving < 2 sigma of the measured difference ({2 * noise * 1e3:.2f} ms, from the "
                        f"spread of identical batches); measured {meas_saving * 1e3:+.2f} ms",
                    )
                )
                continue
            share = meas_saving / pred_saving
            out.append(
                Check(
                    f"{pb.plan}: measured / predicted saving vs baseline",
                    f"{share:.0%}",
                    f">= {TARGET_SAVING:.0%}",
                    share >= TARGET_SAVING,
                    f"measured {meas_saving * 1e3:.2f} ms, predicted {pred_saving * 1e3:.2f} ms "
                    "over the workload's batches",
                )
            )
    ref = next((pb for pb in benches if pb.plan == "baseline"), None)
    for pb in benches:
        if ref is None or pb is ref:
            continue
        rows = layers_calibrated_on(ref.results, pb.results)
        if not rows:
            continue
        err = max(rows, key=lambda row: abs(row[3]))[3]
        out.append(
            Check(
                f"{pb.plan}: layer |error| with op speeds calibrated on baseline",
                f"{abs(err):.1%}",
                f"<= {TARGET_LAYER:.0%}",
                abs(err) <= TARGET_LAYER,
                "each op's measured/predicted ratio on the baseline run scales the same op here; "
                + ", ".join(f"{k} {e:+.1%}" for k, _, _, e in rows),
            )
        )
    return out


def call_weighted_median_error(colls: Sequence[CollectiveResult]) -> float | None:
    """Median |relative error| over every collective call the plan issued (each row counts `iters`
    times). The target is judged per distinct collective (row); this says how much of the plan's
    traffic that median stands for when a few odd-sized, rarely issued rows sit near the middle."""
    weighted = sorted((abs(c.rel_error), c.iters) for c in colls if c.rel_error is not None)
    total = sum(w for _, w in weighted)
    if not total:
        return None
    seen = 0
    for err, w in weighted:
        seen += w
        if seen * 2 >= total:
            return err
    return weighted[-1][0]


def saving_noise(a: BenchResults, b: BenchResults) -> float | None:
    """Standard deviation of (total of a's batches - total of b's), from each run's own spread.

    Batches with the same prediction have the same shape and context (the seed workload has two
    such groups of eight): their measured spread is run noise. Var(total) = sum over groups of
    n x var(group); the two runs are independent. None when no group has two batches.
    """
    var = 0.0
    found = False
    for r in (a, b):
        groups: dict[float, list[float]] = defaultdict(list)
        for x in r.batches:
            if x.predicted_s is not None:
                groups[round(x.predicted_s, 9)].append(x.measured_s)
        for vals in groups.values():
            if len(vals) > 1:
                found = True
                var += len(vals) * statistics.variance(vals)
    return math.sqrt(var) if found else None


def _layer_ops(r: BenchResults, layer: LayerResult) -> list[OpResult]:
    """The ops measured inside one layer entry (same layer kind, same token count)."""
    return [o for o in r.ops if o.layer_kind == layer.layer_kind and o.tokens == layer.tokens]


def op_speed_factors(ref: BenchResults) -> tuple[dict[tuple[str, str], float], dict[str, float]]:
    """measured / predicted per (layer kind, op) on a reference plan, and per op category.

    The factors say how fast the kernels that really ran are compared with the model's kernel
    assumptions (the runtime's plain-torch norms, convs and recurrence are far slower than serving
    kernels). Applied to another plan's predicted ops, they test what the model adds beyond
    kernel speed: how each plan changes every op's shape and share, and its collectives.
    """
    per_op = {(o.layer_kind, o.op): o.measured_s / o.predicted_s for o in ref.ops if o.predicted_s}
    sums: dict[str, list[float]] = {}
    for o in ref.ops:
        if o.predicted_s and o.category:
            acc = sums.setdefault(o.category, [0.0, 0.0])
            acc[0] += o.measured_s
            acc[1] += o.predicted_s
    return per_op, {c: m / p for c, (m, p) in sums.items() if p > 0}


def layers_calibrated_on(ref: BenchResults, run: BenchResults) -> list[tuple[str, float, float, float]]:
    """Per layer kind of `run`: (kind, measured s, predicted s with `ref`'s op speeds, relative error).

    Layer prediction = sum over the layer's ops of predicted x the reference's factor for that op
    (its category's factor for an op the reference lacks) + the layer's predicted collectives
    (layer predicted minus its ops, unscaled: collectives are calibrated by `tpplan calibrate`).
    """
    per_op, per_cat = op_speed_factors(ref)
    out = []
    for layer in run.layers:
        if layer.predicted_s is None:
            continue
        ops = [o for o in _layer_ops(run, layer) if o.predicted_s]
        raw = sum(o.predicted_s or 0.0 for o in ops)
        scaled = sum(
            (o.predicted_s or 0.0) * per_op.get((o.layer_kind, o.op), per_cat.get(o.category or "", 1.0)) for o in ops
        )
        pred = scaled + max(0.0, layer.predicted_s - raw)
        out.append((layer.layer_kind, layer.measured_s, pred, (pred - layer.measured_s) / layer.measured_s))
    return out


def _layers_without(r: BenchResults, category: str) -> list[tuple[str, float]]:
    """Per layer kind: error of (layer - ops of `category`), measured and predicted alike."""
    out = []
    for layer in r.layers:
        ops = _layer_ops(r, layer)
        cat = [o for o in ops if o.category == category]
        if not cat or layer.predicted_s is None:
            continue
        m = layer.measured_s - sum(o.measured_s for o in cat)
        p = layer.predicted_s - sum(o.predicted_s or 0.0 for o in cat)
        if m > 0:
            out.append((layer.layer_kind, (p - m) / m))
    return out


def markdown(benches: Sequence[PlanBench], results_files: dict[str, Path]) -> str:
    """Measured vs predicted per batch, layer, op (by layer kind and by category) and collective, per plan."""
    first = benches[0].results
    m = first.meta
    lines = [
        f"# tpplan bench: {first.model}, TP{first.tp}, {first.workload}",
        "",
        f"- slice: {first.model_slice.description}",
        f"- machine: {m.machine}, {m.gpus} x {m.gpu}; torch {m.torch_version}"
        + (f", NCCL {m.nccl_version}" if m.nccl_version else "")
        + (f", CUDA {m.cuda_version}" if m.cuda_version else ""),
        f"- date: {m.date.isoformat()}; command: `{m.command}`",
        f"- predictions: topology `{first.topology}`{_profiles_note(first)}; kernels: {benches[0].kernels}",
        "- method: CUDA events after warm-up; ops/layers/batches = slowest rank, collectives = fastest rank "
        "(the others wait for it), median over passes; ops and layers are the mean over the workload's "
        "batches (the prediction likewise, at each batch's context); errors = (predicted - measured) / measured",
        "- files: " + ", ".join(f"`{p}`" for p in results_files.values()),
        "",
    ]
    for pb in benches:
        lines += _plan_markdown(pb)
    lines += _summary_markdown(benches)
    return "\n".join(lines) + "\n"


def _profiles_note(r: BenchResults) -> str:
    """Whether the predictions used measured kernel profiles (`OpResult.profiled`)."""
    profiled = [o for o in r.ops if o.profiled]
    if not profiled:
        return " (roofline kernel estimates, no kernel profiles)"
    return f" with measured kernel profiles for {len({o.kernel for o in profiled})} kernel classes"


def _plan_markdown(pb: PlanBench) -> list[str]:
    r = pb.results
    out = [f"## {pb.plan}", ""]
    if pb.fallbacks:
        out += [f"Fallbacks: {len(pb.fallbacks)} chunk(s) ran the baseline plan ({pb.fallbacks[0]}).", ""]
    out += [
        "### Batches",
        "",
        "| batch | tokens | requests | context | measured ms | predicted ms | error |",
        "|---:|---:|---|---|---:|---:|---:|",
    ]
    for b in r.batches:
        out.append(
            f"| {b.index} | {b.tokens} | {','.join(map(str, b.requests))} | {pb.batch_contexts.get(b.index, '')}"
            f" | {_ms(b.measured_s)} | {_ms(b.predicted_s)} | {_err(b.measured_s, b.predicted_s)} |"
        )
    tm = sum(b.measured_s for b in r.batches)
    tp = sum(b.predicted_s or 0 for b in r.batches)
    out += [f"| all | | | | {_ms(tm)} | {_ms(tp)} | {_err(tm, tp)} |", ""]
    out += [
        "### Layers (mean over batches)",
        "",
        "| layer kind | tokens | measured ms | comm ms | compute ms | predicted ms | error |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for x in r.layers:
        out.append(
            f"| {x.layer_kind} | {x.tokens} | {_ms(x.measured_s)} | {_ms(x.comm_measured_s)} | "
            f"{_ms(x.compute_measured_s)} | {_ms(x.predicted_s)} | {_err(x.measured_s, x.predicted_s)} |"
        )
    out += [
        "",
        "### Ops by category (sum over the layer's ops, mean over batches)",
        "",
        "| layer kind | category | ops | measured ms | predicted ms | error |",
        "|---|---|---:|---:|---:|---:|",
    ]
    cats: dict[tuple[str, str], list[OpResult]] = defaultdict(list)
    for o in r.ops:
        cats[(o.layer_kind, o.category or "other")].append(o)
    for (lk, cat), os_ in sorted(cats.items()):
        mm = sum(o.measured_s for o in os_)
        pp = sum(o.predicted_s or 0 for o in os_)
        out.append(f"| {lk} | {cat} | {len(os_)} | {_ms(mm)} | {_ms(pp)} | {_err(mm, pp)} |")
    out += [
        "",
        "### Ops",
        "",
        "| layer kind | op | category | tokens | measured ms | predicted ms | error |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for o in r.ops:
        out.append(
            f"| {o.layer_kind} | {o.op} | {o.category} | {o.tokens} | {_ms(o.measured_s)} | "
            f"{_ms(o.predicted_s)} | {_err(o.measured_s, o.predicted_s)} |"
        )
    out += [
        "",
        "### Collectives",
        "",
        "| layer kind | label | kind | shape | dtype | MB | calls | measured us | predicted us | error | "
        "runtime replay us | direct us | runtime overhead |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, c in enumerate(r.collectives):
        rt = pb.runtime_s.get(i)
        ov = f"{rt / c.direct_s - 1:+.1%}" if rt and c.direct_s else ""
        out.append(
            f"| {c.layer_kind or ''} | {c.label} | {c.kind} | {'x'.join(map(str, c.shape))} | {c.dtype} | "
            f"{c.bytes / 1e6:.2f} | {c.iters} | {_us(c.measured_s)} | {_us(c.predicted_s)} | "
            f"{_err(c.measured_s, c.predicted_s)} | {_us(rt)} | {_us(c.direct_s)} | {ov} |"
        )
    for t in r.ttft:
        out += [
            "",
            f"TTFT extrapolated to {t.topology}, {t.workload}: mean {t.mean_s:.3f} s, p50 {t.p50_s:.3f} s, "
            f"max {t.max_s:.3f} s (unscaled prediction: mean {t.predicted_mean_s or 0:.3f} s). Method: {TTFT_METHOD}.",
        ]
    out.append("")
    return out


def _summary_markdown(benches: Sequence[PlanBench]) -> list[str]:
    out = [
        "## Summary",
        "",
        "| plan | batches measured ms | predicted ms | error | rank measured | rank predicted | "
        "collective median err | layer worst err |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    tot = {pb.plan: (sum(b.measured_s for b in pb.results.batches),
                     sum(b.predicted_s or 0 for b in pb.results.batches)) for pb in benches}  # fmt: skip
    rank_m = {p: i + 1 for i, p in enumerate(sorted(tot, key=lambda p: tot[p][0]))}
    rank_p = {p: i + 1 for i, p in enumerate(sorted(tot, key=lambda p: tot[p][1]))}
    for pb in benches:
        r = pb.results
        tm, tp = tot[pb.plan]
        cs, ls = error_summary(list(r.collectives)), error_summary(list(r.layers))
        cmed, lmax = cs["median_abs_err"], ls["max_abs_err"]
        out.append(
            f"| {pb.plan} | {_ms(tm)} | {_ms(tp)} | {_err(tm, tp)} | {rank_m[pb.plan]} | {rank_p[pb.plan]} | "
            f"{'' if cmed is None else f'{cmed:.1%}'} | {'' if lmax is None else f'{lmax:.1%}'} |"
        )
    out += ["", "## Targets", "", "| target | value | bar | result | detail |", "|---|---:|---|---|---|"]
    for c in checks(benches):
        res = "n/a" if c.ok is None else ("PASS" if c.ok else "FAIL")
        out.append(f"| {c.name} | {c.value} | {c.bar} | {res} | {c.detail} |")
    out.append("")
    return out


def anchor_rows(benches: Sequence[PlanBench], anchor: Path) -> list[str]:
    """Collectives whose size matches a row of the 2xH200 NCCL probe, measured beside the probe's time."""
    data = json.loads(anchor.read_text())
    probe = {
        ("all_reduce", 7168): "ar_hidden",
        ("reduce_scatter", 7168): "rs_hidden",
        ("all_gather", 7168): "ag_hidden",
        ("all_gather", 2112): "ag_latent",
    }
    out = [
        "## Against the NCCL probe (`" + anchor.name + "`)",
        "",
        "| plan | collective | tokens | measured us | direct us | probe us |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for pb in benches:
        for c in pb.results.collectives:
            if len(c.shape) != 2:
                continue
            key = probe.get((c.kind, c.shape[1]))
            row = next((r for r in data.get("rows", []) if r["T"] == c.shape[0]), None)
            if key and row and key in row:
                out.append(
                    f"| {pb.plan} | {c.label} | {c.shape[0]} | {_us(c.measured_s)} | {_us(c.direct_s)} | "
                    f"{row[key] * 1e3:.1f} |"
                )
    return [*out, ""]


def from_files(paths: Sequence[Path]) -> list[PlanBench]:
    """Results files written earlier (`--from`), for the markdown and the checks without a rerun.

    Files that keep the runtime-replay times (`replay_s`) give the same overhead check as the run;
    older ones compare the in-plan times with `direct_s`."""
    from tpplan.bench_results import load_bench_results

    out = []
    for p in paths:
        r = load_bench_results(p, "--from")
        replay = {i: c.replay_s for i, c in enumerate(r.collectives) if c.replay_s}
        out.append(PlanBench(r.plan, r, replay, {}, [], [], "as recorded in the results files"))
    return out


def checks_ok(benches: Sequence[PlanBench]) -> bool:
    """True when no applicable target fails."""
    return all(c.ok is not False for c in checks(benches))


__all__ = [
    "TTFT_METHOD",
    "BenchConfig",
    "Check",
    "PlanBench",
    "act_dtype",
    "anchor_rows",
    "build_results",
    "category_ratios",
    "check_inputs",
    "checks",
    "checks_ok",
    "extrapolate_ttft",
    "from_files",
    "markdown",
    "output_paths",
    "resolved_workload",
    "results_json",
    "run_bench",
    "write_atomic",
]
