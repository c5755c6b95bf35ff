"""`audit --pd PREFILL:DECODE[:NP:ND]`: a P/D deployment priced beside the aggregated one.

Each side is a mesh, `tp<N>[pp<N>][cp<N>]`, optionally with its own plan after a slash
(`tp16/dp-attention`; without one, the plan being audited, made at that TP by its name). `NP:ND` are the
instance counts; without them the ratio is chosen for the topology's GPUs (`simulate.disagg.choose_ratio`).
The result goes into each plan's audit JSON under `serving.disaggregated` (docs/audit-json.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tpplan.commands._bounds import MAX_REPLICAS, named
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh

if TYPE_CHECKING:
    from tpplan.cost.topology import Topology
    from tpplan.cost.workload import Workload
    from tpplan.engines.speculative import Speculative
    from tpplan.layout.plan import Plan
    from tpplan.models.graph import ModelGraph
    from tpplan.simulate.requests import Arrivals

PdOpt = Annotated[
    str | None,
    typer.Option(
        "--pd",
        help="P/D disaggregation beside the aggregated loop: PREFILL:DECODE[:NP:ND], each side "
        "tp<N>\\[pp<N>]\\[cp<N>]\\[/PLAN] (e.g. tp8:tp16/dp-attention:3:1); without NP:ND the ratio is chosen "
        "for the topology's GPUs; needs --topology and --workload (or an arrival option)",
        callback=named("--pd"),
    ),
]
MESH = re.compile(r"tp(?P<tp>\d+)(?:pp(?P<pp>\d+))?(?:cp(?P<cp>\d+))?(?:/(?P<plan>[^:]+))?")
EXAMPLE = "e.g. --pd tp8:tp8 or --pd tp4:tp8/dp-attention:2:1"


@dataclass(frozen=True)
class PdSides:
    """What `--pd` names: each side's mesh and plan (None: the audited plan), and the ratio if given."""

    prefill: Mesh
    decode: Mesh
    prefill_plan: str | None
    decode_plan: str | None
    ratio: tuple[int, int] | None
    text: str

    def gpus(self) -> int | None:
        """GPUs the deployment needs where the ratio is given (the topology gets as many nodes)."""
        if self.ratio is None:
            return None
        return self.ratio[0] * self.prefill.gpus + self.ratio[1] * self.decode.gpus


def _inside(sides: PdSides, err: TpplanError) -> TpplanError:
    """A library error about one side's mesh or plan, said of `--pd` (its `tp=3` is the side's tp3, not --tp)."""
    unflag = re.compile(r"\b(tp|pp|cp|plan|pd|instances)=")
    where, reason, fix = (unflag.sub(r"\1 ", x) for x in (err.where, err.reason, err.fix))
    return TpplanError(f"--pd {sides.text}", f"{where}: {reason}", fix)


def _bad(text: str, reason: str) -> TpplanError:
    return TpplanError(f"--pd {text}", reason, f"write PREFILL:DECODE[:NP:ND], {EXAMPLE}")


def _side(text: str, part: str) -> tuple[Mesh, str | None]:
    m = MESH.fullmatch(part.strip())
    if m is None:
        raise _bad(text, f"'{part}' is not a mesh tp<N>[pp<N>][cp<N>][/PLAN]")
    sizes = {k: int(m[k] or 1) for k in ("tp", "pp", "cp")}
    if not all(1 <= v <= MAX_REPLICAS for v in sizes.values()):
        raise _bad(text, f"'{part}' has a size outside 1..{MAX_REPLICAS}")
    return Mesh(sizes["tp"], sizes["pp"], cp=sizes["cp"]), m["plan"]


def parse_pd(text: str) -> PdSides:
    """`--pd`'s value, checked: two meshes, and two instance counts or none."""
    parts = text.split(":")
    if len(parts) not in (2, 4):
        raise _bad(text, f"has {len(parts)} field(s), not 2 or 4")
    (pm, pplan), (dm, dplan) = _side(text, parts[0]), _side(text, parts[1])
    ratio = None
    if len(parts) == 4:
        if not all(p.isdecimal() and 1 <= int(p) <= MAX_REPLICAS for p in parts[2:]):  # isdigit() takes "²"
            raise _bad(text, f"instance counts '{parts[2]}:{parts[3]}' must be whole numbers 1..{MAX_REPLICAS}")
        ratio = (int(parts[2]), int(parts[3]))
    return PdSides(pm, dm, pplan, dplan, ratio, text)


def pd_engine(engine: str | None) -> str:
    """The engine version whose P/D hand-off prices the pools: the loop's (`cost.pipeline.loop_engine`) for
    `--engine` SGLang or vLLM, else the default."""
    from tpplan.cost.pipeline import loop_engine

    if engine and engine.strip().lower().split("@")[0] not in ("sglang", "vllm"):
        raise TpplanError(f"--pd with --engine {engine}", "only SGLang's and vLLM's P/D hand-off were read",
                          "use --engine sglang or --engine vllm, or leave --pd out")  # fmt: skip
    return loop_engine(engine)


