"""Run the CLI's main() in the test process: exit code, stdout and stderr without a new interpreter."""

from __future__ import annotations

import sys

from tools.in_process import run_captured as run_captured  # the one in-process runner, re-exported


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """`tpplan ARGS` through cli.main() in this process; (exit code, stdout, stderr). The exit code
    follows SystemExit's rules: None is 0, an int is itself, a message is 1."""
    from tpplan import cli

    monkeypatch.setattr(sys, "argv", ["tpplan", *args])
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out = capsys.readouterr()
    return code, out.out, out.err


def run_in_process(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """As `run_cli`, for tests that read only the exit code and stderr."""
    code, _, err = run_cli(monkeypatch, capsys, *args)
    return code, err
