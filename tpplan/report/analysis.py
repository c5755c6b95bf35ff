"""Everything the memo states, computed: audits over plans and TP sizes, predictions, verdicts,
next steps, and the places where tpplan's model differs from the seed's hand analysis.

The time/memory/TTFT predictor (`tpplan.cost.predict.predict_plan`) is optional here: it is looked
up at run time (`load_predictor`) and can be passed in, so the memo works from the audit alone
when the predictor is missing, and says so. Everything below is torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tpplan.audit import DTYPE_BYTES, PlanAudit, audit_plan
from tpplan.cost.collectives import collective_time
from tpplan.cost.gemm import gemm_time
from tpplan.cost.topology import Topology
from tpplan.cost.workload import Workload
from tpplan.errors import TpplanError
from tpplan.layout.placement import Collective
from tpplan.layout.propagate import LayerResult
from tpplan.models.graph import ModelGraph, OpKind
from tpplan.models.spec import MLASpec, MoESpec
from tpplan.plans.named import make_plan
from tpplan.plans.plan import Plan
from tpplan.report.bench_results import BenchResults
from tpplan.report.engines import EngineRecipe, recipes

PredictFn = Callable[..., Any]

REPORT_PLANS = (
    "baseline",
    "input-scattered",
    "input-scattered+restore",
    "latent-scattered",
    "sequence-parallel",
    "gate-aware",
    "sp-moe",
    "ep4",
)
# Predicted TTFT changes smaller than this are within the model's error (the accuracy
# targets are 5-10%); such a plan is not worth a multi-node reservation.
MIN_GAIN = 0.02
_SHORT = {"all_reduce": "AR", "reduce_scatter": "RS", "all_gather": "AG", "all_to_all": "A2A", "send_recv": "P2P"}


SearchFn = Callable[..., list[Plan]]


def load_search() -> SearchFn | None:
    """A function returning the search's best plans (`tpplan.search`), or None where it is missing."""
    try:
        from tpplan.search import RooflineObjective, search, ttft_shapes  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None

    def best(
        graph: ModelGraph, n: int, topology: Topology, workload: Workload | None, dtype: str, top: int
    ) -> list[Plan]:
        shapes = ttft_shapes(workload) if workload is not None else ((8192, 1.0),)
        result = search(graph, n, RooflineObjective(topology, shapes=shapes, dtype=dtype), top=top, dtype=dtype)
        return [c.plan for c in result.candidates]

    return best


def describe_plan(plan: Plan) -> str:
    """A found plan has no prose summary: say its decisions."""
    d = plan.describe()
    parts = [f"stream {d['stream']}, partial sums reduced to {d['reduce']}"]
    for key, words in (
        ("gather", "all-gather"),
        ("gather_for", "all-gather for one consumer"),
        ("a2a", "all-to-all to heads"),
        ("replicate", "replicate"),
        ("token_shard", "token-shard"),
    ):
        if d[key]:
            parts.append(f"{words}: " + ", ".join(f"`{x}`" for x in d[key]))  # type: ignore[union-attr]
    parts.append(f"MoE {d['moe']}")
    return "; ".join(parts) + "."


def load_predictor() -> PredictFn | None:
    """`tpplan.cost.predict.predict_plan` when this build has it, else None (volume-only memo)."""
    try:
        from tpplan.cost.predict import predict_plan  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    return predict_plan  # type: ignore[no-any-return,unused-ignore]


@dataclass
class Variant:
    """One plan at one parallel shape (TP x PP) with its audit, predictions and engine flags."""

    plan: Plan
    tp: int
    pp: int
    audit: PlanAudit
    predictions: dict[str, Any] = field(default_factory=dict)  # workload name -> PlanPrediction
    prediction_error: str | None = None
    engines: list[EngineRecipe] = field(default_factory=list)

    @property
    def key(self) -> str:
        """Readable label: the plan name, plus the shape when it is not the report's main one."""
        return self.plan.name if self.pp == 1 else f"{self.plan.name} TP{self.tp}xPP{self.pp}"

    @property
    def legal(self) -> bool:
        return self.audit.legal


