"""Dev script: extract AIConfigurator's measured single-node NCCL tables into shipped curve sets.

`python -m tpplan.cost.sources.aic_curves` reads `aiconfigurator-core`'s packaged NCCL tables
(`systems/data/<system>/comm/nccl/<version>/nccl_perf.parquet`, the files the package's own
`NCCL.load_data` binds) and writes one JSON curve set per (system, NCCL version) under
`tpplan/cost/presets/curves/`. Cluster presets name a set (`curve_sets` in the cluster file), so
the planner prices collectives from these points without the package installed. Run it again only
to refresh the data from a newer AIC; the sets record the AIC version they came from.

Conventions (as `tpplan.cost.sources.aic` reads the same tables): `message_size` counts
half-precision elements in nccl-tests' size convention, so bytes = 2 x message_size; `latency` is
in milliseconds. Rows repeated at one size (a table collected twice) are merged by their median.
"""

from __future__ import annotations

import json
import statistics
from importlib import resources
from pathlib import Path
from typing import Any

AIC_KINDS = {"all_reduce": "all_reduce", "reduce_scatter": "reduce_scatter", "all_gather": "all_gather",
             "alltoall": "all_to_all"}  # fmt: skip
ALGORITHM = "nccl"  # NCCL's own algorithm choice (its tuner's default), as AIC measured it
HALF_BYTES = 2

# (AIC system, NCCL version) pairs shipped: the newest complete collection of each system a preset uses.
SHIPPED = (
    ("h200_sxm", "2.29.2"),
    ("h100_sxm", "2.29.2"),
    ("rtx_pro_6000_server", "2.29.2"),
    ("b300_sxm", "2.29.2"),
    ("gb300", "2.29.2"),
)
# (AIC system, engine, version) of the engines' own all-reduce tables shipped as opt-in sets: the
# engine's custom all-reduce (one-shot/two-shot kernels at small sizes, NCCL above its limit),
# eager (as prefill runs it) and CUDA-graph captured where the table has both.
SHIPPED_ENGINE_AR = (
    ("h200_sxm", "sglang", "0.5.14"),
    ("h200_sxm", "vllm", "0.24.0"),
    ("h200_sxm", "trtllm", "1.3.0rc20"),
    ("rtx_pro_6000_server", "sglang", "0.5.14"),
)


def _aic_root() -> Path:
    import aiconfigurator_core

    return Path(aiconfigurator_core.__file__).parent / "systems" / "data"


def aic_version() -> str:
    """The installed aiconfigurator-core version."""
    from importlib.metadata import version

    return version("aiconfigurator-core")


def nccl_points(system: str, nccl: str) -> dict[tuple[str, int], list[tuple[float, float]]]:
    """{(tpplan kind, ranks): [(bytes, seconds), ...] ascending} of one AIC NCCL table (half rows)."""
    import pandas as pd

    path = _aic_root() / system / "comm" / "nccl" / nccl / "nccl_perf.parquet"
    table = pd.read_parquet(path)
    table = table[table.nccl_dtype == "half"]
    out: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for (op, ranks), rows in table.groupby(["op_name", "num_gpus"]):
        if op not in AIC_KINDS:
            continue
        by_size: dict[int, list[float]] = {}
        for size, ms in zip(rows.message_size, rows.latency, strict=True):
            by_size.setdefault(int(size), []).append(float(ms))
        out[(AIC_KINDS[op], int(ranks))] = [
            (float(size * HALF_BYTES), statistics.median(ms) * 1e-3) for size, ms in sorted(by_size.items())
        ]
    return out


def engine_ar_points(system: str, engine: str, version: str) -> dict[tuple[str, int], list[tuple[float, float]]]:
    """{(algorithm, ranks): [(bytes, seconds), ...]} of one engine's custom all-reduce table
    (bf16 elements, so bytes = 2 x message_size); algorithm = engine + its backend (eager, graph)."""
    import pandas as pd

    table = pd.read_parquet(_aic_root() / system / "comm" / engine / version / "custom_allreduce_perf.parquet")
    backend = table["backend"] if "backend" in table else table["implementation"]
    out: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for (name, ranks), rows in table.assign(algo=backend).groupby(["algo", "num_gpus"]):
        mode = f"-{str(name).split('_')[-1]}" if "_" in str(name) else ""  # sglang_eager -> -eager
        by_size: dict[int, list[float]] = {}
        for size, ms in zip(rows.message_size, rows.latency, strict=True):
            by_size.setdefault(int(size), []).append(float(ms))
        out[(f"{engine}-custom{mode}", int(ranks))] = [
            (float(size * HALF_BYTES), statistics.median(ms) * 1e-3) for size, ms in sorted(by_size.items())
        ]
    return out


def engine_ar_sets(system: str, engine: str, version: str) -> list[dict[str, Any]]:
    """The opt-in curve sets of one engine's all-reduce table (kind all_reduce only), one per
    backend (eager, CUDA graph) so a cluster names the one its engine runs (fastest would win)."""
    aic = aic_version()
    source = f"aiconfigurator-core {aic}: {system} {engine} {version} (custom_allreduce_perf.parquet, bf16)"
    by_algo: dict[str, list[dict[str, Any]]] = {}
    for (algo, ranks), pts in sorted(engine_ar_points(system, engine, version).items()):
        points = [[x, round(t, 12)] for x, t in pts]
        curve = {"kind": "all_reduce", "algorithm": algo, "ranks": ranks, "points": points, "source": source}
        by_algo.setdefault(algo, []).append(curve)
    return [
        {
            "name": f"{system}-{algo.replace('-custom', '')}-{version}-allreduce",
            "source": source,
            "aic_version": aic,
            "system": system,
            "engine": f"{engine}@{version}",
            "notes": "single node; the engine's all-reduce path (custom kernels, NCCL above their limit); opt-in",
            "curves": curves,
        }
        for algo, curves in by_algo.items()
    ]


