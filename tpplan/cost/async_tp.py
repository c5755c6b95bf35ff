"""Async TP priced as torch's fused ops run it (`tpplan.engines.async_tp`): each fused pair's GEMM in
TP chunks of T/N rows, each chunk's peer-to-peer copy hidden behind another chunk's GEMM.

The price is a simulation of the ops' code, not max(compute, communication). Two streams, as torch
issues them: step k of the loop runs on the current stream when k is even and on a second stream when
odd, and a stream runs its items in order. Beside that the GEMMs share the SMs (one at a time) and the
copies share the NVLink (one at a time). So chunk k+1's copy runs under chunk k's GEMM, the fill (the
all-gather's shard copy into its symmetric buffer; the reduce-scatter's first GEMM) and the drain (the
all-gather's last GEMM; the reduce-scatter's sum of the N partials) are exposed, and the chunk GEMMs
(T/N rows) are priced by the compute pricer at that shape, so they run at the efficiency of a smaller
GEMM (never faster than 1/N of the whole: the search's bound relies on it). Copies are priced at the
NVLink's latency and bandwidth (`peer_copy_seconds`), local copies and the partial sum at the HBM
roofline, barriers at the link latency.

What the overlap costs the GEMMs beside a copy is one named parameter (`AsyncTpCosts.gemm_beside_copy`):
1.08, measured on one H200 beside a copy-engine copy paced to 200-400 GB/s (docs/benchmarks.md, "GEMMs
beside a copy-engine copy"; torch's copies are `copy_` calls between device tensors, which CUDA runs on
a copy engine for contiguous same-dtype tensors). The copies' own slowdown beside the GEMMs was not
measured (the pacing kernel itself waits for SMs there): they are priced at the link's rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tpplan.cost.kernel_pricer import KERNEL_FLOOR_S, KernelPricer
from tpplan.cost.prediction import KindTime
from tpplan.cost.segments import Segments
from tpplan.errors import TpplanError
from tpplan.layout.propagate import LayerResult
from tpplan.lower.program import FusedPair

KindTimeOf = Callable[[LayerResult, Segments], KindTime]  # `Predictor.kind_time`

# The one place the compute slowdown beside a concurrent copy lives: the median of 28 multi-wave GEMMs
# (0.13-1 ms, bf16 and fp8) beside a paced copy-engine copy on one H200, 0.98-1.32 (h200-2026-12-02d).
GEMM_BESIDE_COPY = 1.08


@dataclass(frozen=True)
class AsyncTpCosts:
    """What the overlap costs: every chunk GEMM of a fused op runs `gemm_beside_copy` times slower
    (a chunk with no copy beside it too: the first of a reduce-scatter, the last of an all-gather).
    At least 1: the search's bound (`tpplan.search.async_tp`) needs a fused pair to take at least its
    GEMMs' unfused time."""

    gemm_beside_copy: float = GEMM_BESIDE_COPY

    def __post_init__(self) -> None:
        if self.gemm_beside_copy < 1.0:
            raise ValueError(f"gemm_beside_copy {self.gemm_beside_copy} < 1: a GEMM beside a copy is not faster")


def all_gather_matmul_seconds(n: int, gemm: float, copy: float, local_copy: float, barrier: float) -> float:
    """`fused_all_gather_matmul` on `n` ranks (torch `_pipelined_multi_all_gather_and_consume`, return_A on):
    `gemm` one chunk's GEMMs (all the Bs on T/N rows), `copy` one peer's T/N rows over NVLink, `local_copy`
    the rank's own rows copied once in HBM, `barrier` one symmetric-memory barrier."""
    t = barrier + local_copy + barrier  # barrier, own rows into the symmetric buffer, barrier
    stream = [t, t]  # the current stream and the backend stream
    copy_free = t
    compute = stream[0] = t + gemm  # the own chunk, on the current stream
    for step in range(1, n):
        s = 0 if step % 2 == 0 else 1
        copy_free = max(stream[s], copy_free) + copy  # peer (rank + step)'s rows
        compute = stream[s] = max(copy_free, compute) + gemm
    last = 0 if n % 2 == 0 else 1
    stream[last] += local_copy  # own rows into the gathered output, beside the last GEMM
    return max(stream) + barrier


def matmul_reduce_scatter_seconds(n: int, gemm: float, copy: float, reduce: float, barrier: float) -> float:
    """`fused_matmul_reduce_scatter` on `n` ranks (torch `_pipelined_produce_and_all2all`, then the sum):
    `gemm` one chunk's partial GEMM (T/N rows), `copy` one partial chunk pulled from a peer, `reduce` the
    sum of the N stacked partials, `barrier` one symmetric-memory barrier."""
    stream = [barrier, barrier]
    compute = copy_free = barrier
    for step in range(1, n):
        s = 0 if step % 2 == 0 else 1
        compute = max(stream[s], compute) + gemm  # the partial for peer (rank + step), into buffer s
        copy_free = max(compute + barrier, copy_free) + copy  # the partial for this rank, from peer (rank - step)
        stream[s] = copy_free + barrier  # the buffer is free once every peer has read it
    stream[0] = max(stream[0], compute) + gemm  # the own rows' partial, straight into the output
    return max(stream) + barrier + reduce


