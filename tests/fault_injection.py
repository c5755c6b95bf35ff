"""Fault injection for the multi-process tests, through the runtime's collective hook.

`fault_env("RANK:KIND")` is the environment that makes that rank raise before its first
collective of KIND; `"RANK:KIND:hang"` makes it sleep instead, `"RANK:KIND:kill"` makes it SIGKILL
itself (what the OOM killer does), `"RANK:KIND:stop"` makes it SIGSTOP itself (as `kill -STOP` does).
Every rank imports this file (the runtime's `TPPLAN_RANK_HOOKS` seam, `tpplan.runtime.hooks`), which
registers `_maybe_fault`.
Fault injection lives here only: tpplan itself registers no hook.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tpplan.runtime.hooks import HOOKS_ENV, add_collective_hook

FAULT_ENV = "TPPLAN_TEST_FAULT"


def fault_env(spec: str) -> dict[str, str]:
    """Environment variables that load this hook into every rank and make it inject `spec`."""
    return {HOOKS_ENV: str(Path(__file__).resolve()), FAULT_ENV: spec}


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