# (AIC system, NCCL version) whose 8-GPU ring all-reduce (NVLS off) is derived from its 4-GPU ring curve
SHIPPED_RING8 = (("h200_sxm", "2.29.2"), ("h100_sxm", "2.29.2"))
RING_LL_MAX = 2**20  # NCCL's 8-GPU all-reduce on NVSwitch runs Ring/LL up to 1 MiB, NVLS from 2 MiB
RING8_DELTA_BYTES = (2**18, 2**19, 2**20)  # where both measured curves are ring: the extra latency is fitted there


def ring8_points(system: str, nccl: str) -> tuple[list[tuple[float, float]], float]:
    """The 8-GPU all-reduce with NVLS off, derived from one AIC table (docs/benchmarks.md, "The
    8-GPU all-reduce with NVLS off"): up to 1 MiB the measured 8-GPU points (NCCL runs the ring
    there even with NVLS on); above, the 4-GPU curve (a ring: NCCL does not pick NVLS at 4 GPUs)
    at the same bus bandwidth, time x (2*7/8)/(2*3/4), plus the fixed extra time of the four more
    ranks' ring steps, the median of measured 8-GPU minus scaled 4-GPU over 256 KiB-1 MiB.
    Returns (points, that extra time in seconds)."""
    table = nccl_points(system, nccl)
    four, eight = dict(table[("all_reduce", 4)]), dict(table[("all_reduce", 8)])
    scale = (2 * 7 / 8) / (2 * 3 / 4)
    delta = statistics.median(eight[x] - scale * four[x] for x in RING8_DELTA_BYTES)
    points = [(x, eight[x] if x <= RING_LL_MAX else scale * four[x] + delta) for x in sorted(eight)]
    return points, delta


def ring8_set(system: str, nccl: str) -> dict[str, Any]:
    """The derived NVLS-off 8-GPU all-reduce of one table as a curve set of one curve."""
    version = aic_version()
    points, delta = ring8_points(system, nccl)
    source = (f"derived from aiconfigurator-core {version}: {system} NCCL {nccl} (nccl_perf.parquet, half): "
              f"8-GPU all-reduce <= 1 MiB, above it the 4-GPU curve at equal busbw + {delta * 1e6:.2f} us")  # fmt: skip
    curve = {"kind": "all_reduce", "algorithm": "ring", "ranks": 8,
             "points": [[x, round(t, 12)] for x, t in points], "source": source}  # fmt: skip
    return {
        "name": f"{system}-nccl-{nccl}-ring8",
        "source": source,
        "aic_version": version,
        "system": system,
        "nccl": nccl,
        "derived": "ring8",
        "notes": "single node, NVLS off (NCCL_NVLS_ENABLE=0): derived, not measured; docs/benchmarks.md judges it",
        "curves": [curve],
    }


def curve_set(system: str, nccl: str) -> dict[str, Any]:
    """The JSON curve set of one table: provenance plus one curve per kind x group size."""
    version = aic_version()
    source = f"aiconfigurator-core {version}: {system} NCCL {nccl} (nccl_perf.parquet, half)"
    curves = [
        {"kind": kind, "algorithm": ALGORITHM, "ranks": ranks, "points": [[x, round(t, 12)] for x, t in pts],
         "source": source}
        for (kind, ranks), pts in sorted(nccl_points(system, nccl).items())
    ]  # fmt: skip
    return {
        "name": f"{system}-nccl-{nccl}",
        "source": source,
        "aic_version": version,
        "system": system,
        "nccl": nccl,
        "notes": "single node; bytes in nccl-tests' size convention (2 x AIC's half elements), seconds",
        "curves": curves,
    }


def _dumps(data: dict[str, Any]) -> str:
    """JSON with one curve per line (readable diffs when the data is refreshed)."""
    head = {k: v for k, v in data.items() if k != "curves"}
    lines = [json.dumps(head, indent=1)[:-2] + ',\n "curves": [']
    lines.append(",\n".join("  " + json.dumps(c, separators=(",", ":")) for c in data["curves"]))
    return "\n".join(lines) + "\n ]\n}\n"


def main() -> None:
    out_dir = Path(str(resources.files("tpplan.cost").joinpath("presets", "curves")))
    out_dir.mkdir(exist_ok=True)
    sets = [curve_set(system, nccl) for system, nccl in SHIPPED]
    sets += [ring8_set(system, nccl) for system, nccl in SHIPPED_RING8]
    sets += [one for spec in SHIPPED_ENGINE_AR for one in engine_ar_sets(*spec)]
    for data in sets:
        path = out_dir / f"{data['name']}.json"
        path.write_text(_dumps(data), encoding="utf-8")
        print(f"{path}: {len(data['curves'])} curves")


if __name__ == "__main__":
    main()
