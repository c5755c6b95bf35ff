"""Measure collectives (and GEMMs on GPU) on the local group and fit the cost model's constants.

The result is a topology file: the base preset's hardware plus, per collective kind, a latency
(alpha) and bus bandwidth (busbw) fitted by least squares on relative error, which
`collective_time` then uses instead of the datasheet link model.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic_core import to_json

from tpplan.cost.topology import (
    COLLECTIVE_KINDS,
    FittedCollective,
    GemmPoint,
    Topology,
    load_topology,
    topology_to_toml,
)
from tpplan.errors import TpplanError
from tpplan.lower.sizes import bus_factor
from tpplan.outputs import write_files
from tpplan.runtime.group import GroupSpec, run_group
from tpplan.runtime.hooks import before_collective
from tpplan.signals import exit_cleanly

# GEMM sweep: the (K, N) of the shapes in presets/h200_gemm_shapes.json, four token counts
# (`--gemm-model` adds the shapes a model's named plans produce, at six token counts).
GEMM_M = (256, 2048, 8192, 16384)
GEMM_M_MODEL = (256, 1024, 2048, 4096, 8192, 16384)
GEMM_KN = (
    (7168, 2112), (7168, 384), (7168, 12288), (3584, 6144), (3584, 768), (3584, 192),
    (7168, 3584), (7168, 768), (8192, 8192),
)  # fmt: skip


@dataclass(frozen=True)
class SweepPoint:
    """One measured size of one collective (nccl-tests columns)."""

    kind: str
    nbytes: int
    count: int
    dtype: str
    time_s: float
    world: int

    @property
    def algbw_GBps(self) -> float:
        """size / time."""
        return self.nbytes / self.time_s / 1e9

    @property
    def busbw_GBps(self) -> float:
        """algbw times nccl-tests' factor for this kind and group size."""
        return self.algbw_GBps * bus_factor(self.kind, self.world)


@dataclass
class CalibrationConfig:
    """What to measure and how."""

    backend: str = "auto"
    nproc: int = 2
    min_bytes: int = 1 << 20
    max_bytes: int = 1 << 28
    steps: int = 8
    iters: int = 20
    warmup: int = 5
    collectives: tuple[str, ...] = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
    gemm: bool | None = None  # None: on when the backend is nccl
    gemm_kn: tuple[tuple[int, int], ...] = GEMM_KN  # (K, N) shapes; --gemm-model adds a model's plan shapes
    gemm_m: tuple[int, ...] = GEMM_M
    timeout_s: float = 300.0
    progress: bool = True


@dataclass
class CalibrationResult:
    """Measured points, fitted constants, and GEMM rates."""

    world: int
    backend: str
    device_name: str
    points: list[SweepPoint] = field(default_factory=list)
    gemm: list[GemmPoint] = field(default_factory=list)
    fitted: dict[str, FittedCollective] = field(default_factory=dict)


def sweep_counts(min_bytes: int, max_bytes: int, steps: int, elem: int, world: int) -> list[int]:
    """Element counts spaced geometrically from min to max bytes, multiples of the group size.

    Each size is rounded to three significant bits (a multiple of an eighth of the power of two
    below it), as nccl-tests' sizes are: NCCL is measurably slower on odd sizes, which a sweep of
    raw geometric sizes would then teach the model (seen on 2xH200: up to 30% slower).
    """
    if steps < 1 or min_bytes < 1 or max_bytes < min_bytes:
        raise TpplanError(
            "--min-bytes/--max-bytes/--steps",
            f"need 1 <= min <= max and steps >= 1, got {min_bytes}, {max_bytes}, {steps}",
            "pass a valid size sweep",
        )
    ratio = (max_bytes / min_bytes) ** (1 / max(steps - 1, 1))
    counts: list[int] = []
    for i in range(steps):
        target = min_bytes * ratio**i / elem
        grain = max(1, 2 ** max(0, math.floor(math.log2(max(target, 1))) - 3))
        aligned = max(grain, round(target / grain) * grain)
        c = max(world, round(aligned / world) * world)
        if c not in counts:
            counts.append(c)
    return counts


