"""The audit: a plan's legality and communication for a whole model at one TP size.

`audit_plan` runs the propagation over every layer (cached per layer kind and entry
placement), adds the reduction before the final norm, and sums volumes per token per rank.
`audit` does it for several plans and adds deltas against the baseline; `Audits` keeps them, one
per (plan, TP, dtype) of a graph, for the stages after it (prediction, search, report) to share.
Everything here is pure Python; `to_json` gives the stable JSON documented in docs/audit-json.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from tpplan.dtypes import DTYPE_BYTES, WEIGHT_BITS
from tpplan.errors import TpplanError
from tpplan.layout.dp_attention import stream_reduction
from tpplan.layout.plan import Plan
from tpplan.layout.propagate import CommEvent, LayerResult, Violation, propagate_model
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import ModelGraph, Op, build_model_graph
from tpplan.models.opkinds import op_kind
from tpplan.models.quant import op_weights
from tpplan.placement import P
from tpplan.plans.named import NAMED_PLANS, make_plan
from tpplan.units import pct_change_json


class PredictionJSON(Protocol):
    """What `to_json` needs of a plan's prediction (`tpplan.cost.predict.PlanPrediction`, which
    imports this module: the cost model sits above the audit)."""

    @property
    def plan(self) -> Plan: ...
    @property
    def topology(self) -> str: ...
    @property
    def workload(self) -> str | None: ...
    @property
    def pp(self) -> int: ...

    def to_json(self) -> dict[str, object]: ...


JSON_SCHEMA_VERSION = 3  # 3: weight figures in the stored dtype, embedding included, per PP stage


def check_expert_dtype(graph: ModelGraph, expert_dtype: str | None) -> None:
    """A routed-experts format asked of a model without routed experts would change nothing: the commands
    refuse it rather than ignore it (library callers may price every model with one format)."""
    if expert_dtype is not None and not graph.has_routed_experts:
        raise TpplanError(
            f"expert_dtype={expert_dtype}", f"{graph.spec.name} has no routed experts for it to set", "drop it"
        )


class StoredWeights:
    """Stored bytes per weight element of each op, as the checkpoint holds it: the config's
    `quantization_config` read (`tpplan.models.quant`), the rest in the activation dtype, and
    `expert_dtype` (`--expert-dtype`) overriding the routed experts. The one place every memory
    figure (audit, prediction, search, memo) takes weight bytes from."""

    def __init__(self, graph: ModelGraph, dtype: str = "bf16", expert_dtype: str | None = None) -> None:
        if expert_dtype is not None and expert_dtype not in WEIGHT_BITS:
            raise TpplanError(
                f"expert_dtype={expert_dtype}", "unknown weight dtype", f"choose one of {', '.join(WEIGHT_BITS)}"
            )
        self.graph = graph
        self.dtype_bytes = float(DTYPE_BYTES[dtype])
        self.op_weights = op_weights(graph)
        self.expert_override = expert_dtype is not None
        self.expert_bytes = WEIGHT_BITS[expert_dtype or dtype] / 8.0
        self.experts_fp8 = False  # the checkpoint's experts run their GEMMs at the FP8 rate
        for (kind, name), w in self.op_weights.items():
            op = next(o for o in graph.kinds[kind].ops if o.name == name)
            if op_kind(op.kind).routed_experts and not self.expert_override:
                self.expert_bytes = w.full_bytes / op.weight_numel
                self.experts_fp8 = w.fmt.compute == "fp8"

    def per_element(self, kind: str, op: Op) -> float:
        """Stored bytes per weight element of `op` in layer kind `kind` (scales included)."""
        if op_kind(op.kind).routed_experts:
            return self.expert_bytes
        w = self.op_weights.get((kind, op.name))
        return w.full_bytes / op.weight_numel if w is not None else self.dtype_bytes


@dataclass(frozen=True)
class WeightMemory:
    """Weight bytes one rank of one pipeline stage holds, in the stored dtype: every layer of the
    stage under the plan, plus the vocab-parallel embedding (first stage) and LM head (last stage,
    or the first when tied). `replicated_extra` is part of `weights`: what replication costs beyond
    sharding those ops over TP, shown apart because it is a plan's price."""

    weights: float
    replicated_extra: float


