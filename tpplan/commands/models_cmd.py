"""`tpplan models`, `tpplan gpus`, `tpplan topologies`, `tpplan workloads`: list the built-in presets,
one line each."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.table import Table

from tpplan.commands._console import console, show
from tpplan.commands._options import check_json_target, emit_json, json_option

if TYPE_CHECKING:
    from tpplan.cost.cluster import Fabric
    from tpplan.cost.gpu import GpuSpec


def models() -> None:
    """List built-in model presets (config.json files shipped with tpplan)."""
    from tpplan.models.config import list_presets, load_model

    table = Table(title="Built-in presets (use with --model; or pass a path to any config.json)")
    for col in ("preset", "model_type", "hidden", "layers", "layer kinds"):
        table.add_column(col)
    for name in list_presets():
        spec = load_model(name)
        kinds = ", ".join(f"{k} x{c}" for k, c in spec.count_kinds().items())
        table.add_row(name, spec.model_type, str(spec.hidden), str(spec.num_layers), kinds)
    show(console(), table)


def gpus(json_target: Annotated[str | None, json_option("one entry per GPU model")] = None) -> None:
    """List the GPU model presets (use with --gpu; or pass a .toml file): figures and kernel sources."""
    from tpplan.cost.topology import list_gpus, load_gpu

    check_json_target(json_target)
    rows = [gpu_row(name, load_gpu(name)) for name in list_gpus()]
    if emit_json(json_target, {"gpus": rows}):
        return
    table = Table(title="GPU models (--gpu NAME; one .toml in tpplan/cost/presets/gpus/ each); dense TFLOP/s",
                  box=box.SIMPLE, pad_edge=False, padding=(0, 1, 0, 0))  # fmt: skip
    for col in ("preset", "GPU", "GiB", "TB/s", "bf16", "fp8", "--engine tables", "figures"):
        table.add_column(col, justify="left" if col in ("preset", "GPU", "figures") or "-" in col else "right")
    for r in rows:
        fp8 = "none" if r["fp8_tflops"] is None else f"{r['fp8_tflops']:g}"
        table.add_row(r["preset"], r["name"].removeprefix("NVIDIA "), f"{r['memory_GiB']:g}", f"{r['hbm_TBps']:g}",
                      f"{r['bf16_tflops']:g}", fp8, _tables_text(r["engine_tables"]),
                      "datasheet" if r["figures"] == "datasheet" else "measured")  # fmt: skip
    out = console()
    show(out, table)
    out.print(
        "fp8 none: no fp8 tensor cores; fp8 GEMMs are priced at the bf16 peak (fp8 weights dequantized). "
        "--engine tables: AIConfigurator's measured kernels for the GPU's system (`tpplan[aic]`). "
        "figures: datasheet, or measured on the stack the preset names; every figure's source is in the "
        "preset's .toml (`tpplan gpus --json`: the same, with each op class's source).",
        markup=False,
    )


def topologies() -> None:
    """List built-in topology presets (use with --topology; or pass a .toml/.json file)."""
    from tpplan.cost.topology import list_topologies, load_topology

    table = Table(title="Topology presets (--topology; --nodes sets the node count, default one node)")
    for col in ("preset", "one node", "inside a node", "between nodes"):
        table.add_column(col, no_wrap=True)
    for name in list_topologies():
        t = load_topology(name)
        inter = f"{t.inter.nics_per_node}x{t.inter.nic_Gbps:g} Gb/s" if t.inter is not None else "-"
        gpu = t.gpu.name.removeprefix("NVIDIA ")
        node = f"{t.gpus_per_node} x {gpu}, {t.gpu.memory_GiB:g} GiB"
        table.add_row(name, node, f"{t.intra.kind} {t.intra.bandwidth_GBps:g} GB/s", inter)
    out = console()
    show(out, table)
    show(out, _curve_table(list_topologies(), load_topology))


def workloads() -> None:
    """List built-in workload presets (use with --workload; or pass a .toml/.json file)."""
    from tpplan.cost.workload import WORKLOAD_ALIASES, list_workloads, load_workload

    old = {new: old for old, new in WORKLOAD_ALIASES.items()}
    table = Table(title="Workload presets (--workload)")
    for col in ("preset", "prompt tokens", "output tokens", "concurrency", "requests", "chunk", "also named"):
        table.add_column(col)
    for name in list_workloads():
        w = load_workload(name)
        lens = w.input_lens or [w.input_len or 0]
        prompt = f"{lens[0]:,}" if len(set(lens)) == 1 else f"{min(lens):,}-{max(lens):,}"
        table.add_row(name, prompt, f"{w.output_len:,}", str(w.concurrency), str(w.total_requests),
                      f"{w.chunk_size:,}", old.get(name, ""))  # fmt: skip
    show(console(), table)


def register(app: typer.Typer) -> None:
    """Add the preset listings to the CLI."""
    for name, command in (("models", models), ("gpus", gpus), ("topologies", topologies), ("workloads", workloads)):
        app.command(name)(command)


def gpu_row(preset: str, gpu: GpuSpec) -> dict[str, Any]:
    """One GPU model as `tpplan gpus` lists it (and its JSON): figures, kernel tables, their source."""
    from tpplan.cost.sources.aic import system_tables

    return {
        "preset": preset,
        "name": gpu.name,
        "memory_GiB": gpu.memory_GiB,
        "hbm_TBps": gpu.hbm_TBps,
        "bf16_tflops": gpu.bf16_tflops,
        "fp8_tflops": gpu.fp8_tflops,
        "system": gpu.system,
        "engine_tables": system_tables(gpu.system),
        "figures": gpu.software or "datasheet",
        "provenance": dict(gpu.provenance),
    }


def _tables_text(tables: dict[str, list[str]] | None) -> str:
    """'sglang vllm trtllm', 'none' (the database ships no tables) or why it cannot tell."""
    if tables is None:
        return "tpplan[aic] not installed"
    return ",".join(tables) if tables else "none"


def curve_rows(name: str, topo: Fabric) -> list[tuple[str, str, str, str]]:
    """(preset, groups, curve set, its source) for each curve set a topology prices collectives from."""
    from tpplan.cost.curve_sets import curve_set, list_curve_sets

    owner = {(c["source"], c["kind"], c["algorithm"], c["ranks"]): n for n in list_curve_sets()
             for c in curve_set(n)["curves"]}  # fmt: skip
    held: dict[str, set[tuple[str, int]]] = {}
    for c in topo.curves:
        held.setdefault(owner.get((c.source, c.kind, c.algorithm, c.ranks), ""), set()).add((c.kind, c.ranks))
    rows = []
    for set_name, keys in held.items():
        data: dict[str, Any] = curve_set(set_name) if set_name else {"curves": [], "name": "its own [[curves]]"}
        ranks, kinds = sorted({r for _, r in keys}), sorted({k for k, _ in keys})
        across = ranks[-1] > topo.gpus_per_node
        what = (f"{kinds[0]} " if len(kinds) == 1 else "") + "/".join(map(str, ranks))
        what += f", {topo.gpus_per_node}/node" if across else " GPUs"
        left_out = sorted({(c["kind"], c["ranks"]) for c in data["curves"]} - keys)
        what += "".join(f", no {k}@{r}" for k, r in left_out) + (" (derived)" if "derived" in data else "")
        rows.append((name, what, data["name"], _measured_by(data)))
    return rows


def _measured_by(data: dict[str, Any]) -> str:
    """AIC's version for a set extracted (or derived) from AIConfigurator, else the published run's issue."""
    if "aic_version" in data:
        return f"AIC {data['aic_version']}"
    if "url" in data:  # https://github.com/NVIDIA/nccl-tests/issues/309 -> nccl-tests#309
        parts = data["url"].rstrip("/").split("/")
        return f"{parts[-3]}#{parts[-1]}"
    return "the topology file"


def _curve_table(names: list[str], load: Callable[[str], Fabric]) -> Table:
    table = Table(title="Measured collective curves (priced first; other collectives: link model or fitted)",
                  box=box.SIMPLE, pad_edge=False)  # fmt: skip
    for col in ("preset", "groups priced from curves", "curve set", "source"):
        table.add_column(col, no_wrap=True)
    for name in names:
        for row in curve_rows(name, load(name)):
            table.add_row(*row)
    return table
