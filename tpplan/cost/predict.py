"""Predict a plan's time, memory and TTFT on a topology: the audit's decisions priced op by op.

The audit (`tpplan.audit`) says, per layer kind, how each op runs under a plan (its strategy, the
share of the op's work one rank does, its weight per rank) and which collectives the plan issues.
This module turns that into seconds and bytes on a `Topology`:

- compute per op: GEMMs through `gemm_time` at the per-rank shape (the shape decides efficiency:
  a 192-wide expert shard runs at ~2% of peak), grouped expert GEMMs at the rows an expert really
  sees, attention and recurrences by a roofline with named efficiencies, everything else by HBM
  bandwidth. Work every rank repeats (a replicated GEMM on all tokens) is counted: `redundant`.
- collectives: every `CommEvent` of the layer, sized for the batch, through `collective_time` on
  the TP group as it sits on the nodes (hierarchical algorithms when it spans nodes).
- pipeline parallelism: contiguous stages, stage-boundary send/recv of what really crosses (the
  hidden stream and, for K3, the attention-residual bank), and the chunked-prefill bubble.
- memory per rank: weights under the plan, activations of one chunk, KV cache, recurrent state.

Formulas and assumptions: docs/cost-model.md ("Prediction"). Torch-free; cheap after the first call
(times are cached per distinct layer result and batch shape), because a search prices hundreds of
plans and the TTFT scheduler asks for every prefill batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from tpplan.audit import Audit, PlanAudit, audit_plan
from tpplan.cost.collectives import collective_time, nccl_bytes
from tpplan.cost.gemm import achieved_tflops, gemm_bytes, gemm_time
from tpplan.cost.kernel_models import KernelModels
from tpplan.cost.provenance import Provenance, provenance
from tpplan.cost.topology import KernelProfile, Topology
from tpplan.cost.workload import PrefillBatch, TTFTResult, Workload, simulate_ttft
from tpplan.dtypes import DTYPE_BYTES
from tpplan.errors import TpplanError
from tpplan.layout.plan import Plan
from tpplan.layout.propagate import CommEvent, LayerResult, OpDecision
from tpplan.layout.transitions import collective_transition
from tpplan.models.graph import LayerGraph, ModelGraph, Op, OpKind
from tpplan.models.opkinds import cost_class, kernel_key, mixer
from tpplan.models.quant import op_weights
from tpplan.placement import S_COL, S_TOK, P, Placement, R

# Named assumptions (docs/cost-model.md). Efficiencies are fractions of the GPU's dense peak.
ATTN_EFFICIENCY = 0.55  # causal prefill attention (FlashAttention-3 class kernels, head dim 128-192)
# Chunked gated delta rule: fla_core 0.6.0 `chunk_kda` on one H200 (bf16, 48 heads x 128, 8192 tokens in
# two chunks with carried state) took 4.16 ms for 51.5 GFLOP of the graph's count, 1.25% of the dense peak
# (docs/benchmarks/h200x2-2026-11-30/fla-kda-check.json). The 0.25 assumed before was 20x too fast.
RECURRENCE_EFFICIENCY = 0.0125
KERNEL_FLOOR_S = 3e-6  # smallest time of a non-GEMM kernel that does any work (launch + tail)
EXPERT_M_TILE = 128  # rows per expert are padded to this in grouped GEMMs
STATE_BYTES = 4  # KDA/GDN recurrent state is kept in fp32 (conv state in the activation dtype)
WEIGHT_BITS = {"bf16": 16.0, "fp16": 16.0, "fp32": 32.0, "fp8": 8.0, "mxfp4": 4.25}  # mxfp4: 4 bits + e8m0/32

Category = str  # "gemm" | "attention" | "recurrence" | "moe" | "elementwise"


@dataclass(frozen=True)
class OpTime:
    """One op of one layer kind, per rank, for one batch."""

    layer_kind: str
    op: str
    role: str
    category: Category
    flops_per_rank: float
    bytes_per_rank: float
    seconds: float
    redundant: bool  # every rank does the whole op (e.g. the replicated qkv_a under baseline)
    shape: tuple[int, int, int] | None = None  # (M, K, N) per rank for GEMMs (per expert group for MoE)
    kernel: str | None = None  # kernel class a measured profile may price (None: GEMMs, from the GEMM table)
    modelled_s: float | None = None  # the model's own estimate, before a kernel profile replaced it
    extrapolated: bool = False  # a physical kernel model priced it outside the shapes its sweep measured


LAYOUT_COPY_KERNEL = "layout_copy"  # kernel class of the runtime's pack/unpack copies around collectives


@dataclass(frozen=True)
class CollectiveTime:
    """One collective of one layer kind, for one batch."""

    layer_kind: str
    label: str
    kind: str  # all_reduce | reduce_scatter | all_gather | all_to_all | send_recv
    region: str
    nbytes: float  # nccl-tests size
    seconds: float
    algorithm: str


@dataclass
class KindTime:
    """Time of one layer of a kind (compute and communication are not overlapped)."""

    kind: str
    count: int
    ops: list[OpTime]
    collectives: list[CollectiveTime]

    @property
    def compute_s(self) -> float:
        return sum(o.seconds for o in self.ops)

    @property
    def comm_s(self) -> float:
        return sum(c.seconds for c in self.collectives)

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s

    @property
    def redundant_s(self) -> float:
        """Compute every rank repeats: what a token-sharded plan could save."""
        return sum(o.seconds for o in self.ops if o.redundant)


@dataclass
class MemoryBreakdown:
    """Bytes per rank on the fullest pipeline stage. `replicated_extra` is part of `weights`
    (what replication costs beyond sharding), shown separately because it is a plan's price."""

    weights: float
    replicated_extra: float
    activations: float
    kv_cache: float
    recurrent_state: float

    @property
    def total(self) -> float:
        return self.weights + self.activations + self.kv_cache + self.recurrent_state


