"""Every command's --help renders: typer reads option help as Rich markup, so a bracketed word in a help
text that reads as a closing tag (`[/PLAN]`) ends `tpplan CMD --help` with a MarkupError traceback."""

from __future__ import annotations

import pytest
from cli_helpers import run_cli

from tpplan.cli import app

COMMANDS = sorted(c.name for c in app.registered_commands if c.name)


def test_the_commands_are_found() -> None:
    """Guard: the list below is the CLI's (else the next test checks nothing)."""
    assert {"audit", "search", "report", "verify", "bench"} <= set(COMMANDS)


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_renders(monkeypatch, capsys, command: str) -> None:
    code, out, err = run_cli(monkeypatch, capsys, *([command] if command else []), "--help")
    assert code == 0 and "Usage" in out and "Traceback" not in err, err[-2000:]
