"""Verify a plan by execution: the sharded forward equals the single-process one, and the traced
collectives equal the predicted ones.

`verify_cases(cases, backend=..., nproc=N)` runs many `VerifyCase`s inside one process group
(spawned locally, or in place under torchrun): forming a group is the expensive part, so tests
and the CLI batch their cases. For each case rank 0 runs the single-process reference
(`executor.forward_chunk`, full weights, the same dtype) and records every layer's `resid_out` and
`mlp_out`, the final hidden and the MoE routing; every rank runs the plan
(`distributed.PlanRunner`) from its own shard; the local values are brought to full size with
untraced collectives and compared on rank 0; every rank's trace is compared with
`lower.schedule.predict_schedule` for that rank (MoE all-to-all shapes use the reference's
routing).

Tolerance: relative error = max |sharded - reference| / max |reference| per tensor. fp32 runs
must stay within 1e-4 (observed: <= 4e-6; the sharded run only reorders sums). bf16 runs are
compared with a bf16 reference and must stay within 1e-1: each rank rounds its partial sums to 8
mantissa bits before the reduction, in another order than one process does, which costs a few
percent of a tensor's largest value after several layers (observed 2-5e-2 on tiny K3); a
placement error costs O(1) (the seed's variant: ~1).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpplan.dtypes import dtype_name
from tpplan.layout.plan import Plan
from tpplan.layout.schedule import CollectiveCall, bytes_by_kind
from tpplan.lower.schedule import predict_schedule

if TYPE_CHECKING:
    from tpplan.models.graph import ModelGraph

TOLERANCE = {"float32": 1e-4, "bfloat16": 1e-1, "float16": 2e-2}


@dataclass(frozen=True)
class VerifyCase:
    """One run to verify: model (preset or config path), plan (by name, or a `Plan`), batch and numerics."""

    model: str
    plan: str
    tokens: int = 16
    chunk: int | None = None
    seed: int = 0
    dtype: str = "fp32"
    force: bool = False
    weights: str | None = None  # safetensors folder; None: random init from `seed`
    plan_obj: Plan | None = None  # a custom plan (e.g. EP) instead of the named one
    tolerance: float | None = None  # None: TOLERANCE[dtype]; real widths on GPU need more (docs/runtime.md)

    @property
    def label(self) -> str:
        ch = f" chunk={self.chunk}" if self.chunk else ""
        return f"{self.model} {self.plan} T={self.tokens}{ch} {self.dtype}" + (" (forced)" if self.force else "")


@dataclass
class TensorError:
    chunk: int
    layer: int  # number of layers for the final hidden / logits
    value: str
    max_abs: float
    rel: float


@dataclass
class CaseResult:
    case: VerifyCase
    n: int
    legal: bool
    reason: str
    errors: list[TensorError] = field(default_factory=list)
    traced: list[list[CollectiveCall]] = field(default_factory=list)  # per rank
    predicted: list[list[CollectiveCall]] = field(default_factory=list)  # per rank
    fallback_traced: list[int] = field(default_factory=list)
    fallback_predicted: list[int] = field(default_factory=list)
    copies: list[tuple[int, int, str]] = field(default_factory=list)  # rank 0's layout copies (Tracer.copies)
    seconds: float = 0.0

    @property
    def tolerance(self) -> float:
        if self.case.tolerance is not None:
            return self.case.tolerance
        return TOLERANCE[dtype_name(self.case.dtype)]

    @property
    def max_rel(self) -> float:
        return max((e.rel for e in self.errors), default=0.0)

    @property
    def numbers_match(self) -> bool:
        return bool(self.errors) and all(e.rel <= self.tolerance for e in self.errors)

    @property
    def trace_matches(self) -> bool:
        same = all(
            [c.key() for c in t] == [c.key() for c in p] for t, p in zip(self.traced, self.predicted, strict=True)
        )
        return same and self.fallback_traced == self.fallback_predicted

    @property
    def passed(self) -> bool:
        return self.legal and self.numbers_match and self.trace_matches

    def bytes_table(self, rank: int = 0) -> list[tuple[str, int, float, int, float]]:
        """(kind, traced calls, traced bytes sent, predicted calls, predicted bytes sent) for `rank`."""
        t = bytes_by_kind(self.traced[rank]) if self.traced else {}
        p = bytes_by_kind(self.predicted[rank]) if self.predicted else {}
        kinds = sorted(set(t) | set(p))
        return [(k, *t.get(k, (0, 0.0)), *p.get(k, (0, 0.0))) for k in kinds]


# ----------------------------------------------------------------------------------------------
# Worker (runs on every rank)


@cache
def _graph(model: str) -> Any:
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph

    return build_model_graph(load_model(model))


@cache
def _plan(model: str, name: str, n: int) -> Plan:
    from tpplan.plans.named import make_plan

    return make_plan(name, _graph(model), n)


@cache
def _random(model: str, seed: int) -> Any:
    from tpplan.runtime.executor import numerics_for
    from tpplan.runtime.weights import random_weights

    g = _graph(model)
    return random_weights(g, numerics_for(g), seed=seed)


def _reference(
    graph: Any, weights: Any, ids: Any, chunk: int | None, nu: Any, device: Any, dtype: Any, dp_ranks: int = 0
) -> dict[str, Any]:
    """Single-process run in the sharded run's dtype: taps[(chunk, layer, value)], hidden per chunk,
    routes[(chunk, layer)]. `dp_ranks` (DP attention): the batch is that many requests, each run
    on its own (see `tpplan.layout.dp_attention`)."""
    from tpplan.runtime.executor import layer_weights

    w = {k: v.to(device=device, dtype=dtype) for k, v in weights.items()}
    resolved = {
        (i, op.name): layer_weights(op, i, w, nu)
        for i, kind in enumerate(graph.layer_kinds)
        for op in graph.kinds[kind].ops
    }
    step = chunk or ids.numel()
    pieces = [ids[s : s + step] for s in range(0, ids.numel(), step)]
    if dp_ranks:  # DP attention: rank r's request is its token range of every chunk, run on its own
        from tpplan.layout.schedule import token_range

        per_request = []
        for r in range(dp_ranks):
            mine = [p[slice(*token_range(p.numel(), dp_ranks, r))] for p in pieces]
            per_request.append(_reference_pieces(graph, w, resolved, mine, nu))
        return _concat_requests(per_request, len(pieces), w)
    return _reference_pieces(graph, w, resolved, pieces, nu)


def _concat_requests(parts: list[dict[str, Any]], chunks: int, w: dict[str, Any]) -> dict[str, Any]:
    """One reference from every DP rank's own: each chunk's rows in rank order (the global order)."""
    import torch

    from tpplan.runtime.executor import lm_head

    taps = {k: torch.cat([p["taps"][k] for p in parts if k in p["taps"]]) for k in parts[0]["taps"]}
    routes = {k: [row for p in parts for row in p["routes"].get(k, [])] for k in parts[0]["routes"]}
    hidden = [torch.cat([p["hidden"][c] for p in parts]) for c in range(chunks)]
    head = lm_head(w).float().cpu()
    return {"taps": taps, "hidden": hidden, "routes": routes, "head": head}


def _reference_pieces(graph: Any, w: Any, resolved: Any, pieces: list[Any], nu: Any) -> dict[str, Any]:
    """One sequence fed chunk by chunk (`pieces`), state carried; an empty piece yields empty rows."""
    import torch

    from tpplan.models.opkinds import op_kind
    from tpplan.runtime.executor import RunState, forward_chunk, lm_head

    st = RunState()
    taps: dict[tuple[int, int, str], Any] = {}
    routes: dict[tuple[int, int], list[list[int]]] = {}
    hidden = []
    for c, piece in enumerate(pieces):
        if not piece.numel():
            hidden.append(torch.zeros(0, graph.hidden))
            continue

        def observe(i: int, env: dict[str, Any], c: int = c) -> None:
            taps[(c, i, "resid_out")] = env["resid_out"].float().cpu()
            taps[(c, i, "mlp_out")] = env["mlp_out"].float().cpu()
            lg = graph.kinds[graph.layer_kinds[i]]
            for op in lg.ops:
                if op_kind(op.kind).routed_experts:
                    r = env[op.inputs[1]]
                    routes[(c, i)] = [torch.nonzero(row).flatten().tolist() for row in r.cpu()]

        hidden.append(forward_chunk(graph, w, resolved, piece, st, nu, True, observe).float().cpu())
    head = lm_head(w).float().cpu()
    return {"taps": taps, "hidden": hidden, "routes": routes, "head": head}


_REF_CACHE: dict[str, Any] = {}


def _rel(a: Any, b: Any) -> tuple[float, float]:
    diff = float((a.float() - b.float()).abs().max()) if a.numel() else 0.0
    scale = float(b.float().abs().max()) if b.numel() else 0.0
    return diff, diff / max(scale, 1e-30)


def _assemble(pieces: list[tuple[str, Any]], heads: int, tokens: int) -> Any:
    """The full [T, W] value from every rank's local piece (rank order) and its placement."""
    import torch

    from tpplan.runtime.shard import head_range

    pl, first = pieces[0]
    n = len(pieces)
    ts = [t.float() for _, t in pieces]
    if pl == "R":
        return first.float()[:tokens]
    if pl == "S(tok)":
        return torch.cat(ts, dim=0)[:tokens]
    if pl == "P":
        return torch.stack(ts).sum(0)
    owners = sorted({head_range(heads, n, r)[0]: r for r in range(n)}.items())
    return torch.cat([ts[r] for _, r in owners], dim=1)