@dataclass
class PlanPrediction:
    plan: Plan
    tp: int
    pp: int
    legal: bool
    tokens: int
    context: int
    kinds: list[KindTime]
    stage_comm_s: float  # stage-boundary send/recv (+ re-gather) for one chunk, all boundaries
    forward_s: float  # one batch of `tokens`, whole model; PP: sum of the stages for one chunk
    memory: MemoryBreakdown
    ttft: TTFTResult | None
    topology: str
    workload: str | None
    stage_s: list[float] = field(default_factory=list)  # per stage, one chunk, its send included
    final_comm_s: float = 0.0  # the reduction before the final norm
    gpu_memory_bytes: float = 0.0
    provenance: Provenance | None = None  # how the times were made and the error band that applies

    @property
    def compute_s(self) -> float:
        """Whole-model compute for one chunk (every layer)."""
        return sum(k.count * k.compute_s for k in self.kinds)

    @property
    def comm_s(self) -> float:
        """Whole-model TP communication for one chunk (without stage sends)."""
        return sum(k.count * k.comm_s for k in self.kinds) + self.final_comm_s

    @property
    def redundant_s(self) -> float:
        return sum(k.count * k.redundant_s for k in self.kinds)

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.gpu_memory_bytes

    def to_json(self) -> dict[str, object]:
        """Plain data for `tpplan audit --json` (docs/audit-json.md, `prediction`)."""
        ttft = None
        if self.ttft is not None:
            t = self.ttft
            ttft = {
                "mean_s": t.mean_s,
                "p50_s": t.p50_s,
                "max_s": t.max_s,
                "throughput_tok_s": t.throughput_tok_s,
                "makespan_s": t.makespan_s,
                "batches": len(t.batches),
                "requests": len(t.ttft_s),
            }
        m = self.memory
        return {
            "topology": self.topology,
            "workload": self.workload,
            "tp": self.tp,
            "pp": self.pp,
            "tokens": self.tokens,
            "context": self.context,
            "forward_s": self.forward_s,
            "provenance": self.provenance.to_json() if self.provenance else None,
            "compute_s": self.compute_s,
            "comm_s": self.comm_s,
            "redundant_compute_s": self.redundant_s,
            "stage_comm_s": self.stage_comm_s,
            "stage_s": list(self.stage_s),
            "layer_kinds": {
                k.kind: {
                    "count": k.count,
                    "compute_s": k.compute_s,
                    "comm_s": k.comm_s,
                    "total_s": k.total_s,
                    "redundant_s": k.redundant_s,
                    "ops": [
                        {
                            "op": o.op,
                            "role": o.role,
                            "category": o.category,
                            "flops_per_rank": o.flops_per_rank,
                            "bytes_per_rank": o.bytes_per_rank,
                            "seconds": o.seconds,
                            "redundant": o.redundant,
                            "shape": list(o.shape) if o.shape else None,
                        }
                        for o in k.ops
                        if o.seconds > 0
                    ],
                    "collectives": [
                        {
                            "label": c.label,
                            "kind": c.kind,
                            "region": c.region,
                            "nbytes": c.nbytes,
                            "seconds": c.seconds,
                            "algorithm": c.algorithm,
                        }
                        for c in k.collectives
                    ],
                }
                for k in self.kinds
            },
            "memory_bytes_per_rank": {
                "weights": m.weights,
                "replicated_extra": m.replicated_extra,
                "activations": m.activations,
                "kv_cache": m.kv_cache,
                "recurrent_state": m.recurrent_state,
                "total": m.total,
                "gpu": self.gpu_memory_bytes,
                "fits": self.fits,
            },
            "ttft": ttft,
        }


# ----------------------------------------------------------------------------------------------
# Pipeline stages


def stage_layers(num_layers: int, pp: int) -> list[range]:
    """Contiguous layer ranges per stage, vLLM/SGLang's default partition: L // pp each, the
    remainder added to the stages just before the last one (the last stage also holds the head)."""
    if pp < 1 or pp > num_layers:
        raise TpplanError(f"--pp {pp}", f"must be between 1 and the {num_layers} layers", "choose a smaller PP size")
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    out, start = [], 0
    for s in sizes:
        out.append(range(start, start + s))
        start += s
    return out


def bank_snapshots(graph: ModelGraph, layer: int) -> int:
    """K3 attention-residual snapshots held before `layer` (0-based): one per block started
    before it (a snapshot is taken at layers 0, B, 2B, ...)."""
    block = graph.spec.attn_res_block_size
    if not block or layer <= 0:
        return 0
    return math.ceil(layer / block)


def stage_boundary_width(graph: ModelGraph, layer: int) -> int:
    """Features per token that cross into a stage starting at `layer`: SGLang's PP proxy tensors
    carry `hidden_states` and `residual` (2H), and K3 adds the attention-residual bank (one H-wide
    snapshot per block started so far)."""
    return (2 + bank_snapshots(graph, layer)) * graph.hidden


# ----------------------------------------------------------------------------------------------
# The predictor: one per (graph, plan, topology, tp, pp, dtype), caching per batch shape

Segments = tuple[tuple[int, int], ...]  # (tokens, context) per request segment of a batch


