"""`tpplan report`: the decision memo (report.md, report.html, PNGs) for one model and topology."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from tpplan.commands._bounds import CP_RANGE, PP_RANGE, TP_RANGE, named, replica_count
from tpplan.commands._options import (
    ClusterOpt,
    CpKvOpt,
    CpLayersOpt,
    GpuOpt,
    ModelOpt,
    NodesOpt,
    RouterOpt,
    SearchRedundantExpertsOpt,
    check_json_target,
    check_router,
    emit_json,
    json_option,
    load_cluster,
    refuse_lone_router,
)
from tpplan.commands._serving import (
    ArrivalRateOpt,
    RequestsOpt,
    SeedOpt,
    SpecOpt,
    TraceOpt,
    arrival_of,
    asked,
    serving_arrivals,
    speculative_of,
)
from tpplan.commands._targets import (
    GpusOpt,
    RankPdOpt,
    TargetStatOpt,
    TpotTargetOpt,
    TtftTargetOpt,
    budget_gpus,
    check_targets,
    targets_of,
    with_serving,
)
from tpplan.commands.audit import ExpertDtypeOpt
from tpplan.commands.search import MEMORY_CAP_HELP, OverlapChoice, memory_cap_value

if TYPE_CHECKING:
    from tpplan.cost.workload import Workload
    from tpplan.engines.speculative import Speculative
    from tpplan.models.graph import ModelGraph
    from tpplan.report.memo_ask import MemoAsk
    from tpplan.report.results import Analysis


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report_cmd(
        ctx: typer.Context,
        model: ModelOpt,
        topology: Annotated[
            str,
            typer.Option("--topology", "-t", help="Topology preset or .toml/.json file", callback=named("--topology")),
        ] = "h200x8-ib400",
        workload: Annotated[
            list[str] | None,
            typer.Option(
                "--workload",
                "-w",
                help="Workload preset(s) or file(s); default: prompt16k-c8 and prompt16k-c16",
                callback=named("--workload"),
            ),
        ] = None,
        out: Annotated[
            str,
            typer.Option(
                "--out", "-o", help="Output directory: a new one, or one tpplan wrote before (replaced atomically)"
            ),
        ] = "report",
        json_target: Annotated[str | None, json_option("docs/report-json.md")] = None,
        bench: Annotated[
            str | None, typer.Option("--bench", help="Results JSON from `tpplan bench` (docs/bench-json.md)")
        ] = None,
        tp: Annotated[
            int | None, typer.Option("--tp", help="TP size; default: every GPU of the topology", callback=TP_RANGE)
        ] = None,
        plan: Annotated[
            list[str] | None, typer.Option("--plan", "-p", help="Plan(s) to compare; default: every named plan")
        ] = None,
        current: Annotated[
            str,
            typer.Option(
                "--current",
                help="Today's deployment, the reference for every verdict: a plan (ep4, moe-a2a+ep4) and/or a "
                "shape ('TP32 EP4', 'moe-a2a TP8xPP4')",
            ),
        ] = "baseline",
        nodes: NodesOpt = None,
        gpu: GpuOpt = None,
        cluster: ClusterOpt = None,
        dtype: Annotated[str, typer.Option("--dtype", help="Activation dtype: bf16, fp16, fp32, fp8")] = "bf16",
        expert_dtype: ExpertDtypeOpt = None,
        prefill_cp: Annotated[
            int,
            typer.Option(
                "--prefill-cp", min=1, help="SGLang prefill context-parallel size the server runs (its gates read it)"
            ),
        ] = 1,
        dp: Annotated[
            int, typer.Option("--dp", min=1, help="Data-parallel size the server runs (vLLM's MoE SP gate reads it)")
        ] = 1,
        memory_cap: Annotated[str | None, typer.Option("--memory-cap", help=MEMORY_CAP_HELP)] = None,
        engine: Annotated[
            list[str] | None,
            typer.Option(
                "--engine",
                help="Serving engine and version, sglang@VERSION or vllm@VERSION (repeat for both): the memo judges "
                "the flags against each (default: each engine's current release in tpplan's engine data); the first "
                "one's measured kernels price compute (needs the aic extra, pip install 'tpplan\\[aic]'; the "
                "database's nearest version)",
            ),
        ] = None,
        overlap: Annotated[
            OverlapChoice | None,
            typer.Option(
                "--overlap",
                help="Also rank each all-to-all plan under an engine's micro-batch overlap, as `tpplan search "
                "--overlap` does (default: off, as there): tbo (SGLang) or dbo (vLLM); or asynctp (fused GEMMs)",
            ),
        ] = None,
        pp: Annotated[
            int | None,
            typer.Option(
                "--pp", help="Search only this many pipeline stages, as `tpplan search --pp`", callback=PP_RANGE
            ),
        ] = None,
        cp: Annotated[
            int | None,
            typer.Option(
                "--cp", help="Search only this context-parallel size, as `tpplan search --cp`", callback=CP_RANGE
            ),
        ] = None,
        cp_layers: CpLayersOpt = "all",
        cp_kv: CpKvOpt = "engines",
        router: RouterOpt = None,
        dp_attention: Annotated[
            bool,
            typer.Option(
                "--dp-attention", help="Also rank the named DP-attention plans, as `tpplan search --dp-attention`"
            ),
        ] = False,
        replicas: Annotated[
            str | None,
            typer.Option(
                "--replicas",
                metavar="N|all",
                help="Search copies of each deployment as `tpplan search --replicas` does (default: one copy, "
                "as there)",
            ),
        ] = None,
        arrival_rate: ArrivalRateOpt = None,
        trace: TraceOpt = None,
        requests: RequestsOpt = None,
        seed: SeedOpt = 0,
        ttft_target: TtftTargetOpt = None,
        tpot_target: TpotTargetOpt = None,
        target_stat: TargetStatOpt = "p90",
        gpus: GpusOpt = None,
        pd: RankPdOpt = True,
        spec: SpecOpt = None,
        ep_num_redundant_experts: SearchRedundantExpertsOpt = 0,
    ) -> None:
        """Write the decision memo: verdict per plan with reasons and formulas, plots, next steps, engine flags;
        under --ttft-target/--tpot-target a Serving section with the deployment(s) chosen and their launch lines."""
        import shlex
        import sys

        from rich.table import Table
        from rich.text import Text

        from tpplan.audit import check_expert_dtype
        from tpplan.bench_results import load_bench_results
        from tpplan.commands._console import console, show, steps
        from tpplan.cost.workload import load_workload
        from tpplan.models.config import load_model
        from tpplan.models.graph import build_model_graph
        from tpplan.outputs import Output
        from tpplan.report.analysis import analyse
        from tpplan.report.memo import build_memo, load_plots
        from tpplan.report.memo_ask import MemoAsk, ServerSettings
        from tpplan.report.writer import write_memo
        from tpplan.search.grid import MeshAsk

        outputs = (Output("--out", out, folder=True),)  # a folder tpplan may not replace is refused before any work
        check_json_target(json_target, *outputs)  # with --json FILE, checked together (not inside --out)
        load_plots()  # fail before any work when matplotlib is missing

        # Validate every input before anything is written.
        from tpplan.commands._plan_deployment import file_deployment, flag_given

        saved = file_deployment(plan)  # a plan file is priced at its whole deployment (report/analysis.py)
        if saved is not None and not flag_given(ctx, "cp_kv"):
            cp_kv = saved[1].cp_kv  # and at the KV mode it was ranked with
        if saved is not None and not flag_given(ctx, "router"):
            router = saved[1].router  # and behind the request router it was ranked with
        check_router(engine[0] if engine else None, router)  # the loop's engine's router, before any work
        reps = replica_count(replicas)
        speculative = speculative_of(spec, True)  # the memo always has workloads
        if speculative is not None and ttft_target is None and tpot_target is None and json_target is None:
            from tpplan.errors import TpplanError

            raise TpplanError("--spec", "prices decode steps, which the memo shows only under targets or in --json",
                              "add --tpot-target/--ttft-target or --json FILE, or drop --spec")  # fmt: skip
        copies = reps if isinstance(reps, int) else 1
        targets = targets_of(ttft_target, tpot_target, target_stat)
        if flag_given(ctx, "router"):  # a file's router comes with the file's replicas; targets serve every split
            unset = saved[1].replicas if saved is not None else "all" if targets is not None else None
            refuse_lone_router(router, reps if reps is not None else unset)
        need = tp * (pp or 1) * ((cp or 1) if cp_layers == "all" else 1) * copies if tp else budget_gpus(gpus, nodes)
        if saved is not None and tp is None:  # a preset with as many nodes as the file's deployment needs
            f = saved[1]
            need = f.tp * f.pp * (f.cp if f.cp_layers == "all" else 1) * f.replicas
        topo = load_cluster(topology, nodes, need, gpu=gpu, cluster=cluster, engine=engine[0] if engine else None)
        assert topo is not None  # --topology has a default
        check_targets(targets, gpus, topo, workload[0] if workload else "prompt16k-c8", trace)
        wls = [load_workload(w) for w in (workload or ["prompt16k-c8", "prompt16k-c16"])]
        results = load_bench_results(bench) if bench else None
        graph = build_model_graph(load_model(model))
        check_expert_dtype(graph, expert_dtype)
        if speculative is not None:
            from tpplan.cost.draft import check_draft

            check_draft(speculative, graph.spec)  # MTP's nextn layers, an EAGLE draft for this model
        if targets is not None:  # before any work: the first workload's requests serve under the targets
            from tpplan.search.under_targets import check_workload

            check_workload(targets, wls[0], graph.spec.numerics.stated_context)
        arrival = (
            arrival_of(arrival_rate, trace, requests, seed) if asked(arrival_rate, trace, requests) or seed else None
        )
        if arrival is not None:  # a bad rate or trace is refused before any work, as audit refuses it
            serving_arrivals(arrival, wls[0], graph)
        ask = MemoAsk(
            deployment=MeshAsk(tp=tp, pp=pp, cp=cp, replicas=reps, cp_layers=cp_layers, cp_kv=cp_kv, router=router),
            dtype=dtype,
            expert_dtype=expert_dtype,
            plans=tuple(plan or ()),
            current=current,
            memory_cap_gib=memory_cap_value(memory_cap),
            engines=tuple(engine or ()),
            overlap=None if overlap is None else overlap.value,
            dp_attention=dp_attention,
            redundant_experts=ep_num_redundant_experts,
            server=ServerSettings(prefill_cp=prefill_cp, data_parallel=dp),
            arrival=arrival,
            bench=results,
        )
        command = "tpplan " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else ""
        with steps(f"tpplan report {model}") as say:
            analysis = analyse(graph, topo, wls, ask, progress=say)
            if targets is not None:
                say("serving each deployment under the targets")
                analysis = with_serving(analysis, graph, topo, wls[0], targets, arrival, engine, pd, reps, speculative,
                                        dtype=dtype, expert_dtype=expert_dtype, cp_layers=cp_layers, cp_kv=cp_kv,
                                        router=router,
                                        memory_cap_gib=memory_cap_value(memory_cap),
                                        redundant_experts=ep_num_redundant_experts)  # fmt: skip
            data = memo_data(analysis, command, graph, wls[0], ask, speculative) if json_target else None
            say("writing report.md, report.html and the plots")
            path = write_memo(build_memo(analysis, command), out)
        if data is not None:
            check_json_target(json_target, *outputs)  # again: either may have changed during the work
            if emit_json(json_target, data):
                return  # `--json -`: standard output holds only the JSON
        out_console = console()
        out_console.print(f"wrote {path}/report.md, report.html and {len(list(path.glob('*.png')))} plots")
        table = Table(title="Verdict per plan (reasons and formulas in report.md)")
        for col in ("plan", "verdict", "why"):
            table.add_column(col)
        for v in analysis.verdicts:
            table.add_row(Text(v.key), Text(v.status), Text(v.headline))
        show(out_console, table)
        if analysis.bottom is not None:
            out_console.print(analysis.bottom.text.replace("**", ""), markup=False)


def memo_data(
    analysis: Analysis, command: str, graph: ModelGraph, workload: Workload, ask: MemoAsk, spec: Speculative | None
) -> dict[str, Any]:
    """`--json`'s object (docs/report-json.md): the memo's facts (`report.memo_json`), each chosen deployment
    with the `serving` block audit and search add (`serving_block`, at the first workload and the memo's
    arrival process: each workload's closed loop without one; decode steps speculative under `--spec`)."""
    from tpplan.commands._serving import arrival_of, serving_block
    from tpplan.report.memo_json import chosen_variants, memo_json

    topo = analysis.topology
    arrivals = serving_arrivals(ask.arrival or arrival_of(None, None, None, 0), workload, graph)
    served = {}
    if arrivals is not None and analysis.predictor_note is None:  # predictions on: each chosen deployment served
        for v in (v for v in chosen_variants(analysis) if v.predictions):  # one that did not predict: none
            m = v.parallel
            served[v.key] = serving_block(graph, v.plan, topo, arrivals, workload, tp=m.tp, pp=m.pp,
                                          dtype=analysis.dtype, expert_dtype=ask.expert_dtype, cp=m.cp,
                                          cp_layers=m.cp_layers, cp_kv=analysis.cp_kv, replicas=m.replicas,
                                          router=ask.deployment.router,
                                          speculative=spec)  # fmt: skip
    return memo_json(analysis, command, served)
