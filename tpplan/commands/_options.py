"""Options several commands share, written once (flags, help, type) so every command's --help says
the same thing about them. A command's own default goes after the annotation (`= None`)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from tpplan.commands._bounds import NODES_RANGE, TOKENS_RANGE, TP_RANGE


class Backend(StrEnum):
    auto = "auto"
    gloo = "gloo"
    nccl = "nccl"


ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Preset name or path to config.json")]
NodesOpt = Annotated[
    int | None, typer.Option("--nodes", help="Override the topology's node count", callback=NODES_RANGE)
]
ProcessesOpt = Annotated[int, typer.Option("--tp", help="Tensor-parallel size N (processes)", callback=TP_RANGE)]
WeightsOpt = Annotated[Path | None, typer.Option("--weights", help="Folder of *.safetensors (default: random)")]
PrefillTokensOpt = Annotated[int, typer.Option("--tokens", help="Prefill tokens", callback=TOKENS_RANGE)]
BackendOpt = Annotated[Backend, typer.Option(help="auto = nccl with CUDA, else gloo")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds before a stuck collective fails")]
ProgressOpt = Annotated[bool, typer.Option("--progress/--no-progress")]

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
]
