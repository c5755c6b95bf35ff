"""Options several commands share, written once (flags, help, type) so every command's --help says
the same thing about them. A command's own default goes after the annotation (`= None`)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tpplan.commands._bounds import NODES_RANGE, TOKENS_RANGE, TP_RANGE

if TYPE_CHECKING:
    from tpplan.cost.topology import Topology


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

def load_cluster(topology: str, nodes: int | None, gpus: int | None = None) -> Topology:
    """The topology with a node count nobody has to guess: `--nodes`, a topology file's own, or for
    a preset as many nodes as `gpus` (TP x PP) need, else one node (a preset's file says 4 only as
    the seed memo's example; `cluster_text` prints what was used)."""
    from tpplan.cost.topology import load_topology

    topo = load_topology(topology, nodes=nodes)
    is_file = Path(topology).suffix.lower() in (".toml", ".json") or Path(topology).exists()
    if nodes is None and not is_file:
        need = max(1, -(-gpus // topo.gpus_per_node)) if gpus else 1
        topo = topo.with_nodes(need) if need != topo.nodes else topo
    return topo


def cluster_text(topo: Topology) -> str:
    """`h200x8-ib400 (4 x 8 GPUs)`: the topology and the cluster it stands for."""
    return f"{topo.name} ({topo.nodes} x {topo.gpus_per_node} GPUs)"


__all__ = [
    "Backend",
    "BackendOpt",
    "ModelOpt",
    "NodesOpt",
    "PrefillTokensOpt",
    "ProcessesOpt",
    "ProgressOpt",
    "TimeoutOpt",
    "WeightsOpt",
    "cluster_text",
    "load_cluster",
]
