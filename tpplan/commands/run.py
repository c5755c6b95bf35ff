"""`tpplan run`: execute one plan on torch.distributed and time it (no reference, no checks)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tpplan.commands._console import print_plan_notes
from tpplan.commands._options import (
    Backend,
    BackendOpt,
    ModelOpt,
    PrefillTokensOpt,
    ProcessesOpt,
    TimeoutOpt,
    WeightsOpt,
)

if TYPE_CHECKING:
    from tpplan.runtime.run import RunResult


def run(
    model: ModelOpt,
    tp: ProcessesOpt,
    plan: Annotated[str, typer.Option("--plan", "-p", help="Plan to run (must be legal)")],
    weights: WeightsOpt = None,
    tokens: PrefillTokensOpt = 64,
    chunk: Annotated[int | None, typer.Option("--chunk", help="Chunked prefill size")] = None,
    backend: BackendOpt = Backend.auto,
    dtype: Annotated[str, typer.Option("--dtype", help="fp32 or bf16")] = "bf16",
    repeat: Annotated[int, typer.Option("--repeat", help="Timed prefills")] = 3,
    timeout: TimeoutOpt = 300,
    force: Annotated[bool, typer.Option("--force", help="Start more ranks than this machine holds")] = False,
) -> int:
    """Run a legal plan and print the prefill time and the collectives each rank issued."""
    from tpplan.errors import TpplanError
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.named import make_plan
    from tpplan.runtime.checkpoint_files import check_folder
    from tpplan.runtime.distributed import check_legal
    from tpplan.runtime.group import RankFailed, under_torchrun
    from tpplan.runtime.run import RunCase, run_plan

    if dtype not in ("fp32", "bf16"):
        raise TpplanError(f"--dtype {dtype}", "run uses fp32 or bf16", "pass --dtype bf16")
    if not force:
        _check_local_ranks(model, tp, dtype, weights, backend)
    check_folder(weights)  # every *.safetensors file checked before any rank starts (a FIFO would block)
    graph = build_model_graph(load_model(model))
    the_plan = make_plan(plan, graph, tp)
    print_plan_notes([the_plan])
    check_legal(graph, the_plan, tp)
    case = RunCase(model, plan, tokens, chunk, 0, dtype, str(weights) if weights else None, repeat)
    try:
        res = run_plan(case, backend=backend.value, nproc=tp, timeout_s=timeout)
    except RankFailed as exc:
        from tpplan.commands._failure import print_failure, verify_memory_hint

        print_failure("run", exc, verify_memory_hint(model, tp, dtype, weights is None, reference=False))
        return 1
    if res is None or (under_torchrun() and int(os.environ["RANK"]) != 0):
        return 0
    _print_run(res, f"{model} {plan} TP{tp} {dtype}: {tokens} tokens" + (f" in chunks of {chunk}" if chunk else ""))
    return 0


def _check_local_ranks(model: str, tp: int, dtype: str, weights: Path | None, backend: Backend) -> None:
    """The TP ranks fit this machine (its GPUs, or its memory for CPU ranks), before any starts."""
    from tpplan.commands._failure import verify_memory_hint
    from tpplan.commands._ranks import check_local_ranks

    def hint() -> str:
        return verify_memory_hint(model, tp, dtype, weights is None, reference=False)

    check_local_ranks("--tp", tp, backend.value, False, hint)


def _print_run(res: RunResult, what: str) -> None:
    """The best prefill time of the run `what` names, and rank 0's collectives per prefill."""
    from rich.table import Table

    from tpplan.commands._console import console as make_console
    from tpplan.commands._console import show
    from tpplan.layout.schedule import bytes_by_kind

    console = make_console()
    best = min(res.seconds)
    console.print(f"{what}: prefill {best * 1e3:.1f} ms (best of {len(res.seconds)}, slowest rank), "
                  f"{res.shard_elements / 1e6:,.1f} M weight elements on rank 0")  # fmt: skip
    t = Table(title="collectives per prefill, rank 0")
    for col in ("kind", "calls", "MiB sent"):
        t.add_column(col, justify="right")
    for kind, (calls, sent) in sorted(bytes_by_kind(res.calls).items()):
        t.add_row(kind, str(calls), f"{sent / 2**20:,.3f}")
    show(console, t)
    if res.fallback_chunks:
        console.print(f"chunks {res.fallback_chunks} ran the baseline plan (fewer tokens than ranks)")


def register(app: typer.Typer) -> None:
    """Add the `run` command to the CLI."""
    app.command("run")(run)
