"""`tpplan verify`: run plans for real on torch.distributed and check numbers and bytes.

Spawns `--tp` local processes (gloo on CPU, NCCL with one process per GPU), or runs in place
under `torchrun` (one process per rank, its environment variables name the group). Rank 0 runs
the single-process reference; every rank runs the plan from its own weight shard. Prints, per
plan, the max abs / relative error per layer and the bytes traced vs predicted per collective
kind; exits 1 when any check fails, 2 when a plan is illegal (unless --force) or an input is bad.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from tpplan.commands._bounds import TP_RANGE
from tpplan.commands._console import console as make_console
from tpplan.commands._console import print_plan_notes, print_wrapped, show, styled
from tpplan.commands._options import (
    Backend,
    BackendOpt,
    CpLayersOpt,
    CpOpt,
    CpRecurrenceOpt,
    ModelOpt,
    PrefillTokensOpt,
    TimeoutOpt,
    WeightsOpt,
    check_json_target,
    emit_json,
    json_option,
)
from tpplan.commands._plan_deployment import print_deployment_notes, resolve


def _mib(b: float) -> str:
    return f"{b / 2**20:,.3f}" if b >= 2**10 else f"{b:,.0f} B"


def _print_result(console: Any, res: Any) -> None:
    from rich.table import Table

    case = res.case
    status = "[bold green]PASS[/]" if res.passed else "[bold red]FAIL[/]"
    console.print(Text.assemble("\n", styled(status), f"  {case.label}  (TP{res.n}, {res.seconds:.1f}s)"))
    if not res.legal:
        reason = res.reason if len(res.reason) <= 600 else res.reason[:600].rsplit(" ", 1)[0] + " ..."
        print_wrapped(console, f"  illegal plan: {reason} (`tpplan audit --plan {case.plan}` lists every edge)")
    worst: dict[tuple[int, str], Any] = {}
    for e in res.errors:
        key = (e.layer, e.value)
        if key not in worst or e.rel > worst[key].rel:
            worst[key] = e
    kinds = res.case.model
    t = Table(title=f"max error over chunks vs the single-process reference ({kinds}, tolerance {res.tolerance:g})")
    for col in ("layer", "value", "max abs", "rel", "ok"):
        t.add_column(col, justify="right")
    for (layer, value), e in sorted(worst.items()):
        ok = styled("[green]yes[/]" if e.rel <= res.tolerance else "[red]NO[/]")
        name = "final" if value in ("hidden", "logits") else str(layer)
        t.add_row(name, value, f"{e.max_abs:.3e}", f"{e.rel:.3e}", ok)
    show(console, t)
    if not res.traced:
        return
    b = Table(title="collectives of rank 0: traced vs predicted (bytes sent per rank, MiB)")
    for col in ("kind", "traced calls", "traced MiB", "predicted calls", "predicted MiB", "match"):
        b.add_column(col, justify="right")
    for kind, tc, tb, pc, pb in res.bytes_table(0):
        match = styled("[green]yes[/]" if (tc, tb) == (pc, pb) else "[red]NO[/]")
        b.add_row(kind, str(tc), _mib(tb), str(pc), _mib(pb), match)
    show(console, b)
    unplanned = [c for c in res.traced[0] if not c.planned]
    if unplanned:
        console.print(f"  {len(unplanned)} collectives were not named by the plan (forced), e.g. "
                      f"{unplanned[0].kind} {unplanned[0].value} {list(unplanned[0].shape)}")  # fmt: skip
    per_rank = styled("all ranks" if res.trace_matches else "[red]differs[/]")
    console.print(Text.assemble("  trace == prediction (kind, shape, dtype, bytes, order): ", per_rank,
                  f"; fallback chunks traced {res.fallback_traced}, predicted {res.fallback_predicted}"))  # fmt: skip


def _summary(res: Any) -> dict[str, Any]:
    return {
        "model": res.case.model,
        "plan": res.case.plan,
        "tp": res.n,
        "tokens": res.case.tokens,
        "chunk": res.case.chunk,
        "dtype": res.case.dtype,
        "forced": res.case.force,
        "legal": res.legal,
        "passed": res.passed,
        "max_rel_error": res.max_rel,
        "tolerance": res.tolerance,
        "trace_matches": res.trace_matches,
        "seconds": res.seconds,
        "bytes_by_kind_rank0": [
            {"kind": k, "traced_calls": tc, "traced_sent_bytes": tb, "predicted_calls": pc, "predicted_sent_bytes": pb}
            for k, tc, tb, pc, pb in res.bytes_table(0)
        ],
        "fallback_chunks": res.fallback_traced,
    }


PlansOpt = Annotated[
    list[str], typer.Option("--plan", "-p", help="Plan(s) to verify; 'legal' = every legal named plan")
]
VerifyTpOpt = Annotated[
    int | None,
    typer.Option("--tp", help="Tensor-parallel size N (processes; default: a plan file's)", callback=TP_RANGE),
]
ChunkOpt = Annotated[int | None, typer.Option("--chunk", help="Chunked prefill size (state carried)")]
VerifyDtypeOpt = Annotated[str, typer.Option("--dtype", help="fp32 or bf16 (both runs use it)")]
WeightSeedOpt = Annotated[int, typer.Option("--seed", help="Random weights and token ids")]
ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force", help="Run an illegal plan anyway and show the mismatch; start more ranks than this machine holds"
    ),
]
PlanProgressOpt = Annotated[bool, typer.Option("--progress/--no-progress", help="A line on stderr per plan and step")]
ToleranceOpt = Annotated[
    float | None,
    typer.Option(
        "--tolerance",
        help="Max error / max |reference| per tensor (default 1e-4 fp32, 1e-1 bf16, 2e-2 fp16). At real widths "
        "on GPU fp32 summation order alone reaches ~1e-3: compare with the baseline plan's error.",
    ),
]


def verify(
    ctx: typer.Context,
    model: ModelOpt,
    plan: PlansOpt,
    tp: VerifyTpOpt = None,
    weights: WeightsOpt = None,
    tokens: PrefillTokensOpt = 64,
    chunk: ChunkOpt = None,
    backend: BackendOpt = Backend.auto,
    dtype: VerifyDtypeOpt = "fp32",
    seed: WeightSeedOpt = 0,
    force: ForceOpt = False,
    timeout: TimeoutOpt = 300,
    json_target: Annotated[str | None, json_option("a summary per plan; atomic")] = None,
    progress: PlanProgressOpt = True,
    tolerance: ToleranceOpt = None,
    cp: CpOpt = 1,
    cp_recurrence: CpRecurrenceOpt = "serial",
    cp_layers: CpLayersOpt = "all",
) -> int:
    """Execute plans on torch.distributed; compare with the single-process model and the predicted bytes."""
    check_json_target(json_target)  # before the run: a bad path costs one line, not minutes

    from tpplan.dtypes import dtype_name
    from tpplan.errors import TpplanError
    from tpplan.runtime.group import RankFailed, under_torchrun

    d = resolve(ctx, plan, {"tp": tp, "cp": cp, "cp_recurrence": cp_recurrence, "cp_layers": cp_layers})
    tp, cp = d["tp"], d["cp"]  # type: ignore[assignment]
    cp_recurrence, cp_layers = d["cp_recurrence"], d["cp_layers"]  # type: ignore[assignment]
    if tp is None:
        raise TpplanError("--tp", "no TP size given", "pass --tp N (or a plan file, which holds its own)")
    print_deployment_notes(d)
    _check_sizes(tp, dtype, tokens, chunk)
    if cp > 1:  # context parallelism: CP N ranks of TP 1 (commands/_verify_cp.py)
        return _verify_cp(model, cp, tp, plan, tokens, chunk, dtype, backend.value, seed, weights, timeout,
                          force, json_target, cp_recurrence, cp_layers)  # fmt: skip
    _check_ranks(model, tp, dtype, weights, backend, force)
    names = _plans_to_verify(model, plan, tp, force)
    dtype_name(dtype)
    from tpplan.runtime.checkpoint_files import check_folder
    from tpplan.runtime.verify import VerifyCase, verify_cases

    check_folder(weights)  # every *.safetensors file checked before any rank starts (a FIFO would block)
    cases = [
        VerifyCase(
            model, name, tokens, chunk, seed, dtype, force, str(weights) if weights else None, tolerance=tolerance
        )
        for name in names
    ]
    try:
        results = verify_cases(cases, backend=backend.value, nproc=tp, timeout_s=timeout, progress=progress)
    except RankFailed as exc:
        from tpplan.commands._failure import print_failure, verify_memory_hint

        print_failure("verify", exc, verify_memory_hint(model, tp, dtype, weights is None))
        return 1
    if under_torchrun() and int(os.environ["RANK"]) != 0:
        return 0
    return _report(results, json_target)


def _check_sizes(tp: int, dtype: str, tokens: int, chunk: int | None) -> None:
    """The run's sizes and dtype, one line each where bad."""
    from tpplan.errors import TpplanError

    if tp < 1:
        raise TpplanError(f"--tp {tp}", "the TP size must be at least 1", "pass --tp 1 or more")
    if dtype not in ("fp32", "bf16"):
        raise TpplanError(f"--dtype {dtype}", "verify runs fp32 or bf16", "pass --dtype fp32 or --dtype bf16")
    if tokens < 1 or (chunk is not None and chunk < 1):
        raise TpplanError("--tokens/--chunk", "must be positive", "pass --tokens 64 (and --chunk 16)")


