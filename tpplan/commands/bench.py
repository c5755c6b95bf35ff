"""`tpplan bench`: run plans on a model slice on the local GPUs (NCCL) or CPU (gloo), measured vs predicted."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tpplan.commands._bounds import TOKENS_RANGE, named
from tpplan.commands._options import ProgressOpt

if TYPE_CHECKING:
    from tpplan.bench.config import BenchConfig
    from tpplan.bench.results import PlanBench


OutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="results JSON (several plans: <stem>-<plan>.json)")]
PlansOpt = Annotated[list[str] | None, typer.Option("--plan", "-p", help="plan to run (repeatable)")]
ModelOpt = Annotated[str | None, typer.Option("--model", "-m", help="preset name or config.json (a run needs it)")]
WorkloadOpt = Annotated[
    str, typer.Option("--workload", "-w", help="workload preset or file", callback=named("--workload"))
]
TopologyOpt = Annotated[
    str | None,
    typer.Option(
        "--topology",
        "-t",
        help="topology the predictions use (a calibrated one; default "
        "h200x2-calibrated, with --repredict the one each run recorded)",
        callback=named("--topology"),
    ),
]
LayersOpt = Annotated[
    str | None, typer.Option("--layers", help="layers to run: auto, START:STOP or 0-based list (e.g. 1,2,3,4)")
]
ExpertsOpt = Annotated[
    int | None, typer.Option("--experts", help="routed experts kept per MoE layer (default: as many as fit)")
]
TokensOpt = Annotated[
    int | None, typer.Option("--tokens", help="override the workload's prompt length", callback=TOKENS_RANGE)
]
ChunkOpt = Annotated[int | None, typer.Option("--chunk", help="override the workload's chunk size")]
RequestsOpt = Annotated[int | None, typer.Option("--requests", help="override the workload's request count")]
ItersOpt = Annotated[int, typer.Option("--iters", help="timed passes over the workload's batches")]
WarmupOpt = Annotated[int, typer.Option("--warmup", help="untimed batches first")]
DirectItersOpt = Annotated[int, typer.Option("--direct-iters", help="calls per collective replay")]
BackendNameOpt = Annotated[str, typer.Option("--backend", help="nccl, gloo or auto")]
NprocOpt = Annotated[int | None, typer.Option("--nproc", help="ranks (default: GPUs, or 2 on CPU)")]
DtypeOpt = Annotated[str | None, typer.Option("--dtype", help="bf16 (NCCL default), fp16, fp32 (gloo default)")]
KernelsOpt = Annotated[str, typer.Option("--kernels", help="fast (SDPA attention, bf16 experts) or reference")]
OverheadOpt = Annotated[
    bool, typer.Option("--overhead", help="GPU: measure the runtime's overhead inside the plan's own run")
]
TimingOpt = Annotated[
    str,
    typer.Option(
        "--timing",
        help="GPU: as-issued (the default: the timing every recorded run used) or host-ahead (a sleep queued "
        "before each timed batch, so ops time the GPU; not yet run on a GPU)",
    ),
]
TargetTopologyOpt = Annotated[
    str | None, typer.Option("--target-topology", help="extrapolate the whole model's TTFT to this topology")
]
TargetNodesOpt = Annotated[int | None, typer.Option("--target-nodes", help="nodes of the target topology")]
MdOpt = Annotated[Path | None, typer.Option("--md", help="markdown table to write")]
AnchorOpt = Annotated[
    Path | None, typer.Option("--anchor", help="NCCL probe JSON to compare with (h200x2_nccl_probe.json)")
]
CheckOpt = Annotated[bool, typer.Option("--check", help="print the targets; exit 1 if one fails")]
FromOpt = Annotated[
    list[Path] | None,
    typer.Option("--from", help="results JSON written earlier: redo the markdown/checks, run nothing"),
]
RepredictOpt = Annotated[
    bool,
    typer.Option(
        "--repredict",
        help="with --from: price the recorded runs again with the current cost model "
        "(--out writes the re-predicted results)",
    ),
]
SeedOpt = Annotated[int, typer.Option("--seed")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="seconds before a stuck collective fails")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Start more ranks than this machine holds")]


def bench(
    out: OutOpt = None,
    plan: PlansOpt = None,
    model: ModelOpt = None,
    workload: WorkloadOpt = "prompt16k-c8",
    topology: TopologyOpt = None,
    layers: LayersOpt = None,
    experts: ExpertsOpt = None,
    tokens: TokensOpt = None,
    chunk: ChunkOpt = None,
    requests: RequestsOpt = None,
    iters: ItersOpt = 2,
    warmup: WarmupOpt = 2,
    direct_iters: DirectItersOpt = 20,
    backend: BackendNameOpt = "auto",
    nproc: NprocOpt = None,
    dtype: DtypeOpt = None,
    kernels: KernelsOpt = "fast",
    overhead: OverheadOpt = False,
    timing: TimingOpt = "as-issued",
    target_topology: TargetTopologyOpt = None,
    target_nodes: TargetNodesOpt = None,
    md: MdOpt = None,
    anchor: AnchorOpt = None,
    check: CheckOpt = False,
    from_files: FromOpt = None,
    repredict: RepredictOpt = False,
    seed: SeedOpt = 0,
    timeout: TimeoutOpt = 600,
    progress: ProgressOpt = True,
    force: ForceOpt = False,
) -> None:
    """Run plans on a representative model slice with real collectives; time every collective, op, layer and
    batch against the prediction; write the bench JSON (docs/bench-json.md) and a markdown table."""
    from tpplan.bench.config import BenchConfig
    from tpplan.bench.results import output_paths, results_json
    from tpplan.plans.named import plan_name

    _check_outputs(out, plan, md, anchor, from_files, repredict)
    if from_files:
        benches, paths, files = _recorded(from_files, repredict, topology, out)
    else:
        model, out, nproc = _run_inputs(model, out, plan, nproc, backend, force)
        cfg = BenchConfig(
            model=model, plans=tuple(dict.fromkeys(plan_name(p) for p in plan or ())),  # an alias: the plan's name
            workload=workload, topology=topology or "h200x2-calibrated", layers=layers, experts=experts,
            tokens=tokens, chunk=chunk, requests=requests, iters=iters, warmup=warmup, direct_iters=direct_iters,
            backend=backend, nproc=nproc, dtype=dtype, kernels=kernels, overhead=overhead,
            timing=timing,
            target_topology=target_topology, target_nodes=target_nodes, seed=seed, timeout_s=timeout, progress=progress,
            command="tpplan " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        )  # fmt: skip
        ran = _run(cfg)
        if ran is None:
            return  # a non-zero torchrun rank
        benches = ran
        paths = output_paths(out, [b.plan for b in benches])
        files = {paths[b.plan]: results_json(b.results) for b in benches}
    _write_and_check(benches, paths, files, md, anchor, check)


def _check_outputs(
    out: Path | None, plan: list[str] | None, md: Path | None, anchor: Path | None, from_files: list[Path] | None,
    repredict: bool,
) -> None:  # fmt: skip
    """Every output path first: a bad one costs one line, not a run (several plans: one file each)."""
    from tpplan.bench.results import output_paths
    from tpplan.errors import TpplanError
    from tpplan.outputs import Output, check_outputs
    from tpplan.plans.named import plan_name

    if repredict and not from_files:
        raise TpplanError("--repredict", "needs recorded runs", "pass --from RESULTS.json (repeatable)")
    names = list(dict.fromkeys(plan_name(p) for p in plan or [])) or [""]  # the names the files will have
    if from_files and repredict and out is not None:  # re-predicted results: one file per recorded plan
        from tpplan.bench_results import load_bench_results

        names = [load_bench_results(f, "--from").plan for f in from_files]
        if len(set(names)) < len(names):
            raise TpplanError("--out", "the --from files repeat a plan", "re-predict one run per plan at a time")
    written = output_paths(out, names).values() if out and (not from_files or repredict) else []
    check_outputs(*(Output("--out", p) for p in written), *([Output("--md", md)] if md is not None else []))
    if anchor is not None and not anchor.is_file():
        raise TpplanError(f"--anchor {anchor}", "file not found", "pass the probe JSON or leave --anchor out")


def _recorded(
    from_files: list[Path], repredict: bool, topology: str | None, out: Path | None
) -> tuple[list[PlanBench], dict[str, Path], dict[Path, str]]:
    """The runs `--from` names (with `--repredict`, priced again on `topology`): the benches, the file each
    came from or goes to, and the files to write (re-predicted results with `--out`)."""
    from tpplan.bench.results import from_files as load_previous
    from tpplan.bench.results import output_paths, results_json

    files: dict[Path, str] = {}
    if not repredict:
        benches = load_previous(from_files)
        return benches, {b.plan: f for b, f in zip(benches, from_files, strict=True)}, files
    from tpplan.bench.repredict import repredict as reprice

    benches = reprice(from_files, topology)
    paths = {b.plan: f for b, f in zip(benches, from_files, strict=True)}
    if out is not None:
        paths = output_paths(out, [b.plan for b in benches])
        files = {paths[b.plan]: results_json(b.results) for b in benches}
    return benches, paths, files


def _run_inputs(
    model: str | None, out: Path | None, plan: list[str] | None, nproc: int | None, backend: str, force: bool
) -> tuple[str, Path, int]:
    """A run's model, results file and ranks (default: the GPUs, or 2 on CPU), checked to fit this machine."""
    from tpplan.commands._ranks import check_local_ranks
    from tpplan.errors import TpplanError

    if out is None or not plan:
        raise TpplanError("--out/--plan", "a run needs both", "pass --plan NAME ... --out FILE (or --from FILES)")
    if model is None:
        raise TpplanError("--model", "a run needs a model", "pass --model M (`tpplan models` lists presets)")
    if nproc is None:
        import torch

        nproc = torch.cuda.device_count() if backend != "gloo" and torch.cuda.is_available() else 2
    check_local_ranks("--nproc", nproc, backend, force)
    return model, out, nproc


