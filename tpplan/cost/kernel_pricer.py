"""The compute pricer: one kernel step of the lowered program (`tpplan.lower.KernelCall`) -> its price.

`KernelPricer.price` turns a kernel call into an `OpTime` (seconds, the source that priced it, whether
it was extrapolated, and what its format was priced from), by the op-kind registry's cost class
(`tpplan.models.opkinds.cost_class`):

- `gemm`: the per-rank (M, K, N) the lowering gives the call (the shape decides efficiency: a
  192-wide expert shard runs at ~2% of peak), through a kernel source, the decode GEMM model or
  the GEMM table (`cost.compute.ShapePrices`);
- `experts`: grouped GEMMs at the rows an expert really sees (tile-padded);
- `attention`, `recurrence`, `attn_res`: a roofline with the GPU's named efficiencies, or the
  physical kernel models where the GPU has them; decode tokens apart (`_decode_attention`);
- everything else by HBM bandwidth; then through a measured kernel profile where the topology has one.

Work every rank repeats is flagged `redundant`. The collectives, layout copies and stage sends beside
the kernels are the collective pricer's (`cost.collective_pricer`). Formulas and assumptions:
docs/cost-model.md ("Prediction").
"""

from __future__ import annotations

import math

from tpplan.audit import StoredWeights
from tpplan.cost.compute import DECODE_MODEL, KERNEL_MODEL, PROFILE, ROOFLINE, ShapePrices
from tpplan.cost.expert_rows import FUSED_DECODE, RUNTIME_TILE, below_measured_rows, expert_rows
from tpplan.cost.gemm import Dtype as GemmDtype
from tpplan.cost.gemm import gemm_bytes, measured_floor
from tpplan.cost.gpu import ATTN_EFFICIENCY, RECURRENCE_EFFICIENCY
from tpplan.cost.kernel_models import KernelModels
from tpplan.cost.kernel_source import STAND_IN, AttentionShape, GemmShape, KernelPrice, KernelSource, MoeShape
from tpplan.cost.kernel_source import GemmDtype as KernelDtype
from tpplan.cost.prediction import OpTime
from tpplan.cost.segments import Segments, batch_pairs, masked_pairs
from tpplan.cost.sparse_attention import absorbed_mla_work, runs_absorbed, selected_keys, sparse_rule
from tpplan.cost.topology import KernelProfile, Topology
from tpplan.dtypes import DTYPE_BYTES
from tpplan.engines import DEFAULT_ENGINES
from tpplan.engines.sparse_mla import heads_run
from tpplan.layout.propagate import OpDecision
from tpplan.lower.program import KernelCall
from tpplan.lower.stages import bank_snapshots
from tpplan.mesh import Mesh
from tpplan.models.graph import LayerGraph, ModelGraph, Op
from tpplan.models.opkinds import band_class, cost_class, kernel_key, mixer, mixer_of, op_kind
from tpplan.models.quant import WeightFormat
from tpplan.placement import S_TOK

# Named assumptions (docs/cost-model.md). The roofline efficiencies belong to a GPU model
# (`GpuSpec.attn_efficiency`, `recurrence_efficiency`); their defaults are re-exported here.
KERNEL_FLOOR_S = 3e-6  # smallest time of a non-GEMM kernel that does any work (launch + tail)
EXPERT_M_TILE = RUNTIME_TILE.rows  # rows per expert of tpplan's runtime's grouped GEMMs (bench/model_fit.py)

Priced = tuple[float, float, float]  # (seconds, flops, bytes) of one kernel on one rank


def roofline_seconds(flops: float, nbytes: float, peak: float, hbm: float, efficiency: float = 1.0) -> float:
    """A kernel bound by compute (`peak` FLOP/s at `efficiency`) or by HBM (`hbm` bytes/s), at least
    the kernel floor; 0 for no work."""
    if flops <= 0 and nbytes <= 0:
        return 0.0
    return max(flops / (peak * efficiency), nbytes / hbm, KERNEL_FLOOR_S)


def profiled_seconds(topo: Topology, kernel: str | None, op_name: str, modelled: float) -> float:
    """`modelled` through the topology's measured profile for this op (its own, 'kind:op name', first,
    else its kernel class's); unchanged where the topology has none."""
    profiles = topo.gpu.kernel_profiles
    if kernel is None or not profiles or modelled <= 0:
        return modelled
    profile: KernelProfile | None = profiles.get(f"{kernel}:{op_name}") or profiles.get(kernel)
    return profile.apply(modelled) if profile is not None else modelled


