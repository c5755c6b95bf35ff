"""`tpplan models`, `tpplan topologies`, `tpplan workloads`: list the built-in presets, one line each."""

from __future__ import annotations

import typer
from rich.table import Table

from tpplan.commands._console import console, show


def register(app: typer.Typer) -> None:
    @app.command("models")
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

    @app.command("topologies")
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
        show(console(), table)

    @app.command("workloads")
    def workloads() -> None:
        """List built-in workload presets (use with --workload; or pass a .toml/.json file)."""
        from tpplan.cost.workload import WORKLOAD_ALIASES, list_workloads, load_workload

        old = {new: old for old, new in WORKLOAD_ALIASES.items()}
        table = Table(title="Workload presets (--workload)")
        for col in ("preset", "prompt tokens", "concurrency", "requests", "chunk", "also named"):
            table.add_column(col)
        for name in list_workloads():
            w = load_workload(name)
            lens = w.input_lens or [w.input_len or 0]
            prompt = f"{lens[0]:,}" if len(set(lens)) == 1 else f"{min(lens):,}-{max(lens):,}"
            table.add_row(
                name, prompt, str(w.concurrency), str(w.total_requests), f"{w.chunk_size:,}", old.get(name, "")
            )
        show(console(), table)
