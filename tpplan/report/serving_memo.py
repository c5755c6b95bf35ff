"""What the memo's Serving section prints, computed: the search's deployments served under the targets and each
chosen pool's launch lines (`build_serving_memo`, called by `tpplan report` under `--ttft-target`/
`--tpot-target`). Launch lines: both engines' flags for the plan at that mesh (`engines.recipes`, or
"needs code" where no flag realises it) with the KV pool's memory share as the engine derives it
(`cost.kv_capacity`), the step budget the loop ran and the running-request cap that holds the chosen load
(`engines.serving_flags`). `report.serving_section` renders it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpplan.cost.decode_band import DecodeBand
    from tpplan.cost.topology import Topology
    from tpplan.cost.workload import Workload
    from tpplan.engines.speculative import Speculative
    from tpplan.models.graph import ModelGraph
    from tpplan.search.results import RankedPlan, SearchOutcome
    from tpplan.search.serving_points import DeploymentAnswer
    from tpplan.search.targets import Targets
    from tpplan.search.under_targets import TargetsOutcome
    from tpplan.simulate.serving import Arrival


@dataclass(frozen=True)
class PoolLaunch:
    """One pool's launch line for one engine version: the command with its memory flags, or why none."""

    deployment: str  # the answer's label
    pool: str  # "aggregated", "prefill" or "decode"
    engine: str  # "SGLang 0.5.23"
    instances: int  # servers of this line (replicas, or the pool's instances)
    command: str  # "" where no flag realises the plan
    why_not: str = ""  # why no flag does ("needs code")
    memory: str = ""  # the memory settings in words, from the engine's derivation


@dataclass(frozen=True)
class ServingMemo:
    """What the Serving section prints: the outcome under the targets, the workload, each chosen pool's lines."""

    outcome: TargetsOutcome
    workload: Workload
    launches: tuple[PoolLaunch, ...]
    sources: tuple[str, ...]  # citations of the flags
    decode_band: tuple[str, DecodeBand] | None = None  # the first chosen deployment's decode-step band

    def chosen(self) -> list[DeploymentAnswer]:
        """The best aggregated and the best P/D deployment meeting the targets, each followed, where no engine
        release launches it (needs code), by the best of its kind one does; where none meets them, the closest."""
        meeting = self.outcome.meeting
        if not meeting:
            near = self.outcome.closest()
            return [near] if near is not None else []
        out: list[DeploymentAnswer] = []
        for kind in ("aggregated", "disaggregated"):
            of_kind = [a for a in meeting if a.kind == kind]
            if not of_kind:
                continue
            out.append(of_kind[0])
            launched = next((a for a in of_kind if a.launch is not None and not a.needs_code), None)
            if of_kind[0].needs_code and launched is not None:
                out.append(launched)
        return out


def build_serving_memo(
    outcome: SearchOutcome, graph: ModelGraph, workload: Workload, targets: Targets, *, arrival: Arrival | None,
    engines: tuple[str, ...] | None, pd: bool = True, speculative: Speculative | None = None,
) -> ServingMemo:  # fmt: skip
    """The search's deployments served under `targets` and the chosen pools' launch lines; `speculative`:
    decode steps as speculative steps (`--spec`), and the decoding pools' lines with its flags."""
    from tpplan.engines.serving_flags import sources
    from tpplan.search.under_targets import serve_under_targets

    rate = arrival if arrival is not None and arrival.rate is not None else None
    got = serve_under_targets(outcome, graph, workload, targets, arrival=rate,
                              requests=arrival.requests if arrival is not None else None, disaggregated=pd,
                              speculative=speculative, engines=engines)  # fmt: skip
    memo = ServingMemo(got, workload, (), ())
    pools = _Pools(outcome, graph, workload, engines, speculative)
    launches: list[PoolLaunch] = []
    for a in memo.chosen():
        launches += _launches(a, pools)
    from tpplan.engines.speculative import sources as spec_sources

    read = [*sources("sglang"), *sources("vllm")]
    read += [*spec_sources("sglang"), *spec_sources("vllm")] if speculative is not None else []
    cites = tuple(dict.fromkeys(s.cite() for s in read))
    chosen = memo.chosen()
    # The band prices a one-token decode step; under --spec a step verifies K + 1 tokens: no band printed.
    band = None if speculative is not None or not chosen else chosen_decode_band(chosen[0], outcome, graph, workload)
    return ServingMemo(got, workload, tuple(launches), cites, None if band is None else (chosen[0].label, band))


