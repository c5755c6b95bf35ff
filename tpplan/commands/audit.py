"""`tpplan audit` and `tpplan explain`: legality and communication of plans, without torch."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from tpplan.commands._audit_tables import print_audit, print_cp, print_crossover, print_fp8_note, print_predictions
from tpplan.commands._bounds import NODES_RANGE, PP_RANGE, REPLICAS_RANGE, TP_RANGE, named
from tpplan.commands._console import console as make_console
from tpplan.commands._console import print_plan_notes, print_wrapped, steps
from tpplan.commands._disagg import PdOpt, parse_pd, pd_block, pd_engine, print_pd
from tpplan.commands._options import (
    ClusterOpt,
    CpKvOpt,
    CpLayersOpt,
    CpOpt,
    CpRecurrenceOpt,
    EngineOpt,
    GpuOpt,
    ModelOpt,
    RedundantExpertsOpt,
    RouterOpt,
    check_json_target,
    check_router,
    cluster_text,
    emit_json,
    json_option,
    load_cluster,
    redundant_plans,
    refuse_lone_router,
)
from tpplan.commands._plan_deployment import flag_given, print_deployment_notes, resolve
from tpplan.commands._serving import (
    ArrivalRateOpt,
    RequestsOpt,
    SeedOpt,
    SpecOpt,
    TraceOpt,
    arrival_of,
    asked,
    print_serving,
    serving_arrivals,
    serving_block,
    speculative_of,
)
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh

if TYPE_CHECKING:
    from collections.abc import Callable

    from tpplan.audit import Audit, PlanAudit
    from tpplan.commands._disagg import PdSides
    from tpplan.commands._plan_deployment import FromFile
    from tpplan.cost.predict import PlanPrediction
    from tpplan.cost.topology import Topology
    from tpplan.cost.workload import Workload
    from tpplan.engines.speculative import Speculative
    from tpplan.simulate.requests import Arrivals
    from tpplan.simulate.serving import Arrival

TpOpt = Annotated[
    int | None,
    typer.Option("--tp", help="Tensor-parallel size N (default with --topology: GPUs per node)", callback=TP_RANGE),
]
WideOpt = Annotated[
    bool, typer.Option("--wide", help="Show every column (wider than 100 columns; for wide terminals and files)")
]
ReplicasOpt = Annotated[
    int,
    typer.Option(
        "--replicas",
        help="Identical copies of the TP x CP x PP deployment, the workload's requests split between them "
        "(each on GPUs of its own; memory per rank is one replica's); with --topology",
        callback=REPLICAS_RANGE,
    ),
]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="Activation dtype for byte counts: bf16, fp16, fp32, fp8")]
ExpertDtypeOpt = Annotated[
    str | None,
    typer.Option(
        "--expert-dtype",
        help="Routed-expert weight dtype: bf16, fp8, mxfp4 (default: as the config's quantization_config stores "
        "them, else --dtype)",
    ),
]


PlansOpt = Annotated[list[str] | None, typer.Option("--plan", "-p", help="Plan(s) to audit; default: all named")]
TopologyOpt = Annotated[
    str | None,
    typer.Option(
        "--topology",
        "-t",
        help="Topology preset or .toml/.json file: adds predicted time and memory",
        callback=named("--topology"),
    ),
]
WorkloadOpt = Annotated[
    str | None,
    typer.Option(
        "--workload",
        "-w",
        help="Workload preset or .toml/.json file: adds TTFT (needs --topology)",
        callback=named("--workload"),
    ),
]
PpOpt = Annotated[int, typer.Option("--pp", help="Pipeline stages (TP x PP GPUs); with --topology", callback=PP_RANGE)]
NodesOpt = Annotated[
    int | None,
    typer.Option(
        "--nodes",
        help="Nodes of the topology (default: as many as replicas x TP x CP x PP need); with --topology",
        callback=NODES_RANGE,
    ),
]
CrossoverOpt = Annotated[
    bool,
    typer.Option(
        "--crossover", help="Tokens per step at which each plan overtakes baseline, per layer kind (--topology)"
    ),
]
ExplainTpOpt = Annotated[
    int | None, typer.Option("--tp", help="Tensor-parallel size N (default: a plan file's)", callback=TP_RANGE)
]
ExplainPlanOpt = Annotated[str, typer.Option("--plan", "-p", help="Plan to explain")]


def audit_cmd(
    ctx: typer.Context,
    model: ModelOpt,
    tp: TpOpt = None,
    plan: PlansOpt = None,
    json_target: Annotated[str | None, json_option("docs/audit-json.md")] = None,
    dtype: DtypeOpt = "bf16",
    topology: TopologyOpt = None,
    workload: WorkloadOpt = None,
    pp: PpOpt = 1,
    cp: CpOpt = 1,
    cp_recurrence: CpRecurrenceOpt = "scan",
    cp_layers: CpLayersOpt = "all",
    cp_kv: CpKvOpt = "engines",
    replicas: ReplicasOpt = 1,
    router: RouterOpt = None,
    nodes: NodesOpt = None,
    expert_dtype: ExpertDtypeOpt = None,
    wide: WideOpt = False,
    gpu: GpuOpt = None,
    cluster: ClusterOpt = None,
    engine: EngineOpt = None,
    crossover: CrossoverOpt = False,
    arrival_rate: ArrivalRateOpt = None,
    trace: TraceOpt = None,
    requests: RequestsOpt = None,
    seed: SeedOpt = 0,
    pd: PdOpt = None,
    spec: SpecOpt = None,
    ep_num_redundant_experts: RedundantExpertsOpt = 0,
) -> None:
    """Check plans op by op against the model's real layer graph and count their communication;
    with --topology (and --workload) also predict time, memory and TTFT."""
    from tpplan.audit import audit, to_json

    check_json_target(json_target)
    arrival = arrival_of(arrival_rate, trace, requests, seed)
    requests_asked = bool(workload) or asked(arrival_rate, trace, requests)
    predicting = requests_asked or pp != 1 or replicas != 1 or expert_dtype or nodes or crossover or pd
    sides, speculative = _check_asked(pd, engine, requests_asked, bool(topology or cluster), bool(predicting), spec)
    d = resolve(ctx, plan, {"tp": tp, "pp": pp, "cp": cp, "cp_recurrence": cp_recurrence, "cp_layers": cp_layers,
                            "cp_kv": cp_kv, "replicas": replicas, "router": router})  # fmt: skip
    tp, pp, cp, replicas = d["tp"], d["pp"], d["cp"], d["replicas"]  # type: ignore[assignment]
    cp_recurrence, cp_layers, cp_kv = d["cp_recurrence"], d["cp_layers"], d["cp_kv"]  # type: ignore[assignment]
    _check_deployment(d, bool(topology or cluster), engine, flag_given(ctx, "router"))  # a plan file's, where no flag
    with steps(f"tpplan audit {model}") as say:  # progress on stderr for a long one (--engine, serving)
        asked_mesh = Mesh(tp, pp=pp, cp=cp, cp_layers=cp_layers, replicas=replicas) if tp else None
        topo, wl = (_load_inputs(topology, nodes, asked_mesh, sides, gpu, cluster, engine, workload, replicas, say)
                    if topology or cluster or gpu or engine else (None, None))  # fmt: skip
        say("auditing the plans")
        result = audit(model, _tp_of(tp, topo), redundant_plans(plan, ep_num_redundant_experts), dtype)
        print_plan_notes(pa.plan for pa in result.plans)
        mesh = Mesh(result.n, pp=pp, replicas=replicas, cp=cp, cp_recurrence=cp_recurrence,
                    cp_layers=cp_layers, cp_kv=cp_kv, router=str(d["router"]) if d["router"] else None)  # fmt: skip
        predictions = _predict(result, topo, mesh, wl, expert_dtype, engine, say) if topo is not None else None
        data: dict[str, Any] = to_json(result, predictions)
        arrivals = _serve(data, result, topo, arrival, wl, mesh, expert_dtype, sides, engine, say, speculative)
        _add_cp_and_crossover(data, result, mesh, topo if crossover else None, expert_dtype, say)
    if not emit_json(json_target, data):
        _print_tables(data, result, topo if predictions else None, wide, expert_dtype, served=arrivals is not None)


def _tp_of(tp: int | None, topo: Topology | None) -> int:
    """The TP size asked for, else the topology's GPUs per node."""
    n = tp or (topo.gpus_per_node if topo is not None else None)
    if n is None:
        raise TpplanError("--tp", "no TP size given", "pass --tp N (or --topology T: TP = its GPUs per node)")
    return n