def _layer_weight_terms(res: LayerResult, stored: StoredWeights, n: int) -> tuple[list[float], list[float]]:
    """One layer's weight bytes per rank, op by op, and what replication adds, op by op."""
    weights, extra = [], []
    for d in res.decisions:
        wb = stored.per_element(res.kind, d.op)
        weights.append(d.weight_elements_per_rank * wb)
        if d.split == "replicated" and d.op.split.value in ("col", "row"):
            extra.append((d.op.weight_numel - d.op.weight_numel / n) * wb)
    return weights, extra


def layer_weight_bytes(res: LayerResult, stored: StoredWeights, n: int) -> float:
    """One layer's weight bytes on one rank of TP `n` (`stage_weights`' per-layer figure; the MTP draft's
    nextn layer, `tpplan.cost.draft`)."""
    total = 0.0
    for t in _layer_weight_terms(res, stored, n)[0]:
        total += t
    return total


def stage_weights(
    pa: PlanAudit, graph: ModelGraph, stages: Sequence[range], stored: StoredWeights
) -> list[WeightMemory]:
    """Per pipeline stage (`stages`: the layers each holds), the weight memory one rank holds."""
    spec, n = graph.spec, pa.n
    embed = spec.vocab * spec.hidden / n * stored.dtype_bytes  # vocab-parallel embedding and head
    # DP attention: every rank looks its own tokens up in the whole embedding table (the head stays
    # vocab-parallel); the table beyond its vocab slice is replication (docs/design.md, "DP attention").
    embed_in = spec.vocab * spec.hidden * stored.dtype_bytes if pa.plan.dp_attention else embed
    # Layers of a kind mostly share one result: its per-op terms are computed once and added in
    # layer order (the same additions as op by op, so the figure is bit-for-bit the same).
    terms: dict[int, tuple[list[float], list[float]]] = {}
    out = []
    for s, rng in enumerate(stages):
        weights = extra = 0.0
        for j in rng:
            res = pa.layer_results[j]
            hit = terms.get(id(res))
            if hit is None:
                hit = terms[id(res)] = _layer_weight_terms(res, stored, n)
            for t in hit[0]:
                weights += t
            for t in hit[1]:
                extra += t
        if s == 0:
            weights += embed_in
            extra += embed_in - embed
        if s == len(stages) - 1 and (not spec.tie_embeddings or len(stages) > 1):
            weights += embed
        out.append(WeightMemory(weights, extra))
    return out


@dataclass(frozen=True)
class KindSummary:
    kind: str
    count: int
    result: LayerResult  # as the layer most often sees its input

    @property
    def legal(self) -> bool:
        return self.result.legal


@dataclass(frozen=True)
class PlanAudit:
    """One plan audited over every layer at TP `n`: its legality, communication and weights."""

    plan: Plan
    n: int
    dtype_bytes: int
    kinds: dict[str, KindSummary]
    layer_results: list[LayerResult]
    final_elements_per_token: float
    final_units: float
    weight_bytes_per_rank: float  # stored dtype, whole model on one stage (PP 1), embedding included
    replicated_extra_bytes: float  # what replication costs beyond the sharded baseline (part of the above)
    violations: list[Violation] = field(default_factory=list)

    @property
    def legal(self) -> bool:
        return not self.violations

    @property
    def comm_elements_per_token(self) -> float:
        return sum(r.elements_per_token() for r in self.layer_results) + self.final_elements_per_token

    @property
    def comm_bytes_per_token(self) -> float:
        return self.comm_elements_per_token * self.dtype_bytes

    @property
    def units(self) -> float:
        return sum(r.units() for r in self.layer_results) + self.final_units

    def collective_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.layer_results:
            for c in r.comms:
                counts[c.collective.value] = counts.get(c.collective.value, 0) + 1
        return counts


