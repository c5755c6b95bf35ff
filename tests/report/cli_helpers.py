"""Run the CLI's main() in the test process: exit code and stderr without a new interpreter."""

from __future__ import annotations

import sys


def run_in_process(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """The CLI's main() in this process (fast); returns (exit code, stderr)."""
    from tpplan import cli

    monkeypatch.setattr(sys, "argv", ["tpplan", *args])
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err
