"""What SIGINT, SIGTERM and SIGHUP do to a tpplan command, in one place.

A command stopped by one of them unwinds like an error: SIGINT raises KeyboardInterrupt (exit 130),
SIGTERM and SIGHUP raise `Terminated` (exit 128 + the signal), so every `finally` runs: forked
search workers are stopped, ranks killed, temporaries removed. Once one of them has been raised,
later ones are ignored (`exit_cleanly`), so a second Ctrl-C cannot break off that cleanup
half-way or print a traceback; the command still ends with the first signal's exit code.

Two more guards, for the instants a handler cannot cover: `deferred` holds the signals while a
temporary is created and recorded, or while renames commit a write (a handler raising between the
`mkstemp` and the assignment would lose its name), and `die_with_parent` makes a worker process
receive SIGKILL when its parent dies by any means (SIGKILL included), so no worker outlives a
command holding its stdout and stderr. No tpplan imports: the planner, the writers and the runtime
use it alike.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from types import FrameType

STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # the signals that end a command with cleanup
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class Terminated(SystemExit):
    """SIGTERM or SIGHUP arrived; raised so that cleanup runs, then the process exits 128 + the signal."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(128 + signum)
        self.signum = signum


def _ours(signum: int, handler: object) -> bool:
    """A handler nobody set (so ours may take its place): the default, or Python's for SIGINT."""
    return handler == signal.SIG_DFL or (signum == signal.SIGINT and handler is signal.default_int_handler)


class _State:
    """What the handlers of `exit_cleanly` know: Python runs them in the main thread, whichever
    thread the signal reached, so this needs no lock."""

    raised = False  # one signal has been raised: later ones are ignored
    holding = 0  # inside `deferred` (nested depth)
    pending: int | None = None  # a signal that came while holding


def _raise(signum: int) -> None:
    _State.raised = True
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


def _stop(signum: int, frame: FrameType | None) -> None:
    if _State.raised:
        return  # cleanup of the first one is under way
    if _State.holding:
        _State.pending = _State.pending or signum
        return
    _raise(signum)


@contextmanager
def exit_cleanly() -> Iterator[None]:
    """While inside, the first SIGINT/SIGTERM/SIGHUP raises (KeyboardInterrupt / Terminated) and any
    later one is ignored, so that the cleanup the first one started runs whole. Only the main thread
    sets handlers; a handler someone else set, or a signal ignored from the start (a background job
    of a non-interactive shell ignores SIGINT), is left as it is. The handlers are put back on exit,
    unless a signal came: the process is on its way out then, and the signals stay ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    mine = [s for s in STOPPING if _ours(s, signal.getsignal(s))]
    before = {s: signal.getsignal(s) for s in mine}
    if mine:
        _State.raised, _State.pending = False, None
    for s in mine:
        signal.signal(s, _stop)
    try:
        yield
    finally:
        for s, handler in before.items():
            # after a signal, ignored from here on: the process is on its way out, and Python's own
            # shutdown would put the default back (a second Ctrl-C then killed it by SIGINT)
            signal.signal(s, signal.SIG_IGN if _State.raised else handler)


@contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP (those `exit_cleanly` handles) while inside: one that arrives
    meanwhile is raised just after the block, once what was done inside is recorded."""
    _State.holding += 1
    try:
        yield
    finally:
        _State.holding -= 1
        if not _State.holding and _State.pending is not None and not _State.raised:
            signum, _State.pending = _State.pending, None
            _raise(signum)


def die_with_parent(parent: int) -> None:
    """In a worker process: receive SIGKILL when the parent dies, and exit now if it already has.

    Linux's PR_SET_PDEATHSIG (elsewhere only the check); the worker's stopping signals go back to
    their defaults (a forked worker inherits the parent's handlers, which would raise in it) and
    SIGINT is ignored: a Ctrl-C reaches the whole process group, and the parent stops its workers."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        import ctypes

        with suppress(OSError, AttributeError):  # no prctl: the check below still sees a parent already gone
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


__all__ = ["STOPPING", "Terminated", "deferred", "die_with_parent", "exit_cleanly"]
