"""How much of a model slice and its workload a card holds: experts and requests sized from its memory.

`model_slice.experts_that_fit` sized only the routed experts (35% of the card) and never the tokens,
so gpt-oss-120b and GLM-5.1 stopped with CUDA OOM on an 80 GB card: their dense weights, KV caches of
every request in flight and the attention's working set were never counted. Here a rank's bytes are
every weight of the slice (`runtime.weights.expected_params`, in the run's dtype, the experts spread
over the ranks), the KV cache and recurrent state of every request as the runtime keeps them (each
request's whole prompt, the MLA cache expanded per head as `kernels_attention.mla_attention` holds it,
GQA's at its KV heads, DSA's fp32 index keys), and a reserve for activations and the allocator.
The run keeps as many experts as fit (a power of two, at least top-k and the rank count), then as
many requests; what was cut is said in the results (`SliceFit.note`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tpplan.bench.model_slice import ModelSlice, build_slice
from tpplan.cost.workload import Workload
from tpplan.models.opkinds import mixer_of
from tpplan.models.spec import MoESpec

RESERVE = 0.25  # of the card: activations (attention blocks, expert rows), the CUDA context, fragmentation


@dataclass(frozen=True)
class SliceFit:
    """Routed experts and requests a run keeps, the bytes per rank they take, and what was cut."""

    experts: int | None
    requests: int
    bytes_per_rank: float
    memory: float
    note: str


def weight_bytes(sl: ModelSlice, n: int, dtype_bytes: int) -> tuple[float, float]:
    """(dense bytes per rank, routed-expert bytes per rank per expert kept): every tensor the runtime
    builds for the slice, split evenly over `n` ranks (a TP1 run holds all of it)."""
    from tpplan.runtime.executor import numerics_for
    from tpplan.runtime.weights import expected_params

    total = 0.0
    experts = 0.0
    for name, shape in expected_params(sl.graph, numerics_for(sl.full)).items():
        size = float(dtype_bytes)
        for d in shape:
            size *= d
        if ".experts." in name or ".mlp.experts" in name:
            experts += size
        else:
            total += size
    kept = sl.experts or 1
    return total / n, experts / kept / n


def cache_bytes_per_token(sl: ModelSlice, dtype_bytes: int) -> float:
    """KV-cache bytes one prompt token leaves in every attention layer of the slice, as the runtime keeps
    them: GQA's k and v at the KV heads, MLA's per-head keys and values (the latent expanded), DSA's
    fp32 index keys; recurrent layers keep a fixed state instead (`state_bytes`)."""
    g = sl.graph
    out = 0.0
    for kind in g.layer_kinds:
        lg = g.kinds[kind]
        for op in lg.ops:
            if (mx := mixer_of(op)) is None:
                continue
            widths = [lg.values[v].width for v in op.inputs]
            if mx.latent_kv:
                # q [n(nope+rope)], kv [n(nope+v)], k_rope [rope]: keys n(nope+rope), values n*v
                heads = op.int_attr("heads", 1)
                nope = widths[0] // heads - widths[2]
                out += (widths[0] + widths[1] - heads * nope) * dtype_bytes
            elif mx.head_kv:
                out += (widths[1] + widths[2]) * dtype_bytes
            elif mx.topk_indexer:
                out += 4.0 * lg.values[op.inputs[1]].width
    return out


def state_bytes(sl: ModelSlice) -> float:
    """fp32 recurrent state per request over the slice's KDA/GDN layers ([heads, dk, dv] each)."""
    out = 0.0
    g = sl.graph
    for kind in g.layer_kinds:
        for op in g.kinds[kind].ops:
            if (mx := mixer_of(op)) is not None and mx.state_dims is not None:  # a recurrence: KDA, GDN
                heads = op.int_attr("v_heads", op.int_attr("heads", 1))
                d = op.int_attr("head_dim", 128)
                out += 4.0 * heads * d * d
    return out


def fit_slice(model: str, layers: str | None, wl: Workload, n: int, memory: float, dtype_bytes: int = 2,
              reserve: float = RESERVE) -> SliceFit:  # fmt: skip
    """The most routed experts, then the most requests, whose bytes per rank fit `memory` less the reserve.
    Experts are powers of two from max(top-k, n) up to the model's; requests from the workload's down to 1."""
    probe = build_slice(model, layers, None)
    most = probe.experts
    dense, per_expert = weight_bytes(probe, n, dtype_bytes)
    tokens = sum(wl.prompt_len(r) for r in range(wl.total_requests))
    per_request = tokens / wl.total_requests * cache_bytes_per_token(probe, dtype_bytes) / n + state_bytes(probe)
    budget = (1.0 - reserve) * memory

    def need(experts: int, requests: int) -> float:
        return dense + per_expert * experts + per_request * requests

    requests = wl.total_requests
    if most is None:
        while requests > 1 and need(0, requests) > budget:
            requests //= 2
        return SliceFit(None, requests, need(0, requests), memory, _note(None, None, requests, wl, memory))
    top_k = max(layer.mlp.top_k for layer in probe.graph.spec.layers if isinstance(layer.mlp, MoESpec))
    floor = min(most, max(top_k, n))
    candidates = sorted({e for e in _powers(most) if e >= floor and e % n == 0} | {floor})
    experts = max((e for e in candidates if need(e, requests) <= budget), default=floor)
    while requests > 1 and need(experts, requests) > budget:
        requests //= 2
    return SliceFit(experts, requests, need(experts, requests), memory, _note(experts, most, requests, wl, memory))


def _powers(most: int) -> list[int]:
    out, e = [], 1
    while e <= most:
        out.append(e)
        e *= 2
    return [*out, most]


def _note(experts: int | None, most: int | None, requests: int, wl: Workload, memory: float) -> str:
    """What the card's memory cut, in words ('' when nothing was)."""
    cut = []
    if experts is not None and most is not None and experts < most:
        cut.append(f"{experts} of {most} routed experts")
    if requests < wl.total_requests:
        cut.append(f"{requests} of {wl.total_requests} requests")
    return f"sized to the card's {memory / 2**30:.0f} GiB: " + ", ".join(cut) if cut else ""


__all__ = ["RESERVE", "SliceFit", "cache_bytes_per_token", "fit_slice", "state_bytes", "weight_bytes"]
