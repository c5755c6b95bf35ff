"""The batch schedule's vocabulary: a collective call as one rank makes it, chunks, padding, fallback.

The audit counts volume per token; the runtime moves tensors. The calls a batch makes are listed by
`tpplan.lower.schedule.predict_schedule` from the lowered program (`tpplan.lower`); this module holds
what both it and the runtime use: the call record (`CollectiveCall`, which the runtime's tracer fills
from the real tensors), prefill chunks, token padding and ranges, and the fallback of a chunk too
small to scatter. Pure Python: no torch.

Conventions (those of nccl-tests, so `bytes` is the size a benchmark would use):
- all_reduce: the [T, W] buffer; reduce_scatter: its [T_pad, W] input; all_gather: its output
  ([T_pad, W] for tokens, [T, N*w] for head columns); all_to_all: the rank's [T_pad/N, N*w] input.
- `sent_bytes`: what the rank sends with ring algorithms: 2(N-1)/N, (N-1)/N, (N-1)/N and
  (N-1)/N of `bytes` respectively; for MoE all-to-all (uneven), the rows it sends to other ranks.
- Token-sharded values are padded to T_pad = N*ceil(T/N) rows; head-sharded, replicated and
  partial values hold the true T rows.
- A chunk with fewer tokens than ranks is not scattered: a plan that shards tokens falls back to
  the baseline plan for that chunk (SGLang does the same), keeping its TP/EP experts, when that
  keeps every token mixer's state layout; the schedule says so. MoE all-to-all plans only pad.
- MoE all-to-all (plan.moe == "a2a"): per MoE layer, an all_to_all of the N send counts (int64),
  the dispatch of token rows (activation dtype) with their float32 routing weights for the
  destination's E/N experts appended as extra columns (bit-reinterpreted: `moe_weight_columns`,
  2 per expert in bf16, 1 in fp32), and the combine of expert outputs. Only real (not padding)
  tokens are dispatched; a token goes once to every rank hosting one of its experts. Exact shapes
  need the routing (`routes`); without it the expected rows under uniform routing are used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from tpplan.layout.plan import Plan, baseline, with_ep
from tpplan.layout.propagate import LayerResult, propagate_model
from tpplan.mesh import Mesh
from tpplan.models.graph import LayerGraph, ModelGraph
from tpplan.models.opkinds import op_kind
from tpplan.placement import S_TOK, Collective


@dataclass(frozen=True)
class CollectiveCall:
    """One collective call as one rank makes it (prediction or trace: the same fields)."""

    chunk: int
    layer: int  # layer index; the number of layers for the reduction before the final norm
    kind: str  # Collective value: all_reduce, reduce_scatter, all_gather, all_to_all
    value: str  # graph value moved (MoE: `<input>:counts|dispatch|combine`)
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    sent_bytes: float
    planned: bool = True  # False: issued only because --force ran an illegal edge

    def key(self) -> tuple[object, ...]:
        """What must match between trace and prediction."""
        return (self.chunk, self.layer, self.kind, self.value, self.shape, self.dtype, self.bytes, self.sent_bytes)


@dataclass
class ChunkSchedule:
    """The collectives of one prefill chunk on one rank, and whether it fell back to the baseline."""

    index: int
    tokens: int
    plan: str  # the plan actually run for this chunk
    fallback: bool
    calls: list[CollectiveCall] = field(default_factory=list)


def ring_sent_bytes(kind: str, nbytes: int, n: int) -> float:
    """Bytes one rank sends for a uniform collective of size `nbytes` (nccl-tests size)."""
    if n <= 1:
        return 0.0
    if kind == Collective.ALL_REDUCE:
        return 2.0 * (n - 1) / n * nbytes
    return (n - 1) / n * nbytes


def chunk_sizes(tokens: int, chunk: int | None) -> list[int]:
    """Token counts of the prefill chunks of a `tokens`-long sequence."""
    step = chunk or tokens
    return [min(step, tokens - s) for s in range(0, tokens, step)]


def padded_rows(tokens: int, n: int) -> tuple[int, int]:
    """(T_pad, rows per rank) for token sharding over `n` ranks."""
    per = -(-tokens // n)
    return per * n, per


def token_range(tokens: int, n: int, rank: int) -> tuple[int, int]:
    """The real tokens [lo, hi) rank `rank` holds when a value is token-sharded."""
    _, per = padded_rows(tokens, n)
    return min(rank * per, tokens), min((rank + 1) * per, tokens)


def scatters_tokens(plan: Plan) -> bool:
    """True when the plan ever holds a value token-sharded."""
    return plan.stream is S_TOK or plan.reduce is S_TOK or bool(plan.token_shard) or plan.moe == "a2a"


def value_dtype(lg: LayerGraph, value: str, act: str) -> str:
    """The dtype of `value` given the activation dtype `act`, as its producer's kind states it (router score
    matrices are float32: the kernels route in fp32); the activation dtype for the layer's inputs."""
    for op in lg.ops:
        if op.output == value:
            return op_kind(op.kind).output_dtype(op, act)
    return act