@dataclass(frozen=True)
class Verdict:
    key: str
    status: str  # "reference" | "NO" | "YES" | "CONDITIONAL"
    headline: str
    reasons: tuple[str, ...]
    formula: str


@dataclass(frozen=True)
class NextStep:
    key: str
    gain: float  # seconds (predicted) or fraction of bytes (volume basis)
    basis: str
    price: str
    engine: str


@dataclass(frozen=True)
class BoundaryRow:
    """One row of the hand-derived attention-input table (path, its formula and units), beside the
    plan that realises it and the units and formula tpplan derives from the graph."""

    path: str
    hand_formula: str
    hand_units: int
    plan: str
    units: float
    legal: bool
    formula: str


@dataclass
class Analysis:
    model: str
    graph: ModelGraph
    topology: Topology
    workloads: list[Workload]
    tp: int
    dtype: str
    variants: list[Variant]
    volume_vs_tp: dict[str, list[tuple[int, float]]]
    boundary_rows: list[BoundaryRow]
    verdicts: list[Verdict]
    next_steps: list[NextStep]
    differences: list[tuple[str, str]]  # (title, paragraph with numbers)
    predictor_note: str | None
    bench: BenchResults | None = None

    def variant(self, key: str) -> Variant | None:
        return next((v for v in self.variants if v.key == key), None)

    @property
    def baseline(self) -> Variant:
        return self.variants[0]


def _gib(b: float) -> str:
    return f"{b / 2**30:,.1f} GiB"


def _pct(x: float, base: float) -> float:
    return 0.0 if not base else 100.0 * (x - base) / base


def attn_formula(res: LayerResult, n: int) -> str:
    """The seed's unit arithmetic for one layer's attention-input boundary, e.g.
    `RS(delta 7168) + AG(qkv_latent 2112) = 7168 + 2112 = 9280`."""
    comms = [c for c in res.comms if c.region == "attn_side" and not c.internal]
    if not comms:
        return "no collective = 0"
    names = " + ".join(f"{_SHORT[c.collective.value]}({c.value.split(':')[0]} {c.width})" for c in comms)
    terms = []
    for c in comms:
        if c.collective is Collective.ALL_REDUCE:
            terms.append(f"2x{c.width}")
        elif c.collective is Collective.ALL_TO_ALL:
            terms.append(f"{c.width}/{n}")
        else:
            terms.append(f"{c.width}")
    total = f"{res.units('attn_side'):g}"
    sums = " + ".join(terms)
    return f"{names} = {total}" if sums == total else f"{names} = {sums} = {total}"


def _mla_kind(graph: ModelGraph) -> str | None:
    return next((k for k, lg in graph.kinds.items() if isinstance(lg.spec.attn, MLASpec)), None)


def _audit_or_none(graph: ModelGraph, name: str, n: int, dtype: str) -> PlanAudit | None:
    try:
        return audit_plan(graph, make_plan(name, graph, n), n, dtype)
    except TpplanError:
        return None


def tp_sizes(graph: ModelGraph, world: int, tp: int) -> list[int]:
    """Powers of two from 2 up to the cluster (and the chosen TP) for the volume sweep."""
    top = max(world, tp)
    sizes = [2**i for i in range(1, int(math.log2(top)) + 1)]
    return sorted({*sizes, tp})


