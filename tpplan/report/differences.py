"""Where tpplan's richer model departs from a volume-only hand analysis: one paragraph per topic.

Each function returns (title, paragraph) or None, and states a fact only when the analysis holds
it: a paragraph about the MLA latent exists only for a model with one, the attention-residual bank
is mentioned only when the model has it, an engine's verdict comes from its recipe, and a
consequence ("costs nothing here") only from the verdict table it refers to.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from tpplan.cost.collectives import collective_time
from tpplan.cost.gemm import gemm_time
from tpplan.dtypes import DTYPE_BYTES
from tpplan.engines.recipes import family
from tpplan.models.opkinds import op_kind
from tpplan.models.spec import MLASpec, MoESpec
from tpplan.placement import COLLECTIVE_SHORT
from tpplan.report.results import Analysis, Variant, held_weights, ttft_mean
from tpplan.units import GIB, gib, pct_change

Paragraph = tuple[str, str] | None


def _first_prediction(v: Variant | None) -> object | None:
    return next(iter(v.predictions.values()), None) if v is not None else None


def _ttft_sentence(a: Analysis, v: Variant) -> str:
    """' Predicted mean TTFT at W: x s vs y s for today's `ref`.' when both are predicted."""
    w = a.first_workload
    ref = a.current
    t, t0 = (ttft_mean(v, w), ttft_mean(ref, w)) if w else (None, None)
    if t is None or t0 is None:
        return ""
    return f" Predicted mean TTFT at {w}: {t:.3f} s vs {t0:.3f} s for today's `{ref.key}` ({pct_change(t, t0):+.1f}%)."


def _redundant_breakdown(a: Analysis, base: Variant) -> str:
    """The predictor's own account of repeated work under baseline, and of the latent prototype's trade."""
    p = _first_prediction(base)
    if p is None:
        return ""
    per_op: dict[str, float] = {}
    for k in p.kinds:  # type: ignore[attr-defined]
        for o in k.ops:
            if o.redundant:
                per_op[o.op] = per_op.get(o.op, 0.0) + float(o.seconds) * int(k.count)
    total = sum(per_op.values())
    if not total:
        return ""
    fwd = float(p.forward_s)  # type: ignore[attr-defined]
    top = sorted(per_op.items(), key=lambda x: -x[1])[:4]
    for name in ("qkv_a", "kv_a"):
        if name in per_op and name not in dict(top):
            top.append((name, per_op[name]))
    text = (
        f" The time predictor counts {total * 1e3:,.1f} ms of work every rank repeats per batch under baseline "
        f"({100 * total / fwd:.0f}% of the {fwd * 1e3:,.1f} ms forward; largest: "
        + ", ".join(f"`{op}` {t * 1e3:,.1f} ms" for op, t in top)
        + ")."
    )
    lp = _first_prediction(a.variant("latent-scattered"))
    if lp is not None:
        d = fwd - float(lp.forward_s)  # type: ignore[attr-defined]
        text += (
            f" Whole batch, `latent-scattered` is predicted at {float(lp.forward_s) * 1e3:,.1f} ms vs "  # type: ignore[attr-defined]
            f"{fwd * 1e3:,.1f} ms ({'-' if d > 0 else '+'}{abs(d) * 1e3:,.1f} ms)."
        )
    return text


def redundant_latent(a: Analysis, chunk: int) -> Paragraph:
    """Baseline repeats the MLA latent GEMM on every rank; sharding it costs a latent all-gather."""
    g, topo, n, base = a.graph, a.topology, a.tp, a.baseline
    mla = next((k for k, lg in g.kinds.items() if isinstance(lg.spec.attn, MLASpec)), None)
    if mla is None or n <= 1 or mla not in base.audit.kinds:
        return None
    red = [
        d
        for d in base.audit.kinds[mla].result.decisions
        if d.compute_share >= 1.0 and op_kind(d.op.kind).linear and d.op.weight_numel
    ]
    qkv = next((d for d in red if d.op.name in ("qkv_a", "kv_a")), None)
    if qkv is None:
        return None
    out_w = g.kinds[mla].values[qkv.op.output].width
    k_w = qkv.op.weight_numel // out_w
    t_full = gemm_time(chunk, k_w, out_w, topo.gpu, "bf16")
    t_shard = gemm_time(math.ceil(chunk / n), k_w, out_w, topo.gpu, "bf16")
    ag = collective_time("all_gather", chunk * out_w * DTYPE_BYTES[a.dtype], n, topo).time_s
    m = g.counts()[mla]
    lat = a.variant("latent-scattered")
    more_bytes = lat is not None and lat.audit.comm_bytes_per_token > base.audit.comm_bytes_per_token
    if ag > t_full - t_shard:
        verdict = (
            f"So token-sharding it (`latent-scattered`) loses on these two terms: "
            f"{(ag - t_full + t_shard) * m * 1e3:.2f} ms more per batch"
            + (", on top of moving more bytes." if more_bytes else ".")
        )
    else:
        verdict = (
            f"So, on these two terms alone, token-sharding it would gain {(t_full - t_shard - ag) * m * 1e3:.2f} ms "
            "per batch"
            + (" although it moves more bytes: bytes alone cannot decide it" if more_bytes else "")
            + "; the whole-batch time (with launch latency and the rest of the layer) does."
        )
    lead = "The seed counted bytes only. " if a.asks_the_seed_question else "A byte count misses repeated compute. "
    return (
        f"Redundant {qkv.op.name} compute under baseline",
        lead + f"Under baseline every rank runs `{qkv.op.name}` [{chunk}, {k_w}] x [{k_w}, {out_w}] on all "
        f"{chunk} tokens of a batch: {t_full * 1e3:.3f} ms per {mla} layer on {topo.gpu.name} vs {t_shard * 1e3:.3f} "
        f"ms token-sharded over {n} ranks, so {(t_full - t_shard) * m * 1e3:.2f} ms per batch over {m} layers could "
        f"be saved. The latent all-gather that sharding needs costs {ag * 1e3:.3f} ms per layer "
        f"({ag * m * 1e3:.2f} ms per batch) on {topo.name} x{topo.nodes}. " + verdict + _redundant_breakdown(a, base),
    )


