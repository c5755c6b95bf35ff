"""Fault injection for the multi-process tests, through the runtime's collective hook.

`fault_env("RANK:KIND")` is the environment that makes that rank raise before its first
collective of KIND; `"RANK:KIND:hang"` makes it sleep instead, `"RANK:KIND:kill"` makes it SIGKILL
itself (what the OOM killer does), `"RANK:KIND:stop"` makes it SIGSTOP itself (as `kill -STOP` does).
Every rank imports this file at start-up (tests/rank_hooks/sitecustomize.py, which `fault_env` puts on
PYTHONPATH), which registers `_maybe_fault` on the runtime's collective hook (`tpplan.runtime.hooks`).
Fault injection lives here only: tpplan itself registers no hook and imports no module its
environment names.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tpplan.runtime.hooks import add_collective_hook

FAULT_ENV = "TPPLAN_TEST_FAULT"
HOOK_DIR = Path(__file__).resolve().parent / "rank_hooks"  # its sitecustomize imports this file
REPO = Path(__file__).resolve().parents[1]


def fault_env(spec: str) -> dict[str, str]:
    """Environment variables that load this hook into every process started with them (the CLI and
    its ranks) and make it inject `spec`. The repository stays on the path (this checkout's tpplan)."""
    path = os.pathsep.join(p for p in (str(HOOK_DIR), str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, FAULT_ENV: spec}


def _maybe_fault(rank: int, kind: str) -> None:
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return
    parts = spec.split(":")
    if int(parts[0]) == rank and parts[1] == kind:
        if len(parts) > 2 and parts[2] == "hang":
            time.sleep(3600)
        if len(parts) > 2 and parts[2] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if len(parts) > 2 and parts[2] == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        raise RuntimeError(f"injected fault before {kind} ({FAULT_ENV}={spec})")


add_collective_hook(_maybe_fault)