def volume_sweep(
    graph: ModelGraph, names: list[str], sizes: list[int], dtype: str
) -> dict[str, list[tuple[int, float]]]:
    """Bytes per token per rank of each plan at each TP size it can run at (legal or not)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for name in names:
        pts = []
        for n in sizes:
            pa = _audit_or_none(graph, name, n, dtype)
            if pa is not None:
                pts.append((n, pa.comm_bytes_per_token))
        out[name] = pts
    return out


def _predict(
    fn: PredictFn,
    v: Variant,
    graph: ModelGraph,
    topo: Topology,
    workloads: list[Workload],
    dtype: str,
    expert_dtype: str | None,
) -> None:
    extra = {"expert_dtype": expert_dtype} if expert_dtype else {}
    for wl in workloads:
        try:
            v.predictions[wl.name] = fn(
                graph, v.plan, topo, tp=v.tp, pp=v.pp, workload=wl, tokens=wl.chunk_size, dtype=dtype, **extra
            )
        except (TpplanError, NotImplementedError, ValueError) as exc:
            if isinstance(exc, TpplanError) and v.plan.name == "baseline" and v.pp == 1:
                raise  # the baseline always predicts: a failure here is a bad input (e.g. --expert-dtype)
            v.prediction_error = f"{type(exc).__name__}: {exc}"
            v.predictions.clear()
            return


def ttft_mean(v: Variant, workload: str) -> float | None:
    """Predicted mean TTFT of a variant under a workload, when predicted."""
    p = v.predictions.get(workload)
    ttft = getattr(p, "ttft", None) if p is not None else None
    return None if ttft is None else float(ttft.mean_s)


def memory_fit(v: Variant) -> tuple[float, float, bool] | None:
    """(predicted bytes per rank, GPU bytes, fits) from the first prediction, when predicted."""
    p = next(iter(v.predictions.values()), None)
    mem = getattr(p, "memory", None) if p is not None else None
    gpu = float(getattr(p, "gpu_memory_bytes", 0.0) or 0.0)
    if mem is None or not gpu:
        return None
    return float(mem.total), gpu, float(mem.total) <= gpu


def kind_times(v: Variant) -> dict[str, float] | None:
    """Predicted seconds per layer kind for one batch (kind time x layers of that kind)."""
    p = next(iter(v.predictions.values()), None)
    if p is None:
        return None
    out = {k.kind: float(k.total_s) * int(k.count) for k in p.kinds}
    if getattr(p, "stage_comm_s", 0.0):
        out["pipeline send/recv"] = float(p.stage_comm_s)
    return out


def redundant_seconds(v: Variant) -> float | None:
    """Predicted seconds per batch spent on ops every rank repeats on every token."""
    p = next(iter(v.predictions.values()), None)
    if p is None:
        return None
    return sum(float(o.seconds) * int(k.count) for k in p.kinds for o in k.ops if o.redundant)


def _verdict(
    v: Variant, base: Variant, n: int, mla: str | None, wl: str | None, engine: EngineRecipe | None
) -> Verdict:
    kind = mla or next(iter(v.audit.kinds))
    formula = attn_formula(v.audit.kinds[kind].result, n) if kind in v.audit.kinds else ""
    vol = _pct(v.audit.comm_bytes_per_token, base.audit.comm_bytes_per_token)
    t_v = ttft_mean(v, wl) if wl else None
    t_b = ttft_mean(base, wl) if wl else None
    timing = ""
    if t_v is not None and t_b is not None:
        timing = f"; predicted mean TTFT ({wl}) {t_v:.3f} s vs {t_b:.3f} s ({_pct(t_v, t_b):+.1f}%)"
    if v is base:
        fit = memory_fit(v)
        note = (
            (f"predicted memory {_gib(fit[0])} per rank exceeds the GPU's {_gib(fit[1])}: lower --expert-dtype",)
            if fit is not None and not fit[2]
            else ()
        )
        return Verdict(
            v.key, "reference", "Megatron TP: the all-reduce path (the seed's deployment adds EP4)", note, formula
        )
    if v.pp > 1 and not timing:
        return Verdict(
            v.key,
            "OPEN",
            f"TP collectives stay inside a node ({v.audit.comm_bytes_per_token:,.0f} vs "
            f"{base.audit.comm_bytes_per_token:,.0f} bytes per token per rank); the bubble and stage sends need "
            "the time predictor",
            (),
            formula,
        )
    if not v.legal:
        roots = [viol.sentence() for viol in v.audit.violations if not viol.consequence_of]
        ops = sorted({viol.op for viol in v.audit.violations if not viol.consequence_of})
        head = f"illegal: {len(roots)} root edge(s) ({', '.join(ops)}); its {vol:+.1f}% volume is not reachable"
        return Verdict(v.key, "NO", head, tuple(roots), formula)
    if v.prediction_error:
        timing = f"; not predicted ({v.prediction_error})"
    worse = t_v > t_b if (t_v is not None and t_b is not None) else vol > 0
    if t_v is None and vol == 0:
        return Verdict(v.key, "OPEN", head_same(vol, timing), (), formula)
    small = t_v is not None and t_b is not None and not worse and (t_b - t_v) < MIN_GAIN * t_b
    extra = v.audit.replicated_extra_bytes
    head = f"legal; {vol:+.1f}% bytes per token per rank vs baseline{timing}"
    reasons: list[str] = []
    if extra:
        reasons.append(f"replicates weights: +{_gib(extra)} per rank")
    fit, base_fit = memory_fit(v), memory_fit(base)
    if fit is not None and not fit[2]:
        reasons.append(f"predicted memory {_gib(fit[0])} per rank exceeds the GPU's {_gib(fit[1])}")
        if base_fit is not None and base_fit[2]:
            return Verdict(v.key, "NO", head + " (does not fit in memory)", tuple(reasons), formula)
    if engine is not None and engine.blocked:
        failed = "; ".join(c.text for c in engine.conditions if c.met is False)
        reasons.append(f"SGLang would not run it: {failed}")
    elif engine is not None and engine.realises == "no":
        reasons.append(f"no SGLang flag realises it: {engine.summary}")
    if worse:
        return Verdict(v.key, "NO", head + " (more than it saves)", tuple(reasons), formula)
    if small:
        return Verdict(
            v.key, "NO", head + f" (gain under {100 * MIN_GAIN:g}%: within the model's error)", tuple(reasons), formula
        )
    status = "CONDITIONAL" if extra or (engine is not None and engine.realises != "yes") else "YES"
    return Verdict(v.key, status, head, tuple(reasons), formula)


def head_same(vol: float, timing: str) -> str:
    """Headline for a legal plan whose bytes equal the baseline's and that has no time prediction."""
    return f"legal; {vol:+.1f}% bytes per token per rank vs baseline (same traffic: only time can tell){timing}"