def peer_copy_seconds(p: KernelPricer, nbytes: float) -> float:
    """One `copy_` out of a peer's symmetric buffer: the NVLink's latency and per-GPU bandwidth. No NCCL
    call overhead (`launch_us`): the copy is queued on a stream like a kernel, ahead of the GPU."""
    intra = p.topo.intra
    return intra.latency_us * 1e-6 + nbytes / (intra.bandwidth_GBps * 1e9) if nbytes > 0 else 0.0


def _hbm(p: KernelPricer, nbytes: float) -> float:
    return max(nbytes / p.hbm, KERNEL_FLOOR_S) if nbytes > 0 else 0.0


def check_one_domain(p: KernelPricer, plan: str) -> None:
    """The fused ops read peers' symmetric buffers: the TP group (of plan `plan`) must share one NVLink domain."""
    topo, tp = p.topo, p.mesh.tp
    rpn = p.mesh.ranks_per_node(topo.gpus_per_node)
    if tp > topo.gpus_per_node or rpn < tp or topo.intra.kind != "nvlink":
        where = (f"its TP{tp} group spans {math.ceil(tp / rpn)} nodes" if rpn < tp
                 else f"{topo.name}'s GPUs are linked by {topo.intra.kind}")  # fmt: skip
        raise TpplanError(
            f"plan={plan} (TP{tp} on {topo.name})",
            f"async TP reads every TP peer's symmetric buffer over NVLink, and {where}",
            f"keep the TP group inside one NVLink node (TP <= {topo.gpus_per_node}) or drop +asynctp",
        )


def pair_seconds(
    p: KernelPricer, pair: FusedPair, res: LayerResult, kt: KindTime, gemm_kt: KindTime, costs: AsyncTpCosts
) -> tuple[float, float]:
    """(fused, unfused) seconds of one pair the lowering's async TP pass names (`lower.program.FusedPair`)
    in layer `res` (priced `kt`): the chunk pipeline, and the GEMMs plus the NCCL collective that the
    layer's price holds for them (`gemm_kt`: the layer holding the GEMMs). The priced GEMMs and collective
    are found by name, so steps another lowering pass adds do not shift them."""
    n = p.mesh.tp
    gemms = [next(o for o in gemm_kt.ops if o.op == name) for name in pair.gemms]
    comm = next(c for c in res.comms if c.value == pair.collective)
    ops = {x.name: x for x in p.graph.kinds[gemm_kt.kind].ops}
    chunk_gemm = 0.0
    rows = 0
    for o in gemms:
        assert o.shape is not None  # a GEMM's (M, K, N) per rank
        m, k, nn = o.shape
        rows = math.ceil(m / n)  # SGLang pads T to a multiple of N: every chunk has ceil(T/N) rows
        scale = o.seconds / o.modelled_s if o.modelled_s else 1.0  # a measured profile's correction, kept
        chunk_gemm += p.gemm_at(gemm_kt.kind, ops[o.op], rows, k, nn) * scale
    # a chunk never runs faster than its share of the whole GEMM (GEMMs do not speed up with fewer rows)
    chunk_gemm = max(chunk_gemm, sum(o.seconds for o in gemms) / n) * costs.gemm_beside_copy
    chunk_bytes = rows * comm.width * p.b
    copy = peer_copy_seconds(p, chunk_bytes)
    barrier = p.topo.intra.latency_us * 1e-6
    if pair.pattern == "ag_gemm":
        fused = all_gather_matmul_seconds(n, chunk_gemm, copy, _hbm(p, 2 * chunk_bytes), barrier)
    else:
        fused = matmul_reduce_scatter_seconds(n, chunk_gemm, copy, _hbm(p, (n + 1) * chunk_bytes), barrier)
    coll = next(c for c in kt.collectives if c.label == comm.label)
    return fused, sum(o.seconds for o in gemms) + coll.seconds


def fused_layers_seconds(
    p: KernelPricer, plan: str, kind_time: KindTimeOf, results: Sequence[LayerResult], layers: Sequence[int],
    pairs: Sequence[FusedPair], segs: Segments, costs: AsyncTpCosts | None = None,
) -> float:  # fmt: skip
    """Seconds for the consecutive layers `layers` (indices into `results`) of one batch, with every fused
    pair the lowered program names (`Program.fused`, from `lower.passes.async_tp`, which leaves unfused a
    reduce-scatter whose GEMM ran in the stage before and the collectives a CP exchange replaces) run as
    its chunk pipeline, the layer's other ops and collectives as before."""
    check_one_domain(p, plan)
    costs = costs or AsyncTpCosts()
    by_layer: dict[int, list[FusedPair]] = {}
    for pair in pairs:
        by_layer.setdefault(pair.layer, []).append(pair)
    total = 0.0
    for i in layers:
        kt = kind_time(results[i], segs)
        total += kt.total_s
        for pair in by_layer.get(i, []):
            gemm_kt = kind_time(results[i - 1], segs) if pair.from_previous else kt
            fused, unfused = pair_seconds(p, pair, results[i], kt, gemm_kt, costs)
            total += fused - unfused
    return total


__all__ = [
    "GEMM_BESIDE_COPY",
    "AsyncTpCosts",
    "all_gather_matmul_seconds",
    "check_one_domain",
    "fused_layers_seconds",
    "matmul_reduce_scatter_seconds",
    "pair_seconds",
    "peer_copy_seconds",
]