def chosen_decode_band(
    a: DeploymentAnswer, outcome: SearchOutcome, graph: ModelGraph, workload: Workload
) -> DecodeBand:
    """The band of one decode step of the deployment that decodes for `a` (P/D: its decode pool): at the chosen
    (or closest) load's requests per decoding instance, at most the batch its KV pool admits, each request at
    the mean KV length of a decode (prompt + output / 2)."""
    from tpplan.cost.decode_band import decode_step_band
    from tpplan.cost.predictor import cached_predictor
    from tpplan.mesh import Mesh

    p = a.best or a.closest
    r = a.decode_ranked or a.ranked
    instances = int((a.ratio or "1:1").split(":")[1]) if a.decode_ranked is not None else 1
    batch = math.ceil(p.load.clients / instances) if p.load.clients is not None else (a.admitted_batch or 1)
    batch = min(batch, a.admitted_batch) if a.admitted_batch else batch
    prompt = workload.input_len if workload.input_len is not None else max(workload.input_lens or [0])
    topo = outcome.topology
    assert topo is not None
    one = Mesh(tp=r.tp, pp=r.pp, cp=r.cp, replicas=1, cp_layers=outcome.cp_layers, cp_kv=outcome.cp_kv)
    pred = cached_predictor(graph, r.plan, topo, one, outcome.dtype, outcome.expert_dtype, r.audit)
    return decode_step_band(pred, batch, prompt + workload.output_len // 2)


@dataclass(frozen=True)
class _Pools:
    """What every pool's launch lines read: the search's outcome, the model, the workload, the `--engine`
    versions and the speculative decoding the decoding pools run (`--spec`; None: none)."""

    outcome: SearchOutcome
    graph: ModelGraph
    workload: Workload
    engines: tuple[str, ...] | None
    speculative: Speculative | None


def _launches(a: DeploymentAnswer, pools: _Pools) -> list[PoolLaunch]:
    p = a.best or a.closest
    if a.decode_ranked is None:
        return _pool(pools, a.label, "aggregated", a.ranked, a.replicas, p.load.clients)
    n_p, n_d = (int(x) for x in (a.ratio or "1:1").split(":"))
    per_d = math.ceil(p.load.clients / n_d) if p.load.clients is not None else None
    return [*_pool(pools, a.label, "prefill", a.ranked, n_p, None),
            *_pool(pools, a.label, "decode", a.decode_ranked, n_d, per_d)]  # fmt: skip


def with_flags(args: tuple[str, ...], flags: tuple[str, ...]) -> tuple[str, ...]:
    """`args` with `flags` set: a flag already there (`--chunked-prefill-size 8192`) takes the new value."""
    names = {f.split()[0] for f in flags}
    return (*(x for x in args if x.split()[0] not in names), *flags)


def _pool(pools: _Pools, label: str, pool: str, r: RankedPlan, instances: int, running: int | None) -> list[PoolLaunch]:
    """Both engines' launch lines for one pool: the recipe's flags for the plan at its mesh, the memory flags and,
    under `--spec`, the speculative-decoding flags (the cap stays the memory flags'); a P/D prefill pool is launched
    with its decode pool's draft, which it loads and runs (`tpplan.engines.speculative.PD_PREFILL_SOURCES`)."""
    from dataclasses import replace

    from tpplan.cost.draft import eagle3_draft
    from tpplan.cost.predictor import cached_predictor
    from tpplan.engines import Launch, select_pair
    from tpplan.engines.recipes import launches, recipes, why_not_launched
    from tpplan.engines.routing import pd_pool_router, replica_router, router_note
    from tpplan.engines.serving_flags import memory_flags, pd_flags
    from tpplan.engines.speculative import launch_flags
    from tpplan.errors import TpplanError
    from tpplan.mesh import Mesh

    outcome, graph, workload, spec = pools.outcome, pools.graph, pools.workload, pools.speculative
    topo: Topology | None = outcome.topology
    assert topo is not None
    one = Mesh(tp=r.tp, pp=r.pp, cp=r.cp, replicas=1, cp_layers=outcome.cp_layers, cp_kv=outcome.cp_kv)
    pair = select_pair(list(pools.engines) if pools.engines else None)
    out = []
    nodes = max(1, -(-one.gpus // topo.gpus_per_node))  # the nodes one server spans
    launch = Launch(graph.spec, one, chunk=workload.chunk_size, gpu=topo.gpu.name, nodes=nodes)
    for rec, ev in zip(recipes(r.plan, launch, engines=pair), pair, strict=True):
        name = f"{rec.engine} {ev.key.split('@')[1]}"
        if not launches(rec):
            out.append(PoolLaunch(label, pool, name, instances, "", why_not=why_not_launched(rec)))
            continue
        p = cached_predictor(graph, r.plan, topo, one, outcome.dtype, outcome.expert_dtype, r.audit)
        from tpplan.cost.draft import draft_memory
        from tpplan.cost.kv_capacity import kv_capacity

        draft = draft_memory(p, spec)  # the draft is in every pool's memory, a P/D prefill server's too
        try:
            kv = kv_capacity(p, ev.key, pd=pool != "aggregated", draft=draft)
        except TpplanError as err:
            out.append(
                PoolLaunch(label, pool, name, instances, "", why_not=f"its KV sizing was not read: {err.reason}")
            )
            continue
        flags = memory_flags(ev.key, kv.settings, workload.chunk_size, running)
        flags += pd_flags(ev.key, "prefill" if pool == "prefill" else "decode") if pool != "aggregated" else ()
        flags += launch_flags(ev.key, spec, eagle3=eagle3_draft(spec)) if spec is not None else ()
        try:  # the aggregated pool's replicas behind the deployment's request router; a P/D pool behind its P/D router
            router = replica_router(ev.key, outcome.router) if pool == "aggregated" else pd_pool_router(ev.key)
        except TpplanError as err:  # a router the other engine version does not have
            out.append(PoolLaunch(label, pool, name, instances, "", why_not=f"{err.where}: {err.reason}"))
            continue
        spans = max(1, -(-one.gpus * instances // topo.gpus_per_node))  # the nodes every instance takes
        note = router_note(router, graph.spec, spans) if pool == "aggregated" else ""
        rec = replace(rec, args=with_flags(rec.args, flags), replicas=instances, router=router, router_note=note)
        cmd = rec.command()
        memory = (f"{kv.label} keeps {kv.tokens:,} KV tokens per rank; off its pool: {kv.reserve_text}"
                  + (f"; at most {running} running requests hold the load" if running is not None else ""))  # fmt: skip
        out.append(PoolLaunch(label, pool, name, instances, cmd, memory=memory))
    return out


__all__ = ["PoolLaunch", "ServingMemo", "build_serving_memo", "chosen_decode_band", "with_flags"]