def _next_steps(variants: list[Variant], wl: str | None) -> list[NextStep]:
    base = variants[0]
    steps: list[NextStep] = []
    for v in variants[1:]:
        if not v.legal:
            continue
        t_v, t_b = (ttft_mean(v, wl), ttft_mean(base, wl)) if wl else (None, None)
        if t_v is not None and t_b is not None:
            gain, basis = t_b - t_v, f"predicted mean TTFT gain at {wl}"
            if gain < MIN_GAIN * t_b:
                continue
            fit, base_fit = memory_fit(v), memory_fit(base)
            if fit is not None and base_fit is not None and base_fit[2] and not fit[2]:
                continue
        elif v.pp > 1:
            continue  # a different parallel shape: bytes per rank are not comparable without time
        else:
            b0 = base.audit.comm_bytes_per_token
            gain = (b0 - v.audit.comm_bytes_per_token) / b0 if b0 else 0.0
            basis = "communication bytes saved (no time prediction)"
        if gain <= 0:
            continue
        price = f"+{_gib(v.audit.replicated_extra_bytes)} weights/rank" if v.audit.replicated_extra_bytes else "none"
        sgl = next((e for e in v.engines if e.engine == "SGLang"), None)
        engine = "SGLang flags exist" if sgl and sgl.realises == "yes" else (sgl.summary if sgl else "")
        steps.append(NextStep(v.key, gain, basis, price, engine))
    return sorted(steps, key=lambda s: -s.gain)