def gate_aware_price(a: Analysis, chunk: int) -> Paragraph:
    """The repaired plan's replication price, when the repair replicated anything on this model."""
    ga = a.variant("gate-aware")
    if ga is None or not ga.legal or not held_weights(ga)[1] or ga.key in a.same_as:
        return None
    base, topo = a.current, a.topology
    vol = pct_change(ga.audit.comm_bytes_per_token, base.audit.comm_bytes_per_token)
    share = held_weights(ga)[1] / (topo.gpu.memory_GiB * GIB)
    pmem = getattr(_first_prediction(ga), "memory", None)
    bmem = getattr(_first_prediction(base), "memory", None)
    colls = ", ".join(f"{COLLECTIVE_SHORT[k]} x{c}" for k, c in sorted(ga.audit.collective_counts().items()))
    ops = sorted({r.rsplit(".", 1)[-1] for r in ga.plan.replicate})
    mem = (
        f"predicted memory per rank {gib(pmem.total)} vs {gib(bmem.total)} under `{base.key}`"
        if pmem is not None and bmem is not None
        else f"weights as stored: {gib(held_weights(ga)[0])} per rank vs "
        f"{gib(held_weights(base)[0])} under `{base.key}`"
    )
    engines = [e for e in ga.engines if e.realises == "no"]
    ships = (
        " No engine flag realises it."
        if len(engines) == len(ga.engines)
        else " " + "; ".join(f"{e.engine}: {e.summary}" for e in ga.engines) + "."
    )
    lead = "The seed asked for a gate-aware design but did not price it. " if a.asks_the_seed_question else ""
    return (
        "The gate-aware plan: price and gain",
        lead + "tpplan finds it by repairing input-scattered: every column-parallel projection that would read "
        "the token-sharded hidden is replicated and its output all-to-all'd to head-sharded (here: "
        + ", ".join(f"`{o}`" for o in ops)
        + f"). It is legal and moves {vol:+.1f}% bytes per token per rank vs `{base.key}` ({colls} per forward) "
        f"for +{gib(held_weights(ga)[1])} of replicated weights per rank, {100 * share:.0f}% of a "
        f"{topo.gpu.memory_GiB:g} GiB {topo.gpu.name} ({mem}). That memory comes out of the KV cache."
        + ships
        + _ttft_sentence(a, ga),
    )


def _moe_replicated(moe: MoESpec) -> str:
    parts = ["the router"]
    if moe.shared_intermediate:
        parts.insert(0, "shared experts")
    if moe.latent:
        parts.append("the latent projections")
    return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]


def moe_all_to_all(a: Analysis, chunk: int) -> Paragraph:
    """MoE all-to-all's volume and price, and what it does to SGLang's input-scattered gate here."""
    moe_v = a.variant("sp-moe")
    moe = next((layer.mlp for layer in a.graph.spec.layers if isinstance(layer.mlp, MoESpec)), None)
    if moe_v is None or moe is None or not moe_v.legal:
        return None
    base = a.current
    vol = pct_change(moe_v.audit.comm_bytes_per_token, base.audit.comm_bytes_per_token)
    text = (
        ("The seed recommended it without numbers. " if a.asks_the_seed_question else "")
        + f"SP-MoE with DeepEP-style dispatch/combine (uniform routing, per-rank dedup) moves {vol:+.1f}% bytes per "
        f"token per rank vs `{base.key}` at TP{moe_v.tp}, for +{gib(held_weights(moe_v)[1])} per rank "
        f"of replicated {_moe_replicated(moe)}."
    )
    scat = a.variant("input-scattered")
    vd = a.verdict("input-scattered")
    if scat is not None and vd is not None and any(e.engine == "SGLang" for e in moe_v.engines):
        text += " In SGLang it turns off the input-scattered gate (moe_a2a_backend must be none)"
        if not scat.legal:
            text += ", which costs nothing here: input-scattered is illegal on this model."
        elif vd.status in ("YES", "CONDITIONAL"):
            text += (
                f", and input-scattered is a {vd.status} on this model: the two cannot be combined there; compare "
                "their TTFT in the table above."
            )
        else:
            text += f"; input-scattered's own verdict here is {vd.status}, so little is lost."
    title = "MoE all-to-all" + (" (the seed's next step 2)" if a.asks_the_seed_question else "")
    return (title, text + _ttft_sentence(a, moe_v))


