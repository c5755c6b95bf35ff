"""Whole-model TTFT extrapolated from a bench slice to a target topology (see `TTFT_METHOD`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from tpplan.bench.config import BenchConfig, op_category, op_kind_name
from tpplan.bench.model_slice import ModelSlice
from tpplan.bench_results import CollectiveResult, OpResult, TTFTExtrapolation
from tpplan.cost.workload import PrefillBatch, Workload, simulate_ttft
from tpplan.mesh import Mesh

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
    from tpplan.cost.predict import cached_predictor, predict_plan, segments_of
    from tpplan.cost.topology import load_topology
    from tpplan.plans.named import make_plan

    assert cfg.target_topology is not None
    topo = load_topology(cfg.target_topology, cfg.target_nodes)
    full = sl.full
    tp = topo.world_size
    plan = make_plan(plan_name, full, tp)
    ratios = category_ratios(ops, colls)
    p = cached_predictor(full, plan, topo, Mesh(tp, pp=1), "bf16", None)

    def scaled(batch: PrefillBatch) -> float:
        segs = segments_of(batch)
        total = 0.0
        for res in p.audit.layer_results:
            kt = p.kind_time(res, segs)
            for o in kt.ops:
                cat = op_category(op_kind_name(full, res.kind, o.op), o.category)
                total += o.seconds * ratios.get(cat, 1.0)
            total += kt.comm_s * ratios.get("comm", 1.0)
        return total + p.final_seconds(segs) * ratios.get("comm", 1.0)

    got = simulate_ttft(wl, scaled)
    plain = predict_plan(full, plan, topo, mesh=Mesh(tp), workload=wl, tokens=wl.chunk_size)
    name = topo.name + (f" x{cfg.target_nodes} nodes" if cfg.target_nodes else "")
    return TTFTExtrapolation(
        topology=f"{name} (TP{tp})",
        workload=wl.name,
        mean_s=got.mean_s,
        p50_s=got.p50_s,
        max_s=got.max_s,
        predicted_mean_s=plain.ttft.mean_s if plain.ttft else None,
        target=topo.name,
        nodes=topo.nodes,
        tp=tp,
    )