def fit_alpha_beta(points: list[SweepPoint]) -> FittedCollective:
    """Least squares of time = alpha + busbytes / busbw, weighted to minimise relative error.

    Relative weighting keeps small messages (latency) from being drowned by large ones. A
    negative alpha is clamped to 0 and busbw refitted alone.
    """
    import numpy as np

    if not points:
        raise ValueError("no points to fit")
    kind, world = points[0].kind, points[0].world
    x = np.array([bus_factor(kind, world) * p.nbytes for p in points], dtype=float)
    t = np.array([p.time_s for p in points], dtype=float)
    a_mat = np.stack([1.0 / t, x / t], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(a_mat, np.ones_like(t), rcond=None)
    if alpha < 0 or len(points) == 1:
        alpha = 0.0
        beta = float(np.sum(x / t) / np.sum((x / t) ** 2))
    if beta <= 0 or not math.isfinite(beta):
        raise TpplanError(
            f"calibration of {kind}",
            "time did not grow with message size, so no bandwidth can be fitted",
            "raise --max-bytes or --iters",
        )
    pred = alpha + beta * x
    return FittedCollective(
        alpha_us=float(alpha) * 1e6,
        busbw_GBps=1.0 / float(beta) / 1e9,
        group_size=world,
        points=len(points),
        max_rel_err=float(np.max(np.abs(pred - t) / t)),
        curve=sorted((float(p.nbytes), float(p.time_s)) for p in points),
    )


def _worker(rank: int, world: int, device: Any, cfg: CalibrationConfig) -> CalibrationResult:
    """Runs on every rank; rank 0 returns the measurements."""
    import torch

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    dname = "bfloat16" if dtype == torch.bfloat16 else "float"
    elem = torch.tensor([], dtype=dtype).element_size()
    counts = sweep_counts(cfg.min_bytes, cfg.max_bytes, cfg.steps, elem, world)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    res = CalibrationResult(world=world, backend=cfg.backend, device_name=name)
    # Two passes over the sweep, keeping each size's faster one: a size measured while the host
    # is busy would otherwise bend the measured curve that the prediction interpolates.
    passes = 2 if device.type == "cuda" else 1
    jobs = [(k, c) for _ in range(passes) for k in cfg.collectives for c in counts]
    best: dict[tuple[str, int], float] = {}
    do_gemm = bool(cfg.gemm) and device.type == "cuda" and rank == 0
    progress = _progress(cfg.progress and rank == 0)
    with progress:
        task = progress.add_task("collectives", total=len(jobs))
        from tpplan.bench._dist import make_op, time_op

        for kind, count in jobs:
            before_collective(rank, kind)
            op = make_op(kind, count, world, rank, dtype, device)
            t = time_op(op, device, cfg.iters, cfg.warmup)
            best[(kind, count)] = min(t, best.get((kind, count), t))
            progress.update(task, advance=1, description=f"{kind} {count * elem} B")
        res.points.extend(SweepPoint(k, c * elem, c, dname, t, world) for (k, c), t in best.items())
        if do_gemm:
            gtask = progress.add_task("gemm", total=len(cfg.gemm_m) * len(cfg.gemm_kn))
            for m in cfg.gemm_m:
                for k, n in cfg.gemm_kn:
                    res.gemm.append(_time_gemm(m, k, n, device, cfg.iters, cfg.warmup))
                    progress.update(gtask, advance=1, description=f"gemm {m}x{k}x{n}")
    return res


def _progress(enabled: bool) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn

    from tpplan.progress import progress

    return progress(enabled, TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn())


def _time_gemm(m: int, k: int, n: int, device: Any, iters: int, warmup: int) -> GemmPoint:
    """Achieved bf16 TFLOP/s of one [m,k] x [n,k]^T product as `F.linear` runs it (weights stored
    [out, in], the layout of every checkpoint and runtime: `a @ b` with b [k,n] picks other cuBLAS
    kernels, 10% slower at K3's TP2 shapes on an H200); the fastest of three batch means (CUDA events)."""

    import torch
    import torch.nn.functional as F

    a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=device, dtype=torch.bfloat16)
    for _ in range(warmup):
        F.linear(a, w)
    times = []
    for _ in range(3):  # batches of back-to-back products, as the collectives are timed
        torch.cuda.synchronize(device)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            F.linear(a, w)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3 / iters)
    return GemmPoint(M=m, K=k, N=n, tflops=2 * m * k * n / min(times) / 1e12)


def run_calibration(cfg: CalibrationConfig) -> CalibrationResult | None:
    """Measure on the group and fit; None on non-zero torchrun ranks."""
    from tpplan.runtime.group import resolve_backend, under_torchrun

    bad = [c for c in cfg.collectives if c not in COLLECTIVE_KINDS]
    if bad:
        raise TpplanError("--collectives", f"unknown {bad}", f"use some of {', '.join(COLLECTIVE_KINDS)}")
    backend = resolve_backend(cfg.backend)
    nproc = int(os.environ["WORLD_SIZE"]) if under_torchrun() else cfg.nproc
    if nproc < 2:
        raise TpplanError("--nproc", f"got {nproc}", "calibrate needs a group of >= 2 processes")
    gemm = cfg.gemm if cfg.gemm is not None else backend == "nccl"
    cfg = CalibrationConfig(**{**cfg.__dict__, "backend": backend, "gemm": gemm})
    res = run_group(_worker, GroupSpec(backend, nproc, cfg.timeout_s), cfg)
    if res is None:
        return None
    for kind in cfg.collectives:
        res.fitted[kind] = fit_alpha_beta([p for p in res.points if p.kind == kind]).model_copy(
            update={"backend": backend}
        )
    return res


def calibrated_topology(base: Topology, res: CalibrationResult) -> Topology:
    """The base preset's hardware with the fitted constants (and GEMM table) attached."""
    if res.world > base.gpus_per_node:
        raise TpplanError(
            "--base-topology",
            f"{base.name} has {base.gpus_per_node} GPUs per node, the group had {res.world}",
            "pick a base preset with at least as many GPUs per node",
        )
    gpu = base.gpu.model_copy(update={"gemm_table": res.gemm}) if res.gemm else base.gpu
    notes = f"calibrated on {res.world} x {res.device_name} with {res.backend}; hardware specs from {base.name}"
    fitted: dict[str, FittedCollective] = {**{str(k): v for k, v in base.fitted.items()}, **res.fitted}
    return base.model_copy(update={"name": f"{base.name}-calibrated", "gpu": gpu, "fitted": fitted, "notes": notes})


def write_topology_atomic(topo: Topology, out: Path, header: str = "") -> None:
    """Write TOML (or JSON by suffix) whole (`tpplan.outputs.write_files`), once a temporary copy of
    the text beside `out` has been read back as the same topology."""
    out = Path(out)
    text = (
        to_json(topo.file_data(), indent=2).decode()
        if out.suffix.lower() == ".json"
        else topology_to_toml(topo, header)
    )
    with exit_cleanly():  # SIGTERM or SIGHUP removes the read-back copy too
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=out.suffix, dir=out.parent or ".")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            if load_topology(tmp) != topo:
                raise RuntimeError("written topology does not read back identically")
        finally:
            Path(tmp).unlink(missing_ok=True)
        write_files({out: text})
