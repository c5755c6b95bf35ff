"""`tpplan audit` and `tpplan explain`: legality and communication of plans, without torch."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from tpplan.commands._bounds import NODES_RANGE, PP_RANGE, REPLICAS_RANGE, TP_RANGE, named
from tpplan.commands._console import console as make_console
from tpplan.commands._console import print_plan_notes, print_wrapped, show, steps, styled
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
    check_json_target,
    cluster_text,
    emit_json,
    json_option,
    load_cluster,
)
from tpplan.commands._plan_deployment import print_deployment_notes, resolve
from tpplan.commands._serving import (
    ArrivalRateOpt,
    RequestsOpt,
    SeedOpt,
    TraceOpt,
    arrival_of,
    asked,
    print_serving,
    serving_arrivals,
    serving_block,
)
from tpplan.placement import COLLECTIVE_SHORT
from tpplan.units import signed_pct

if TYPE_CHECKING:
    from tpplan.audit import PlanAudit
    from tpplan.cost.topology import Topology
    from tpplan.models.graph import ModelGraph

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


def _fmt_bytes(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(b) < 1024 or unit == "GiB":
            return f"{b:,.1f} {unit}" if unit != "B" else f"{b:,.0f} B"
        b /= 1024
    return f"{b:,.1f} GiB"


def register(app: typer.Typer) -> None:
    @app.command("audit")
    def audit_cmd(
        ctx: typer.Context,
        model: ModelOpt,
        tp: TpOpt = None,
        plan: Annotated[
            list[str] | None, typer.Option("--plan", "-p", help="Plan(s) to audit; default: all named")
        ] = None,
        json_target: Annotated[str | None, json_option("docs/audit-json.md")] = None,
        dtype: DtypeOpt = "bf16",
        topology: Annotated[
            str | None,
            typer.Option(
                "--topology",
                "-t",
                help="Topology preset or .toml/.json file: adds predicted time and memory",
                callback=named("--topology"),
            ),
        ] = None,
        workload: Annotated[
            str | None,
            typer.Option(
                "--workload",
                "-w",
                help="Workload preset or .toml/.json file: adds TTFT (needs --topology)",
                callback=named("--workload"),
            ),
        ] = None,
        pp: Annotated[
            int, typer.Option("--pp", help="Pipeline stages (TP x PP GPUs); with --topology", callback=PP_RANGE)
        ] = 1,
        cp: CpOpt = 1,
        cp_recurrence: CpRecurrenceOpt = "scan",
        cp_layers: CpLayersOpt = "all",
        cp_kv: CpKvOpt = "engines",
        replicas: ReplicasOpt = 1,
        nodes: Annotated[
            int | None,
            typer.Option(
                "--nodes",
                help="Nodes of the topology (default: as many as replicas x TP x CP x PP need); with --topology",
                callback=NODES_RANGE,
            ),
        ] = None,
        expert_dtype: ExpertDtypeOpt = None,
        wide: WideOpt = False,
        gpu: GpuOpt = None,
        cluster: ClusterOpt = None,
        engine: EngineOpt = None,
        crossover: Annotated[
            bool,
            typer.Option(
                "--crossover", help="Tokens per step at which each plan overtakes baseline, per layer kind (--topology)"
            ),
        ] = False,
        arrival_rate: ArrivalRateOpt = None,
        trace: TraceOpt = None,
        requests: RequestsOpt = None,
        seed: SeedOpt = 0,
        pd: PdOpt = None,
    ) -> None:
        """Check plans op by op against the model's real layer graph and count their communication;
        with --topology (and --workload) also predict time, memory and TTFT."""
        from tpplan.audit import audit, to_json
        from tpplan.errors import TpplanError
        from tpplan.mesh import Mesh

        check_json_target(json_target)
        arrival = arrival_of(arrival_rate, trace, requests, seed)
        serving_asked = asked(arrival_rate, trace, requests)
        sides = parse_pd(pd) if pd is not None else None
        if sides is not None:
            pd_engine(engine)  # an engine whose P/D hand-off was not read: one line before any work
        if sides is not None and not (workload or serving_asked):
            raise TpplanError(
                "--pd", "prices serving, which needs requests", "add --workload (or --arrival-rate/--trace)"
            )
        if (workload or pp != 1 or replicas != 1 or expert_dtype or nodes or crossover or serving_asked or pd) and not (
            topology or cluster
        ):
            raise TpplanError(
                "--workload/--pp/--replicas/--nodes/--expert-dtype/--crossover/--arrival-rate/--trace/--requests/--pd",
                "predictions need a topology",
                "add --topology (e.g. h200x8-ib400)",
            )
        # a plan file's deployment where no flag sets it (commands/_plan_deployment.py)
        d = resolve(ctx, plan, {"tp": tp, "pp": pp, "cp": cp, "cp_recurrence": cp_recurrence,
                                "cp_layers": cp_layers, "cp_kv": cp_kv, "replicas": replicas})  # fmt: skip
        tp, pp, cp, replicas = d["tp"], d["pp"], d["cp"], d["replicas"]  # type: ignore[assignment]
        cp_recurrence, cp_layers, cp_kv = d["cp_recurrence"], d["cp_layers"], d["cp_kv"]  # type: ignore[assignment]
        print_deployment_notes(d)
        if (pp != 1 or replicas != 1) and not (topology or cluster):  # from the file: legality and bytes only
            why = (f"without --topology the audit checks legality and bytes per token, which PP {pp} and "
                   f"{replicas} replica(s) do not change; add --topology to predict time and memory there")  # fmt: skip
            print_deployment_notes(replace(d, notes=(why,)))
        with steps(f"tpplan audit {model}") as say:  # progress on stderr for a long one (--engine, serving)
            predictions = None
            topo = wl = None
            if topology or cluster or gpu or engine:
                from tpplan.cost.workload import load_workload

                gpus = tp * pp * (cp if cp_layers == "all" else 1) * replicas if tp else None
                if sides is not None and sides.gpus():
                    gpus = max(gpus or 0, sides.gpus() or 0)
                say("loading the topology" + (f" and the {engine} kernel tables" if engine else ""))
                topo = load_cluster(topology, nodes, gpus, gpu=gpu, cluster=cluster, engine=engine)
                wl = load_workload(workload) if workload else None
                if wl is not None and replicas > 1:
                    from tpplan.cost.workload import replica_workloads

                    replica_workloads(wl, replicas)  # more replicas than clients: one line before any work
                tp = tp or (topo.gpus_per_node if topo is not None else None)
            if tp is None:
                raise TpplanError("--tp", "no TP size given", "pass --tp N (or --topology T: TP = its GPUs per node)")
            say("auditing the plans")
            result = audit(model, tp, plan, dtype)
            print_plan_notes(pa.plan for pa in result.plans)
            if topo is not None:
                from tpplan.cost.kv_capacity import kv_engines_for
                from tpplan.cost.predict import predict_audit

                say(f"pricing {len(result.plans)} plan(s) on {topo.name}")
                mesh = Mesh(result.n, pp=pp, replicas=replicas, cp=cp, cp_recurrence=cp_recurrence,
                            cp_layers=cp_layers, cp_kv=cp_kv)  # fmt: skip
                predictions = predict_audit(result, topo, mesh=mesh, workload=wl, expert_dtype=expert_dtype,
                                            kv_engines=kv_engines_for(engine))  # fmt: skip
            data: dict[str, Any] = to_json(result, predictions)
            arrivals = serving_arrivals(arrival, wl, result.graph) if topo is not None else None
            if arrivals is not None and topo is not None:
                say("running the serving loop")
                for pa, entry in zip(result.plans, data["plans"], strict=True):
                    entry["serving"] = serving_block(result.graph, pa.plan, topo, arrivals, wl, tp=result.n, pp=pp,
                                                     dtype=result.dtype, expert_dtype=expert_dtype, cp=cp,
                                                     cp_recurrence=cp_recurrence, cp_layers=cp_layers, cp_kv=cp_kv,
                                                     replicas=replicas, per_request=True)  # fmt: skip
                    if sides is not None:
                        say(f"P/D: {pd}")
                        entry["serving"]["disaggregated"] = pd_block(result.graph, pa.plan, topo, arrivals, wl, sides,
                                                                     dtype=result.dtype, expert_dtype=expert_dtype,
                                                                     engine=engine)  # fmt: skip
            if cp > 1:
                from tpplan.layout.context_parallel import audit_cp

                cpa = audit_cp(result.graph, result.n, cp, cp_recurrence, cp_layers)  # type: ignore[arg-type]
                data["context_parallel"] = cpa.to_json()
            if crossover and topo is not None:
                say("thresholds: where each plan overtakes baseline")
                data["crossover"] = _crossover_rows(result, topo, expert_dtype)
        if emit_json(json_target, data):
            return
        _print_audit(data, wide)
        if cp > 1:
            print_cp(data["context_parallel"], data["tp"])
        if predictions:
            assert topo is not None
            _print_predictions(data, wide, cluster_text(topo))
            print_fp8_note(topo, result.graph, dtype, expert_dtype)
        if crossover:
            _print_crossover(data["crossover"])
        if arrivals is not None:
            print_serving(data["plans"])
            print_pd(data["plans"])

    @app.command("explain")
    def explain_cmd(
        ctx: typer.Context,
        model: ModelOpt,
        tp: Annotated[
            int | None, typer.Option("--tp", help="Tensor-parallel size N (default: a plan file's)", callback=TP_RANGE)
        ] = None,
        plan: Annotated[str, typer.Option("--plan", "-p", help="Plan to explain")] = "baseline",
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
        cpa = audit_cp(result.graph, tp, cp, cp_recurrence, cp_layers) if cp > 1 else None  # type: ignore[arg-type]
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


def _print_audit(data: dict, wide: bool = False) -> None:
    console = make_console(wide=wide)
    console.print(
        f"[bold]{escape(data['model'])}[/] ({data['model_type']}, hidden {data['hidden']}, {data['layers']} layers: "
        + ", ".join(f"{k} x{c}" for k, c in data["layer_kind_counts"].items())
        + f") at TP{data['tp']}, {data['dtype']}",
        markup=True,
    )
    for note in data.get("not_modelled", ()):
        console.print(f"  not modelled: {note}", markup=False)
    for note in data.get("defaulted", ()):
        console.print(f"  defaulted: {note}", markup=False)
    t = Table(title="Whole model: communication per token per rank (ring, (N-1)/N included)")
    for col in (
        "plan",
        "legal",
        "bytes/tok/rank",
        "vs base",
        "rel. units",
        "collectives per forward",
        "replicated/rank",
    ):
        t.add_column(col, justify="right" if col not in ("plan", "legal") else "left")
    for p in data["plans"]:
        counts = " ".join(f"{COLLECTIVE_SHORT[k]}x{v}" for k, v in sorted(p["collectives_per_forward"].items()))
        t.add_row(
            p["name"],
            styled("yes" if p["legal"] else "[red]NO[/]"),
            f"{p['comm_bytes_per_token_per_rank']:,.0f}",
            signed_pct(p["comm_delta_pct"]),
            f"{p['comm_units_per_token']:,.0f}",
            counts,
            _fmt_bytes(p["replicated_extra_bytes_per_rank"]),
        )
    show(console, t)
    k = Table(title="Per layer kind (relative units: AR=2W, RS=AG=W, A2A=W/N)")
    for col in ("plan", "layer kind", "legal", "attn-in units", "vs base", "layer units", "collectives per layer"):
        k.add_column(col)
    for p in data["plans"]:
        for kind, info in p["layer_kinds"].items():
            colls = " + ".join(
                f"{COLLECTIVE_SHORT[c['collective']]}({c['value'].split(':')[0]} {c['width']})"
                for c in info["collectives"]
            )
            k.add_row(
                p["name"],
                f"{kind} x{info['count']}",
                styled("yes" if info["legal"] else "[red]NO[/]"),
                f"{info['attn_input_units']:g}",
                signed_pct(info["attn_input_delta_pct"]),
                f"{info['layer_units']:g}",
                colls,
            )
    show(console, k)
    for p in data["plans"]:
        if p["reasons"] or p["engine_notes"]:
            console.print(f"\n[bold]{escape(p['name'])}[/]:", markup=True)
        roots = [r for r in p["reasons"] if "(follows from" not in r]
        follow = len(p["reasons"]) - len(roots)
        for r in roots:
            print_wrapped(console, f"  - {r}")
        if follow:
            console.print(f"  ({follow} further illegal edges follow from these; `tpplan explain` shows them)")
        for note in p["engine_notes"]:
            print_wrapped(console, f"  note (engine gate, not legality): {note}")


def print_cp(cp: dict, tp: int) -> None:
    """The context-parallel table: per layer kind, its token split and what its mixers exchange over
    the CP group (per TP rank; `tpplan.layout.context_parallel`)."""
    console = make_console()
    if cp.get("layers") == "mla":
        title = (f"Context parallel, MLA layers only: CP{cp['cp']} inside TP{tp} (MLA attention TP "
                 f"{cp['attention_tp']}; per rank; AG units/tok = W)")  # fmt: skip
    else:
        title = (f"Context parallel: CP{cp['cp']} groups of TP{tp}, recurrence by {cp['recurrence']} "
                 "(per TP rank; AG units/tok = W)")  # fmt: skip
    t = Table(title=title)
    for col in ("layer kind", "split", "legal", "AG units/tok", "CP exchanges per layer"):
        t.add_column(col, justify="right" if col == "AG units/tok" else "left")
    for kind, info in cp["kinds"].items():
        xs = " + ".join(_cp_label(x) for x in info["exchanges"]) or (
            "none (own tokens only)" if cp.get("layers", "all") == "all" else "none (the full sequence, TP as planned)"
        )
        if info.get("replaces_plan_collectives_on"):
            xs += f", replacing the plan's collective on {'+'.join(info['replaces_plan_collectives_on'])}"
        legal = styled("yes" if info["legal"] else "[red]NO[/]")
        t.add_row(kind, info["split"], legal, f"{info['units_per_token']:g}", xs)
    show(console, t)
    for r in cp["reasons"]:
        print_wrapped(console, f"  - CP: {r}")


def _cp_label(x: dict) -> str:
    kind = {"all_gather": "AG", "send_recv": "SR", "all_reduce": "AR"}[x["collective"]]
    what = "+".join(x["values"])
    size = f"{x['elements_per_token']:g}/tok" if x["elements_per_token"] else f"{x['elements_per_seq']:g}/seq"
    chain = f" x{x['serial_steps']} serial" if x["serial_steps"] else ""
    return f"{kind}({what} {size}){chain}"


def _ms(s: float) -> str:
    return f"{s * 1e3:,.1f}"


def _crossover_rows(result: object, topo: object, expert_dtype: str | None) -> list[dict[str, object]]:
    """Where each legal plan of the audit overtakes baseline (tpplan/report/crossover.py)."""
    from tpplan.mesh import Mesh
    from tpplan.report.crossover import crossovers

    plans = [pa.plan for pa in result.plans if pa.legal]  # type: ignore[attr-defined]
    rows = crossovers(result.graph, plans, topo, mesh=Mesh(result.n), dtype=result.dtype, expert_dtype=expert_dtype)  # type: ignore[attr-defined,arg-type]
    return [c.to_json() for c in rows]


def _print_crossover(rows: list[dict[str, object]]) -> None:
    console = make_console()
    t = Table(title="Where each plan overtakes baseline (one layer per kind, new tokens per step, no context)")
    for col in ("plan", "layer kind", "against baseline", "overtakes at", "stops at"):
        t.add_column(col, justify="right" if col.endswith(" at") else "left")
    for r in rows:
        up, down = r["overtakes_at_tokens"], r["stops_at_tokens"]
        t.add_row(str(r["plan"]), str(r["kind"]), str(r["summary"]), "-" if up is None else f"{up:,}",
                  "-" if down is None else f"{down:,}")  # fmt: skip
    show(console, t)


# Shown with --wide only: derivable from the others (compute = forward - comms), zero at PP1, or
# detail of the memory, TTFT and communication columns. The default tables fit 100 columns.
_WIDE_ONLY = {"compute", "replicated", "KV", "p50 s", "max s"}
_WIDE_ONLY_PER_LAYER = {"collectives"}


def print_fp8_note(topo: Topology, graph: ModelGraph, dtype: str, expert_dtype: str | None) -> None:
    """Under predicted times: that fp8 GEMMs were priced as bf16 ones, where the GPU has no fp8."""
    from tpplan.cost.gpu import fp8_fallback_note

    quant = graph.spec.quant
    note = fp8_fallback_note(topo.gpu, dtype, expert_dtype, quant is not None and quant.fmt.compute == "fp8")
    if note:
        print_wrapped(make_console(), note, indent=2)


def provenance_line(prov: dict | None) -> str:
    """The line under a table of predicted times: how they were made and the error band that applies
    (`tpplan.cost.provenance`); a difference between plans inside the band is too close to call."""
    if not prov:
        return "Times: byte volumes only (no topology), exact counts."
    band = f", error band ±{prov['band'] * 100:.1f}%" if prov["band"] else ""
    return f"Times: {prov['label']}{band} ({prov['basis']}); differences inside the band are too close to call."


def over_note(gpu_bytes: float, fixes: str) -> str:
    """The one line under a table whose memory column says (over): what it means and what to do."""
    return (
        f"(over): the predicted memory per rank exceeds one GPU's {_fmt_bytes(gpu_bytes)} in this topology, "
        f"so the plan does not fit as set up. Fix: {fixes}."
    )


def _print_predictions(data: dict, wide: bool = False, cluster: str | None = None) -> None:
    console = make_console(wide=wide)
    first = next(p["prediction"] for p in data["plans"] if p.get("prediction"))
    r = first.get("replicas", 1)
    head = (
        f"Predicted on {cluster or first['topology']}: "
        + (f"{r} replicas of " if r > 1 else "")
        + f"TP{first['tp']}"
        + (f" x CP{first['cp']}" if first.get("cp", 1) > 1 else "")
        + f" x PP{first['pp']}, one batch of "
        f"{first['tokens']} tokens" + (f", workload {first['workload']}" if first["workload"] else "")
    )
    t = Table(title=head + " (ms per batch; memory per rank)")
    cols = ["plan", "legal", "forward", "compute", "TP comm", "stage send", "redundant", "memory", "replicated", "KV"]
    cols += ["TTFT mean s", "p50 s", "max s", "tok/s"]
    hidden = set() if wide else _WIDE_ONLY | ({"stage send"} if first["pp"] == 1 else set())
    cols = [c for c in cols if c not in hidden]
    for col in cols:
        t.add_column(
            col, justify="left" if col in ("plan", "legal") else "right", min_width=18 if col == "plan" else None
        )
    over = None
    for p in data["plans"]:
        pr = p.get("prediction")
        if not pr:
            continue
        m = pr["memory_bytes_per_rank"]
        ttft = pr["ttft"]
        if not m["fits"]:
            over = m["gpu"]
        cells = {
            "plan": p["name"],
            "legal": styled("yes" if p["legal"] else "[red]NO[/]"),
            "forward": _ms(pr["forward_s"]),
            "compute": _ms(pr["compute_s"]),
            "TP comm": _ms(pr["comm_s"]),
            "stage send": _ms(pr["stage_comm_s"]),
            "redundant": _ms(pr["redundant_compute_s"]),
            "memory": styled(_fmt_bytes(m["total"]) + ("" if m["fits"] else " [red](over)[/]")),
            "replicated": _fmt_bytes(m["replicated_extra"]),
            "KV": _fmt_bytes(m["kv_cache"]),
            "TTFT mean s": f"{ttft['mean_s']:.3f}" if ttft else "",
            "p50 s": f"{ttft['p50_s']:.3f}" if ttft else "",
            "max s": f"{ttft['max_s']:.3f}" if ttft else "",
            "tok/s": f"{ttft['throughput_tok_s']:,.0f}" if ttft else "",
        }
        t.add_row(*(cells[c] for c in cols))
    show(console, t, wrap=("memory",))
    # the question's band: the baseline's prediction, as search and the memo state it (question_provenance)
    ref = next((p["prediction"] for p in data["plans"] if p["name"] == "baseline" and p.get("prediction")), first)
    console.print(provenance_line(ref.get("provenance")), markup=False)
    if r > 1:
        console.print(
            f"Replicas: times and memory per rank are one replica's; TTFT is over every request, the workload's "
            f'requests split between the {r} replicas (each its own scheduler; docs/cost-model.md, "Replicas").',
            markup=False,
        )
    extrapolated = sorted({op for p in data["plans"] for op in (p.get("prediction") or {}).get("extrapolated_ops", [])})
    if extrapolated:
        console.print(
            f"Extrapolated: {len(extrapolated)} op(s) priced outside the shapes their measurements cover (the "
            f"GEMM table's, the kernel models' sweeps) ({', '.join(extrapolated[:6])}"
            f"{', ...' if len(extrapolated) > 6 else ''}); those times are less sure.",
            markup=False,
        )
    if over is not None:
        fixes = "a larger --tp or --pp, or quantized experts (--expert-dtype fp8 or mxfp4)"
        console.print(over_note(over, fixes), markup=False)
    if not wide:
        console.print("(--wide adds compute, replicated weight, KV cache, p50/max TTFT and collectives)")
    k = Table(title="Per layer of each kind (ms per batch): compute + communication, not overlapped")
    kcols = ["plan", "layer kind", "compute", "comm", "total", "redundant", "slowest ops", "collectives"]
    kcols = [c for c in kcols if wide or c not in _WIDE_ONLY_PER_LAYER]
    for col in kcols:
        k.add_column(col, justify="left" if col in ("plan", "layer kind", "slowest ops", "collectives") else "right")
    for p in data["plans"]:
        pr = p.get("prediction")
        if not pr:
            continue
        for kind, info in pr["layer_kinds"].items():
            slow = sorted(info["ops"], key=lambda o: -o["seconds"])[:3]
            cells = {
                "plan": p["name"],
                "layer kind": f"{kind} x{info['count']}",
                "compute": _ms(info["compute_s"]),
                "comm": _ms(info["comm_s"]),
                "total": _ms(info["total_s"]),
                "redundant": _ms(info["redundant_s"]),
                "slowest ops": ", ".join(f"{o['op']} {o['seconds'] * 1e3:.2f}" for o in slow),
                "collectives": " ".join(
                    f"{COLLECTIVE_SHORT[c['kind']]} {c['seconds'] * 1e3:.2f}" for c in info["collectives"]
                ),
            }
            k.add_row(*(cells[c] for c in kcols))
    show(console, k)