def _check_asked(
    pd: str | None, engine: str | None, requests: bool, has_topology: bool, predicting: bool, spec: str | None
) -> tuple[PdSides | None, Speculative | None]:
    """The P/D deployment `--pd` names, with an engine whose P/D hand-off was read, and the speculative
    decoding `--spec` asks for; both price serving, so they need requests; every prediction needs a topology."""
    sides = parse_pd(pd) if pd is not None else None
    if sides is not None:
        pd_engine(engine)  # an engine whose P/D hand-off was not read: one line before any work
    if sides is not None and not requests:
        raise TpplanError("--pd", "prices serving, which needs requests", "add --workload (or --arrival-rate/--trace)")
    if predicting and not has_topology:
        raise TpplanError(
            "--workload/--pp/--replicas/--nodes/--expert-dtype/--crossover/--arrival-rate/--trace/--requests/--pd",
            "predictions need a topology",
            "add --topology (e.g. h200x8-ib400)",
        )
    return sides, speculative_of(spec, requests)


def _print_tables(
    data: dict[str, Any], result: Audit, topo: Topology | None, wide: bool, expert_dtype: str | None, served: bool
) -> None:
    """The audit's tables (`_audit_tables`): bytes, CP, predictions on `topo` (None: none made), crossovers
    and serving, each where the audit made it."""
    print_audit(data, wide)
    if "context_parallel" in data:
        print_cp(data["context_parallel"], data["tp"])
    if topo is not None:
        print_predictions(data, wide, cluster_text(topo))
        print_fp8_note(topo, result.graph, result.dtype, expert_dtype)
    if "crossover" in data:
        print_crossover(data["crossover"])
    if served:
        print_serving(data["plans"])
        print_pd(data["plans"])


