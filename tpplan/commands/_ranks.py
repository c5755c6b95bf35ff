"""The guard before `verify`, `run` and `bench` start local ranks: refuse (exit 2, one line with the
process count, the predicted memory where known, and `--force`) a run that would start more
processes than this machine can hold, e.g. `verify --tp 64` on 2 cores (64 processes, minutes, GiBs).

Under torchrun the processes exist already (the launcher started them), so nothing is checked."""

from __future__ import annotations

import os
from collections.abc import Callable

from tpplan.errors import TpplanError

CPU_RANKS_PER_CORE = 2  # gloo ranks are CPU processes: more than 2 per core only queue for the cores


def cpu_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def local_rank_limit(backend: str) -> tuple[int, str]:
    """How many local ranks this machine holds under `backend` ('auto' resolved as the runtime does),
    and why: one per visible GPU on nccl, `CPU_RANKS_PER_CORE` per core (at least 2 cores) on gloo."""
    from tpplan.runtime.group import resolve_backend

    if resolve_backend(backend) == "nccl":
        import torch

        gpus = torch.cuda.device_count()
        return gpus, f"{gpus} visible GPU(s), one rank each on nccl"
    cores = cpu_cores()
    return max(2, cores) * CPU_RANKS_PER_CORE, f"{cores} CPU core(s), {CPU_RANKS_PER_CORE} gloo ranks per core"


def check_local_ranks(
    option: str, ranks: int, backend: str, force: bool, predicted: Callable[[], str] | None = None
) -> None:
    """Raise a TpplanError when `ranks` local processes exceed what this machine holds (unless `force`);
    `predicted()` words the run's predicted memory (called only when refusing: it reads the model)."""
    from tpplan.runtime.group import under_torchrun

    if force or under_torchrun():
        return
    limit, why = local_rank_limit(backend)
    if ranks <= limit:
        return
    memory = f"; {predicted().split('. Try ')[0]}" if predicted is not None else ""
    raise TpplanError(
        f"{option} {ranks}",
        f"would start {ranks} local processes but this machine holds at most {limit} ({why}){memory}",
        f"use {option} {limit} or fewer, or pass --force to start them anyway",
    )
