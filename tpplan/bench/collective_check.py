"""Predicted vs measured collectives on the seed's activation shapes, for a topology file.

Usage on a GPU box (after `tpplan calibrate --out topo.toml`):
    python -m tpplan.bench.collective_check topo.toml --json check.json
    torchrun --nproc-per-node 2 -m tpplan.bench.collective_check topo.toml
Shapes: [T, W] bf16 for W in 7168 (hidden), 2112 (MLA latent), 12288 (K3 gate), T = 1K..16K.
Sizes follow nccl-tests: all_reduce/reduce_scatter/all_gather move the full [T, W]; all_to_all
is S(tok) -> S(col), so each rank's send buffer holds T * W / n elements.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from tpplan.cost.collectives import collective_time
from tpplan.cost.topology import load_topology
from tpplan.lower.sizes import nccl_size
from tpplan.runtime.group import GroupSpec, resolve_backend, run_group
from tpplan.runtime.hooks import before_collective
from tpplan.text import TextConsole

TOKENS = (1024, 2048, 4096, 8192, 16384)
WIDTHS = (7168, 2112, 12288)
KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


@dataclass(frozen=True)
class CheckRow:
    """One shape: measured and predicted time, relative error (pred - meas) / meas."""

    kind: str
    tokens: int
    width: int
    nbytes: int
    measured_s: float
    predicted_s: float
    algorithm: str

    @property
    def rel_err(self) -> float:
        """Signed relative error of the prediction."""
        return (self.predicted_s - self.measured_s) / self.measured_s


@dataclass(frozen=True)
class CheckReport:
    """All rows plus the summary the acceptance criterion uses (median and worst |error|)."""

    topology: str
    world: int
    backend: str
    rows: tuple[CheckRow, ...]

    @property
    def median_abs_err(self) -> float:
        """Median of |relative error| over all rows."""
        return statistics.median(abs(r.rel_err) for r in self.rows)

    @property
    def worst_abs_err(self) -> float:
        """Largest |relative error|."""
        return max(abs(r.rel_err) for r in self.rows)

    def to_json(self) -> dict[str, Any]:
        """Plain dict for --json."""
        return {
            "topology": self.topology,
            "world": self.world,
            "backend": self.backend,
            "median_abs_err": self.median_abs_err,
            "worst_abs_err": self.worst_abs_err,
            "rows": [{**asdict(r), "rel_err": r.rel_err} for r in self.rows],
        }


def _worker(rank: int, world: int, device: Any, job: dict[str, Any]) -> list[tuple]:
    import torch

    from tpplan.bench._dist import make_op, time_op

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    elem = torch.tensor([], dtype=dtype).element_size()
    out = []
    for kind in job["kinds"]:
        for width in job["widths"]:
            for t in job["tokens"]:
                count = int(nccl_size(kind, t * width, world))
                count -= count % world
                before_collective(rank, kind)
                op = make_op(kind, count, world, rank, dtype, device)
                out.append((kind, t, width, count * elem, time_op(op, device, job["iters"],
                                                                   job["warmup"])))  # fmt: skip
    return out


def run_check(
    topology: str,
    *,
    nproc: int = 2,
    backend: str = "auto",
    tokens: tuple[int, ...] = TOKENS,
    widths: tuple[int, ...] = WIDTHS,
    kinds: tuple[str, ...] = KINDS,
    iters: int = 20,
    warmup: int = 5,
    timeout_s: float = 300.0,
) -> CheckReport | None:
    """Measure every (kind, width, T) on the group and predict it from `topology`.

    Returns None on non-zero torchrun ranks.
    """
    topo = load_topology(topology)
    backend = resolve_backend(backend)
    job = {"kinds": kinds, "widths": widths, "tokens": tokens, "iters": iters, "warmup": warmup}
    measured = run_group(_worker, GroupSpec(backend, nproc, timeout_s), job)
    if measured is None:
        return None
    world = nproc
    import os

    if "WORLD_SIZE" in os.environ:
        world = int(os.environ["WORLD_SIZE"])
    rows = []
    for kind, t, width, nbytes, secs in measured:
        est = collective_time(kind, nbytes, world, topo)
        rows.append(CheckRow(kind, t, width, nbytes, secs, est.time_s, est.algorithm))
    return CheckReport(topo.name, world, backend, tuple(rows))


def print_report(rep: CheckReport) -> None:
    """Rich table of predicted vs measured, then the median and worst error."""
    from rich.table import Table

    table = Table(title=f"{rep.topology}: predicted vs measured ({rep.world} ranks, {rep.backend})")
    for col in ("collective", "T", "W", "size (B)", "measured (us)", "predicted (us)", "err"):
        table.add_column(col, justify="right")
    table.add_column("algorithm")
    for r in rep.rows:
        table.add_row(
            r.kind, str(r.tokens), str(r.width), str(r.nbytes), f"{r.measured_s * 1e6:.1f}",
            f"{r.predicted_s * 1e6:.1f}", f"{r.rel_err:+.1%}", r.algorithm,
        )  # fmt: skip
    console = TextConsole()  # the algorithm names come from the topology file: printed as text
    console.print(table)
    console.print(f"median |err| {rep.median_abs_err:.1%}, worst |err| {rep.worst_abs_err:.1%}")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def main(
    topology: Annotated[str, typer.Argument(help="topology preset or file (e.g. calibrated)")],
    nproc: Annotated[int, typer.Option(help="local processes when not under torchrun")] = 2,
    backend: Annotated[str, typer.Option(help="auto|gloo|nccl")] = "auto",
    tokens: Annotated[str, typer.Option(help="comma-separated T")] = "1024,2048,4096,8192,16384",
    widths: Annotated[str, typer.Option(help="comma-separated W")] = "7168,2112,12288",
    kinds: Annotated[str, typer.Option(help="comma-separated")] = ",".join(KINDS),
    iters: int = 20,
    warmup: int = 5,
    json_out: Annotated[Path | None, typer.Option("--json", help="write JSON here")] = None,
) -> None:
    """Measure the seed's collective shapes and compare with the topology's prediction."""
    rep = run_check(
        topology,
        nproc=nproc,
        backend=backend,
        tokens=_ints(tokens),
        widths=_ints(widths),
        kinds=tuple(k.strip() for k in kinds.split(",") if k.strip()),
        iters=iters,
        warmup=warmup,
    )
    if rep is None:
        return
    print_report(rep)
    if json_out is not None:
        json_out.write_text(json.dumps(rep.to_json(), indent=1))


if __name__ == "__main__":
    typer.run(main)
