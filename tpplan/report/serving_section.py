"""The memo's "Serving" section: the deployment(s) chosen under the stated TTFT/TPOT targets, at the stated
statistic, what binds, and the launch lines of each pool with the memory settings the simulation assumed.

`serving_memo` (called by `tpplan report` under `--ttft-target`/`--tpot-target`) serves the search's
deployments under the targets (`tpplan.search.under_targets`) and builds each chosen pool's launch lines:
both engines' flags for the plan at that mesh (`engines.recipes`, or "needs code" where no flag realises
it) with the KV pool's memory share as the engine derives it (`cost.kv_capacity`), the step budget the
loop ran and the running-request cap that holds the chosen load (`engines.serving_flags`). `serving_section`
renders it; every sentence is made from the figures of `ServingMemo` it prints beside them (`chosen_text`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tpplan.report.doc import Block, Bullets, Code, Heading, Para, Table
from tpplan.report.rows import fig
from tpplan.search.targets import seconds_text

if TYPE_CHECKING:
    from tpplan.cost.topology import Topology
    from tpplan.cost.workload import Workload
    from tpplan.models.graph import ModelGraph
    from tpplan.report.results import Analysis
    from tpplan.search.results import RankedPlan, SearchOutcome
    from tpplan.search.serving_points import DeploymentAnswer, ServingPoint
    from tpplan.search.targets import Targets
    from tpplan.search.under_targets import TargetsOutcome
    from tpplan.simulate.serving import Arrival

SHOWN = 6  # deployments in the section's table


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

    def chosen(self) -> list[DeploymentAnswer]:
        """The best aggregated and the best P/D deployment meeting the targets; where none does, the closest."""
        meeting = self.outcome.meeting
        if not meeting:
            near = self.outcome.closest()
            return [near] if near is not None else []
        out: list[DeploymentAnswer] = []
        for kind in ("aggregated", "disaggregated"):
            best = next((a for a in meeting if a.kind == kind), None)
            if best is not None:
                out.append(best)
        return out


def chosen_text(targets: Targets, a: DeploymentAnswer) -> str:
    """One chosen deployment in a sentence, every figure from its best (or closest) load."""
    p = a.best or a.closest
    load = p.load.describe() + (" per replica" if a.replicas > 1 and p.load.clients is not None else "")
    figs = "; ".join(f"{tg.label} {seconds_text(p.achieved[tg.metric])} (target {seconds_text(tg.seconds)})"
                     for tg in targets.each)  # fmt: skip
    head = "meets the targets" if a.best is not None else "is the closest to the targets, and misses them"
    pools = f" at {a.ratio} (prefill : decode instances)" if a.ratio else ""
    return (f"`{a.label}`{pools} {head} at {load}: {figs}; {p.goodput_per_gpu:.3g} good requests/s per GPU, "
            f"{p.output_tok_s_per_gpu:,.0f} output tokens/s per GPU, {p.output_tok_s_per_user:,.0f} tokens/s per user. "
            f"What binds: {a.binds or 'nothing at this load'} ({a.why}).")  # fmt: skip


def serving_section(a: Analysis, command: str, plots: ModuleType, pngs: dict[str, Any]) -> list[Block]:
    """The Serving section, when the memo was asked for targets."""
    s = a.serving
    if s is None:
        return []
    out, wl = s.outcome, s.workload
    how = f"at {out.rate:g} requests/s (Poisson)" if out.rate is not None else f"on the budget of {out.gpus} GPUs"
    prompt = wl.input_len if wl.input_len is not None else max(wl.input_lens or [0])
    b: list[Block] = [
        Heading("Serving"),
        Para(
            f"Each deployment of the search served with decode {how} under {out.targets.describe()}: workload "
            f"`{wl.name}`, {prompt:,}-token prompts and {wl.output_len:,} output tokens, steps of {wl.chunk_size:,} "
            "tokens, requests admitted as the engine admits them (its running-request cap and KV pool), P/D pools "
            "beside the aggregated deployments; ranked by goodput per GPU (requests meeting both targets by their "
            "own TTFT and TPOT, per second, per GPU). " + out.verdict()
        ),
    ]
    b.append(Bullets(tuple(chosen_text(out.targets, x) for x in s.chosen())))
    b.append(_table(out))
    for x in s.chosen():
        lines = [ln for ln in s.launches if ln.deployment == x.label]
        if not lines:
            continue
        b.append(Para(f"Launch lines for `{x.label}` (each pool, both engines; memory settings as the engine "
                      "derives them, the step budget the loop ran, the running cap that holds the load):"))  # fmt: skip
        for ln in lines:
            what = (
                f"{ln.pool} pool, {ln.instances} server(s)" if ln.pool != "aggregated" else f"{ln.instances} server(s)"
            )
            if ln.command:
                b.append(Para(f"{ln.engine}, {what}: {ln.memory}"))
                b.append(Code(ln.command, "bash"))
            else:
                b.append(Para(f"{ln.engine}, {what}: needs code ({ln.why_not})."))
    b.append(Para("Flags read from: " + "; ".join(s.sources) + "."))
    return b


def _table(out: TargetsOutcome) -> Table:
    heads = ["deployment", "load"] + [f"{tg.label} ms" for tg in out.targets.each]
    rows = []
    for x in out.answers[:SHOWN]:
        p: ServingPoint = x.best or x.closest
        rows.append((f"`{x.label}`", p.load.describe(), *(fig(p.achieved[tg.metric] * 1e3) for tg in out.targets.each),
                     f"{p.goodput_per_gpu:.3g}", f"{p.output_tok_s_per_gpu:,.0f}", f"{p.output_tok_s_per_user:,.0f}",
                     "yes" if x.best is not None else "no", x.binds or "-"))  # fmt: skip
    heads += ["goodput/GPU", "tok/s/GPU", "tok/s/user", "meets", "binds"]
    n = len(heads)
    return Table(tuple(heads), tuple(rows), tuple(range(2, n - 2)))


def serving_memo(
    outcome: SearchOutcome, graph: ModelGraph, workload: Workload, targets: Targets, *, arrival: Arrival | None,
    engines: tuple[str, ...] | None, pd: bool = True,
) -> ServingMemo:  # fmt: skip
    """The search's deployments served under `targets` and the chosen pools' launch lines."""
    from tpplan.engines.serving_flags import sources
    from tpplan.search.under_targets import serve_under_targets

    rate = arrival if arrival is not None and arrival.rate is not None else None
    got = serve_under_targets(outcome, graph, workload, targets, arrival=rate,
                              requests=arrival.requests if arrival is not None else None, disaggregated=pd)  # fmt: skip
    memo = ServingMemo(got, workload, (), ())
    launches: list[PoolLaunch] = []
    for a in memo.chosen():
        launches += _launches(a, outcome, graph, workload, engines)
    cites = tuple(dict.fromkeys(s.cite() for e in ("sglang", "vllm") for s in sources(e)))
    return ServingMemo(got, workload, tuple(launches), cites)


def _launches(
    a: DeploymentAnswer, outcome: SearchOutcome, graph: ModelGraph, workload: Workload, engines: tuple[str, ...] | None
) -> list[PoolLaunch]:
    p = a.best or a.closest
    if a.decode_ranked is None:
        return _pool(a.label, "aggregated", a.ranked, a.replicas, p.load.clients, outcome, graph, workload, engines)
    n_p, n_d = (int(x) for x in (a.ratio or "1:1").split(":"))
    per_d = math.ceil(p.load.clients / n_d) if p.load.clients is not None else None
    return [*_pool(a.label, "prefill", a.ranked, n_p, None, outcome, graph, workload, engines),
            *_pool(a.label, "decode", a.decode_ranked, n_d, per_d, outcome, graph, workload, engines)]  # fmt: skip


def with_flags(args: tuple[str, ...], flags: tuple[str, ...]) -> tuple[str, ...]:
    """`args` with `flags` set: a flag already there (`--chunked-prefill-size 8192`) takes the new value."""
    names = {f.split()[0] for f in flags}
    return (*(x for x in args if x.split()[0] not in names), *flags)


def _pool(
    label: str, pool: str, r: RankedPlan, instances: int, running: int | None, outcome: SearchOutcome,
    graph: ModelGraph, workload: Workload, engines: tuple[str, ...] | None,
) -> list[PoolLaunch]:  # fmt: skip
    """Both engines' launch lines for one pool: the recipe's flags for the plan at its mesh, the memory flags."""
    from dataclasses import replace

    from tpplan.cost.predictor import cached_predictor
    from tpplan.engines import select_pair
    from tpplan.engines.recipes import recipes
    from tpplan.engines.serving_flags import memory_flags, pd_flags
    from tpplan.errors import TpplanError
    from tpplan.mesh import Mesh

    topo: Topology | None = outcome.topology
    assert topo is not None
    one = Mesh(tp=r.tp, pp=r.pp, cp=r.cp, replicas=1, cp_layers=outcome.cp_layers, cp_kv=outcome.cp_kv)
    pair = select_pair(list(engines) if engines else None)
    out = []
    nodes = max(1, -(-one.gpus // topo.gpus_per_node))  # the nodes one server spans
    for rec, ev in zip(recipes(r.plan, graph.spec, one, nodes=nodes, chunk=workload.chunk_size,
                               gpu=topo.gpu.name, engines=pair), pair, strict=True):  # fmt: skip
        name = f"{rec.engine} {ev.key.split('@')[1]}"
        if rec.realises == "no" or rec.blocked:
            out.append(PoolLaunch(label, pool, name, instances, "", why_not=rec.summary))
            continue
        p = cached_predictor(graph, r.plan, topo, one, outcome.dtype, outcome.expert_dtype, r.audit)
        try:
            from tpplan.cost.kv_capacity import kv_capacity

            kv = kv_capacity(p, ev.key)
        except TpplanError as err:
            out.append(
                PoolLaunch(label, pool, name, instances, "", why_not=f"its KV sizing was not read: {err.reason}")
            )
            continue
        flags = memory_flags(ev.key, kv.settings, workload.chunk_size, running)
        flags += pd_flags(ev.key, "prefill" if pool == "prefill" else "decode") if pool != "aggregated" else ()
        cmd = replace(rec, args=with_flags(rec.args, flags), replicas=instances).command()
        memory = (f"{kv.label} keeps {kv.tokens:,} KV tokens per rank ({kv.reserve_text})"
                  + (f"; at most {running} running requests hold the load" if running is not None else ""))  # fmt: skip
        out.append(PoolLaunch(label, pool, name, instances, cmd, memory=memory))
    return out


__all__ = ["PoolLaunch", "ServingMemo", "chosen_text", "serving_memo", "serving_section", "with_flags"]