def kernel_dtype(fmt: WeightFormat | None, compute: GemmDtype) -> KernelDtype:
    """The format a kernel source's rows are asked for, from the checkpoint's weight format:
    block-scaled fp8 (`weight_block_size`), per-tensor/per-channel fp8, mxfp4, nvfp4, int4; else
    (no format, int8) the dtype the GEMM computes in."""
    if fmt is None:
        return compute
    if fmt.compute == "fp8":
        return "fp8_block" if fmt.block else "fp8"
    for name in ("mxfp4", "nvfp4", "int4"):
        if fmt.name.startswith(name):
            return name
    return compute


class KernelPricer:
    """Prices kernel steps for one model on one GPU model, for a rank of `mesh`'s TP group, with the
    weights in the checkpoint's formats (`dtype` activations; `expert_dtype` overriding the routed
    experts'). `sources`: the kernel sources asked before tpplan's formulas (`cost.compute.kernel_sources`);
    `impls`: kernel family -> the implementation a recorded run used (physical kernel models only where
    they were fitted on it, and the runtime's host overhead charged); None for the serving set, whose
    routed experts run `serving_engine`'s fused-MoE row tiles (default: the first default engine)."""

    def __init__(
        self,
        graph: ModelGraph,
        topo: Topology,
        mesh: Mesh,
        dtype: str,
        expert_dtype: str | None,
        *,
        sources: tuple[KernelSource, ...] = (),
        impls: dict[str, str] | None = None,
        serving_engine: str | None = None,
    ) -> None:
        self.graph, self.topo, self.mesh, self.dtype = graph, topo, mesh, dtype
        self.serving_engine = serving_engine or DEFAULT_ENGINES[0]
        self.b = DTYPE_BYTES[dtype]
        self.gemm_dtype: GemmDtype = "fp8" if dtype == "fp8" else "bf16"
        self._init_weight_formats(expert_dtype)
        self.peak = topo.gpu.peak_tflops("fp8" if dtype == "fp8" else "bf16") * 1e12
        self.hbm = topo.gpu.hbm_TBps * 1e12
        self.shapes = ShapePrices(topo.gpu, sources)
        self._source: str | None = None  # set by price: what priced the op it prices
        self._decode_source: str | None = None  # set by _decode_attention: what priced a step's decode tokens
        self.gemm_floor = measured_floor(topo.gpu)  # below it the GEMM table extrapolates
        # Physical kernel models where the GPU has fitted constants, for ops that run the kernel they
        # were fitted on. Host overhead of tpplan's runtime (`host_s` of a set) is charged only where a
        # recorded run of it is priced.
        models = topo.gpu.kernel_models
        self.models = KernelModels(models, charge_host=impls is not None) if models else None
        self.impls = impls
        self._extrapolated = False  # set by price for the op it prices
        block = graph.spec.attn_res_block_size
        n_layers = graph.spec.num_layers
        self.bank_mean = sum(bank_snapshots(graph, i) for i in range(n_layers)) / n_layers if block else 0.0

    def _init_weight_formats(self, expert_dtype: str | None) -> None:
        """Weight bytes and GEMM dtype per op from the checkpoint's quantization_config
        (`tpplan.audit.StoredWeights`, the one place memory figures take them from); `--expert-dtype`
        overrides the routed experts' format. A kernel source is asked for the rows of the format
        the config names (`kernel_dtype`: block-scaled or per-tensor fp8, mxfp4, nvfp4, int4)."""
        self.stored = StoredWeights(self.graph, self.dtype, expert_dtype)
        self.op_weights = self.stored.op_weights
        self.expert_bytes = self.stored.expert_bytes
        self.experts_gemm_dtype: GemmDtype = "fp8" if self.stored.experts_fp8 else self.gemm_dtype
        experts = next((w.fmt for (k, name), w in self.op_weights.items() if self._is_experts(k, name)), None)
        if expert_dtype is not None:  # --expert-dtype names a format without its scales' layout
            self.moe_dtype: KernelDtype = {"fp8": "fp8", "mxfp4": "mxfp4"}.get(expert_dtype, "bf16")  # type: ignore[assignment]
        else:
            self.moe_dtype = kernel_dtype(experts, self.experts_gemm_dtype)
        self._note: str | None = None  # set by price: where the op's format was priced from other rows

    def _is_experts(self, kind: str, name: str) -> bool:
        return any(o.name == name and op_kind(o.kind).routed_experts for o in self.graph.kinds[kind].ops)

    def weight_elem_bytes(self, kind: str, op: Op) -> float:
        """Stored bytes per weight element of `op` (scales included), as the checkpoint holds it."""
        return self.stored.per_element(kind, op)

    def _gemm_format(self, kind: str, op: Op) -> tuple[GemmDtype, float | None, KernelDtype]:
        """(GEMM dtype of tpplan's formula, weight bytes per element where a weight-only format changes
        them, else None, the format a kernel source is asked for)."""
        w = self.op_weights.get((kind, op.name))
        if w is None:
            return self.gemm_dtype, None, self.gemm_dtype
        if w.fmt.compute == "fp8":
            return "fp8", None, kernel_dtype(w.fmt, "fp8")
        return self.gemm_dtype, w.full_bytes / op.weight_numel, kernel_dtype(w.fmt, self.gemm_dtype)

    def _gemm(
        self,
        m: int,
        k: int,
        n: int,
        dtype: GemmDtype | None = None,
        weight_bytes: float | None = None,
        kernel: KernelDtype | None = None,
    ) -> float:
        """One GEMM through the compute pricer: a kernel source's price for the weight format `kernel`
        (default `dtype`), else the GEMM table's (`ShapePrices.formula_gemm`, memoised across
        predictors of the same GPU).

        `weight_bytes`: a weight-only format (int4, mxfp4) computes at `dtype` but reads its packed
        weight, so tpplan's formula bounds it by those bytes (memory-bound at small M)."""
        dt = dtype or self.gemm_dtype
        if not self.shapes.sources:
            self._source = self.shapes.gemm_source
            self._extrapolated = self._extrapolated or self._below_table(m, k, n)
            return self.shapes.formula_gemm(m, k, n, dt, weight_bytes)
        fmt = kernel or dt
        price = self.shapes.gemm(GemmShape(m, k, n, fmt), weight_bytes)
        if fmt != "bf16" and price.source == self.shapes.gemm_source:
            self._note = f"{fmt} GEMMs: no engine row at some shapes, tpplan's {dt} GEMM formula"
        elif STAND_IN.format(wanted=fmt) in price.source:
            self._note = f"{fmt} GEMMs: the engine's tables lack {fmt}, {price.source} stood in"
        self._source = price.source
        below = price.source == self.shapes.gemm_source and self._below_table(m, k, n)
        self._extrapolated = self._extrapolated or price.extrapolated or below
        return price.seconds

    def _small_gemm(self, m: int, k: int, n: int, dt: str, weight_bytes: float | None) -> float | None:
        """A linear op's bf16 GEMM at decode sizes (M <= 512) by the GPU's measured `gemm_small` model, where it
        has one and no kernel source (an engine's table) prices GEMMs; None otherwise. The experts' grouped
        GEMMs keep the GEMM table inside their own model (fitted with it)."""
        if self.shapes.sources or self.models is None or dt != "bf16" or weight_bytes not in (None, 2.0):
            return None
        secs = self.models.small_gemm(m, k, n)
        if secs is not None:
            self._source = DECODE_MODEL
        return secs

    def _below_table(self, m: int, k: int, n: int) -> bool:
        """Whether tpplan's GEMM table prices (m, k, n) below its smallest measured M, K or N (extrapolated)."""
        f = self.gemm_floor
        return f is not None and (m < f[0] or k < f[1] or n < f[2])

    def gemm_seconds(self, m: int, k: int, n: int) -> float:
        """A GEMM outside the layer graph (the speculative draft's lm_head and eh_proj, `tpplan.cost.draft`)
        with weights in the activation dtype, through the pricer the layers' GEMMs take."""
        return self._gemm(m, k, n) if m else 0.0

    def gemm_at(self, kind: str, op: Op, m: int, k: int, n: int) -> float:
        """`op`'s GEMM at another shape (async TP's T/N-row chunks), through the pricer and weight format
        `price` uses, before any measured kernel profile."""
        gd, wb, kd = self._gemm_format(kind, op)
        return self._gemm(m, k, n, gd, wb, kd) if m else 0.0

    def _elementwise(self, lg: LayerGraph, d: OpDecision, t: int, extra_bytes: float = 0.0) -> tuple[float, float]:
        op = d.op
        widths = sum(lg.values[v].width for v in op.inputs if v in lg.values) + lg.values[op.output].width
        share = d.compute_share
        return op.flops_per_token * t * share, widths * t * self.b * share + extra_bytes

    def _roofline(self, flops: float, nbytes: float, efficiency: float = 1.0) -> float:
        return roofline_seconds(flops, nbytes, self.peak, self.hbm, efficiency)

    def _experts(self, call: KernelCall, t: int) -> tuple[float, float, float, tuple[int, int, int]]:
        """Grouped expert GEMMs (gate+up, then down) on one rank: rows routed to its experts."""
        d = call.decision
        op = d.op
        k = op.int_attr("top_k")
        ew, inter = op.int_attr("width"), op.int_attr("intermediate")
        n, ep = self.mesh.tp, call.ep_size or 1
        assert call.experts is not None  # the lowering's per-rank share of the routed experts
        e_loc, i_loc, rows = call.experts
        engine = self.serving_engine if self.impls is None else None  # a recorded run: tpplan's runtime's tile
        held = e_loc * {"a2a": n, "ep": ep}.get(str(d.split), 1)  # physical experts over the group (+ redundant)
        share = expert_rows(engine, e_loc, held, k, t, rows, self.moe_dtype)
        active, m_pad = share.active, share.padded
        m_use = max(1, round(rows))
        secs = flops = nbytes = t_compute = 0.0
        for kk, nn in ((ew, 2 * i_loc), (i_loc, ew)):
            weights = active * kk * nn * self.expert_bytes
            gd = self.experts_gemm_dtype
            act = gemm_bytes(m_use, kk, nn, gd) - kk * nn * (1 if gd == "fp8" else 2)
            f = 2.0 * m_use * kk * nn
            t_pad = self._gemm(m_pad, kk, nn, gd, kernel=self.moe_dtype)
            t_mem = (act + weights) / self.hbm
            secs += max(t_pad, t_mem)
            t_compute += t_pad
            flops += f
            nbytes += act + weights
        # The tokens whose rows this rank combines: its own share under all-to-all, else every token.
        tokens_here = math.ceil(t / n) if d.split == "a2a" else t
        fused_decode = self.impls is None and below_measured_rows(self.models, rows / active)
        phys = None if fused_decode else self._physical_experts(m_use, active, ew, i_loc, tokens_here, t_compute)
        if phys is not None and self.models is not None:
            self._extrapolated = self.models.extrapolated("experts", experts=active, rows_per_expert=rows / active)
            self._source = KERNEL_MODEL
        secs = secs if phys is None else phys
        decode_rows = fused_decode or (phys is None and engine is not None and share.one_tile)
        if decode_rows and share.tile.source.read:  # the engine's tile was read for this format
            self._source = FUSED_DECODE
        if self.shapes.sources:
            tp_, ep_ = {"a2a": (1, n), "ep": (n // ep, ep)}.get(str(d.split), (n, 1))
            # the engine's MoE layer holds `held` physical experts (redundant copies too), as its kernel runs them
            moe = MoeShape(t, ew, inter, held, k, tp_, ep_, self.moe_dtype)
            price = self.shapes.moe(moe)
            if price is not None:
                secs, self._source, self._extrapolated = price.seconds, price.source, price.extrapolated
            self._note = self._moe_note(price)
        return secs, flops, nbytes, (m_use, ew, 2 * i_loc)

    def _moe_note(self, price: KernelPrice | None) -> str | None:
        """Where the experts' format was not priced from rows of that format, what priced it."""
        fmt = self.moe_dtype
        if price is None:
            return None if fmt == "bf16" else f"{fmt} experts: no engine row at this shape, tpplan's formula"
        if STAND_IN.format(wanted=fmt) in price.source:
            return f"{fmt} experts: the engine's tables lack {fmt}, {price.source} stood in"
        return None

    def _model(self, family: str) -> KernelModels | None:
        """The physical models, where they cover `family` as the run executed it (see __init__)."""
        if self.models is None:
            return None
        if self.impls is not None and not self.models.fitted_for(family, self.impls.get(family)):
            return None
        return self.models

    def _physical_experts(
        self, rows: int, active: int, width: int, inter: int, tokens: int, compute_s: float
    ) -> float | None:
        """Grouped GEMMs by the experts model (compute: the GEMM table at the tile-padded shapes) plus
        the routing around them as memory traffic (`KernelModels.routing`): a serving engine's fused-MoE
        combine where no recorded run of tpplan's runtime is priced (`impls` None), else the runtime's."""
        m = self._model("experts")
        ffn = None if m is None else m.experts(active, width, inter, compute_s, self.expert_bytes, rows)
        if m is None or ffn is None:
            return None
        return ffn + m.routing(rows, tokens, width, self.hbm, fused=self.impls is None)

    def price(self, lg: LayerGraph, call: KernelCall, t: int, pairs: int, ctx: int, segs: Segments) -> OpTime:
        """One kernel step of the lowered program (its per-rank shape, rows and whether every rank repeats
        it) priced for a batch of `t` tokens on this rank (`pairs`, `ctx`, `segs`: what its attention sees)."""
        d = call.decision
        op = d.op
        shape = None
        self._extrapolated = False
        self._source = ROOFLINE
        self._note = None
        cost = cost_class(op)
        if cost == "gemm":
            secs, flops, nbytes, shape = self._absorbed_kv_b(lg, call, segs) or self._gemm_step(lg, call)
            cat = "gemm"
        elif cost == "experts":
            secs, flops, nbytes, shape = self._experts(call, t)
            cat = "moe"
        elif cost == "attention":
            (secs, flops, nbytes), cat = self._attention(lg, d, t, pairs, ctx, segs), "attention"
        elif cost == "recurrence":
            (secs, flops, nbytes), cat = self._recurrence(lg, d, t), "recurrence"
        elif cost == "free":
            secs = flops = nbytes = 0.0
            cat = "elementwise"
        elif cost == "attn_res":
            (secs, flops, nbytes), cat = self._attn_res(lg, call.rows), "elementwise"
        else:  # elementwise (norms, gates, short convolutions): memory-bound
            (secs, flops, nbytes), cat = self._memory_bound(lg, d, t), "elementwise"
        redundant = call.redundant and bool(flops or nbytes)
        kernel = kernel_key(op, str(d.split))
        measured = self._profiled(kernel, op.name, secs)
        source = PROFILE if measured != secs else (None if cost == "free" else self._source)
        return OpTime(lg.kind, op.name, op.role, cat, flops, nbytes, measured, redundant, shape, kernel, secs,
                      self._extrapolated, source, self._note, band_class(op))  # fmt: skip

    def _gemm_step(self, lg: LayerGraph, call: KernelCall) -> tuple[float, float, float, tuple[int, int, int]]:
        """A linear op at the call's per-rank (M, K, N), in its weight format."""
        assert call.shape is not None  # a GEMM step's per-rank (M, K, N)
        m, kk, nn = call.shape
        gd, wb, kd = self._gemm_format(lg.kind, call.decision.op)
        small = self._small_gemm(m, kk, nn, gd, wb) if m else None  # a decode step's projection
        secs = small if small is not None else (self._gemm(m, kk, nn, gd, wb, kd) if m else 0.0)
        nbytes = gemm_bytes(m, kk, nn, gd) + (kk * nn * (wb - (1 if gd == "fp8" else 2)) if wb else 0.0)
        return secs, 2.0 * m * kk * nn, nbytes, call.shape

    def _attention(self, lg: LayerGraph, d: OpDecision, t: int, pairs: int, ctx: int, segs: Segments) -> Priced:
        """Attention: decode tokens apart (`_decode_attention`), DSA's prefill as the engine runs it
        (`_sparse_prefill`), the rest by the roofline, the physical kernel model or a kernel source, over
        the pairs its mask (window, chunk) lets it score."""
        op, share = d.op, d.compute_share
        absorbed = self._decode_attention(lg, op, share, segs, own=d.strategy.output is S_TOK)
        if absorbed is not None:  # decode tokens (MLA absorbed; GQA by its decode model): apart
            segs = tuple(s for s in segs if s[0] > 1)
            t, pairs, ctx = batch_pairs(segs)
        sparse = self._sparse_prefill(lg, d, segs)
        secs, flops, nbytes = sparse or self._prefill_attention(lg, d, t, pairs, ctx, segs)
        if absorbed is None:
            return secs, flops, nbytes
        if not segs:
            self._source = self._decode_source
            return absorbed
        return secs + absorbed[0], flops + absorbed[1], nbytes + absorbed[2]

    def _prefill_attention(self, lg: LayerGraph, d: OpDecision, t: int, pairs: int, ctx: int, segs: Segments) -> Priced:
        """Attention over all its heads in the per-head form (what `_attention` does not price apart)."""
        op, share = d.op, d.compute_share
        if op.attrs.get("window") or op.attrs.get("chunk"):  # sliding-window or chunked mask
            pairs, ctx = masked_pairs(segs, op.optional_int_attr("window"), op.optional_int_attr("chunk"))
        flops = op.ctx_flops_per_token * pairs * share
        kv_w = lg.values[op.inputs[1]].width + (lg.values[op.inputs[2]].width if len(op.inputs) > 2 else 0)
        _, nbytes = self._elementwise(lg, d, t, extra_bytes=ctx * kv_w * self.b * share)
        secs = self._roofline(flops, nbytes, self.topo.gpu.attn_efficiency)
        impl = str(op.attrs.get("impl"))
        model = self._model(impl)
        heads = op.int_attr("heads", 1)
        h_rank = max(1, round(heads * share))
        dqk, dv = lg.values[op.inputs[0]].width // heads, lg.values[op.output].width // heads
        if model is not None and t > 0:
            dv_run = max(dv, dqk)  # a narrower v (MLA) is zero-padded for the flash kernels
            window = op.optional_int_attr("window")
            phys = model.attention(h_rank, t, ctx, dqk, dv_run, flops * (dqk + dv_run) / (dqk + dv), window)
            secs = secs if phys is None else phys
            name = "attention_prefix" if ctx > 0 else "attention_causal"
            self._extrapolated = phys is not None and model.extrapolated(name, heads=h_rank, tokens=t, context=ctx)
            self._source = ROOFLINE if phys is None else KERNEL_MODEL
        if self.shapes.sources and t > 0:
            secs = self._sourced_attention(op, impl, h_rank, dqk, dv, share, segs, secs)
        return secs, flops, nbytes

    def _sparse_prefill(self, lg: LayerGraph, d: OpDecision, segs: Segments) -> Priced | None:
        """DSA's prefill attention in the absorbed form where the serving engine runs it so
        (`cost.sparse_attention`): each query's heads, padded as the engine's kernel pads them, over its selected
        latent rows; by the GPU's `dsa_attention` model where it has one, else the attention roofline. None
        (the per-head form) for a step the engine runs as dense MHA, a recorded run of tpplan's runtime
        (`impls`: its sparse kernel is per head), or any other attention. `own` as in `_decode_attention`."""
        op, mx = d.op, mixer_of(d.op)
        if mx is None or not mx.sparse_topk or self.impls is not None or "kv_latent" not in lg.values:
            return None
        topk = lg.values[op.inputs[3]].width
        if not runs_absorbed(self.serving_engine, segs, topk):
            return None
        rule, self._note = sparse_rule(self.serving_engine)
        part, share = (d.compute_share, 1.0) if d.strategy.output is S_TOK else (1.0, d.compute_share)
        t, ctx = sum(n for n, _ in segs), sum(c for _, c in segs)
        heads = heads_run(rule, max(1, round(op.int_attr("heads", 1) * share)))
        lora, rope = lg.values["kv_latent"].width, lg.values[op.inputs[2]].width
        keys = part * selected_keys(segs, topk)
        flops, nbytes = absorbed_mla_work(heads, part * t, keys, part * (t + ctx), lora, rope, self.b)
        m = self._model("dsa_attention")
        phys = None if m is None else m.dsa_attention(keys * (lora + rope) * self.b, flops)
        self._source = ROOFLINE if phys is None else KERNEL_MODEL
        self._extrapolated = phys is not None and m is not None and m.extrapolated(
            "dsa_attention", heads=heads, tokens=t, context=ctx)  # fmt: skip
        secs = self._roofline(flops, nbytes, self.topo.gpu.attn_efficiency) if phys is None else phys
        return secs, flops, nbytes

    def _absorbed_kv_b(
        self, lg: LayerGraph, call: KernelCall, segs: Segments
    ) -> tuple[float, float, float, tuple[int, int, int]] | None:
        """DSA's `kv_b_proj` in a step the engine runs absorbed (`_sparse_prefill`): it does not run; W_UK
        (nope -> kv_lora) on each query and W_UV (kv_lora -> v) on each output run instead, per head as
        batched GEMMs (vLLM's `torch.bmm` with W_UK_T and W_UV, SGLang's with w_kc and w_vc): the same FLOPs at
        per-head shapes, each bmm priced as one GEMM with its heads side by side in N (the same output tiles, each
        over the same K), in the activation dtype (both
        dequantize a block-fp8 kv_b_proj to it: vLLM's `split_kv_b_proj`, SGLang 0.5.23's
        `DeepseekWeightLoader.post_load_weights`). None for any other GEMM or step."""
        if call.decision.op.name != "kv_b_proj" or call.shape is None or self.impls is not None:
            return None  # every GEMM step asks: the name first, before the attention ops are searched
        att = next((o for o in lg.attn.ops if (x := mixer_of(o)) is not None and x.sparse_topk), None)
        if att is None:
            return None
        prefill = tuple(s for s in segs if s[0] > 1)
        if not runs_absorbed(self.serving_engine, prefill, lg.values[att.inputs[3]].width):
            return None
        m, lora, n = call.shape
        heads = att.int_attr("heads", 1)
        rope = lg.values[att.inputs[2]].width
        nope, v = lg.values[att.inputs[0]].width // heads - rope, lg.values[att.output].width // heads
        h = n // (nope + v)  # this rank's heads
        gd = self.gemm_dtype
        secs = self._gemm(m, nope, h * lora, gd) + self._gemm(m, lora, h * v, gd) if m else 0.0
        nbytes = h * (gemm_bytes(m, nope, lora, gd) + gemm_bytes(m, lora, v, gd))
        self._note = f"absorbed: {h} heads' W_UK ({m}x{nope}x{lora}) and W_UV ({m}x{lora}x{v}) as batched GEMMs"
        return secs, 2.0 * m * h * lora * (nope + v), nbytes, call.shape

    def _recurrence(self, lg: LayerGraph, d: OpDecision, t: int) -> Priced:
        """A linear-attention recurrence (KDA, GDN): the roofline, or its physical kernel model."""
        op = d.op
        flops, nbytes = self._elementwise(lg, d, t)
        secs = self._roofline(flops, nbytes, self.topo.gpu.recurrence_efficiency)
        impl = str(op.attrs.get("impl"))
        model = self._model(impl)
        # GDN's state, and its work, is per v head (a key head serves v_heads / k_heads of them)
        heads = op.int_attr("v_heads", op.int_attr("heads", 1))
        h_rank = max(1, round(heads * d.compute_share))
        phys = None if model is None else model.recurrence(impl, h_rank, t)
        self._source = ROOFLINE if phys is None else KERNEL_MODEL
        self._extrapolated = phys is not None and model is not None and model.extrapolated(
            impl, heads=h_rank, tokens=t)  # fmt: skip
        return (secs if phys is None else phys), flops, nbytes

    def _attn_res(self, lg: LayerGraph, rows: int) -> Priced:
        """K3's attention residual over the bank of block snapshots (its mean depth), and the output RMSNorm."""
        nbytes = (self.bank_mean + 2) * lg.hidden * rows * self.b
        flops = 4.0 * (self.bank_mean + 1) * lg.hidden * rows
        secs = self._roofline(flops, nbytes)
        model = self._model("attn_res")
        phys = None if model is None else model.attn_res(rows, lg.hidden, self.bank_mean)
        # The op also applies the output RMSNorm (`opkind_defs._attn_res_run`), which the sweeps time
        # apart from the depth softmax: its [rows, hidden] read and write at the HBM roofline.
        secs = secs if phys is None else phys + self._roofline(0.0, 2.0 * lg.hidden * rows * self.b)
        self._source = ROOFLINE if phys is None else KERNEL_MODEL
        self._extrapolated = phys is not None and model is not None and model.extrapolated(
            "attn_res", tokens=rows, snapshots=self.bank_mean)  # fmt: skip
        return secs, flops, nbytes

    def _memory_bound(self, lg: LayerGraph, d: OpDecision, t: int) -> Priced:
        """Norms, gates, short convolutions: HBM-bound, or the stream/norm model where the GPU has one."""
        op = d.op
        flops, nbytes = self._elementwise(lg, d, t)
        secs = self._roofline(flops, nbytes)
        if op_kind(op.kind).mixes_tokens:  # a memory-bound token mixer (short convolution): its stream model
            family, axis = str(op.attrs.get("impl")), "channels"
        elif op_kind(op.kind).fused_norm:  # a fused RMSNorm: its stream model, where fitted
            family, axis = "norm", "width"
        else:
            return secs, flops, nbytes
        model = self._model(family)
        phys = None if model is None else (model.stream(nbytes) if axis == "channels" else model.norm(nbytes))
        self._source = ROOFLINE if phys is None else KERNEL_MODEL
        width = lg.values[op.output].width * d.compute_share
        self._extrapolated = phys is not None and model is not None and model.extrapolated(
            family, **{axis: width, "tokens": t})  # fmt: skip
        return (secs if phys is None else phys), flops, nbytes

    def _decode_attention(
        self, lg: LayerGraph, op: Op, share: float, segs: Segments, own: bool = False
    ) -> tuple[float, float, float] | None:
        """A step's decode tokens (one-token segments) priced apart: (seconds, flops, bytes), or None (no
        decode tokens; GQA without a `decode_gqa` model, which stays in the prefill pricing).

        MLA as both engines run it (`tpplan.engines.scheduling.MLA_DECODE_ABSORBED`): MQA over the cached
        latent (kv_lora + rope wide, read once per request whatever the heads), each of this rank's heads
        scoring over the latent and summing kv_lora-wide values (DSA: its top-k keys). GQA: each request's
        keys (its window or chunk where it has one) read once per KV head of the rank. Priced by the GPU's
        measured decode model (`KernelModels.decode`, the decode sweep) where it has one, else by the
        attention roofline. `own` (DP attention: the op's tokens are sharded by request): the rank runs its
        `share` of the requests with every head, reading only their KV, not every request's latent."""
        dec, mx = [c for n, c in segs if n == 1], mixer_of(op)
        if not dec or mx is None:
            return None
        part, share = (share, 1.0) if own else (1.0, share)  # own: `part` of the requests, every head
        heads = max(1, round(op.int_attr("heads", 1) * share))
        m = self.models
        if mx.latent_kv and "kv_latent" in lg.values:  # absorbed in decode
            lora, rope = lg.values["kv_latent"].width, lg.values[op.inputs[2]].width
            # each decode token scores its context and itself; DSA's only its top-k of them (the indexer's output)
            topk = lg.values[op.inputs[3]].width if mx.sparse_topk and len(op.inputs) > 3 else None
            keys = part * sum(min(c + 1, topk or c + 1) for c in dec)
            flops, nbytes = absorbed_mla_work(heads, part * len(dec), keys, keys, lora, rope, self.b)
            phys = None if m is None else m.decode("decode_mla", keys * (lora + rope) * self.b, flops)
        elif mx.head_kv and m is not None and "decode_gqa" in m.consts:
            window, chunk = op.optional_int_attr("window"), op.optional_int_attr("chunk")
            keys = part * sum(min(c + 1, window or c + 1, c % chunk + 1 if chunk else c + 1) for c in dec)
            kv = max(1, round(op.int_attr("kv_heads", op.int_attr("heads", 1)) * share))
            d = lg.values[op.inputs[0]].width // op.int_attr("heads", 1)
            flops = 2.0 * heads * 2 * d * keys
            nbytes = keys * kv * 2 * d * self.b
            phys = m.decode("decode_gqa", nbytes, flops)
        else:
            return None
        self._decode_source = ROOFLINE if phys is None else DECODE_MODEL
        secs = self._roofline(flops, nbytes, self.topo.gpu.attn_efficiency) if phys is None else phys
        return secs, flops, nbytes

    def _sourced_attention(
        self, op: Op, impl: str, heads: int, dqk: int, dv: int, share: float, segs: Segments, secs: float
    ) -> float:
        """The attention call's price from a kernel source where one answers, else `secs` unchanged.
        Per request: the batch's new and cached tokens split evenly over its segments."""
        batch = max(1, len(segs))
        t = sum(n for n, _ in segs)
        ctx = sum(c for _, c in segs)
        kv = max(1, round(op.int_attr("kv_heads", op.int_attr("heads", 1)) * share))
        window = op.int_attr("window") if op.attrs.get("window") else None
        mx = mixer(impl)
        mla = mx.latent_kv and not mx.sparse_topk  # dense attention over MLA's latent: the sources' MLA kernel
        shape = AttentionShape(max(1, t // batch), ctx // batch, heads, heads if mla else kv, dqk, dv,
                               "mla" if mla else "mha", window, batch)  # fmt: skip
        price = self.shapes.attention(shape)
        if price is None:
            return secs
        self._source, self._extrapolated = price.source, price.extrapolated
        return price.seconds

    def _profiled(self, kernel: str | None, op_name: str, modelled: float) -> float:
        return profiled_seconds(self.topo, kernel, op_name, modelled)


__all__ = [
    "ATTN_EFFICIENCY",
    "EXPERT_M_TILE",
    "KERNEL_FLOOR_S",
    "RECURRENCE_EFFICIENCY",
    "KernelPricer",
    "kernel_dtype",
    "profiled_seconds",
    "roofline_seconds",
]