def _redundant_breakdown(a: Analysis, base: Variant) -> str:
    """The predictor's own account of repeated work under baseline, and of the prototype's trade."""
    p = next(iter(base.predictions.values()), None)
    if p is None:
        return ""
    per_op: dict[str, float] = {}
    for k in p.kinds:
        for o in k.ops:
            if o.redundant:
                per_op[o.op] = per_op.get(o.op, 0.0) + float(o.seconds) * int(k.count)
    total = sum(per_op.values())
    if not total:
        return ""
    top = sorted(per_op.items(), key=lambda x: -x[1])[:4]
    for name in ("qkv_a", "kv_a"):
        if name in per_op and name not in dict(top):
            top.append((name, per_op[name]))
    text = (
        f" The time predictor counts {total * 1e3:,.1f} ms of work every rank repeats per batch under baseline "
        f"({100 * total / float(p.forward_s):.0f}% of the {float(p.forward_s) * 1e3:,.1f} ms forward; largest: "
        + ", ".join(f"`{op}` {t * 1e3:,.1f} ms" for op, t in top)
        + ")."
    )
    lat = a.variant("latent-scattered")
    lp = next(iter(lat.predictions.values()), None) if lat is not None else None
    if lp is not None:
        d = float(p.forward_s) - float(lp.forward_s)
        text += (
            f" Whole batch, the prototype is predicted at {float(lp.forward_s) * 1e3:,.1f} ms vs "
            f"{float(p.forward_s) * 1e3:,.1f} ms ({'-' if d > 0 else '+'}{abs(d) * 1e3:,.1f} ms)."
        )
    return text