def audit_plan(graph: ModelGraph, plan: Plan, n: int, dtype: str = "bf16") -> PlanAudit:
    """Audit one plan over every layer of the model."""
    if n < 1:
        raise TpplanError(f"tp={n}", "the TP size must be at least 1", "use tp=1 or more")
    if dtype not in DTYPE_BYTES:
        raise TpplanError(f"dtype={dtype}", "unknown dtype", f"choose one of {', '.join(DTYPE_BYTES)}")
    nbytes = DTYPE_BYTES[dtype]
    walk = propagate_model(graph, plan, n, nbytes)
    cache, results, seen_by_kind, delta = walk.by_entry, walk.results, walk.entries, walk.exit_delta
    # The last block's output is reduced into the stream before the final norm.
    final_el = final_units = 0.0
    if delta is P:
        final = stream_reduction(plan)  # all-reduce into R, reduce-scatter into S(tok) (DP SUM_LEN: all-reduce)
        final_el = final.elements_per_rank(graph.hidden, 0, n)
        final_units = final.relative_units(graph.hidden, 0, n)
    counts = graph.counts()
    kinds: dict[str, KindSummary] = {}
    for kind in graph.kinds:
        seen = seen_by_kind.get(kind, {})
        typical = max(seen, key=lambda d: seen[d]) if any(seen.values()) else str(P)
        res = cache.get((kind, typical)) or next(v for (k, _), v in cache.items() if k == kind)
        kinds[kind] = KindSummary(kind, counts[kind], res)
    # One reason per distinct edge; the same edge in several layer kinds is listed once with all kinds.
    merged: dict[tuple[str, str, str, str, str], Violation] = {}
    for res in cache.values():
        for v in res.violations:
            key = (v.op, v.value, str(v.got), str(v.needs), v.reason)
            if key not in merged:
                merged[key] = v
            elif v.layer_kind not in merged[key].layer_kind.split(", "):
                merged[key] = replace(merged[key], layer_kind=f"{merged[key].layer_kind}, {v.layer_kind}")
    violations = list(merged.values())
    pa = PlanAudit(plan, n, nbytes, kinds, results, final_el, final_units, 0.0, 0.0, violations)
    (whole,) = stage_weights(pa, graph, [range(len(results))], StoredWeights(graph, dtype))
    return replace(pa, weight_bytes_per_rank=whole.weights, replicated_extra_bytes=whole.replicated_extra)


def _decisions_only(plan: Plan) -> Plan:
    """`plan` without its labels (name, words, how it was found, notes): what an audit reads."""
    return plan.with_(name="", title="", summary="", found_by="named", engine_notes=(), notes=())


class Audits:
    """The audits of one graph, each computed once per (plan decisions, TP, dtype) and handed to
    every stage that needs it (search, prediction, report): an object passed along, not a global.

    A plan that differs from an audited one only in its labels (a found plan renamed after the
    named plan it rediscovers, `search-1` in a memo) gets the same audit under its own plan."""

    def __init__(self, graph: ModelGraph) -> None:
        self.graph = graph
        self._by_key: dict[tuple[Plan, int, str], PlanAudit] = {}

    def of(self, plan: Plan, mesh: Mesh, dtype: str = "bf16") -> PlanAudit:
        """The audit of `plan` on `mesh`'s TP group (computed on first use; TpplanError as `audit_plan`). The
        plan's algebra reads only the TP size, so meshes with one TP share an audit."""
        key = (_decisions_only(plan), mesh.tp, dtype)
        hit = self._by_key.get(key)
        if hit is None:
            hit = self._by_key[key] = audit_plan(self.graph, plan, mesh.tp, dtype)
        return hit if hit.plan is plan else replace(hit, plan=plan)  # its own plan, notes and labels

    def add(self, pa: PlanAudit, dtype: str) -> PlanAudit:
        """Keep an audit made elsewhere (a forked search worker's) for later stages; the kept one
        wins when both exist."""
        kept = self._by_key.setdefault((_decisions_only(pa.plan), pa.n, dtype), pa)
        return kept if kept.plan is pa.plan else replace(kept, plan=pa.plan)

    def __len__(self) -> int:
        return len(self._by_key)


@dataclass(frozen=True)
class Audit:
    model: str
    graph: ModelGraph
    n: int
    dtype: str
    plans: list[PlanAudit]

    def baseline(self) -> PlanAudit | None:
        return next((p for p in self.plans if p.plan.name == "baseline"), None)


def audit(
    model: str | ModelGraph, n: int, plans: list[str] | None = None, dtype: str = "bf16", audits: Audits | None = None
) -> Audit:
    """Audit the named plans (all of them by default) for a preset name, config path or graph;
    `audits` keeps them for the stages after (and reuses any it holds)."""
    graph = model if isinstance(model, ModelGraph) else build_model_graph(load_model(model))
    names = plans or list(NAMED_PLANS)
    if "baseline" not in names:
        names = ["baseline", *names]
    kept = audits if audits is not None and audits.graph is graph else Audits(graph)
    audits_ = [kept.of(make_plan(name, graph, n), Mesh(n), dtype) for name in dict.fromkeys(names)]
    return Audit(graph.spec.name, graph, n, dtype, audits_)


