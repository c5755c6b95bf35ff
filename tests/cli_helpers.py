"""Run the CLI's main() in the test process: exit code, stdout and stderr without a new interpreter."""

from __future__ import annotations

import sys


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


def run_captured(*args: str) -> tuple[int, str, str]:
    """As `run_cli`, without pytest fixtures (so hypothesis can call it once per example): stdout and
    stderr captured by redirection; an uncaught exception (a traceback) propagates to the test."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from tpplan import cli

    out, err, argv = io.StringIO(), io.StringIO(), sys.argv
    sys.argv = ["tpplan", *args]
    code = 0
    try:
        with redirect_stdout(out), redirect_stderr(err):
            cli.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = argv
    return code, out.getvalue(), err.getvalue()