def _check_deployment(d: FromFile, has_topology: bool, engine: str | None, router_flagged: bool) -> None:
    """Refuse, before any work, a request router the serving loop's engine (`--engine`'s, `check_router`) lacks,
    a `--router` with one replica (a file's router comes with the file's replicas), and CP's layer or recurrence
    choice given without CP (it would change nothing); where a plan file set the deployment, say so; a PP or
    replicas from it without a topology changes nothing the audit prints, and that is said too."""
    check_router(engine, str(d["router"]) if d["router"] else None)
    if router_flagged:
        refuse_lone_router(str(d["router"]), d["replicas"])
    off_default = [
        f"--cp-{k} {d['cp_' + k]}" for k, v in (("layers", "all"), ("recurrence", "scan")) if d["cp_" + k] != v
    ]
    if d["cp"] == 1 and off_default and d.file is None:  # a search's file may carry the modes it searched with
        from tpplan.errors import TpplanError

        raise TpplanError(" ".join(off_default), "it shapes context parallelism, and --cp is 1",
                          "add --cp 2 or more, or drop it")  # fmt: skip
    print_deployment_notes(d)
    pp, replicas = d["pp"], d["replicas"]
    if (pp != 1 or replicas != 1) and not has_topology:  # from the file: legality and bytes only
        why = (f"without --topology the audit checks legality and bytes per token, which PP {pp} and "
               f"{replicas} replica(s) do not change; add --topology to predict time and memory there")  # fmt: skip
        print_deployment_notes(replace(d, notes=(why,)))