def _differences(a: Analysis, wl_chunk: int) -> list[tuple[str, str]]:
    """Where the richer model departs from the seed's volume-only hand analysis, with numbers."""
    out: list[tuple[str, str]] = []
    g, topo, n = a.graph, a.topology, a.tp
    base = a.baseline
    mla = _mla_kind(g)
    nbytes = DTYPE_BYTES[a.dtype]
    counts = g.counts()
    if mla is not None:
        lg = g.kinds[mla]
        red = [
            d
            for d in base.audit.kinds[mla].result.decisions
            if d.compute_share >= 1.0 and d.op.kind is OpKind.LINEAR and d.op.weight_numel and n > 1
        ]
        qkv = next((d for d in red if d.op.name in ("qkv_a", "kv_a")), None)
        if qkv is not None:
            out_w = lg.values[qkv.op.output].width
            k_w = qkv.op.weight_numel // out_w
            t_full = gemm_time(wl_chunk, k_w, out_w, topo.gpu, "bf16")
            t_shard = gemm_time(math.ceil(wl_chunk / n), k_w, out_w, topo.gpu, "bf16")
            ag = collective_time("all_gather", wl_chunk * out_w * nbytes, n, topo).time_s
            m = counts[mla]
            extra = _redundant_breakdown(a, base)
            out.append(
                (
                    "Redundant qkv_a compute under baseline",
                    f"The seed counted bytes only. Under baseline every rank runs `{qkv.op.name}` "
                    f"[{wl_chunk}, {k_w}] x [{k_w}, {out_w}] on all {wl_chunk} tokens of a batch: "
                    f"{t_full * 1e3:.3f} ms per {mla} layer on {topo.gpu.name} vs {t_shard * 1e3:.3f} ms "
                    f"token-sharded over {n} ranks, so {(t_full - t_shard) * m * 1e3:.2f} ms per batch over {m} "
                    f"layers could be saved. The latent all-gather that sharding needs costs "
                    f"{ag * 1e3:.3f} ms per layer ({ag * m * 1e3:.2f} ms per batch) on {topo.name} "
                    f"x{topo.nodes}. "
                    + (
                        f"So the seed's prototype (latent-scattered) loses on time as well as on bytes here: "
                        f"{(ag - t_full + t_shard) * m * 1e3:.2f} ms per batch."
                        if ag > t_full - t_shard
                        else f"So, on these two terms alone, the seed's prototype would gain "
                        f"{(t_full - t_shard - ag) * m * 1e3:.2f} ms per batch although it moves more bytes: the "
                        "byte count alone cannot decide it; the whole-batch time (with launch latency and the rest "
                        "of the layer) does."
                    )
                    + extra,
                )
            )
    ga = a.variant("gate-aware")
    if ga is not None and ga.legal:
        vol = _pct(ga.audit.comm_bytes_per_token, base.audit.comm_bytes_per_token)
        mem = ga.audit.weight_bytes_per_rank
        share = ga.audit.replicated_extra_bytes / (topo.gpu.memory_GiB * 2**30)
        p = next(iter(ga.predictions.values()), None)
        pmem = getattr(p, "memory", None)
        bp = next(iter(base.predictions.values()), None)
        bmem = getattr(bp, "memory", None)
        t = ""
        if a.workloads and ttft_mean(ga, a.workloads[0].name) is not None:
            w = a.workloads[0].name
            t = f" Predicted mean TTFT at {w}: {ttft_mean(ga, w):.3f} s vs {ttft_mean(base, w):.3f} s baseline."
        colls = ", ".join(f"{_SHORT[k]} x{c}" for k, c in sorted(ga.audit.collective_counts().items()))
        out.append(
            (
                "The gate-aware plan: price and gain",
                f"The seed asked for a gate-aware design but did not price it. tpplan finds it by repairing "
                f"input-scattered: every column-parallel projection that would read the token-sharded hidden is "
                f"replicated and its output all-to-all'd to head-sharded. It is legal and moves {vol:+.1f}% bytes "
                f"per token per rank ({colls} per forward) for +{_gib(ga.audit.replicated_extra_bytes)} of "
                f"replicated weights per rank, {100 * share:.0f}% of a {topo.gpu.memory_GiB:g} GiB "
                f"{topo.gpu.name} ("
                + (
                    f"predicted memory per rank {_gib(pmem.total)} vs {_gib(bmem.total)} under baseline"
                    if pmem is not None and bmem is not None
                    else f"weights at {a.dtype}: {_gib(mem)} per rank vs {_gib(base.audit.weight_bytes_per_rank)} "
                    "under baseline"
                )
                + f"). That memory comes out of the KV cache. No engine ships it.{t}",
            )
        )
    moe = a.variant("sp-moe")
    if moe is not None and moe.legal:
        vol = _pct(moe.audit.comm_bytes_per_token, base.audit.comm_bytes_per_token)
        t = ""
        if a.workloads and ttft_mean(moe, a.workloads[0].name) is not None:
            w = a.workloads[0].name
            t = f" Predicted mean TTFT at {w}: {ttft_mean(moe, w):.3f} s vs {ttft_mean(base, w):.3f} s baseline."
        out.append(
            (
                "MoE all-to-all (the seed's next step 2)",
                f"The seed recommended it without numbers. SP-MoE with DeepEP-style dispatch/combine (uniform "
                f"routing, per-rank dedup) moves {vol:+.1f}% bytes per token per rank vs baseline at TP{n}, for "
                f"+{_gib(moe.audit.replicated_extra_bytes)} per rank of replicated shared experts, router and "
                f"latent projections. It turns off SGLang's input-scattered gate (moe_a2a_backend must be none), "
                f"which costs nothing here because input-scattered is illegal on this model anyway.{t}",
            )
        )
    found = [v for v in a.variants if v.plan.found_by == "search"]
    w0 = a.workloads[0].name if a.workloads else None
    if found and w0 and ttft_mean(found[0], w0) is not None:
        f = found[0]
        named_same = [
            v for v in a.variants if v.pp == 1 and v.plan.found_by != "search" and v.legal and ttft_mean(v, w0)
        ]
        best = min(named_same, key=lambda v: ttft_mean(v, w0) or math.inf) if named_same else None
        cmp = (
            f" The best named plan at the same shape, `{best.key}`, is predicted at {ttft_mean(best, w0):.3f} s."
            if best is not None
            else ""
        )
        out.append(
            (
                "A plan nobody named",
                f"The search (`tpplan.search`, roofline objective over the workload's batches) returns `{f.key}`: "
                f"{f.plan.summary} Predicted mean TTFT at {w0}: {ttft_mean(f, w0):.3f} s vs "
                f"{ttft_mean(base, w0):.3f} s baseline, for +{_gib(f.audit.replicated_extra_bytes)} of replicated "
                f"weights per rank.{cmp} It mixes the seed's ideas per layer kind, which no engine flag expresses.",
            )
        )
    pps = [v for v in a.variants if v.pp > 1]
    pp = pps[0] if pps else None
    if pp is not None:
        vol_rank = pp.audit.comm_bytes_per_token
        t = ""
        if a.workloads and ttft_mean(pp, a.workloads[0].name) is not None:
            w = a.workloads[0].name
            t = f" Predicted mean TTFT at {w}: {ttft_mean(pp, w):.3f} s vs {ttft_mean(base, w):.3f} s at TP{n}."
        elif pp.prediction_error:
            t = f" Not predicted: {pp.prediction_error}."
        else:
            t = " Its time, bubble and stage send/recv need the time predictor."
        for other in pps[1:]:
            if a.workloads and ttft_mean(other, a.workloads[0].name) is not None:
                t += f" Combined with MoE all-to-all (`{other.key}`): {ttft_mean(other, a.workloads[0].name):.3f} s."
        out.append(
            (
                "Pipeline parallelism (the seed's next step 3)",
                f"TP{pp.tp} x PP{pp.pp} keeps every tensor-parallel collective inside one NVLink node: "
                f"{vol_rank:,.0f} bytes per token per rank within the node vs {base.audit.comm_bytes_per_token:,.0f} "
                f"at TP{n} across {topo.nodes} nodes, plus {pp.pp - 1} stage boundaries that send each token's "
                f"hidden ({g.hidden} x {nbytes} B, and K3's attention-residual bank) once each.{t}",
            )
        )
    return out


