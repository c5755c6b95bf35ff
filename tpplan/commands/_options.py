"""Options several commands share, written once (flags, help, type) so every command's --help says
the same thing about them. A command's own default goes after the annotation (`= None`)."""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tpplan.commands._bounds import CP_RANGE, NODES_RANGE, TOKENS_RANGE, TP_RANGE, named
from tpplan.errors import TpplanError

if TYPE_CHECKING:
    from tpplan.cost.topology import Topology
    from tpplan.outputs import Output


class Backend(StrEnum):
    auto = "auto"
    gloo = "gloo"
    nccl = "nccl"


ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="Preset name (`tpplan models`) or path to config.json (or its folder)")
]
NodesOpt = Annotated[
    int | None,
    typer.Option(
        "--nodes",
        help="Nodes of the topology (default for a preset: as many as --tp x --pp needs, else one)",
        callback=NODES_RANGE,
    ),
]
ProcessesOpt = Annotated[int, typer.Option("--tp", help="Tensor-parallel size N (processes)", callback=TP_RANGE)]
WeightsOpt = Annotated[Path | None, typer.Option("--weights", help="Folder of *.safetensors (default: random)")]
PrefillTokensOpt = Annotated[int, typer.Option("--tokens", help="Prefill tokens", callback=TOKENS_RANGE)]
BackendOpt = Annotated[Backend, typer.Option(help="auto = nccl with CUDA, else gloo")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds before a stuck collective fails")]
ProgressOpt = Annotated[bool, typer.Option("--progress/--no-progress")]

RedundantExpertsOpt = Annotated[
    int,
    typer.Option(
        "--ep-num-redundant-experts",
        min=0,
        help="Redundant routed experts over each --plan's EP group, as SGLang's flag (vLLM: EPLB's "
        "num_redundant_experts): experts + N physical experts, an equal share per rank, so an EP size that divides "
        "that count is valid; needs --plan naming EP or all-to-all plans",
    ),
]

SearchRedundantExpertsOpt = Annotated[
    int,
    typer.Option(
        "--ep-num-redundant-experts",
        min=0,
        help="Redundant routed experts in every EP and all-to-all plan searched, as SGLang's flag (vLLM: EPLB's "
        "num_redundant_experts): experts + N physical experts, an equal share per rank, so an EP size that divides "
        "that count is searched too; TP-MoE plans hold none (default 0)",
    ),
]


def redundant_plans(plans: list[str] | None, count: int) -> list[str] | None:
    """The --plan names with `count` redundant experts (`<plan>+redundant<count>`,
    `tpplan.engines.redundant_experts`); one line where no plan is named for them."""
    if not count:
        return plans
    if not plans:
        raise TpplanError(f"--ep-num-redundant-experts {count}", "names no plan to hold the redundant experts",
                          "name EP or all-to-all plans with --plan, e.g. --plan dp-attention+a2a")  # fmt: skip
    return [f"{p}+redundant{count}" for p in plans]


JSON_TO_STDOUT = "-"  # `--json -`: the JSON object is all that goes to standard output


def json_option(schema_doc: str) -> typer.models.OptionInfo:
    """`--json FILE` means the same on every command: write one JSON object to FILE, or with `-` print
    it to standard output in place of the tables (so a pipe gets JSON and nothing else)."""
    return typer.Option(
        "--json",
        metavar="FILE",
        help=f"Write one JSON object ({schema_doc}) to FILE; `--json -` prints it instead of the tables",
    )


def check_json_target(target: str | None, *others: Output) -> Path | None:
    """The file `--json` names, checked before any work together with the command's `others` outputs
    (`tpplan.outputs.check_outputs`: not the same path, not inside a folder output); None: no file,
    either none or standard output."""
    from tpplan.outputs import Output, check_outputs

    mine = [Output("--json", target)] if target is not None and target != JSON_TO_STDOUT else []
    paths = check_outputs(*mine, *others)
    return paths[0] if mine else None


def emit_json(target: str | None, data: object) -> bool:
    """Write `data` where `--json` says; True when it went to standard output (the caller prints no table)."""
    import json

    from tpplan.outputs import write_files

    if target is None:
        return False
    text = json.dumps(data, indent=2)
    if target == JSON_TO_STDOUT:
        typer.echo(text)
        return True
    write_files({Path(target): text}, "--json")
    return False


def load_cluster(
    topology: str | None,
    nodes: int | None,
    gpus: int | None = None,
    *,
    gpu: str | None = None,
    cluster: str | None = None,
    engine: str | None = None,
) -> Topology | None:
    """The topology `--topology`/`--cluster`/`--gpu`/`--engine` name (None: none given), with a node
    count nobody has to guess: `--nodes`, a file's own, or for a preset as many nodes as `gpus`
    (TP x PP) need, else one node (`cluster_text` prints what was used)."""
    from tpplan.cost.cluster import MAX_NODES
    from tpplan.cost.topology import select_topology

    topo = select_topology(topology, nodes, gpu=gpu, cluster=cluster, engine=engine)
    named = topology if topology is not None else cluster
    if topo is None or named is None or nodes is not None:
        return topo
    if Path(named).suffix.lower() in (".toml", ".json") or os.path.exists(named):  # os.path: no raise
        return topo  # a file's own node count
    need = max(1, -(-gpus // topo.gpus_per_node)) if gpus else 1
    if need > MAX_NODES:  # else `with_nodes` blames --nodes, which nobody passed
        raise TpplanError(f"{gpus:,} GPUs", f"need {need:,} nodes of {topo.gpus_per_node}; a cluster holds at "
                          f"most {MAX_NODES:,}", "ask for fewer GPUs (--gpus, or TP x PP x CP x replicas)")  # fmt: skip
    return topo.with_nodes(need) if need != topo.nodes else topo


def cluster_text(topo: Topology) -> str:
    """`h200x8-ib400 (4 x 8 GPUs)`: the topology and the cluster it stands for."""
    return f"{topo.name} ({topo.nodes} x {topo.gpus_per_node} GPUs)"


# -- GPU model and cluster (the two halves of a topology; tpplan.cost.gpu / tpplan.cost.cluster) ----------
_GPU_HELP = "GPU model preset (e.g. h200-measured, h200-datasheet) or .toml file: replaces the topology's GPU"
_CLUSTER_HELP = (
    "Cluster preset (e.g. h200x8-ib400) or .toml file: replaces the topology's cluster, and its GPU where the "
    "cluster names one"
)
_ENGINE_HELP = (
    "Serving engine whose measured kernels price compute where its database has them: sglang, vllm or trtllm, "
    "optionally @version (needs the aic extra: pip install 'tpplan\\[aic]')"
)
GpuOpt = Annotated[str | None, typer.Option("--gpu", help=_GPU_HELP, callback=named("--gpu"))]
EngineOpt = Annotated[str | None, typer.Option("--engine", help=_ENGINE_HELP, callback=named("--engine"))]
ClusterOpt = Annotated[str | None, typer.Option("--cluster", help=_CLUSTER_HELP, callback=named("--cluster"))]

__all__ = [
    "Backend",
    "BackendOpt",
    "ClusterOpt",
    "EngineOpt",
    "GpuOpt",
    "ModelOpt",
    "NodesOpt",
    "PrefillTokensOpt",
    "ProcessesOpt",
    "ProgressOpt",
    "RouterOpt",
    "TimeoutOpt",
    "WeightsOpt",
    "check_router",
    "cluster_text",
    "load_cluster",
]


def _recurrence(value: str) -> str:
    if value not in ("scan", "serial"):
        raise TpplanError(f"--cp-recurrence {value}", "unknown way to hand the recurrent state on",
                          "use scan (two-pass scan) or serial (rank by rank)")  # fmt: skip
    return value


CpOpt = Annotated[
    int,
    typer.Option("--cp", help="Context-parallel size: CP groups of TP ranks, each on 1/CP of the tokens",
                 callback=CP_RANGE),
]  # fmt: skip
CpRecurrenceOpt = Annotated[
    str,
    typer.Option("--cp-recurrence", help="Under --cp, linear attention's state hand-off: scan or serial",
                 callback=_recurrence),
]  # fmt: skip


def _cp_layers(value: str) -> str:
    if value not in ("all", "mla"):
        raise TpplanError(f"--cp-layers {value}", "unknown set of CP-sharded layers",
                          "use all (every layer, TP x CP GPUs) or mla (MLA attention only, CP inside TP)")  # fmt: skip
    return value


CpLayersOpt = Annotated[
    str,
    typer.Option("--cp-layers", help="Under --cp, which layers see a token shard: all, or mla (only the MLA "
                 "attention, the CP group inside the TP group: SGLang PR #38344)", callback=_cp_layers),
]  # fmt: skip


def _cp_kv(value: str) -> str:
    from tpplan.engines.context_parallel import CP_KV_MODES

    if value not in CP_KV_MODES:
        raise TpplanError(f"--cp-kv {value}", "unknown KV cache mode under CP",
                          "use engines (the whole sequence's KV on every CP rank) or sharded (1/CP)")  # fmt: skip
    return value


def _router(value: str | None) -> str | None:
    """A request router some engine version records (`tpplan.engines.routing`), else one line. Whether the loop's
    engine (`cost.pipeline.loop_engine`, from `--engine`, which a callback may not have seen yet) has it is
    checked where the loop is built (`simulate.engine.engine_loop`)."""
    if value is not None:
        from tpplan.cost.pipeline import DEFAULT_PP_ENGINE
        from tpplan.engines import ENGINES
        from tpplan.engines.routing import replica_router, replica_routers

        if not any(r.name == value for key in ENGINES for r in replica_routers(key)):
            replica_router(DEFAULT_PP_ENGINE, value)  # refused, naming the default engine's routers
    return value


def check_router(engine: str | None, router: str | None) -> None:
    """Refuse, in one line before any work, a `--router` the serving loop's engine version lacks: the loop runs
    `cost.pipeline.loop_engine(--engine)`'s rules, so the router must be that version's."""
    if router is not None:
        from tpplan.cost.pipeline import loop_engine
        from tpplan.engines.routing import replica_router

        replica_router(loop_engine(engine), router)


def refuse_lone_router(router: str | None, replicas: object) -> None:
    """Refuse, in one line, a `--router` asked for with one replica (`replicas` 1 or unset): there is nothing for it
    to spread, and the flag would be accepted and ignored."""
    if router is not None and replicas in (None, 1):
        from tpplan.errors import TpplanError

        raise TpplanError(f"--router {router}", "spreads requests over replicas, and the deployment has one",
                          "add --replicas 2 or more, or drop --router")  # fmt: skip


RouterOpt = Annotated[
    str | None,
    typer.Option("--router", help="What spreads the requests over --replicas: a router the engine release records, "
                 "e.g. sglang-router:cache_aware (default: the serving loop engine's own, SGLang's DP controller "
                 "round-robin without --engine; a name it lacks is refused with the list); the serving loop runs "
                 "it, the launch lines start it",
                 callback=_router),
]  # fmt: skip


CpKvOpt = Annotated[
    str,
    typer.Option("--cp-kv", help="Under CP, the KV cache a rank keeps: engines (default: the whole sequence's, "
                 "as SGLang and vLLM do) or sharded (its own tokens', 1/CP: tpplan's own accounting)",
                 callback=_cp_kv),
]  # fmt: skip
