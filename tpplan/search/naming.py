"""Names and words for found plans, and recognising a named plan the search rediscovered."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from tpplan.audit import Audits, PlanAudit
from tpplan.errors import TpplanError
from tpplan.layout.propagate import LayerResult
from tpplan.mesh import Mesh
from tpplan.models.graph import ModelGraph
from tpplan.placement import S_TOK
from tpplan.search.space import GlobalChoice, KindConfig

Behaviour = tuple[object, ...]  # what a plan does, layer by layer: equal for equivalent plans


def _short_choice(choice: str) -> tuple[str, str]:
    """('ag', 'kv_latent'), ('rep', 'q_b_proj'), ('a2a', 'q'), ('tok', 'qkv_a') from a choice in words."""
    if choice.startswith("replicate "):
        return "rep", choice.split()[1]
    if choice.startswith("all-to-all "):
        return "a2a", choice.split()[1]
    if choice.startswith("all-gather "):
        words = choice.split()
        return "ag", words[1] + (f"→{words[3]}" if len(words) > 3 else "")
    return "tok", choice.split()[0]


def describe(g: GlobalChoice, configs: Sequence[KindConfig], has_moe: bool = True) -> tuple[str, str, str]:
    """(name, one-line decisions, summary in words) for a searched plan; the words speak of MoE
    experts only for a model that has them (`has_moe`)."""
    stream = "scattered" if g.stream is S_TOK else "replicated"
    groups: dict[str, list[str]] = {"ag": [], "rep": [], "a2a": [], "tok": []}
    for cfg in configs:
        for ch in cfg.choices:
            verb, what = _short_choice(ch)
            if what not in groups[verb]:
                groups[verb].append(what)
    parts = [stream] + (["rs"] if g.reduce is S_TOK else [])
    parts += [f"{v}{len(groups[v])}" for v in ("ag", "rep", "a2a", "tok") if groups[v]]
    parts.append(f"moe={g.moe_label()}")  # not "moe-a2a": that is an alias of the plan sp-moe
    digest = hashlib.sha1(repr(sorted((c.kind, c.choices) for c in configs)).encode()).hexdigest()[:4]
    name = "+".join(parts) + f"#{digest}"
    labels = {"ag": "AG", "rep": "replicate", "a2a": "A2A", "tok": "token-shard"}
    short = "; ".join(f"{labels[v]} {', '.join(groups[v])}" for v in ("ag", "rep", "a2a", "tok") if groups[v])
    moe_words = {"tp": "MoE experts tensor-parallel", "a2a": "MoE all-to-all dispatch/combine"}.get(
        g.moe, f"MoE expert-parallel EP{g.ep_size} without all-to-all"
    ) + (f", {g.redundant_experts} redundant experts" if g.redundant_experts else "")
    head = (
        "Residual stream token-sharded (block outputs reduce-scattered)"
        if g.stream is S_TOK
        else "Residual stream replicated (block outputs all-reduced)"
    )
    if g.reduce is S_TOK:
        head += "; other partial sums reduce-scattered"
    per_kind = [f"{c.kind}: " + ", ".join(c.choices) for c in configs if c.choices]
    if not has_moe:
        summary = f"{head}." + (" " + ". ".join(per_kind) + "." if per_kind else "")
        return name, short or "no scattering decisions", summary
    summary = f"{head}; {moe_words}." + (" " + ". ".join(per_kind) + "." if per_kind else "")
    return name, (short or "no scattering decisions") + f" | {moe_words}", summary


def behaviour(pa: PlanAudit) -> Behaviour:
    """What a plan does, layer by layer (decisions and collectives): equal for equivalent plans."""
    p = pa.plan
    seen: dict[int, tuple[object, ...]] = {}  # layers of a kind mostly share one result: describe it once

    def layer(r: LayerResult) -> tuple[object, ...]:
        hit = seen.get(id(r))
        if hit is None:
            hit = (
                tuple((d.op.name, d.split, d.strategy.output) for d in r.decisions),
                tuple((c.collective, c.value, c.dst) for c in r.comms),
            )
            seen[id(r)] = hit
        return hit

    ep = p.ep_size if p.moe == "ep" else None
    return (p.moe, ep, p.redundant_experts, p.overlap, tuple(layer(r) for r in pa.layer_results))


def named_behaviours(graph: ModelGraph, n: int, dtype: str, audits: Audits | None = None) -> dict[Behaviour, str]:
    """The behaviour of every legal named plan at TP n, to the plan's name (the first of equals);
    `audits` (of `graph`) are used and kept."""
    from tpplan.plans.named import EXTRA_PLANS, NAMED_PLANS, make_plan

    kept = audits if audits is not None else Audits(graph)
    out: dict[Behaviour, str] = {}
    for name in dict.fromkeys(NAMED_PLANS + EXTRA_PLANS):
        try:
            pa = kept.of(make_plan(name, graph, n), Mesh(n), dtype)
        except TpplanError:
            continue
        if pa.legal:
            out.setdefault(behaviour(pa), name)
    return out