def _check_ranks(model: str, tp: int, dtype: str, weights: Path | None, backend: Backend, force: bool) -> None:
    """The processes match `--tp`: torchrun's world, or (unless `force`) the TP ranks fit this machine."""
    from tpplan.errors import TpplanError
    from tpplan.runtime.group import under_torchrun

    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else tp
    if world != tp:
        raise TpplanError(f"--tp {tp}", f"torchrun started {world} processes", f"pass --tp {world}")
    if not force:
        from tpplan.commands._failure import verify_memory_hint
        from tpplan.commands._ranks import check_local_ranks

        check_local_ranks(
            "--tp", tp, backend.value, force, lambda: verify_memory_hint(model, tp, dtype, weights is None)
        )


def _plans_to_verify(model: str, plans: list[str], tp: int, force: bool) -> list[str]:
    """The plans `--plan` names, once each (`legal`: every legal named plan), their notes printed; an
    illegal one is refused with its first edge unless `force`."""
    from tpplan.audit import audit_plan
    from tpplan.errors import TpplanError
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.named import ALL_PLANS, make_plan, plan_name

    graph = build_model_graph(load_model(model))
    names = list(dict.fromkeys(plan_name(p) for p in plans))
    if "legal" in names:
        names.remove("legal")
        names += [p for p in ALL_PLANS if audit_plan(graph, make_plan(p, graph, tp), tp).legal]
    for name in dict.fromkeys(names):
        pa = audit_plan(graph, make_plan(name, graph, tp), tp)
        print_plan_notes([pa.plan])
        if not pa.legal and not force:
            v, more = pa.violations[0], len(pa.violations) - 1
            edge = f"[{v.layer_kind}] {v.op} receives `{v.value}` {v.got} but needs {v.needs}"
            raise TpplanError(
                f"--plan {name} (--tp {tp})",
                f"the audit calls this plan illegal: {edge}" + (f", and {more} more edge(s)" if more else ""),
                f"`tpplan audit --model {model} --tp {tp} --plan {name}` explains each edge and its fix; pick a "
                "legal plan, or pass --force to run it and see the mismatch",
            )
    return list(dict.fromkeys(names))


