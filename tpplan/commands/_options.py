"""Options several commands share, written once (flags, help, type) so every command's --help says
the same thing about them. A command's own default goes after the annotation (`= None`)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer


class Backend(StrEnum):
    auto = "auto"
    gloo = "gloo"
    nccl = "nccl"


ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Preset name or path to config.json")]
NodesOpt = Annotated[int | None, typer.Option("--nodes", help="Override the topology's node count")]
ProcessesOpt = Annotated[int, typer.Option("--tp", help="Tensor-parallel size N (processes)")]
WeightsOpt = Annotated[Path | None, typer.Option("--weights", help="Folder of *.safetensors (default: random)")]
PrefillTokensOpt = Annotated[int, typer.Option("--tokens", help="Prefill tokens")]
BackendOpt = Annotated[Backend, typer.Option(help="auto = nccl with CUDA, else gloo")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds before a stuck collective fails")]
ProgressOpt = Annotated[bool, typer.Option("--progress/--no-progress")]

# -- GPU model and cluster (the two halves of a topology; tpplan.cost.gpu / tpplan.cost.cluster) ----------
_GPU_HELP = "GPU model preset (e.g. h200-measured, h200-datasheet) or .toml file: replaces the topology's GPU"
_CLUSTER_HELP = (
    "Cluster preset (e.g. h200x8-ib400) or .toml file: replaces the topology's cluster, and its GPU where the "
    "cluster names one"
)
_ENGINE_HELP = (
    "Serving engine whose measured kernels price compute where its database has them: sglang, vllm or trtllm, "
    "optionally @version (needs tpplan[aic])"
)
GpuOpt = Annotated[str | None, typer.Option("--gpu", help=_GPU_HELP)]
EngineOpt = Annotated[str | None, typer.Option("--engine", help=_ENGINE_HELP)]
ClusterOpt = Annotated[str | None, typer.Option("--cluster", help=_CLUSTER_HELP)]

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
    "TimeoutOpt",
    "WeightsOpt",
]