def _load_inputs(
    topology: str | None, nodes: int | None, mesh: Mesh | None, sides: PdSides | None, gpu: str | None,
    cluster: str | None, engine: str | None, workload: str | None, replicas: int, say: Callable[[str], None],
) -> tuple[Topology | None, Workload | None]:  # fmt: skip
    """The topology, with the GPUs the mesh asked for (None: its TP is the topology's) or the P/D
    deployment needs, and the workload; more replicas than the workload's clients is refused here,
    before any work."""
    from tpplan.cost.workload import load_workload

    gpus = mesh.gpus if mesh is not None else None
    if sides is not None and sides.gpus():
        gpus = max(gpus or 0, sides.gpus() or 0)
    say("loading the topology" + (f" and the {engine} kernel tables" if engine else ""))
    topo = load_cluster(topology, nodes, gpus, gpu=gpu, cluster=cluster, engine=engine)
    wl = load_workload(workload) if workload else None
    if wl is not None and replicas > 1:
        from tpplan.cost.workload import replica_workloads

        replica_workloads(wl, Mesh(1, replicas=replicas))  # more replicas than clients: one line before any work
    return topo, wl


def _predict(
    result: Audit, topo: Topology, mesh: Mesh, wl: Workload | None, expert_dtype: str | None, engine: str | None,
    say: Callable[[str], None],
) -> list[PlanPrediction]:  # fmt: skip
    """Every audited plan priced on `topo` at `mesh` (with `--engine`, the KV pool that engine sizes); first,
    requests past the model's stated context and an experts format for a model without experts are refused
    (one line each, as search and report refuse them)."""
    from tpplan.audit import check_expert_dtype
    from tpplan.cost.kv_capacity import kv_engines_for
    from tpplan.cost.predict import predict_audit
    from tpplan.search.under_targets import check_context

    check_expert_dtype(result.graph, expert_dtype)
    if wl is not None:
        check_context(wl, result.graph.spec.numerics.stated_context)

    say(f"pricing {len(result.plans)} plan(s) on {topo.name}")
    # replicas: TTFT through the deployment's request router, as the serving loop and the launch lines take it
    return predict_audit(result, topo, mesh=mesh, workload=wl, expert_dtype=expert_dtype,
                         kv_engines=kv_engines_for(engine))  # fmt: skip


def _serve(
    data: dict[str, Any], result: Audit, topo: Topology | None, arrival: Arrival, wl: Workload | None,
    mesh: Mesh, expert_dtype: str | None, sides: PdSides | None, engine: str | None, say: Callable[[str], None],
    spec: Speculative | None = None,
) -> Arrivals | None:  # fmt: skip
    """Each plan's `serving` JSON from the serving loop over `arrival`'s requests on `topo` (`spec`: its
    decode steps speculative), and with `--pd` its P/D deployment's; none without requests (none asked, or
    no topology). Returns the requests served."""
    if spec is not None:
        spec.check_model(result.graph.spec)  # MTP needs the model's nextn layers
    arrivals = serving_arrivals(arrival, wl, result.graph) if topo is not None else None
    if arrivals is None or topo is None:
        return None
    say("running the serving loop")
    for pa, entry in zip(result.plans, data["plans"], strict=True):
        entry["serving"] = serving_block(result.graph, pa.plan, topo, arrivals, wl, tp=mesh.tp, pp=mesh.pp,
                                         dtype=result.dtype, expert_dtype=expert_dtype, cp=mesh.cp,
                                         cp_recurrence=mesh.cp_recurrence, cp_layers=mesh.cp_layers, cp_kv=mesh.cp_kv,
                                         replicas=mesh.replicas, router=mesh.router, per_request=True,
                                         speculative=spec)  # fmt: skip
        if sides is not None:
            say(f"P/D: {sides.text}")
            entry["serving"]["disaggregated"] = pd_block(result.graph, pa.plan, topo, arrivals, wl, sides,
                                                         dtype=result.dtype, expert_dtype=expert_dtype,
                                                         engine=engine, speculative=spec)  # fmt: skip
    return arrivals


def _add_cp_and_crossover(
    data: dict[str, Any], result: Audit, mesh: Mesh, topo: Topology | None, expert_dtype: str | None,
    say: Callable[[str], None],
) -> None:  # fmt: skip
    """Under CP, what each layer kind exchanges over the CP group; with a topology (`--crossover`), the
    tokens at which each plan overtakes baseline."""
    if mesh.cp > 1:
        from tpplan.layout.context_parallel import audit_cp

        cpa = audit_cp(result.graph, mesh)
        data["context_parallel"] = cpa.to_json()
    if topo is not None:
        say("thresholds: where each plan overtakes baseline")
        data["crossover"] = _crossover_rows(result, topo, expert_dtype)