def _collective_json(c: CommEvent, dtype_bytes: int) -> dict[str, object]:
    """One collective of a layer kind, as the audit JSON lists it."""
    return {
        "collective": c.collective.value,
        "value": c.value,
        "width": c.width,
        "from": str(c.src),
        "to": str(c.dst),
        "region": c.region,
        "producer": c.producer,
        "consumer": c.consumer,
        "bytes_per_token_per_rank": c.elements_per_token * dtype_bytes,
        "units": c.units,
        "reason": c.reason,
    }


def _kinds_json(pa: PlanAudit, base: PlanAudit | None) -> dict[str, object]:
    """Each layer kind of one plan: legality, volumes beside the baseline's, and its collectives."""
    kinds: dict[str, object] = {}
    for kind, ks in pa.kinds.items():
        r = ks.result
        base_units = base.kinds[kind].result.units("attn_side") if base else 0.0
        kinds[kind] = {
            "count": ks.count,
            "legal": r.legal,
            "reasons": [v.sentence() for v in r.violations],
            "attn_input_units": r.units("attn_side"),
            "attn_input_delta_pct": pct_change_json(r.units("attn_side"), base_units),
            "layer_units": r.units(),
            "comm_bytes_per_token_per_rank": r.elements_per_token() * pa.dtype_bytes,
            "collectives": [_collective_json(c, pa.dtype_bytes) for c in r.comms],
        }
    return kinds


def _plan_json(pa: PlanAudit, base: PlanAudit | None, pred: PredictionJSON | None, priced: bool) -> dict[str, object]:
    """One plan's entry; `priced` (predictions were given) adds its `prediction` (None: not priced)."""
    base_bytes = base.comm_bytes_per_token if base else 0.0
    out: dict[str, object] = {
        "name": pa.plan.name,
        "title": pa.plan.title,
        "summary": pa.plan.summary,
        "found_by": pa.plan.found_by,
        "decisions": pa.plan.describe(),
        "legal": pa.legal,
        "reasons": [v.sentence() for v in pa.violations],
        "engine_notes": list(pa.plan.engine_notes),
        "layer_kinds": _kinds_json(pa, base),
        "comm_bytes_per_token_per_rank": pa.comm_bytes_per_token,
        "comm_units_per_token": pa.units,
        "comm_delta_pct": pct_change_json(pa.comm_bytes_per_token, base_bytes),
        "collectives_per_forward": pa.collective_counts(),
        "weight_bytes_per_rank": pa.weight_bytes_per_rank,
        "replicated_extra_bytes_per_rank": pa.replicated_extra_bytes,
    }
    if priced:
        out["prediction"] = pj = pred.to_json() if pred is not None else None
        # one figure: the prediction's (its PP stage, its expert_dtype)
        if pj is not None and isinstance(mem := pj["memory_bytes_per_rank"], dict):
            out["weight_bytes_per_rank"] = mem["weights"]
            out["replicated_extra_bytes_per_rank"] = mem["replicated_extra"]
    return out


def to_json(a: Audit, predictions: Sequence[PredictionJSON] | None = None) -> dict[str, object]:
    """The stable audit JSON (schema documented in docs/audit-json.md); `predictions` (one per plan,
    from `tpplan.cost.predict.predict_audit`) add time, memory and TTFT beside the volumes."""
    by_plan = {p.plan.name: p for p in predictions or ()}
    base = a.baseline()
    spec = a.graph.spec
    out_plans = [_plan_json(pa, base, by_plan.get(pa.plan.name), bool(by_plan)) for pa in a.plans]
    first = next(iter(by_plan.values()), None)
    out: dict[str, object] = {
        "schema_version": JSON_SCHEMA_VERSION,
        "topology": first.topology if first else None,
        "workload": first.workload if first else None,
        "pp": first.pp if first else 1,
        "model": a.model,
        "model_type": spec.model_type,
        "hidden": spec.hidden,
        "layers": spec.num_layers,
        "layer_kind_counts": a.graph.counts(),
        "tp": a.n,
        "dtype": a.dtype,
        "plans": out_plans,
    }
    if spec.notes:  # only for models that have something tpplan leaves out
        out["not_modelled"] = list(spec.notes)
    if spec.defaulted:  # only for configs missing fields transformers defaults
        out["defaulted"] = list(spec.defaulted)
    return out
