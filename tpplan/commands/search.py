"""`tpplan search`: ranked legal plans, including ones nobody named, by predicted time or TTFT."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from tpplan.commands._audit_tables import _fmt_bytes, over_note, print_fp8_note, provenance_line
from tpplan.commands._bounds import CP_RANGE, PP_RANGE, TOKENS_RANGE, TP_RANGE, named, replica_count
from tpplan.commands._console import console as make_console
from tpplan.commands._console import print_wrapped, show, steps, styled
from tpplan.commands._options import (
    ClusterOpt,
    CpKvOpt,
    CpLayersOpt,
    EngineOpt,
    GpuOpt,
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
    print_serving,
    serving_arrivals,
    serving_block,
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
    print_targets,
    serve_search,
    targets_of,
)
from tpplan.commands.audit import DtypeOpt, ModelOpt, WideOpt
from tpplan.units import signed_pct

if TYPE_CHECKING:
    from rich.console import Console

TARGETS_TOP = 3  # ranked plans shown under targets by default: each deployment's best, the targets' table after


def _ms(x: float | None) -> str:
    return "" if x is None else f"{x * 1e3:,.1f}"


class OverlapChoice(StrEnum):
    tbo = "tbo"
    dbo = "dbo"
    asynctp = "asynctp"


MEMORY_CAP_HELP = (
    "Rank only plans whose predicted memory per rank is under this: GiB, 'gpu' (all of one GPU) or 'none'; "
    "default: 90% of one GPU, leaving room for more KV cache than the workload's and the engine's buffers"
)


def memory_cap_value(value: str | None) -> float | str | None:
    """--memory-cap: absent = 90% of one GPU ("serving"), `gpu` = all of it, `none` = no cap, else GiB."""
    if value is None:
        return "serving"
    if value.strip().lower() in ("none", "gpu"):
        return None if value.strip().lower() == "none" else "gpu"
    try:
        return float(value)
    except ValueError:
        from tpplan.errors import TpplanError

        raise TpplanError(f"--memory-cap {value}", "not a number", "give GiB per rank (e.g. 140) or none") from None


def register(app: typer.Typer) -> None:
    @app.command("search")
    def search_cmd(
        model: ModelOpt,
        topology: Annotated[
            str | None,
            typer.Option("--topology", "-t", help="Topology preset or .toml/.json file", callback=named("--topology")),
        ] = None,
        workload: Annotated[
            str | None,
            typer.Option(
                "--workload", "-w", help="Workload preset or file: rank by mean TTFT", callback=named("--workload")
            ),
        ] = None,
        tp: Annotated[
            int | None,
            typer.Option(
                "--tp", help="TP size (default: every TP x PP split of the topology's GPUs)", callback=TP_RANGE
            ),
        ] = None,
        pp: Annotated[
            int | None,
            typer.Option(
                "--pp", help="Pipeline stages (default: every TP x PP split; with --tp: 1)", callback=PP_RANGE
            ),
        ] = None,
        cp: Annotated[
            int | None,
            typer.Option(
                "--cp",
                help="Context-parallel size (default: CP 1 at every split, and TP x CP for CP 2, 4, 8)",
                callback=CP_RANGE,
            ),
        ] = None,
        cp_layers: CpLayersOpt = "all",
        cp_kv: CpKvOpt = "engines",
        router: RouterOpt = None,
        replicas: Annotated[
            str | None,
            typer.Option(
                "--replicas",
                metavar="N|all",
                help="Copies of each deployment, the workload's requests split between them: N, or 'all' for "
                "every count dividing the GPUs (with --workload and no --tp/--pp) beside one copy (default: 1)",
            ),
        ] = None,
        nodes: NodesOpt = None,
        gpu: GpuOpt = None,
        cluster: ClusterOpt = None,
        engine: EngineOpt = None,
        memory_cap: Annotated[
            str | None,
            typer.Option("--memory-cap", help=MEMORY_CAP_HELP),
        ] = None,
        top: Annotated[
            int | None,
            typer.Option(
                "--top", help="How many ranked plans to show (default 10; under targets 3, one per deployment)"
            ),
        ] = None,
        json_target: Annotated[str | None, json_option("docs/search-json.md")] = None,
        save: Annotated[
            Path | None,
            typer.Option("--save", help="Write each ranked plan as DIR/plan-<rank>.json, for any command's --plan"),
        ] = None,
        tokens: Annotated[
            int, typer.Option("--tokens", help="Batch size for forward time without a workload", callback=TOKENS_RANGE)
        ] = 8192,
        dtype: DtypeOpt = "bf16",
        expert_dtype: Annotated[
            str | None, typer.Option("--expert-dtype", help="Routed-expert weight dtype: bf16, fp8, mxfp4")
        ] = None,
        objective: Annotated[
            str, typer.Option("--objective", help="time (predicted; needs --topology) or volume (bytes)")
        ] = "time",
        all_plans: Annotated[
            bool,
            typer.Option("--all", help="Exact top-K over all plans (slower), not the best of each plan family"),
        ] = False,
        dp_attention: Annotated[
            bool,
            typer.Option("--dp-attention", help="Also rank the named DP-attention plans (docs/design.md)"),
        ] = False,
        overlap: Annotated[
            OverlapChoice | None,
            typer.Option(
                "--overlap",
                help="Also rank each all-to-all plan under an engine's micro-batch overlap: tbo (SGLang "
                "--enable-two-batch-overlap) or dbo (vLLM --enable-dbo); or each plan with GEMMs next to its "
                "all-gathers / reduce-scatters with them fused: asynctp (TP inside a node); docs/cost-model.md",
            ),
        ] = None,
        wide: WideOpt = False,
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
        """Search every legal plan derived from the model's graph and rank them; under --ttft-target and/or
        --tpot-target, serve each deployment's best with decode and rank them by goodput per GPU."""
        from tpplan.audit import check_expert_dtype
        from tpplan.cost.workload import load_workload
        from tpplan.models.config import load_model
        from tpplan.models.graph import build_model_graph
        from tpplan.outputs import Output
        from tpplan.plans.files import save_plan_dir
        from tpplan.search import MeshAsk, search_plans

        saved = [Output("--save", save, folder=True)] if save is not None else []
        check_json_target(json_target, *saved)  # before the search: a bad path costs one line, not a run
        arrival = arrival_of(arrival_rate, trace, requests, seed)
        speculative = speculative_of(spec, workload is not None or asked(arrival_rate, trace, requests))
        targets = targets_of(ttft_target, tpot_target, target_stat)
        check_router(engine, router)  # the loop's engine's router, before any work
        reps = replica_count(replicas)
        if targets is not None and replicas is None and tp is None and pp is None:
            reps = "all"  # under targets every split of the budget, replicas of smaller deployments included
        refuse_lone_router(router, reps)
        copies = reps if isinstance(reps, int) else 1
        need = tp * (pp or 1) * ((cp or 1) if cp_layers == "all" else 1) * copies if tp else budget_gpus(gpus, nodes)
        topo = load_cluster(topology, nodes, need, gpu=gpu, cluster=cluster, engine=engine)
        check_targets(targets, gpus, topo, workload, trace)
        if topo is None and nodes is not None:
            from tpplan.errors import TpplanError

            raise TpplanError("--nodes", "nodes need a topology", "add --topology (e.g. h200x8-ib400)")
        if topo is None and asked(arrival_rate, trace, requests):
            from tpplan.errors import TpplanError

            raise TpplanError("--arrival-rate/--trace/--requests", "the serving loop needs a topology",
                              "add --topology (e.g. h200x8-ib400)")  # fmt: skip
        with steps(f"tpplan search {model}") as say:
            graph = build_model_graph(load_model(model))
            check_expert_dtype(graph, expert_dtype)
            if speculative is not None:
                from tpplan.cost.draft import check_draft

                check_draft(speculative, graph.spec)  # MTP's nextn layers, an EAGLE draft for this model
            wl = load_workload(workload) if workload else None
            if targets is not None and wl is not None:
                from tpplan.search.under_targets import check_workload

                check_workload(targets, wl, graph.spec.numerics.stated_context)  # before the search
            arrivals = serving_arrivals(arrival, wl, graph) if topo is not None and targets is None else None
            outcome = search_plans(
                graph,
                topo,
                ask=MeshAsk(tp=tp, pp=pp, cp=cp, replicas=reps, cp_layers=cp_layers, cp_kv=cp_kv, router=router),
                workload=wl,
                memory_cap_gib=memory_cap_value(memory_cap),
                top=top if top is not None else (TARGETS_TOP if targets is not None else 10),
                tokens=tokens,
                dtype=dtype,
                expert_dtype=expert_dtype,
                objective=objective,
                all_plans=all_plans,
                dp_attention=dp_attention,
                overlap=None if overlap is None else overlap.value,
                progress=say,
                every_deployment=targets is not None,
                redundant_experts=ep_num_redundant_experts,
            )
            under = None
            if targets is not None and wl is not None:
                say("serving each deployment's best plan under the targets")
                under = serve_search(outcome, graph, wl, targets, arrival, pd, speculative, engine)
        data = outcome.to_json()
        if under is not None:
            data["serving_search"] = under.to_json()
        if arrivals is not None and topo is not None:
            entries: list[dict[str, object]] = data["plans"]  # type: ignore[assignment]
            for r, entry in zip(outcome.ranked, entries, strict=True):
                entry["serving"] = serving_block(graph, r.plan, topo, arrivals, wl, tp=r.tp, pp=r.pp, dtype=dtype,
                                                 expert_dtype=expert_dtype, cp=r.cp, cp_layers=cp_layers,
                                                 cp_kv=cp_kv, replicas=r.replicas, router=router,
                                                 speculative=speculative)  # fmt: skip
        if cp_layers != "all":  # the grid's CP sits inside its TP group (search/grid.py's mla_deployments)
            data["cp_layers"] = cp_layers
        if cp_kv != "engines":  # tpplan's own KV accounting under CP, asked for
            data["cp_kv"] = cp_kv
        if router is not None:  # the replicas' request router, asked for (tpplan.engines.routing)
            data["router"] = router
        check_json_target(json_target, *saved)  # again, together: either may have changed during the search
        to_stdout = emit_json(json_target, data)
        if not to_stdout:
            _print(data, wide)
            if topo is not None:
                print_fp8_note(topo, graph, dtype, expert_dtype)
            print_serving(data["plans"], "deployment")  # type: ignore[arg-type]
            if targets is not None:
                print_targets(data["serving_search"])  # type: ignore[arg-type]
        if save is not None:
            written = save_plan_dir(save, outcome.plan_files)
            if written:
                line = f"Saved {len(written)} plan(s) to {save}/ (best: {written[0]}); pass one to any --plan."
                out = make_console(stderr=to_stdout)  # standard output holds only the JSON then
                out.print()
                print_wrapped(out, line)


