"""`tpplan calibrate`: measure collectives (and GEMMs) here, fit the model, write a topology."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tpplan.commands._options import Backend, BackendOpt, ProgressOpt
from tpplan.mesh import Mesh
from tpplan.text import plain

if TYPE_CHECKING:
    from tpplan.bench.calibrate import CalibrationConfig
    from tpplan.cost.topology import Topology


def _print_tables(res: object) -> None:
    from rich.table import Table

    from tpplan.bench.calibrate import CalibrationResult
    from tpplan.commands._console import console as make_console
    from tpplan.commands._console import show

    assert isinstance(res, CalibrationResult)
    console = make_console()
    for kind, fit in res.fitted.items():
        table = Table(title=f"{kind}  ({res.world} ranks, {res.backend}, {res.device_name})")
        for col in ("size (B)", "count", "type", "time (us)", "algbw (GB/s)", "busbw (GB/s)"):
            table.add_column(col, justify="right")
        table.add_column("fit (us)", justify="right")
        for p in (p for p in res.points if p.kind == kind):
            model = fit.alpha_us + (p.busbw_GBps * p.time_s * 1e9) / fit.busbw_GBps / 1e3
            table.add_row(
                str(p.nbytes), str(p.count), p.dtype, f"{p.time_s * 1e6:.1f}",
                f"{p.algbw_GBps:.2f}", f"{p.busbw_GBps:.2f}", f"{model:.1f}",
            )  # fmt: skip
        show(console, table)
    summary = Table(title="fitted: time = alpha + busfactor * size / busbw")
    for col in ("collective", "alpha (us)", "busbw (GB/s)", "points", "max rel err"):
        summary.add_column(col, justify="right")
    for kind, fit in res.fitted.items():
        summary.add_row(
            kind, f"{fit.alpha_us:.1f}", f"{fit.busbw_GBps:.2f}", str(fit.points),
            f"{fit.max_rel_err:.1%}",
        )  # fmt: skip
    show(console, summary)
    if res.gemm:
        console.print(f"GEMM: {len(res.gemm)} shapes measured, written to gpu.gemm_table")


def _kernels_from(paths: list[Path], base_topology: str, out: Path) -> None:
    from rich.table import Table

    from tpplan.bench.calibrate import write_topology_atomic
    from tpplan.bench_results import load_bench_results
    from tpplan.commands._console import console, show
    from tpplan.cost.kernel_fit import fit_kernel_profiles, with_kernel_profiles
    from tpplan.cost.topology import load_topology
    from tpplan.outputs import write_errors

    base = load_topology(base_topology)
    results = [load_bench_results(p, "--kernels-from") for p in paths]
    source = ", ".join(
        f"{r.model} {r.plan} TP{r.tp} {r.workload} ({r.meta.gpu}, {r.meta.date:%Y-%m-%d})" for r in results
    )
    profiles = fit_kernel_profiles(results, source)
    table = Table(title=f"kernel profiles from {len(paths)} results file(s)")
    for col in ("kernel", "samples", "points", "measured / modelled"):
        table.add_column(col, justify="right" if col != "kernel" else "left")
    for key, prof in profiles.items():
        ratios = [y / x for x, y in prof.points]
        span = f"{min(ratios):.2f}" if len(ratios) == 1 else f"{min(ratios):.2f}-{max(ratios):.2f}"
        table.add_row(key, str(prof.samples), str(len(prof.points)), span)
    show(console(), table)
    topo = with_kernel_profiles(base, profiles, f"Kernel profiles fitted from: {source}.")
    topo = topo.model_copy(update={"name": out.stem})  # a preset's name is its file's
    with write_errors("--out", out):
        write_topology_atomic(topo, out, f"written by `tpplan calibrate --kernels-from`: {topo.notes}")
    typer.echo(plain(f"wrote {out}"))


def _quick(base_topology: str, out: Path, models: Path | None, quick: bool) -> None:
    """--quick (GEMM probe -> gpu.gemm_scale) and/or --kernel-models (fitted constants -> gpu.kernel_models)."""
    import statistics

    from rich.table import Table

    from tpplan.bench.calibrate import write_topology_atomic
    from tpplan.commands._console import console, show
    from tpplan.cost.kernel_models import KernelModels
    from tpplan.cost.topology import load_topology
    from tpplan.errors import TpplanError
    from tpplan.outputs import write_errors

    base = load_topology(base_topology)  # --out was checked by the caller, before any work
    gpu_upd: dict[str, object] = {}
    notes = [base.notes or ""]
    if models is not None:
        from tpplan.inputs import load_json

        fix = "pass the JSON `python -m tpplan.bench.model_fit` wrote"
        fit = load_json(models, f"--kernel-models {models}", fix)
        try:
            consts = fit["constants"]
        except (KeyError, TypeError) as exc:
            raise TpplanError(f"--kernel-models {models}", f"not a model fit ({exc})", fix) from None
        unknown = sorted(set(consts) - set(KernelModels.NAMES))
        if unknown:
            raise TpplanError(f"--kernel-models {models}", f"unknown models {unknown}", "pass a model_fit output")
        gpu_upd["kernel_models"] = {k: {n: v if isinstance(v, str) else float(v) for n, v in c.items()}
                                    for k, c in consts.items()}  # fmt: skip
        notes.append(f"physical kernel models fitted in {models.name} ({fit.get('clock_state', 'boost')} clock state)")
    if quick:
        import torch

        if not torch.cuda.is_available():
            raise TpplanError("--quick", "needs a CUDA GPU to time GEMMs", "run it on the machine to calibrate")
        from tpplan.bench.gemm_probe import probe

        points = probe()
        table = Table(title=f"GEMM probe on {torch.cuda.get_device_name()} (queued behind another kernel)")
        for col in ("M", "K", "N", "TFLOP/s", "alone", "table", "measured / table"):
            table.add_column(col, justify="right")
        for p in points:
            table.add_row(str(p.m), str(p.k), str(p.n), f"{p.cold_tflops:.0f}", f"{p.warm_tflops:.0f}",
                          f"{p.table_tflops:.0f}", f"{p.cold_tflops / p.table_tflops:.3f}")  # fmt: skip
        show(console(), table)
        ratios = [p.cold_tflops / p.table_tflops for p in points]
        scale = statistics.median(ratios)
        typer.echo(f"gemm_scale {scale:.3f} (per-shape {min(ratios):.3f}-{max(ratios):.3f}: one factor is only as "
                   "good as that spread)")  # fmt: skip
        gpu_upd["gemm_scale"] = scale
        notes.append(f"gemm_scale {scale:.3f} from `tpplan calibrate --quick` on {torch.cuda.get_device_name()}")
    topo = base.model_copy(update={"name": out.stem, "gpu": base.gpu.model_copy(update=gpu_upd),
                                   "gpu_preset": None,  # the GPU is this machine's now, no longer the preset
                                   "notes": "; ".join(n for n in notes if n)})  # fmt: skip
    with write_errors("--out", out):
        write_topology_atomic(topo, out, f"written by `tpplan calibrate --quick/--kernel-models`: {topo.notes}")
    typer.echo(plain(f"wrote {out}"))


OutOpt = Annotated[Path, typer.Option("--out", help="topology file to write (.toml or .json)")]
NprocOpt = Annotated[int | None, typer.Option(help="local processes to spawn (default: GPUs, or 2 on CPU)")]
MinBytesOpt = Annotated[int, typer.Option(help="smallest message (bytes)")]
MaxBytesOpt = Annotated[int, typer.Option(help="largest message (bytes)")]
StepsOpt = Annotated[int, typer.Option(help="sizes in the sweep (geometric)")]
ItersOpt = Annotated[int, typer.Option(help="timed iterations per size (median)")]
WarmupOpt = Annotated[int, typer.Option(help="untimed iterations per size")]
CollectivesOpt = Annotated[str, typer.Option(help="comma-separated kinds")]
GemmOpt = Annotated[bool | None, typer.Option("--gemm/--no-gemm", help="GEMM sweep (default: on with CUDA)")]
GemmModelOpt = Annotated[
    str | None,
    typer.Option(help="also time the per-rank GEMM shapes this model's named plans run (at --gemm-tp)"),
]
GemmTpOpt = Annotated[int | None, typer.Option(help="TP size for --gemm-model's shapes (default: --nproc)")]
BaseTopologyOpt = Annotated[str, typer.Option(help="preset or file whose GPU and link specs are copied")]
TimeoutOpt = Annotated[float, typer.Option(help="seconds before a stuck collective fails")]
KernelsFromOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--kernels-from",
        help="bench results JSON (repeatable): fit kernel profiles from its timed ops onto --base-topology "
        "and write it, measuring nothing (no GPU needed)",
    ),
]
QuickOpt = Annotated[
    bool,
    typer.Option(
        "--quick",
        help="seconds-long GEMM probe: this GPU's rate / the shape table's, as gpu.gemm_scale "
        "on --base-topology (no collectives)",
    ),
]
KernelModelsOpt = Annotated[
    Path | None,
    typer.Option(
        "--kernel-models",
        help="fitted physical kernel models (tpplan.bench.model_fit JSON) to put on --base-topology (no GPU needed)",
    ),
]


def calibrate(
    out: OutOpt,
    backend: BackendOpt = (Backend.auto),
    nproc: NprocOpt = None,
    min_bytes: MinBytesOpt = 1 << 20,
    max_bytes: MaxBytesOpt = 1 << 28,
    steps: StepsOpt = 8,
    iters: ItersOpt = 20,
    warmup: WarmupOpt = 5,
    collectives: CollectivesOpt = "all_reduce,reduce_scatter,all_gather,all_to_all",
    gemm: GemmOpt = None,
    gemm_model: GemmModelOpt = None,
    gemm_tp: GemmTpOpt = None,
    base_topology: BaseTopologyOpt = "h200x2",
    timeout: TimeoutOpt = 300,
    progress: ProgressOpt = True,
    kernels_from: KernelsFromOpt = None,
    quick: QuickOpt = False,
    kernel_models: KernelModelsOpt = None,
) -> None:
    """Measure collectives over a size sweep, fit alpha/busbw per kind, write a topology file.

    With --kernels-from, fit measured kernel speeds (norms, convs, attention, recurrence, experts)
    from bench results instead, and write --base-topology with them.
    """
    from tpplan.outputs import check_file

    check_file("--out", out)  # before measuring: a bad path costs one line, not a sweep
    if kernels_from:
        _kernels_from(kernels_from, base_topology, out)
        return
    if quick or kernel_models is not None:
        _quick(base_topology, out, kernel_models, quick)
        return
    from tpplan.bench.calibrate import CalibrationConfig
    from tpplan.cost.topology import load_topology

    base = load_topology(base_topology)  # fail on a bad preset before spending time measuring
    if nproc is None:
        import torch

        nproc = torch.cuda.device_count() if torch.cuda.is_available() else 2
    cfg = CalibrationConfig(
        **_gemm_shapes(gemm_model, gemm_tp or nproc, base),  # type: ignore[arg-type]
        backend=backend.value,
        nproc=nproc,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        steps=steps,
        iters=iters,
        warmup=warmup,
        collectives=tuple(c.strip() for c in collectives.split(",") if c.strip()),
        gemm=gemm,
        timeout_s=timeout,
        progress=progress,
    )
    _sweep(cfg, base, out)


def _gemm_shapes(gemm_model: str | None, tp: int, base: Topology) -> dict[str, object]:
    """With --gemm-model, the GEMM sweep's shapes widened by the per-rank shapes that model's named plans
    run at TP `tp` (CalibrationConfig's fields); else none (its defaults)."""
    if gemm_model is None:
        return {}
    from tpplan.bench.calibrate import GEMM_KN, GEMM_M_MODEL
    from tpplan.cost.predict import plan_gemm_shapes
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph

    shapes = plan_gemm_shapes(build_model_graph(load_model(gemm_model)), Mesh(tp), base)
    return {"gemm_kn": tuple(sorted({*GEMM_KN, *shapes})), "gemm_m": GEMM_M_MODEL}


def _sweep(cfg: CalibrationConfig, base: Topology, out: Path) -> None:
    """Measure, print the points and fits, and write `base` with the fitted collectives to `out`; a rank
    that fails ends the command, exit 1, nothing written."""
    from tpplan.bench.calibrate import calibrated_topology, run_calibration, write_topology_atomic
    from tpplan.outputs import write_errors
    from tpplan.runtime.group import RankFailed

    try:
        res = run_calibration(cfg)
    except RankFailed as exc:
        from tpplan.commands._failure import print_failure

        hint = "Try a smaller --max-bytes or fewer --steps"
        print_failure("calibration", exc, hint, tail=f". Nothing was written to {out}.")
        # SystemExit, not typer.Exit: under cli.main's standalone_mode=False click would turn
        # typer.Exit into a return value and the process would exit 0.
        raise SystemExit(1) from None
    if res is None:
        return  # a non-zero torchrun rank
    _print_tables(res)
    topo = calibrated_topology(base, res)
    header = f"written by `tpplan calibrate`: {topo.notes}"
    with write_errors("--out", out):
        write_topology_atomic(topo, out, header)
    typer.echo(plain(f"wrote {out}"))


def register(app: typer.Typer) -> None:
    """Add the `calibrate` command to the CLI."""
    app.command("calibrate")(calibrate)