def run_case(
    case: VerifyCase, rank: int, n: int, device: Any, note: Callable[[str], None] | None = None
) -> CaseResult | None:
    """Run one case on this rank (every rank calls it); rank 0 returns the result.

    `note` (rank 0's progress line, see `_worker`) hears of each step as it starts.
    """
    say = note or (lambda _msg: None)
    import torch

    from tpplan.audit import audit_plan
    from tpplan.runtime.executor import numerics_for

    t0 = time.perf_counter()
    graph = _graph(case.model)
    nu = numerics_for(graph)
    plan = case.plan_obj or _plan(case.model, case.plan, n)
    pa = audit_plan(graph, plan, n, "fp32")
    reason = "; ".join(v.sentence() for v in pa.violations)
    if not pa.legal and not case.force:
        return CaseResult(case, n, False, reason) if rank == 0 else None
    act = dtype_name(case.dtype)
    dtype = getattr(torch, act)
    source, full = _weights(case, graph, nu, rank)
    gen = torch.Generator().manual_seed(case.seed + 1)
    ids = torch.randint(0, graph.spec.vocab, (case.tokens,), generator=gen)
    ref = None
    if rank == 0:  # the same reference serves every plan of a batch of cases
        dp_ranks = n if plan.dp_attention and n > 1 else 0
        key = (case.model, case.tokens, case.chunk, case.seed, case.weights, str(device), act, dp_ranks)
        if _REF_CACHE.get("key") != key:
            say("reference forward (one process, full weights)")
            _REF_CACHE.clear()
            _REF_CACHE["key"] = key
            _REF_CACHE["ref"] = _reference(graph, full, ids.to(device), case.chunk, nu, device, dtype, dp_ranks)
        ref = _REF_CACHE["ref"]
    say(f"plan forward on {n} rank(s)")
    parts, copies = _plan_pieces(case, graph, plan, n, rank, source, nu, device, dtype, ids)
    if rank != 0:
        return None
    assert ref is not None
    say("comparing values and traced collectives")
    res = CaseResult(case, n, pa.legal, reason)
    res.errors = _errors(graph, ref, parts, case)
    res.traced = [p[1] for p in parts]
    res.fallback_traced = parts[0][2]
    res.copies = copies
    for r in range(n):
        sched = predict_schedule(graph, plan, n, case.tokens, chunk=case.chunk, dtype=act, rank=r,
                                 routes=ref["routes"])  # fmt: skip
        res.predicted.append([c for s in sched for c in s.calls])
        if r == 0:
            res.fallback_predicted = [s.index for s in sched if s.fallback]
    res.seconds = time.perf_counter() - t0
    return res