def _print(data: dict, wide: bool = False) -> None:
    """The search's answer on the terminal: the headline, the ranked table, the notes its figures call for, the
    plans the memory cap left out, and each plan's decisions in words."""
    console = make_console(wide=wide)
    timed = data["topology"] is not None and data["score_unit"] == "s"
    grid = len(data["search"]["deployments"]) > 1  # several TP x PP deployments: name each plan's
    what = "mean TTFT" if data["workload"] else ("forward time" if timed else "bytes/token/rank")
    console.print(_headline(data, what), markup=True)
    table, over = _ranked_table(data, what, timed, grid, wide)
    show(console, table, wrap=("memory/rank",))
    if data.get("provenance"):
        console.print(provenance_line(data["provenance"]), markup=False)
    _print_notes(console, data)
    gpu = data.get("gpu_memory_bytes")
    if over and gpu is not None:
        capped = data["memory_cap_bytes"] is not None
        fixes = (
            "plans over the cap are not ranked, --memory-cap none ranks them"
            if capped
            else "--memory-cap GiB ranks only plans under it"
        ) + "; or more GPUs (--nodes, a larger --tp or --pp), or quantized experts (--expert-dtype fp8 or mxfp4)"
        console.print(over_note(gpu, fixes), markup=False)
    if not wide:
        console.print("(--wide adds how each plan was found, its communication bytes and replicated weight)")
    _print_excluded(console, data, grid)
    _print_decisions(console, data, grid)