def _pool(graph: ModelGraph, plan: Plan, mesh: Mesh, plan_name: str | None, sides: PdSides, topo: Topology,
          engine: str, dtype: str, expert_dtype: str | None, chunk: int,
          speculative: Speculative | None = None) -> Any:  # fmt: skip
    from tpplan.cost.pipeline import pipeline_model
    from tpplan.cost.predictor import cached_predictor
    from tpplan.plans.named import make_plan
    from tpplan.simulate.disagg import PoolSpec

    try:
        mesh.check(topo)
        pool_plan = make_plan(plan_name or plan.name, graph, mesh.tp)
        p = cached_predictor(graph, pool_plan, topo, mesh, dtype, expert_dtype, pipeline=pipeline_model(engine))
    except TpplanError as err:
        raise _inside(sides, err) from None
    return PoolSpec(p, chunk_tokens=chunk, speculative=speculative)


def pd_block(
    graph: ModelGraph, plan: Plan, topo: Topology, arrivals: Arrivals, workload: Workload | None, sides: PdSides,
    *, dtype: str = "bf16", expert_dtype: str | None = None, engine: str | None = None,
    speculative: Speculative | None = None,
) -> dict[str, object]:  # fmt: skip
    """`serving.disaggregated` of one audited plan: the P/D deployment `sides` names, served over `arrivals`;
    a deployment that cannot hold a request gets {"admitted": false, "reason"}."""
    from tpplan.commands._serving import chunk_tokens
    from tpplan.simulate.disagg import DisaggDeployment, choose_ratio, serve_disaggregated

    key = pd_engine(engine)
    chunk = chunk_tokens(workload, key, topo)
    pre = _pool(graph, plan, sides.prefill, sides.prefill_plan, sides, topo, key, dtype, expert_dtype, chunk)
    dec = _pool(graph, plan, sides.decode, sides.decode_plan, sides, topo, key, dtype, expert_dtype, chunk, speculative)
    try:
        if sides.ratio is not None:
            dep = DisaggDeployment(pre, dec).with_ratio(*sides.ratio)
            return {"admitted": True, **serve_disaggregated(dep, arrivals).to_json()}
        choice = choose_ratio(pre, dec, arrivals, gpus=topo.world_size)
        done = {r.deployment.ratio: r for r in choice.simulated}
        res = done.get(choice.chosen.ratio) or serve_disaggregated(choice.chosen, arrivals)
    except TpplanError as err:
        if err.where.startswith("request "):  # a request whose KV does not fit a decode instance alone
            return {"admitted": False, "reason": str(err)}
        raise _inside(sides, err) from None
    rows = [{"n_prefill": p, "n_decode": d, "gpus": g, "bound_rps": b, "binding": s} for p, d, g, b, s in choice.table]
    return {"admitted": True, **res.to_json(),
            "ratio_choice": {"gpus": topo.world_size, "count": len(rows), "simulated": sorted(done),
                             "ratios": rows[:10]}}  # fmt: skip


def print_pd(entries: list[dict[str, object]], label: str = "plan") -> None:
    """One row per plan: the P/D deployment's TTFT, TPOT, tokens/s and what binds (fits 100 columns)."""
    from rich.table import Table
    from rich.text import Text

    from tpplan.commands._console import console, print_wrapped, show
    from tpplan.report.rows import fig, rate

    rows = [(e, e["serving"]["disaggregated"]) for e in entries if isinstance(e.get("serving"), dict)  # type: ignore[index]
            and "disaggregated" in e["serving"]]  # type: ignore[operator]  # fmt: skip
    if not rows:
        return
    t = Table(title="P/D disaggregated: TTFT and TPOT in ms, output tokens/s, the side that binds")
    for col in (label, "P:D", "GPUs", "TTFT mean", "TTFT p99", "TPOT mean", "TPOT p99", "tok/s/GPU", "tok/s/user",
                "binds"):  # fmt: skip
        t.add_column(col, justify="left" if col in (label, "binds") else "right")
    out, notes = console(), []
    for e, d in rows:
        name = str(e.get("deployment") or e.get("name"))
        if not d["admitted"]:
            notes.append(f"Not admitted: {name}: {d['reason']}")
            continue
        tt, dec = d["ttft"], d["decode_summary"] or {}
        tpot = dec.get("tpot_s", {})
        ms = [fig(v * 1e3) if v is not None else "-" for v in (tt["mean_s"], tt["p99_s"], tpot.get("mean"),
                                                                  tpot.get("p99"))]  # fmt: skip
        t.add_row(Text(name), d["ratio"], str(d["gpus"]), *ms, rate(dec.get('output_tok_s_per_gpu', 0)),
                  rate(dec.get('output_tok_s_per_user', 0)), d["binding"])  # fmt: skip
        notes.append(f"{name}: {d['binding_text']}")
        if "ratio_choice" in d:
            rc = d["ratio_choice"]
            notes.append(f"{name}: ratio {d['ratio']} chosen for {rc['gpus']} GPUs among {rc['count']} ratios")
    if t.rows:
        show(out, t)
    for line in notes:
        print_wrapped(out, line)
    from tpplan.simulate.disagg import PD_NOT_MODELLED

    print_wrapped(out, "P/D leaves out: " + "; ".join(PD_NOT_MODELLED))


__all__ = ["PdOpt", "PdSides", "parse_pd", "pd_block", "pd_engine", "print_pd"]