def _weights(case: VerifyCase, graph: ModelGraph, nu: Any, rank: int) -> tuple[Any, Any]:
    """Where this rank reads its weight shard from, and the full weights (rank 0's reference; None on the
    other ranks when they come from safetensors)."""
    from tpplan.runtime.shard import DictSource, SafetensorsSource
    from tpplan.runtime.weights import load_safetensors

    if case.weights:
        full = load_safetensors(case.weights, graph, nu) if rank == 0 else None
        return SafetensorsSource(Path(case.weights), graph, nu), full
    full = _random(case.model, case.seed)
    return DictSource(full), full


def _chunk_sizes(case: VerifyCase) -> list[int]:
    """The tokens of each prefill chunk."""
    step = case.chunk or case.tokens
    return [min(step, case.tokens - s) for s in range(0, case.tokens, step)]


def _plan_pieces(
    case: VerifyCase, graph: ModelGraph, plan: Plan, n: int, rank: int, source: Any, nu: Any, device: Any,
    dtype: Any, ids: Any,
) -> tuple[list[Any], list[Any]]:  # fmt: skip
    """The plan's prefill on this rank; every rank's observed pieces (each layer's stream and MLP output,
    the final hidden), traced calls and fallback chunks, gathered on rank 0 in one untraced object gather
    (verification is not part of the plan); and this rank's layout copies."""
    import torch.distributed as dist

    from tpplan.placement import P
    from tpplan.runtime.distributed import PlanRunner, make_comm

    comm = make_comm(rank, n)
    runner = PlanRunner(graph, plan, n, rank, source, comm=comm, numerics=nu, device=device, dtype=dtype,
                        force=case.force)  # fmt: skip
    local: dict[tuple[int, int, str], tuple[str, Any]] = {}  # this rank's pieces, gathered once at the end

    def observe(i: int, env: dict[str, Any]) -> None:
        for name in ("resid_out", "mlp_out"):
            local[(runner.chunk_index, i, name)] = (str(env[name].pl), env[name].t.detach().to("cpu", copy=True))

    layers = len(graph.layer_kinds)
    for c, held in enumerate(runner.prefill(ids, case.chunk, observe)):
        assert held.pl is not P
        local[(c, layers, "hidden")] = (str(held.pl), held.t.detach().to("cpu", copy=True))
    mine = (local, runner.tracer.calls, [e.chunk for e in runner.tracer.events])
    parts: list[Any] = [None] * n if rank == 0 else []
    if n == 1:
        parts = [mine]
    else:
        dist.gather_object(mine, parts if rank == 0 else None, dst=0)
    return parts, list(runner.tracer.copies)