def analyse(
    model: str | ModelGraph,
    topology: Topology,
    workloads: list[Workload],
    *,
    tp: int | None = None,
    dtype: str = "bf16",
    expert_dtype: str | None = None,
    plans: list[str] | None = None,
    predictor: PredictFn | None = None,
    use_default_predictor: bool = True,
    search_top: int = 1,
    bench: BenchResults | None = None,
) -> Analysis:
    """Audit, predict and judge every plan; `tp` defaults to the whole topology."""
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph

    graph = model if isinstance(model, ModelGraph) else build_model_graph(load_model(model))
    world = topology.world_size
    n = tp or world
    if n > world:
        raise TpplanError(f"--tp {n}", f"topology {topology.name} has only {world} GPUs", f"use --tp {world} or less")
    if dtype not in DTYPE_BYTES:
        raise TpplanError(f"--dtype {dtype}", "unknown dtype", f"choose one of {', '.join(DTYPE_BYTES)}")
    fn = predictor or (load_predictor() if use_default_predictor else None)
    note = None
    if fn is None:
        note = (
            "Time, memory and TTFT predictions are not in this build (tpplan.cost.predict is missing); "
            "the verdicts below rest on the audit's volumes, legality and memory, as the seed's did."
        )
    names = list(dict.fromkeys(["baseline", *(plans or REPORT_PLANS)]))
    variants: list[Variant] = []
    for name in names:
        if name == "baseline" or plans:
            pl = make_plan(name, graph, n)  # asked for: an unknown or impossible plan is the user's error
            variants.append(Variant(pl, n, 1, audit_plan(graph, pl, n, dtype)))
            continue
        pa = _audit_or_none(graph, name, n, dtype)  # a default plan this model cannot run is left out
        has_moe = any(isinstance(layer.mlp, MoESpec) for layer in graph.spec.layers)
        if pa is not None and (has_moe or pa.plan.moe != "ep"):
            variants.append(Variant(pa.plan, n, 1, pa))
    finder = load_search() if search_top > 0 and not plans else None
    if finder is not None:
        known = {v.plan.describe().__repr__() for v in variants}
        found = finder(graph, n, topology, workloads[0] if workloads else None, dtype, search_top)
        for i, pl in enumerate(found, 1):
            if repr(pl.describe()) in known:
                continue  # the search's best is a named plan already in the memo
            pl = pl.with_(name=f"search-{i}", title="found by search", summary=describe_plan(pl), found_by="search")
            variants.append(Variant(pl, n, 1, audit_plan(graph, pl, n, dtype)))
    if topology.nodes > 1 and n == world and world % topology.gpus_per_node == 0:
        pp_tp, pp = topology.gpus_per_node, topology.nodes
        for name in ("baseline", "sp-moe"):  # the seed's next steps 2 and 3, alone and together
            if not any(v.plan.name == name for v in variants):
                continue
            pa = _audit_or_none(graph, name, pp_tp, dtype)
            if pa is not None and pa.legal:
                variants.append(Variant(pa.plan, pp_tp, pp, pa))
    for v in variants:
        v.engines = recipes(
            v.plan,
            graph.spec,
            tp=v.tp,
            pp=v.pp,
            nodes=topology.nodes,
            chunk=workloads[0].chunk_size if workloads else 8192,
        )
        if fn is not None:
            _predict(fn, v, graph, topology, workloads, dtype, expert_dtype)
    mla = _mla_kind(graph)
    named = [v.plan.name for v in variants if v.pp == 1 and v.plan.found_by != "search"]  # found plans are per-TP
    sweep = volume_sweep(graph, named, tp_sizes(graph, world, n), dtype)
    boundary_rows: list[BoundaryRow] = []
    if mla is not None:
        spec = graph.kinds[mla].spec.attn
        assert isinstance(spec, MLASpec)
        H, L = graph.hidden, spec.latent_width
        rows = [
            ("original hidden all-reduce", "2H", 2 * H, "baseline"),
            ("ideal DeepSeek path: hidden RS + latent AG", "H + L", H + L, "input-scattered"),
            ("restore the gate's hidden: RS + hidden AG + latent AG", "2H + L", 2 * H + L, "input-scattered+restore"),
            ("minimal prototype: keep hidden AR + latent AG", "2H + L", 2 * H + L, "latent-scattered"),
        ]
        for path, f, units, plan_name in rows:
            v = next((x for x in variants if x.key == plan_name), None)
            if v is None:
                continue
            res = v.audit.kinds[mla].result
            row = BoundaryRow(path, f, units, plan_name, res.units("attn_side"), v.legal, attn_formula(res, n))
            boundary_rows.append(row)
    wl = workloads[0].name if workloads else None
    base = variants[0]
    verdicts = [
        _verdict(v, base, v.tp, mla, wl, next((e for e in v.engines if e.engine == "SGLang"), None)) for v in variants
    ]
    a = Analysis(
        graph.spec.name, graph, topology, workloads, n, dtype, variants, sweep, boundary_rows, verdicts,
        _next_steps(variants, wl), [], note, bench,
    )  # fmt: skip
    a.differences = _differences(a, workloads[0].chunk_size if workloads else 8192)
    return a
