"""`tpplan ARGS` run in this process, its output captured: one runner for the offline tools and the tests.

Faster than a subprocess (no interpreter start, imports shared), and what it captures is what the CLI
writes to a pipe. An uncaught exception (a traceback) propagates to the caller.
"""

from __future__ import annotations

import io
import sys
from contextlib import redirect_stderr, redirect_stdout


def run_captured(*args: str) -> tuple[int, str, str]:
    """`tpplan ARGS` through `tpplan.cli.main()`: (exit code, stdout, stderr)."""
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


__all__ = ["run_captured"]