def found_plan(a: Analysis, chunk: int) -> Paragraph:
    """The search's best plan, when it is not a named one, against the best named plan."""
    w0 = a.first_workload
    found = [v for v in a.variants if v.plan.found_by == "search"]
    if not found or not w0 or ttft_mean(found[0], w0) is None:
        return None
    f = found[0]
    named = [
        v for v in a.variants if v.shape == f.shape and v.plan.found_by != "search" and v.legal and ttft_mean(v, w0)
    ]
    best = min(named, key=lambda v: ttft_mean(v, w0) or math.inf) if named else None
    cmp = (
        f" The best named plan at the same shape, `{best.key}`, is predicted at {ttft_mean(best, w0):.3f} s."
        if best is not None
        else ""
    )
    fam = family(f.plan)
    ships = (
        " No engine flag expresses its per-layer-kind mix."
        if all(e.realises == "no" for e in f.engines)
        else f" Its decisions match the `{fam}` family, which engine flags realise (see Engine flags)."
    )
    return (
        "A plan nobody named",
        f"The search (`tpplan.search`, roofline objective over the workload's batches) returns `{f.key}`: "
        f"{f.plan.summary} Predicted mean TTFT at {w0}: {ttft_mean(f, w0):.3f} s, for "
        f"+{gib(held_weights(f)[1])} of replicated weights per rank.{cmp}{ships}",
    )


def pipeline(a: Analysis, chunk: int) -> Paragraph:
    """TP inside a node x PP across nodes: what crosses a stage boundary, and the predicted time."""
    from tpplan.cost.predict import bank_snapshots, stage_boundary_width, stage_layers

    pps = [v for v in a.variants if v.pp > 1]
    if not pps:
        return None
    pp, g, topo = pps[0], a.graph, a.topology
    starts = [r.start for r in stage_layers(g.spec.num_layers, pp.parallel)][1:]
    widths = [stage_boundary_width(g, s) for s in starts]
    banks = [bank_snapshots(g, s) for s in starts]
    nbytes = DTYPE_BYTES[a.dtype]
    what = "hidden state and residual"
    if g.spec.attn_res_block_size:  # the stream with its residual folded in, and the bank (lower/stages.py)
        what = f"stream (its residual folded in), plus the attention-residual bank ({min(banks)}-{max(banks)} snapshots"
        what += f" of {g.hidden})"
    t = _ttft_sentence(a, pp)
    if not t and pp.prediction_error:
        t = f" Not predicted: {pp.prediction_error}."
    elif not t:
        t = " Its time, bubble and stage send/recv need the time predictor."
    w = a.first_workload
    for other in pps[1:]:
        tt = ttft_mean(other, w) if w else None
        if tt is not None:
            t += f" `{other.key}`: {tt:.3f} s."
    link = "PCIe" if topo.intra.kind == "pcie" else "NVLink"
    return (
        "Pipeline parallelism" + (" (the seed's next step 3)" if a.asks_the_seed_question else ""),
        f"TP{pp.tp} x PP{pp.pp} keeps every tensor-parallel collective inside one {link} node: "
        f"{pp.audit.comm_bytes_per_token:,.0f} bytes per token per rank within the node vs "
        f"{a.baseline.audit.comm_bytes_per_token:,.0f} for baseline at TP{a.tp} across {topo.nodes} nodes, plus "
        f"{pp.pp - 1} stage boundaries that each send every token's {what}: {min(widths):,}-{max(widths):,} values "
        f"x {nbytes} B.{t}",
    )


PARAGRAPHS: tuple[Callable[[Analysis, int], Paragraph], ...] = (
    redundant_latent,
    gate_aware_price,
    moe_all_to_all,
    found_plan,
    pipeline,
)


def differences(a: Analysis, chunk: int) -> list[tuple[str, str]]:
    """Every paragraph whose facts this analysis holds, in the memo's order."""
    return [p for f in PARAGRAPHS if (p := f(a, chunk)) is not None]


__all__ = ["PARAGRAPHS", "differences"]