def _pairs(segs: Segments) -> tuple[int, int, int]:
    """Tokens, causal (query, key) pairs and context tokens read, for a batch of segments."""
    t = sum(n for n, _ in segs)
    pairs = sum(n * c + n * (n + 1) // 2 for n, c in segs)
    return t, pairs, sum(c for _, c in segs)


def masked_pairs(segs: Segments, window: int | None = None, chunk: int | None = None) -> tuple[int, int]:
    """(query, key) pairs and cached keys read for a batch of segments when a query at position p sees
    only keys (p - window, p] (sliding window, HF's convention) or only those of its own `chunk`
    (Llama 4's chunked attention: [p // chunk * chunk, p]). Without either: `_pairs`' causal count."""

    def seen(m: int) -> int:  # keys seen by the queries at positions 0 .. m-1, summed
        if window:
            return m * (m + 1) // 2 if m <= window else window * (window + 1) // 2 + (m - window) * window
        if chunk:
            q, r = divmod(m, chunk)
            return q * chunk * (chunk + 1) // 2 + r * (r + 1) // 2
        return m * (m + 1) // 2

    pairs = sum(seen(c + n) - seen(c) for n, c in segs)
    if window:
        read = sum(min(c, window - 1) for _, c in segs)
    elif chunk:
        read = sum(c % chunk for _, c in segs)
    else:
        read = sum(c for _, c in segs)
    return pairs, read


def cached_tokens(attn: object, seqs: list[int]) -> int:
    """Tokens of KV cache one attention layer keeps for sequences of these lengths: all of them, or
    at most the sliding window / the attention chunk (engines free blocks that fall out of it)."""
    limit = getattr(attn, "window", None) or getattr(attn, "chunk", None)
    return sum(min(s, limit) if limit else s for s in seqs)


class _Predictor:
    def __init__(
        self,
        graph: ModelGraph,
        plan: Plan,
        topo: Topology,
        tp: int,
        pp: int,
        dtype: str,
        expert_dtype: str | None,
        audit: PlanAudit | None = None,
        impls: dict[str, str] | None = None,
    ) -> None:
        if tp < 1 or pp < 1:
            raise TpplanError(f"--tp {tp} --pp {pp}", "sizes must be at least 1", "pass positive sizes")
        if tp * pp > topo.world_size:
            raise TpplanError(
                f"--tp {tp} --pp {pp}",
                f"needs {tp * pp} GPUs, topology {topo.name} has {topo.world_size} "
                f"({topo.nodes} x {topo.gpus_per_node})",
                "use a smaller TP/PP or a topology with more nodes",
            )
        g = topo.gpus_per_node
        if tp > g and tp % g:
            raise TpplanError(
                f"--tp {tp}",
                f"a TP group larger than a node must fill whole nodes of {g} GPUs",
                f"use a multiple of {g}",
            )
        if expert_dtype is not None and expert_dtype not in WEIGHT_BITS:
            raise TpplanError(
                f"--expert-dtype {expert_dtype}", "unknown weight dtype", f"choose one of {', '.join(WEIGHT_BITS)}"
            )
        self.graph, self.plan, self.topo, self.tp, self.pp, self.dtype = graph, plan, topo, tp, pp, dtype
        self.audit: PlanAudit = audit if audit is not None else audit_plan(graph, plan, tp, dtype)
        self.counts = graph.counts()
        self.b = DTYPE_BYTES[dtype]
        self.gemm_dtype = "fp8" if dtype == "fp8" else "bf16"
        self.expert_bytes = WEIGHT_BITS[expert_dtype or dtype] / 8.0
        self._init_weight_formats(expert_dtype)
        self.rpn = min(tp, g)
        self.stages = stage_layers(graph.spec.num_layers, pp)
        self.peak = (topo.gpu.fp8_tflops if dtype == "fp8" else topo.gpu.bf16_tflops) * 1e12
        self.hbm = topo.gpu.hbm_TBps * 1e12
        self.gpu_key = repr(topo.gpu)
        self.profiles = topo.gpu.kernel_profiles
        # Physical kernel models where the GPU has fitted constants, for ops that run the kernel they
        # were fitted on (`impls`: kernel family -> implementation a recorded run used; None: serving set).
        self.models = KernelModels(topo.gpu.kernel_models) if topo.gpu.kernel_models else None
        self.impls = impls
        self._extrapolated = False  # set by _op_time for the op it prices
        block = graph.spec.attn_res_block_size
        n_layers = graph.spec.num_layers
        self.bank_mean = sum(bank_snapshots(graph, i) for i in range(n_layers)) / n_layers if block else 0.0
        self._kind_cache: dict[tuple[int, Segments], KindTime] = {}
        self._stage_cache: dict[Segments, tuple[list[float], list[float], float]] = {}

    # -- compute ---------------------------------------------------------------------------
    def _init_weight_formats(self, expert_dtype: str | None) -> None:
        """Weight bytes and GEMM dtype per op from the checkpoint's quantization_config
        (`tpplan.models.quant`); `--expert-dtype` overrides the routed experts' format."""
        self.op_weights = op_weights(self.graph)
        self.expert_override = expert_dtype is not None
        self.experts_gemm_dtype = self.gemm_dtype
        for (kind, name), w in self.op_weights.items():
            op = next(o for o in self.graph.kinds[kind].ops if o.name == name)
            if op.kind is OpKind.EXPERTS and not self.expert_override:
                self.expert_bytes = w.full_bytes / op.weight_numel
                self.experts_gemm_dtype = "fp8" if w.fmt.compute == "fp8" else self.gemm_dtype

    def _weight_elem_bytes(self, kind: str, op: Op) -> float:
        """Stored bytes per weight element of `op` (scales included), as the checkpoint holds it."""
        if op.kind is OpKind.EXPERTS:
            return self.expert_bytes
        w = self.op_weights.get((kind, op.name))
        return w.full_bytes / op.weight_numel if w is not None else self.b

    def _gemm_format(self, kind: str, op: Op) -> tuple[str, float | None]:
        """(GEMM dtype, weight bytes per element where a weight-only format changes them, else None)."""
        w = self.op_weights.get((kind, op.name))
        if w is None:
            return self.gemm_dtype, None
        if w.fmt.compute == "fp8":
            return "fp8", None
        return self.gemm_dtype, w.full_bytes / op.weight_numel

    def _gemm(self, m: int, k: int, n: int, dtype: str | None = None, weight_bytes: float | None = None) -> float:
        """gemm_time, memoised across predictors of the same GPU (plans share most shapes).

        `weight_bytes`: a weight-only format (int4, mxfp4) computes at `dtype` but reads its packed
        weight, so its memory bound uses those bytes (memory-bound at small M)."""
        dt = dtype or self.gemm_dtype
        key = (self.gpu_key, m, k, n, dt, weight_bytes)
        hit = _GEMM_CACHE.get(key)
        if hit is None:
            if weight_bytes is None:
                hit = gemm_time(m, k, n, self.topo.gpu, dt)  # type: ignore[arg-type]
            else:
                rate = achieved_tflops(m, k, n, self.topo.gpu, dt) * 1e12  # type: ignore[arg-type]
                moved = gemm_bytes(m, k, n, dt) + k * n * (weight_bytes - (1 if dt == "fp8" else 2))  # type: ignore[arg-type]
                hit = max(2.0 * m * k * n / rate, moved / self.hbm)
            if len(_GEMM_CACHE) < 200_000:
                _GEMM_CACHE[key] = hit
        return hit

    def _rows(self, d: OpDecision, t: int) -> int:
        """Token rows one rank processes for this op."""
        if d.strategy.output is S_TOK or S_TOK in d.strategy.inputs:
            return math.ceil(t / self.tp)
        return t

    def _elementwise(self, lg: LayerGraph, d: OpDecision, t: int, extra_bytes: float = 0.0) -> tuple[float, float]:
        op = d.op
        widths = sum(lg.values[v].width for v in op.inputs if v in lg.values) + lg.values[op.output].width
        share = d.compute_share
        return op.flops_per_token * t * share, widths * t * self.b * share + extra_bytes

    def _roofline(self, flops: float, nbytes: float, efficiency: float = 1.0) -> float:
        if flops <= 0 and nbytes <= 0:
            return 0.0
        return max(flops / (self.peak * efficiency), nbytes / self.hbm, KERNEL_FLOOR_S)

    def _experts(self, d: OpDecision, t: int) -> tuple[float, float, float, tuple[int, int, int]]:
        """Grouped expert GEMMs (gate+up, then down) on one rank: rows routed to its experts."""
        op = d.op
        e, k = int(op.attrs["experts"]), int(op.attrs["top_k"])
        ew, inter = int(op.attrs["width"]), int(op.attrs["intermediate"])
        n = self.tp
        if d.split == "a2a":
            e_loc, i_loc, rows = e // n, inter, t * k / n
        elif d.split == "ep":
            ep = self.plan.ep_size or 1
            e_loc, i_loc, rows = e // ep, inter // (n // ep), t * k / ep
        else:  # tp: every rank runs every expert on its slice of the intermediate
            e_loc, i_loc, rows = e, inter // n, float(t * k)
        active = max(1, min(e_loc, math.ceil(rows)))
        per_expert = rows / active
        m_pad = active * EXPERT_M_TILE * math.ceil(per_expert / EXPERT_M_TILE)
        m_use = max(1, round(rows))
        secs = flops = nbytes = t_compute = 0.0
        for kk, nn in ((ew, 2 * i_loc), (i_loc, ew)):
            weights = active * kk * nn * self.expert_bytes
            gd = self.experts_gemm_dtype
            act = gemm_bytes(m_use, kk, nn, gd) - kk * nn * (1 if gd == "fp8" else 2)
            f = 2.0 * m_use * kk * nn
            t_pad = self._gemm(m_pad, kk, nn, gd)
            t_mem = (act + weights) / self.hbm
            secs += max(t_pad, t_mem)
            t_compute += t_pad
            flops += f
            nbytes += act + weights
        phys = self._physical_experts(m_use, active, ew, i_loc, t, t_compute)
        if phys is not None and self.models is not None:
            self._extrapolated = self.models.extrapolated("experts", experts=active, rows_per_expert=rows / active)
        return (secs if phys is None else phys), flops, nbytes, (m_use, ew, 2 * i_loc)

    def _model(self, family: str) -> KernelModels | None:
        """The physical models, where they cover `family` as the run executed it (see __init__)."""
        if self.models is None:
            return None
        if self.impls is not None and not KernelModels.fitted_for(family, self.impls.get(family)):
            return None
        return self.models

    def _physical_experts(
        self, rows: int, active: int, width: int, inter: int, tokens: int, compute_s: float
    ) -> float | None:
        """Grouped GEMMs by the experts model (compute: the GEMM table at the tile-padded shapes) plus
        the routing around them as memory traffic: rows gathered (bf16), outputs upcast and weighted
        (fp32), scatter-added into [T, width] fp32."""
        m = self._model("experts")
        ffn = None if m is None else m.experts(active, width, inter, compute_s, self.expert_bytes)
        if ffn is None:
            return None
        routing = (rows * width * 22.0 + tokens * width * 14.0) / self.hbm
        return ffn + routing

    def _op_time(self, lg: LayerGraph, d: OpDecision, t: int, pairs: int, ctx: int, segs: Segments = ()) -> OpTime:
        op = d.op
        # Redundant: every rank does the whole op on the same values (true replicated inputs).
        # Ops on partial sums (P) also run whole on every rank, but each on different data.
        redundant = self.tp > 1 and d.compute_share >= 1.0 and P not in d.strategy.inputs
        shape = None
        self._extrapolated = False
        cost = cost_class(op)
        if cost == "gemm":
            out, inp = op.weight_shape
            m = self._rows(d, t)
            wpr = d.weight_elements_per_rank
            if m < t or d.split == "replicated" or op.kind is not OpKind.LINEAR:
                kk, nn = inp, out
            elif d.strategy.output is S_COL:
                kk, nn = inp, max(1, wpr // inp)
            elif d.split == "row":
                kk, nn = max(1, wpr // out), out
            else:
                kk, nn = inp, out
            shape = (m, kk, nn)
            gd, wb = self._gemm_format(lg.kind, op)
            secs = self._gemm(m, kk, nn, gd, wb) if m else 0.0
            nbytes = gemm_bytes(m, kk, nn, gd) + (kk * nn * (wb - (1 if gd == "fp8" else 2)) if wb else 0.0)  # type: ignore[arg-type]
            flops, cat = 2.0 * m * kk * nn, "gemm"
        elif cost == "experts":
            secs, flops, nbytes, shape = self._experts(d, t)
            cat, redundant = "moe", False
        elif cost == "attention":
            share = d.compute_share
            if op.attrs.get("window") or op.attrs.get("chunk"):  # sliding-window or chunked mask
                pairs, ctx = masked_pairs(segs, op.attrs.get("window"), op.attrs.get("chunk"))  # type: ignore[arg-type]
            flops = op.ctx_flops_per_token * pairs * share
            kv_w = lg.values[op.inputs[1]].width + (lg.values[op.inputs[2]].width if len(op.inputs) > 2 else 0)
            _, nbytes = self._elementwise(lg, d, t, extra_bytes=ctx * kv_w * self.b * share)
            secs, cat = self._roofline(flops, nbytes, ATTN_EFFICIENCY), "attention"
            model = self._model(str(op.attrs.get("impl")))
            if model is not None:
                heads = int(op.attrs.get("heads", 1))
                h_rank = max(1, round(heads * share))
                dqk, dv = lg.values[op.inputs[0]].width // heads, lg.values[op.output].width // heads
                dv_run = max(dv, dqk)  # a narrower v (MLA) is zero-padded for the flash kernels
                phys = model.attention(h_rank, t, ctx, dqk, dv_run, flops * (dqk + dv_run) / (dqk + dv))
                secs = secs if phys is None else phys
                name = "attention_prefix" if ctx > 0 else "attention_causal"
                self._extrapolated = phys is not None and model.extrapolated(name, heads=h_rank, tokens=t,
                                                                               context=ctx)  # fmt: skip
        elif cost == "recurrence":
            flops, nbytes = self._elementwise(lg, d, t)
            secs, cat = self._roofline(flops, nbytes, RECURRENCE_EFFICIENCY), "recurrence"
            impl = str(op.attrs.get("impl"))
            model = self._model(impl)
            h_rank = max(1, round(int(op.attrs.get("heads", 1)) * d.compute_share))
            phys = None if model is None else model.recurrence(impl, h_rank, t)
            secs = secs if phys is None else phys
            self._extrapolated = phys is not None and model is not None and model.extrapolated(
                impl, heads=h_rank, tokens=t)  # fmt: skip
        elif cost == "free":
            secs = flops = nbytes = 0.0
            cat = "elementwise"
        elif cost == "attn_res":
            rows = self._rows(d, t)
            nbytes = (self.bank_mean + 2) * lg.hidden * rows * self.b
            flops = 4.0 * (self.bank_mean + 1) * lg.hidden * rows
            secs, cat = self._roofline(flops, nbytes), "elementwise"
            model = self._model("attn_res")
            phys = None if model is None else model.attn_res(rows, lg.hidden, self.bank_mean)
            secs = secs if phys is None else phys
            self._extrapolated = phys is not None and model is not None and model.extrapolated(
                "attn_res", tokens=rows, snapshots=self.bank_mean)  # fmt: skip
        else:  # elementwise (norms, gates, short convolutions): memory-bound
            flops, nbytes = self._elementwise(lg, d, t)
            secs, cat = self._roofline(flops, nbytes), "elementwise"
            if op.kind is OpKind.TOKEN_MIX:  # a memory-bound token mixer (short convolution): its stream model
                impl = str(op.attrs.get("impl"))
                model = self._model(impl)
                phys = None if model is None else model.stream(nbytes)
                secs = secs if phys is None else phys
                channels = lg.values[op.output].width * d.compute_share
                self._extrapolated = phys is not None and model is not None and model.extrapolated(
                    impl, channels=channels, tokens=t)  # fmt: skip
        if not flops and not nbytes:
            redundant = False
        kernel = kernel_key(op, str(d.split) if op.kind is OpKind.EXPERTS else None)
        measured = self._profiled(kernel, op.name, secs)
        return OpTime(lg.kind, op.name, op.role, cat, flops, nbytes, measured, redundant, shape, kernel, secs,
                      self._extrapolated)  # fmt: skip

    def _profiled(self, kernel: str | None, op_name: str, modelled: float) -> float:
        """`modelled` through the measured profile for this op (its own, 'kind:op name', first, else its
        kind's); unchanged where the topology has none."""
        if kernel is None or not self.profiles or modelled <= 0:
            return modelled
        profile: KernelProfile | None = self.profiles.get(f"{kernel}:{op_name}") or self.profiles.get(kernel)
        return profile.apply(modelled) if profile is not None else modelled

    # -- communication -----------------------------------------------------------------------
    def _coll(self, kind_name: str, label: str, kind: str, region: str, nbytes: float) -> CollectiveTime:
        est = collective_time(kind, nbytes, self.tp, self.topo, ranks_per_node=self.rpn)
        return CollectiveTime(kind_name, label, kind, region, nbytes, est.time_s, est.algorithm)

    def _nbytes(self, kind: str, elements_per_token: float, t: int) -> float:
        """nccl-tests size of a collective whose ring volume per rank is `elements_per_token` × t."""
        return nccl_bytes(kind, elements_per_token * t, self.tp, self.b)

    def _layout_copy(self, lg: LayerGraph, c: CommEvent, t: int) -> OpTime | None:
        """The runtime's layout copy around collective `c`, if its transition needs one
        (`Transition.layout_copy`: pack before an all-to-all or an uneven reduce-scatter, unpack after
        a head all-gather): memory-bound compute of its own, bytes = read + write of the local buffer."""
        if c.internal:
            return None
        val = lg.values[c.value]
        copy = collective_transition(c.collective, c.src, c.dst).layout_copy(c.value, val.width, val.heads, self.tp, t)
        if copy is None:
            return None
        name, elements = copy.name, copy.elements
        nbytes = elements * self.b
        modelled = self._roofline(0.0, nbytes)
        secs = self._profiled(LAYOUT_COPY_KERNEL, name, modelled)
        return OpTime(
            lg.kind, name, "layout", "elementwise", 0.0, nbytes, secs, False, None, LAYOUT_COPY_KERNEL, modelled
        )

    def kind_time(self, res: LayerResult, segs: Segments) -> KindTime:
        t, pairs, ctx = _pairs(segs)
        key = (id(res), segs)
        hit = self._kind_cache.get(key)
        if hit is not None:
            return hit
        lg = self.graph.kinds[res.kind]
        ops = [self._op_time(lg, d, t, pairs, ctx, segs) for d in res.decisions]
        colls = []
        for c in res.comms:
            kind = c.collective.value
            colls.append(self._coll(res.kind, c.label, kind, c.region, self._nbytes(kind, c.elements_per_token, t)))
            copy = self._layout_copy(lg, c, t)
            if copy is not None:
                ops.append(copy)
        kt = KindTime(res.kind, self.counts[res.kind], ops, colls)
        self._kind_cache[key] = kt
        return kt

    def final_comm(self, t: int) -> float:
        el = self.audit.final_elements_per_token
        if not el:
            return 0.0
        kind = "all_reduce" if self.plan.stream is R else "reduce_scatter"
        return collective_time(kind, self._nbytes(kind, el, t), self.tp, self.topo, ranks_per_node=self.rpn).time_s

    def boundary(self, layer: int, t: int) -> float:
        """Send/recv into the stage starting at `layer`: each TP rank sends its 1/N slice to its peer
        (SGLang's send_tensor_dict with all_gather_group), the receivers all-gather it unless the
        plan keeps the stream token-sharded (then every rank sends just its own rows)."""
        width = stage_boundary_width(self.graph, layer)
        total = t * width * self.b
        per_rank = total / self.tp
        g = self.topo.gpus_per_node
        dst = next(i for i, r in enumerate(self.stages) if layer in r)  # stage s holds ranks [s*tp, (s+1)*tp)
        rpn = 1 if ((dst - 1) * self.tp) // g != (dst * self.tp) // g else 2
        secs = collective_time("send_recv", per_rank, 2, self.topo, ranks_per_node=rpn).time_s
        if self.plan.stream is not S_TOK and self.tp > 1:
            secs += collective_time("all_gather", total, self.tp, self.topo, ranks_per_node=self.rpn).time_s
        return secs

    def stage_times(self, segs: Segments) -> tuple[list[float], list[float], float]:
        """Per stage: compute+TP-comm seconds for one batch, the send into the next stage, final comm."""
        hit = self._stage_cache.get(segs)
        if hit is not None:
            return hit
        t = sum(n for n, _ in segs)
        results = self.audit.layer_results
        stage_s, sends = [], []
        for i, rng in enumerate(self.stages):
            stage_s.append(sum(self.kind_time(results[j], segs).total_s for j in rng))
            sends.append(self.boundary(rng.stop, t) if i + 1 < len(self.stages) else 0.0)
        final = self.final_comm(t)
        stage_s[-1] += final
        out = (stage_s, sends, final)
        self._stage_cache[segs] = out
        return out

    def latency(self, segs: Segments) -> float:
        """One batch through every stage (no pipelining): what batch_time returns."""
        stage_s, sends, _ = self.stage_times(segs)
        return sum(stage_s) + sum(sends)

    def interval(self, segs: Segments) -> float:
        """Steady-state spacing of batches entering a pipeline: the slowest stage (its send included)."""
        stage_s, sends, _ = self.stage_times(segs)
        return max(s + x for s, x in zip(stage_s, sends, strict=True))

    # -- memory ----------------------------------------------------------------------------------
    def memory(self, workload: Workload | None, tokens: int) -> MemoryBreakdown:
        """Per rank, for the stage that needs the most."""
        spec = self.graph.spec
        n, b = self.tp, self.b
        if workload is not None:
            seqs = [workload.prompt_len(i) + workload.output_len for i in range(workload.concurrency)]
            chunk = min(workload.chunk_size, max(seqs))
        else:
            seqs, chunk = [tokens], tokens
        results = self.audit.layer_results
        embed = spec.vocab * spec.hidden / n * b  # vocab-parallel embedding and head
        best: MemoryBreakdown | None = None
        for s, rng in enumerate(self.stages):
            weights = extra = kv = state = 0.0
            for j in rng:
                res = results[j]
                for d in res.decisions:
                    wb = self._weight_elem_bytes(res.kind, d.op)
                    weights += d.weight_elements_per_rank * wb
                    if d.split == "replicated" and d.op.split.value in ("col", "row"):
                        extra += (d.op.weight_numel - d.op.weight_numel / n) * wb
                kv += self._kv_per_token(spec.layers[j].attn) * cached_tokens(spec.layers[j].attn, seqs)
                state += self._state_per_seq(spec.layers[j].attn) * len(seqs)
            if s == 0:
                weights += embed
            if s == len(self.stages) - 1 and (not spec.tie_embeddings or len(self.stages) > 1):
                weights += embed
            acts = self._activations(rng, chunk)
            m = MemoryBreakdown(weights, extra, acts, kv, state)
            if best is None or m.total > best.total:
                best = m
        assert best is not None
        return best

    def _kv_per_token(self, attn: object) -> float:
        """KV cache bytes per token of one layer on one rank, as its token mixer states it
        (`Mixer.kv_bytes`: MLA caches the latent whole on every rank, GQA this rank's KV heads)."""
        return mixer(attn.kind).kv_bytes(attn, self.tp, self.b)  # type: ignore[attr-defined]

    def _state_per_seq(self, attn: object) -> float:
        """Recurrent state bytes per sequence of one layer on one rank (heads split over TP), as its
        token mixer states it (`Mixer.state_bytes`: delta-rule state in fp32 plus short-conv tails)."""
        return mixer(attn.kind).state_bytes(attn, self.tp, self.b, STATE_BYTES)  # type: ignore[attr-defined]

    def _activations(self, rng: range, t: int) -> float:
        """Peak activation bytes of one chunk: the stream tensors that live across layers (resid,
        delta and the AttnRes bank) plus the largest live set of one op (its inputs and output)."""
        n, b, h = self.tp, self.b, self.graph.hidden
        rows_stream = t if self.plan.stream is R else math.ceil(t / n)
        bank = bank_snapshots(self.graph, rng.stop)  # the most the bank holds inside this stage
        stream = (2 + bank) * rows_stream * h * b
        peak = 0.0
        seen: set[int] = set()
        for j in rng:
            res = self.audit.layer_results[j]
            if id(res) in seen:
                continue
            seen.add(id(res))
            lg = self.graph.kinds[res.kind]
            for d in res.decisions:
                live = sum(self._value_bytes(lg, res.placements.get(v, R), v, t) for v in d.op.inputs if v in lg.values)
                live += self._value_bytes(lg, res.placements.get(d.op.output, R), d.op.output, t)
                if d.op.kind is OpKind.EXPERTS:
                    _, _, _, (m, _, n2) = self._experts(d, t)
                    live += m * (int(d.op.attrs["width"]) + n2 + n2 // 2) * b  # gathered rows + intermediates
                peak = max(peak, live)
        return stream + peak

    def _value_bytes(self, lg: LayerGraph, p: Placement, v: str, t: int) -> float:
        w = lg.values[v].width
        if p is S_TOK:
            return math.ceil(t / self.tp) * w * self.b
        if p is S_COL:
            return t * w / self.tp * self.b
        return t * w * self.b


_CACHE: dict[tuple[object, ...], tuple[_Predictor, tuple[object, ...]]] = {}
_GEMM_CACHE: dict[tuple[object, ...], float] = {}
_CACHE_MAX = 512


def _predictor(
    graph: ModelGraph,
    plan: Plan,
    topo: Topology,
    tp: int,
    pp: int,
    dtype: str,
    expert_dtype: str | None,
    audit: PlanAudit | None = None,
    impls: dict[str, str] | None = None,
) -> _Predictor:
    """Cached per (graph, plan, topology, tp, pp, dtype): the scheduler calls batch_time per batch."""
    if impls is not None:  # a recorded run's implementations (`bench --repredict`): not cached
        return _Predictor(graph, plan, topo, tp, pp, dtype, expert_dtype, audit, impls)
    key = (id(graph), id(topo), plan, tp, pp, dtype, expert_dtype)
    hit = _CACHE.get(key)
    if hit is not None and hit[1][0] is graph and hit[1][1] is topo:
        return hit[0]
    p = _Predictor(graph, plan, topo, tp, pp, dtype, expert_dtype, audit)
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = (p, (graph, topo))  # keep the objects alive so their ids stay theirs
    return p


def plan_gemm_shapes(graph: ModelGraph, tp: int, topo: Topology, dtype: str = "bf16") -> list[tuple[int, int]]:
    """Per-rank (K, N) of every GEMM (and grouped expert GEMM) the model's legal named plans run at
    TP `tp`: the shapes a GEMM table for this model should have measured (`tpplan calibrate --gemm-model`)."""
    from tpplan.plans.named import ALL_PLANS, make_plan

    shapes: set[tuple[int, int]] = set()
    for name in ALL_PLANS:
        try:
            plan = make_plan(name, graph, tp)
        except TpplanError:
            continue
        p = _Predictor(graph, plan, topo.with_nodes(max(1, math.ceil(tp / topo.gpus_per_node))), tp, 1, dtype, None)
        if not p.audit.legal:
            continue
        for res in p.audit.layer_results:
            for o in p.kind_time(res, ((4096, 0),)).ops:
                if o.shape is None:
                    continue
                _, k, n = o.shape
                shapes.add((k, n))
                if o.category == "moe":  # the down projection after gate+up
                    shapes.add((n // 2, k))
    return sorted(shapes)


def batch_time(
    graph: ModelGraph,
    plan: Plan,
    topology: Topology,
    *,
    tp: int,
    pp: int = 1,
    n_tokens: int,
    context: int = 0,
    dtype: str = "bf16",
    expert_dtype: str | None = None,
) -> float:
    """Seconds for one prefill batch of `n_tokens` new tokens after `context` cached ones, through
    the whole model; with PP, the sum of the stages and their sends (one chunk, no pipelining)."""
    if n_tokens < 1:
        raise TpplanError("n_tokens", f"must be >= 1, got {n_tokens}", "pass a positive batch size")
    return _predictor(graph, plan, topology, tp, pp, dtype, expert_dtype).latency(((n_tokens, context),))


def _segments(batch: PrefillBatch) -> Segments:
    return tuple((s.n_tokens, s.start_pos) for s in batch.segments)


def pipeline_ttft(p: _Predictor, workload: Workload) -> TTFTResult:
    """TTFT with chunked prefill pipelined over the stages.

    Batches enter stage 0 one slowest-stage interval apart (chunks of one request pipeline too: a
    chunk needs only the earlier chunks' KV/state on the same stage). A batch leaves the last stage
    `fill = latency - interval` after its slot ends; its requests finish (and closed-loop clients
    resubmit) then. With pp = 1, fill = 0 and this is the plain schedule.
    """

    def slot(batch: PrefillBatch) -> float:
        return p.interval(_segments(batch))

    def fill(batch: PrefillBatch) -> float:
        segs = _segments(batch)
        return p.latency(segs) - p.interval(segs)

    return simulate_ttft(workload, slot, fill if p.pp > 1 else None)


def predict_plan(
    graph: ModelGraph,
    plan: Plan,
    topology: Topology,
    *,
    tp: int,
    pp: int = 1,
    workload: Workload | None = None,
    tokens: int = 8192,
    dtype: str = "bf16",
    expert_dtype: str | None = None,
    audit: PlanAudit | None = None,
) -> PlanPrediction:
    """Time per layer kind, forward time for one batch of `tokens`, memory per rank and (with a
    workload) TTFT, for one plan at TP `tp` x PP `pp` on `topology`."""
    if tokens < 1:
        raise TpplanError("tokens", f"must be >= 1, got {tokens}", "pass a positive batch size")
    p = _predictor(graph, plan, topology, tp, pp, dtype, expert_dtype, audit)
    segs: Segments = ((tokens, 0),)
    stage_s, sends, final = p.stage_times(segs)
    counts = graph.counts()
    kinds = []
    for kind, ks in p.audit.kinds.items():
        kt = p.kind_time(ks.result, segs)
        kinds.append(KindTime(kind, counts[kind], kt.ops, kt.collectives))
    return PlanPrediction(
        plan=p.audit.plan,
        tp=tp,
        pp=pp,
        legal=p.audit.legal,
        tokens=tokens,
        context=0,
        kinds=kinds,
        stage_comm_s=sum(sends),
        forward_s=sum(stage_s) + sum(sends),
        memory=p.memory(workload, tokens),
        ttft=pipeline_ttft(p, workload) if workload is not None else None,
        topology=topology.name,
        workload=workload.name if workload is not None else None,
        stage_s=[s + x for s, x in zip(stage_s, sends, strict=True)],
        final_comm_s=final,
        gpu_memory_bytes=topology.gpu.memory_GiB * 2**30,
        provenance=provenance(topology, tp * pp),
    )


def predict_audit(
    a: Audit,
    topology: Topology,
    *,
    pp: int = 1,
    workload: Workload | None = None,
    tokens: int | None = None,
    expert_dtype: str | None = None,
) -> list[PlanPrediction]:
    """Predict every plan of an audit, reusing its propagation; `tokens` defaults to the
    workload's chunk size (8192 without a workload)."""
    t = tokens or (workload.chunk_size if workload is not None else 8192)
    return [
        predict_plan(
            a.graph,
            pa.plan,
            topology,
            tp=a.n,
            pp=pp,
            workload=workload,
            tokens=t,
            dtype=a.dtype,
            expert_dtype=expert_dtype,
            audit=pa,
        )
        for pa in a.plans
    ]


def predict_many(
    graph: ModelGraph,
    plans: Sequence[Plan],
    topology: Topology,
    *,
    tp: int,
    pp: int = 1,
    workload: Workload | None = None,
    tokens: int = 8192,
    dtype: str = "bf16",
    expert_dtype: str | None = None,
) -> list[PlanPrediction]:
    """`predict_plan` for several plans (same shapes share nothing but the GEMM table cache)."""
    return [
        predict_plan(
            graph,
            pl,
            topology,
            tp=tp,
            pp=pp,
            workload=workload,
            tokens=tokens,
            dtype=dtype,
            expert_dtype=expert_dtype,
        )
        for pl in plans
    ]


__all__ = [
    "CollectiveTime",
    "KindTime",
    "MemoryBreakdown",
    "OpTime",
    "PlanPrediction",
    "bank_snapshots",
    "batch_time",
    "predict_audit",
    "predict_many",
    "predict_plan",
    "stage_boundary_width",
    "stage_layers",
]