def explain_cmd(
    ctx: typer.Context,
    model: ModelOpt,
    tp: ExplainTpOpt = None,
    plan: ExplainPlanOpt = "baseline",
    dtype: DtypeOpt = "bf16",
    cp: CpOpt = 1,
    cp_recurrence: CpRecurrenceOpt = "scan",
    cp_layers: CpLayersOpt = "all",
) -> None:
    """Show one layer of each kind as a dataflow with placements and collectives."""
    from tpplan.audit import audit
    from tpplan.errors import TpplanError
    from tpplan.explain import explain_cp, explain_layer
    from tpplan.layout.context_parallel import audit_cp

    d = resolve(ctx, [plan], {"tp": tp, "cp": cp, "cp_recurrence": cp_recurrence, "cp_layers": cp_layers})
    tp, cp = d["tp"], d["cp"]  # type: ignore[assignment]
    cp_recurrence, cp_layers = d["cp_recurrence"], d["cp_layers"]  # type: ignore[assignment]
    if tp is None:
        raise TpplanError("--tp", "no TP size given", "pass --tp N (or a plan file, which holds its own)")
    print_deployment_notes(d)

    result = audit(model, tp, [plan], dtype)
    asked = Mesh(tp, cp=cp, cp_recurrence=cp_recurrence, cp_layers=cp_layers)
    cpa = audit_cp(result.graph, asked) if cp > 1 else None
    pa = result.plans[-1]  # the plan asked for (audit puts baseline first; an alias or a file names its own)
    console = make_console()
    console.print(f"[bold]{escape(pa.plan.name)}[/] ({escape(pa.plan.title)}) on {escape(result.model)}, TP{tp}: "
                  f"{escape(pa.plan.summary)}", markup=True)  # fmt: skip
    fused = _fused_lines(pa) if pa.plan.overlap == "asynctp" else {}
    for kind, ks in pa.kinds.items():
        widths = {v: val.width for v, val in result.graph.kinds[kind].values.items()}
        status = "legal" if ks.legal else "ILLEGAL"
        console.print(
            f"\n[bold]{kind}[/] x{ks.count}: {status}; attention-input boundary "
            f"{ks.result.units('attn_side'):g} units, whole layer {ks.result.units():g} units",
            markup=True,
        )
        for line in explain_layer(ks.result, widths):
            print_wrapped(console, line, 6)
        for line in fused.get(kind, []):
            print_wrapped(console, f"  async TP: {line}", 6)
        if cpa is not None:
            for line in explain_cp(cpa, kind):
                print_wrapped(console, line, 6)


def register(app: typer.Typer) -> None:
    """Add `audit` and `explain` to the CLI."""
    app.command("audit")(audit_cmd)
    app.command("explain")(explain_cmd)


def _fused_lines(pa: PlanAudit) -> dict[str, list[str]]:
    """Per layer kind, its collectives async TP fuses with GEMMs (`tpplan.layout.fused_gemm`), as the
    kind's second layer of that kind sees them (its entry reduce-scatter has a GEMM before it)."""
    from tpplan.layout.fused_gemm import describe_pair, model_pairs

    results = pa.layer_results
    out: dict[str, list[str]] = {}
    for i, pairs in enumerate(model_pairs(results)):
        kind = results[i].kind
        lines = [describe_pair(p, results[i], results[i - 1] if i else None) for p in pairs]
        if len(lines) > len(out.get(kind, [])):
            out[kind] = lines
    return out


def _crossover_rows(result: object, topo: object, expert_dtype: str | None) -> list[dict[str, object]]:
    """Where each legal plan of the audit overtakes baseline (tpplan/report/crossover.py)."""
    from tpplan.report.crossover import crossovers

    plans = [pa.plan for pa in result.plans if pa.legal]  # type: ignore[attr-defined]
    rows = crossovers(result.graph, plans, topo, mesh=Mesh(result.n), dtype=result.dtype, expert_dtype=expert_dtype)  # type: ignore[attr-defined,arg-type]
    return [c.to_json() for c in rows]
