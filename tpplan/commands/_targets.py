"""The target options of search and report (`--ttft-target`, `--tpot-target`, `--target-stat`, `--gpus`),
the search under them (`tpplan.search.under_targets`), and its tables.

`--ttft-target 2s --tpot-target 50ms` at `--target-stat` (default p90), or each at its own statistic
(`p99:2s`); `--gpus N` sets the GPU budget (whole nodes of the topology); `--arrival-rate R` serves
each deployment at that rate instead. docs/search-json.md, "serving_search".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from tpplan.errors import TpplanError

if TYPE_CHECKING:
    from tpplan.cost.topology import Topology
    from tpplan.cost.workload import Workload
    from tpplan.engines.speculative import Speculative
    from tpplan.models.graph import ModelGraph
    from tpplan.report.results import Analysis
    from tpplan.search.results import SearchOutcome
    from tpplan.search.targets import Targets
    from tpplan.search.under_targets import TargetsOutcome
    from tpplan.simulate.serving import Arrival

TtftTargetOpt = Annotated[
    str | None,
    typer.Option("--ttft-target", metavar="[STAT:]TIME",
                 help="Search under a TTFT target, e.g. 2s or p99:1.5s: rank deployments by goodput per GPU"),
]  # fmt: skip
TpotTargetOpt = Annotated[
    str | None,
    typer.Option("--tpot-target", metavar="[STAT:]TIME",
                 help="Search under a TPOT target, e.g. 50ms or mean:40ms (needs a workload with output_len > 1)"),
]  # fmt: skip
DEFAULT_STAT = "p90"  # --target-stat's default in search and report
TargetStatOpt = Annotated[
    str, typer.Option("--target-stat", help="Statistic of a target given without one: mean, p50, p90 or p99")
]
RankPdOpt = Annotated[
    bool,
    typer.Option("--pd/--no-pd",
                 help="Under targets, also rank P/D deployments: prefill and decode pools of the meshes found"),
]  # fmt: skip
GpusOpt = Annotated[
    int | None,
    typer.Option("--gpus", help="GPU budget of the search under targets, whole nodes (default: the topology's)"),
]


def targets_of(ttft: str | None, tpot: str | None, stat: str) -> Targets | None:
    """The targets the options give (None: neither target), checked before any work."""
    from tpplan.search.targets import Targets, parse_stat, parse_target

    default = parse_stat(stat, "target_stat")
    if ttft is None and tpot is None:
        if stat != DEFAULT_STAT:  # it would change nothing: refused rather than ignored
            raise TpplanError(f"--target-stat {stat}", "it is the statistic of --ttft-target and --tpot-target, "
                              "and neither is given", "add a target, or drop --target-stat")  # fmt: skip
        return None
    return Targets(
        parse_target(ttft, "ttft", default) if ttft is not None else None,
        parse_target(tpot, "tpot", default) if tpot is not None else None,
    )


def check_targets(
    targets: Targets | None, gpus: int | None, topo: Topology | None, workload: str | None, trace: str | None
) -> None:
    """What a search under targets needs, refused in one line before any work: a topology, a workload, no
    trace, and a budget of whole nodes equal to the topology's GPUs."""
    if targets is None:
        if gpus is not None:
            raise TpplanError(f"--gpus {gpus}", "a GPU budget is for the search under targets",
                              "add --ttft-target and/or --tpot-target, or drop --gpus")  # fmt: skip
        return
    if topo is None:
        raise TpplanError("--ttft-target/--tpot-target", "serving under targets needs a topology",
                          "add --topology (e.g. h200x8-ib400)")  # fmt: skip
    if workload is None:
        raise TpplanError("--ttft-target/--tpot-target", "the requests' prompts and outputs come from a workload",
                          "add --workload (a file with output_len above 1 for a TPOT target)")  # fmt: skip
    if trace is not None:
        raise TpplanError("--trace", "the search under targets serves closed-loop loads or a rate, not a trace",
                          "drop --trace, or give --arrival-rate")  # fmt: skip
    if gpus is not None and gpus != topo.world_size:
        raise TpplanError(
            f"--gpus {gpus}",
            f"is not whole nodes of {topo.gpus_per_node} GPUs of {topo.name}",
            f"use a multiple of {topo.gpus_per_node} (smaller deployments are searched as replicas)",
        )


def budget_gpus(gpus: int | None, nodes: int | None) -> int | None:
    """The GPUs the topology must hold for `--gpus` (None: the topology's own); with `--nodes` too, refused."""
    if gpus is None:
        return None
    if gpus < 1:
        raise TpplanError(f"--gpus {gpus}", "must be at least 1", "give the GPU budget, e.g. --gpus 16")
    if nodes is not None:
        raise TpplanError(f"--gpus {gpus} --nodes {nodes}", "both set the GPUs", "give one of them")
    return gpus