def _errors(graph: ModelGraph, ref: dict[str, Any], parts: list[Any], case: VerifyCase) -> list[TensorError]:
    """Every observed value assembled from the ranks' pieces against the reference's, then per chunk the
    final hidden and the logits."""
    sizes = _chunk_sizes(case)
    layers = len(graph.layer_kinds)
    out: list[TensorError] = []
    for key in sorted(ref["taps"]):
        heads = graph.kinds[graph.layer_kinds[key[1]]].values[key[2]].heads
        a = _assemble([p[0][key] for p in parts], heads, sizes[key[0]])
        out.append(TensorError(key[0], key[1], key[2], *_rel(a, ref["taps"][key])))
    for c, r in enumerate(ref["hidden"]):
        h = _assemble([p[0][(c, layers, "hidden")] for p in parts], 0, sizes[c])
        out.append(TensorError(c, layers, "hidden", *_rel(h, r)))
        out.append(TensorError(c, layers, "logits", *_rel(h @ ref["head"].t(), r @ ref["head"].t())))
    return out


def _progress(rank: int, cases: list[VerifyCase], enabled: bool) -> Callable[[int, str], None]:
    """Rank 0's progress lines on stderr (stdout stays the report's; spawned ranks share stderr)."""

    def note(i: int, msg: str) -> None:
        if enabled and rank == 0:
            from tpplan.text import plain

            line = plain(f"verify [{i + 1}/{len(cases)}] {cases[i].plan}: {msg}")  # names as text (issue 35)
            print(line, file=sys.stderr, flush=True)

    return note


def _worker(rank: int, world: int, device: Any, payload: tuple[list[VerifyCase], bool]) -> list[CaseResult | None]:
    import torch

    cases, progress = payload
    note = _progress(rank, cases, progress)
    if device.type == "cpu":
        torch.set_num_threads(1)  # N ranks share the cores; intra-op threads only contend
    else:
        # fp32 means fp32: TF32 (cuDNN convolutions default to it) would add ~1e-3 relative noise
        # to both runs and hide a real difference below it.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    out: list[CaseResult | None] = []
    for i, case in enumerate(cases):
        t0 = time.perf_counter()
        note(i, f"{case.label} on {world} rank(s)")
        out.append(run_case(case, rank, world, device, partial(note, i)))
        res = out[-1]
        if res is not None:
            note(i, f"{'PASS' if res.passed else 'FAIL'} in {time.perf_counter() - t0:.1f} s")
    return out


def _in_process(cases: list[VerifyCase], timeout_s: float, progress: bool) -> list[CaseResult | None]:
    """Run a one-rank gloo group inside this process (a private store; the default group is restored)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("a default process group already exists in this process")
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=timeout_s))
    threads = torch.get_num_threads()
    try:
        return _worker(0, 1, torch.device("cpu"), (cases, progress))
    finally:
        torch.set_num_threads(threads)
        dist.destroy_process_group()


def verify_cases(
    cases: list[VerifyCase],
    *,
    backend: str = "gloo",
    nproc: int = 2,
    timeout_s: float = 120.0,
    progress: bool = False,
) -> list[CaseResult]:
    """Run every case in one process group of `nproc` ranks (or under torchrun); rank 0's results.

    `progress`: rank 0 prints a line to stderr as each case and each of its steps starts.

    Raises `tpplan.runtime.group.RankFailed` naming the rank that failed first when a rank dies or
    a collective times out.
    """
    from tpplan.runtime.group import GroupSpec, resolve_backend, run_group, under_torchrun

    spec = GroupSpec(resolve_backend(backend), nproc, timeout_s)
    if nproc == 1 and spec.backend == "gloo" and not under_torchrun():
        out = _in_process(cases, timeout_s, progress)  # one CPU rank: no process to spawn
    else:
        out = run_group(_worker, spec, (cases, progress))
    return [r for r in out if r is not None] if out is not None else []


__all__ = ["TOLERANCE", "CaseResult", "TensorError", "VerifyCase", "run_case", "verify_cases"]