def _headline(data: dict, what: str) -> str:
    """The first line (Rich markup, input names escaped): model, deployments, topology, workload, what ranks
    the plans and how long the search took."""
    return (
        f"[bold]{escape(data['model'])}[/] at {', '.join(data['search']['deployments'])}"
        + (
            f" on {escape(data['topology'])} ({data['nodes']} x {data['gpus_per_node']} GPUs)"
            if data["topology"]
            else ""
        )
        + (f", workload {escape(data['workload'])}" if data["workload"] else "")
        + f": ranked by {what}; "
        + ("best plan of each family (stream x reduce x MoE mode)" if data["mode"] == "per-family" else "all plans")
        + f"; searched {data['search']['families']} families in {data['search']['seconds']:.2f} s"
    )


def _ranked_table(data: dict, what: str, timed: bool, grid: bool, wide: bool) -> tuple[Table, bool]:
    """Baseline and the ranked plans, a row each (`wide`: every column); and whether any is over one GPU's
    memory, which the note after the table explains."""
    t = Table(title="Ranked legal plans (deltas vs baseline at the same TP x PP)")
    cols = ["#", "plan", "found by", what, "vs base", "comm B/tok/rank", "comm vs base", "memory/rank", "replicated"]
    if not wide:  # low-value columns: the plan's name says how it was found; comm is in the JSON
        cols = [c for c in cols if c not in ("found by", "comm B/tok/rank", "comm vs base", "replicated")]
    for c in cols:
        t.add_column(c, justify="left" if c in ("#", "plan", "found by") else "right", overflow="fold")
    over = False
    for p, rank in [(data["baseline"], "base"), *((p, str(p["rank"])) for p in data["plans"])]:
        cells, over_gpu = _row(data, p, rank, what, timed, grid)
        over = over or over_gpu
        t.add_row(*(cells[c] for c in cols))
    return t, over