_RESULTS: dict[tuple[int, Plan, int], tuple[ModelGraph, list[LayerResult]]] = {}


def layer_results(graph: ModelGraph, plan: Plan, n: int) -> list[LayerResult]:
    """Per-layer propagation results, chained like the audit (each layer sees the previous exit).

    Memoised per (graph, plan, N): the runtime asks for them on every chunk.
    """
    key = (id(graph), plan, n)
    hit = _RESULTS.get(key)
    if hit is None or hit[0] is not graph:
        if len(_RESULTS) > 256:
            _RESULTS.clear()
        hit = (graph, propagate_model(graph, plan, n, 4).results)  # as audited in fp32
        _RESULTS[key] = hit
    return hit[1]


def fallback_plan(plan: Plan, mesh: Mesh) -> Plan | None:
    """The plan a chunk too small to scatter runs instead on `mesh`'s TP group: the baseline with `plan`'s
    experts where they stay (TP, or EP at the plan's size), so no weight moves. None for MoE all-to-all:
    there a rank without real tokens simply dispatches nothing (as DeepEP does), so padding is enough."""
    if plan.moe == "a2a" or plan.dp_attention:  # a DP rank without tokens runs an idle (padded) batch
        return None
    base = baseline()
    return with_ep(base, replace(mesh, ep=plan.ep_size or 1)) if plan.moe == "ep" else base


def falls_back(graph: ModelGraph, plan: Plan, n: int, tokens: int) -> bool:
    """True when a chunk of `tokens` runs `fallback_plan(plan)` instead of `plan` (too few to scatter):
    the plan shards tokens, the chunk has fewer tokens than ranks, and every token mixer keeps its
    state layout (so KV caches and recurrent states carry over)."""
    if n <= 1 or tokens >= n or not scatters_tokens(plan):
        return False
    fb = fallback_plan(plan, Mesh(n))
    return fb is not None and state_layouts(graph, plan, n) == state_layouts(graph, fb, n)


def state_layouts(graph: ModelGraph, plan: Plan, n: int) -> list[tuple[str, str]]:
    """Output placement of every token mixer (its carried state's layout), layer by layer."""
    out = []
    for res in layer_results(graph, plan, n):
        out += [(d.op.name, str(d.strategy.output)) for d in res.decisions if op_kind(d.op.kind).mixes_tokens]
    return out


def bytes_by_kind(calls: Sequence[CollectiveCall]) -> dict[str, tuple[int, float]]:
    """kind -> (number of calls, bytes sent by this rank)."""
    out: dict[str, tuple[int, float]] = {}
    for c in calls:
        k, b = out.get(c.kind, (0, 0.0))
        out[c.kind] = (k + 1, b + c.sent_bytes)
    return out


__all__ = [
    "ChunkSchedule",
    "CollectiveCall",
    "bytes_by_kind",
    "chunk_sizes",
    "fallback_plan",
    "falls_back",
    "padded_rows",
    "ring_sent_bytes",
    "scatters_tokens",
    "token_range",
]