def _report(results: list[Any], json_target: str | None) -> int:
    """Every plan's result, as JSON (`--json`) or tables with the overall verdict; the exit status."""
    ok = all(r.passed for r in results)
    if emit_json(json_target, {"results": [_summary(r) for r in results], "passed": ok}):
        return 0 if ok else 1
    console = make_console()
    for res in results:
        _print_result(console, res)
    verdict = styled("[bold green]all passed[/]" if ok else "[bold red]FAILED[/]")
    console.print(Text.assemble("\n", verdict, f": {sum(r.passed for r in results)}/{len(results)} plans"))
    return 0 if ok else 1


def _verify_cp(model: str, cp: int, tp: int, plans: list[str], tokens: int, chunk: int | None, dtype: str,
               backend: str, seed: int, weights: Path | None, timeout: float, force: bool,
               json_target: str | None, recurrence: str, layers: str = "all") -> int:  # fmt: skip
    from tpplan.commands._ranks import check_local_ranks
    from tpplan.commands._verify_cp import check_cp_args, print_cp, run_cp, run_tp_cp
    from tpplan.errors import TpplanError
    from tpplan.runtime.group import RankFailed

    check_cp_args(cp, tp, plans, chunk, dtype, backend, layers)
    from tpplan.runtime.checkpoint_files import check_folder

    check_folder(weights)  # every *.safetensors file checked before any rank starts (a FIFO would block)
    check_local_ranks("--tp x --cp", tp * cp if layers == "all" else cp, "gloo", force)
    if tp > 1 and weights is not None:
        raise TpplanError("--weights", "a TP x CP run uses random weights", "drop --weights, or pass --tp 1")
    try:
        if tp > 1 and layers == "all":
            summary = run_tp_cp(model, plans[0], tp, cp, tokens, seed, timeout, recurrence)
        else:
            summary = run_cp(model, cp, tokens, seed, weights, timeout, recurrence, layers)
    except RankFailed as exc:
        from tpplan.commands._failure import print_failure

        print_failure("verify", exc)
        return 1
    if emit_json(json_target, {"results": [summary], "passed": summary["passed"]}):
        return 0 if summary["passed"] else 1
    print_cp(make_console(), summary)
    return 0 if summary["passed"] else 1


def register(app: typer.Typer) -> None:
    """Add the `verify` command to the CLI."""
    app.command("verify")(verify)
