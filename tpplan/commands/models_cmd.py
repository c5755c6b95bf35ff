"""`tpplan models`: list the built-in presets."""

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