def _row(data: dict, p: dict, rank: str, what: str, timed: bool, grid: bool) -> tuple[dict[str, str], bool]:
    """One plan's cells by column name (`rank`: its number, or "base"), and whether it is over one GPU's memory."""
    score = _ms(p["ttft"]["mean_s"] if data["workload"] else p["forward_s"]) + " ms" if timed else f"{p['score']:,.0f}"
    gpu = data.get("gpu_memory_bytes")
    mem = p.get("memory_bytes_per_rank", {}).get("total", p["search_memory_bytes_per_rank"])
    over_gpu = gpu is not None and mem > gpu
    found = "named (rediscovered)" if p.get("same_as_named") and rank != "base" else p["found_by"]
    cells = {
        "#": rank,
        "plan": p["name"] + (f" {p['deployment']}" if grid else ""),
        "found by": found,
        what: score,
        "vs base": signed_pct(p.get("delta_vs_baseline_pct")),
        "comm B/tok/rank": f"{p['comm_bytes_per_token_per_rank']:,.0f}",
        "comm vs base": signed_pct(p.get("comm_delta_vs_baseline_pct")),
        "memory/rank": styled(_fmt_bytes(mem) + (" [red](over)[/]" if over_gpu else "")),
        "replicated": _fmt_bytes(p["replicated_extra_bytes_per_rank"]),
    }
    return cells, over_gpu


def _print_notes(console: Console, data: dict) -> None:
    """The sentences the ranked figures call for: ranked plans inside the prediction's band of each other,
    replicas, and what the deployment change alone does (baseline there against baseline at the reference)."""
    scores = [p["score"] for p in data["plans"]]
    prov = data.get("provenance") or {}
    if len(scores) > 1 and prov.get("band") and scores[0] > 0:
        spread = (max(scores) - min(scores)) / scores[0]
        if spread < prov["band"]:
            print_wrapped(
                console,
                f"The {len(scores)} ranked plans lie within {100 * spread:.1f}% of each other, inside the "
                f"±{100 * prov['band']:.1f}% band: the Decisions below say how they differ.",
            )
    reps = sorted({p.get("replicas", 1) for p in data["plans"]} - {1})
    if reps:
        print_wrapped(
            console,
            f"Replicas ({', '.join(f'{r}x' for r in reps)}): copies of the deployment on GPUs of their own; the mean "
            "TTFT is over every request, the requests split between the replicas (docs/cost-model.md, "
            '"Replicas"); memory per rank, the plan and a --save file are one replica\'s (verify checks one).',
        )
    others = [b for b in data.get("baselines", [])[1:] if b["delta_pct"] is not None]
    if others:
        ref = data["baseline"]["deployment"]
        print_wrapped(
            console,
            "The deployment change alone (baseline there vs baseline at "
            + f"{ref}): "
            + "; ".join(f"{b['deployment']} {signed_pct(b['delta_pct'])}" for b in others)
            + ".",
        )


def _print_excluded(console: Console, data: dict, grid: bool) -> None:
    """Under a memory cap, how many plans that would rank it left out and the first ten; and the fixes when no
    plan fits at all."""
    ex = data["excluded_over_cap"]
    if data["memory_cap_bytes"] is not None:
        lines = [
            f"Memory cap {_fmt_bytes(data['memory_cap_bytes'])} per rank: {ex['count']} plan(s) that would rank "
            f"here were excluded ({ex['reason']})."
        ]
        for e in ex["plans"][:10]:
            mem = e.get("memory_bytes_per_rank", e.get("search_memory_bytes_per_rank", 0.0))
            lines.append(f"  - {e['name']}" + (f" {e['deployment']}" if grid else "") + f": {_fmt_bytes(mem)}")
        console.print("\n".join(lines), markup=False)
    if not data["plans"]:
        console.print(
            "[red]No legal plan fits.[/] Use more GPUs (--nodes), a smaller --expert-dtype, or --memory-cap none "
            "to rank plans that do not fit.",
            markup=True,
        )


def _print_decisions(console: Console, data: dict, grid: bool) -> None:
    """Each ranked plan's decisions in one line, and the best one's in words."""
    console.print("\nDecisions (AG all-gather, A2A all-to-all to heads; replicated ops run on local tokens):")
    for p in data["plans"]:
        where = f" {p['deployment']}" if grid else ""
        print_wrapped(console, f"  {p['rank']}. {p['name']}{where}: {p['title']}")
    if data["plans"]:
        best = data["plans"][0]
        console.print(f"\nBest, in words: {best['summary']}", markup=False)