def _run(cfg: BenchConfig) -> list[PlanBench] | None:
    """The bench's runs (None on a torchrun rank other than 0); a rank that fails ends the command, exit 1."""
    from tpplan.bench.plan_bench import run_bench
    from tpplan.commands._failure import print_failure
    from tpplan.runtime.group import RankFailed

    try:
        return run_bench(cfg)
    except RankFailed as exc:
        hint = "Try fewer --experts, fewer --layers, fewer --tokens or fewer --requests"
        print_failure("bench", exc, hint, tail=". Nothing was written.")
        raise SystemExit(1) from None


def _write_and_check(
    benches: list[PlanBench], paths: dict[str, Path], files: dict[Path, str], md: Path | None, anchor: Path | None,
    check: bool,
) -> None:  # fmt: skip
    """The markdown (with the anchor's rows) and every file, together; its summary printed; with `--check`,
    exit 1 when a target is not met."""
    from tpplan.bench.checks import checks, checks_ok
    from tpplan.bench.markdown import anchor_rows, markdown
    from tpplan.commands._console import console, print_markdown
    from tpplan.outputs import write_files

    text = markdown(benches, paths)
    if anchor is not None:
        text += "\n".join(anchor_rows(benches, anchor)) + "\n"
    if md is not None:
        files[md] = text
    write_files(files, "--out/--md")
    out_console = console()
    for f in files:
        out_console.print(f"wrote {f}", markup=False)
    if check or md is None:
        print_markdown(out_console, text[text.index("## Summary") :])
    if check and not checks_ok(benches):
        failed = [c.name for c in checks(benches) if c.ok is False]
        console(stderr=True).print(f"targets not met: {', '.join(failed)}", markup=False, soft_wrap=True)
        raise SystemExit(1)


def register(app: typer.Typer) -> None:
    """Add the `bench` command to the CLI."""
    app.command("bench")(bench)