def serve_search(
    outcome: SearchOutcome, graph: ModelGraph, workload: Workload, targets: Targets, arrival: Arrival, pd: bool,
    speculative: Speculative | None = None, engine: str | None = None,
) -> TargetsOutcome:  # fmt: skip
    """The search's deployments served under the targets, at the rate of `--arrival-rate` if given; `pd`:
    P/D deployments too; `speculative`: decode steps as speculative steps; `engine`: `--engine`'s release, whose
    launch lines (beside the other engine's current release) mark the deployments no engine launches."""
    from tpplan.search.under_targets import serve_under_targets

    return serve_under_targets(outcome, graph, workload, targets, arrival=arrival if arrival.rate is not None else None,
                               requests=arrival.requests, disaggregated=pd, speculative=speculative,
                               engines=(engine,) if engine else None)  # fmt: skip


def with_serving(
    analysis: Analysis, graph: ModelGraph, topo: Topology, workload: Workload, targets: Targets,
    arrival: Arrival | None, engines: list[str] | None, pd: bool, replicas: int | Literal["all"] | None,
    speculative: Speculative | None = None, **search: Any,
) -> Analysis:  # fmt: skip
    """The memo's analysis with its Serving section's data: the search run as `tpplan search` runs it under
    targets (every deployment whole, replicas of smaller splits unless `--replicas`), each deployment served."""
    from dataclasses import replace

    from tpplan.report.serving_memo import build_serving_memo
    from tpplan.search import search_plans
    from tpplan.search.grid import MeshAsk

    sizes = {k: search.pop(k) for k in ("tp", "pp", "cp", "cp_layers", "cp_kv", "router") if k in search}
    ask = MeshAsk(replicas=replicas if replicas is not None else "all", **sizes)
    outcome = search_plans(graph, topo, workload=workload, top=1, every_deployment=True, ask=ask, audits=None,
                           **search)  # fmt: skip
    memo = build_serving_memo(outcome, graph, workload, targets, arrival=arrival,
                        engines=tuple(engines) if engines else None, pd=pd, speculative=speculative)  # fmt: skip
    return replace(analysis, serving=memo)


def print_targets(data: dict[str, Any]) -> None:
    """The answer under targets: each deployment at its best load (or nearest miss; `*`: no engine release launches
    it, the footnote says why), the verdict, the front."""
    from rich.table import Table
    from rich.text import Text

    from tpplan.commands._console import console, print_wrapped, show
    from tpplan.report.rows import fig, rate

    out = console()
    how = f"at {data['rate_per_s']:g} req/s" if data["rate_per_s"] is not None else f"on {data['gpus']} GPUs"
    t = Table(title=f"Under targets, {how}: goodput in requests/s per GPU, times in ms")
    stats = {k: v["stat"] for k, v in data["targets"].items()}
    heads = ["deployment", "clients"] + [f"{stats[k]} {k.upper()}" for k in ("ttft", "tpot") if k in stats]
    for col in (*heads, "goodput/GPU", "tok/s/GPU", "tok/s/user", "binds"):
        t.add_column(col, justify="left" if col in ("deployment", "binds") else "right", overflow="fold")
    for d in data["deployments"]:
        p = d["best"] or d["closest"]
        name = d["deployment"] + ("*" if d["needs_code"] else "") + ("" if d["meets_targets"] else " (misses)")
        clients = "" if p["clients"] is None else str(p["clients"])
        ms = [fig(p["achieved_s"][k] * 1e3) for k in ("ttft", "tpot") if k in stats]
        t.add_row(Text(name), clients, *ms, f"{p['goodput_per_gpu']:.3g}", rate(p['output_tok_s_per_gpu']),
                  rate(p['output_tok_s_per_user']), Text(d["binds"] or ""))  # fmt: skip
    show(out, t)
    why = dict.fromkeys(d["needs_code"] for d in data["deployments"] if d["needs_code"])
    if why:
        print_wrapped(out, "* No engine release launches it (needs code): " + "; ".join(why))
    print_wrapped(out, data["verdict"])
    for s in data["skipped"]:
        print_wrapped(out, f"Not served: {s['deployment']}: {s['why']}")
    f = Table(title="Pareto front: output tokens/s per GPU against tokens/s per user (every load served)")
    for col in ("deployment", "clients", "tok/s/GPU", "tok/s/user", "meets"):
        f.add_column(col, justify="left" if col == "deployment" else "right")
    for p in data["pareto_front"]:
        f.add_row(Text(p["deployment"]), "" if p["clients"] is None else str(p["clients"]),
                  rate(p['output_tok_s_per_gpu']), rate(p['output_tok_s_per_user']),
                  "yes" if p["meets_targets"] else "no")  # fmt: skip
    show(out, f)


__all__ = [
    "GpusOpt",
    "RankPdOpt",
    "TargetStatOpt",
    "TpotTargetOpt",
    "TtftTargetOpt",
    "budget_gpus",
    "check_targets",
    "print_targets",
    "serve_search",
    "targets_of",
    "with_serving",
]
