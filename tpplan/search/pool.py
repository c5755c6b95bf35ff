"""The search's forked workers: they die with the command, whatever ends it.

`forked_pool` is a process pool whose workers inherit the parent's search set-up (forked, not
pickled). A worker must never outlive the command: a SIGTERM or SIGHUP to `tpplan search` or
`tpplan report` once left the workers blocked forever on their task queue, holding the command's
stdout and stderr open, so a caller waiting for end-of-file hung. Two guards: each worker asks the
kernel for SIGKILL when its parent dies (`tpplan.signals.die_with_parent`, which also covers a
SIGKILL to the parent), and a search stopped by an exception (KeyboardInterrupt, `Terminated`, an
error) kills its workers at once instead of letting the pool wait for each to finish.

Forking a process that runs other threads can deadlock the child (a lock a thread held at the fork
stays held in the child forever), and the CLI always runs one: its progress display (a plain line
ticker in a file or pipe, rich's refresh thread in a terminal). Such a thread registers itself with
`pausable`; `forked_pool` stops and joins every registered thread, forks all its workers, then starts
them again, so the parent keeps saying progress while the workers search. A thread nobody registered
still makes the pool decline (it yields None: run the tasks in turn).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any, TypeVar

T = TypeVar("T")

Pause = Callable[[], AbstractContextManager[None]]
_PAUSES: list[Pause] = []  # what stops this process's other threads for a fork (`pausable`)


@contextmanager
def pausable(pause: Pause) -> Iterator[None]:
    """While inside, `forked_pool` enters `pause()` around its fork: it must stop and join a thread
    of this process (a progress display's) and start it again when left, also on an exception."""
    _PAUSES.append(pause)
    try:
        yield
    finally:
        _PAUSES.remove(pause)


def fork_workers(tasks: int) -> int:
    """How many forked workers `tasks` tasks get: one a core, at most one a task; 0 (run them in
    turn) with one core or one task, or where processes cannot fork."""
    import multiprocessing as mp

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = min(tasks, cores)
    return workers if workers > 1 and "fork" in mp.get_all_start_methods() else 0


def _worker_init(parent: int) -> None:
    """A forked worker dies with its parent, and its garbage collector freezes what it inherited
    (the model graph, the price tables) rather than scanning it in every full collection, and
    collects young objects in larger batches. The walk allocates many short-lived containers; this
    takes about 10% off its CPU (docs/benchmarks.md, "Search command speed"). The worker exits
    after the search."""
    import gc

    from tpplan.signals import die_with_parent

    die_with_parent(parent)
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


def _kill_workers(pool: ProcessPoolExecutor) -> None:
    """End the workers now rather than after their current deployment (`shutdown` would wait)."""
    processes = getattr(pool, "_processes", None) or {}  # CPython's own record of its workers
    for proc in list(processes.values()):
        proc.kill()
    pool.shutdown(wait=True, cancel_futures=True)


@contextmanager
def _threads_paused() -> Iterator[None]:
    """Every registered thread stopped while inside (`pausable`), started again after."""
    with ExitStack() as paused:
        for pause in list(_PAUSES):
            paused.enter_context(pause())
        yield


def _fork(workers: int) -> ProcessPoolExecutor:
    """`workers` processes forked now. A pool of the fork context starts all its workers at its first
    task, so a no-op task forks them here, not at the caller's first `submit` (threads run by then)."""
    import multiprocessing as mp

    pool = ProcessPoolExecutor(
        workers, mp_context=mp.get_context("fork"), initializer=_worker_init, initargs=(os.getpid(),)
    )
    pool.submit(int)
    return pool


@contextmanager
def forked_pool(workers: int, pause: bool = True) -> Iterator[ProcessPoolExecutor | None]:
    """A pool of `workers` forked processes (None: this process runs a thread that cannot pause, or
    any thread with `pause=False`, so the caller runs its tasks in turn): shut down normally when the
    block ends, killed when an exception (a signal's included) leaves it."""
    from tpplan.signals import deferred

    pool = None
    try:
        with _threads_paused() if pause else nullcontext():
            if threading.active_count() == 1:
                with deferred():  # a signal meanwhile is raised once `pool` is set: the workers are killed
                    pool = _fork(workers)
        yield pool
    except BaseException:
        if pool is not None:
            _kill_workers(pool)
        raise
    if pool is not None:
        pool.shutdown(wait=True)


_CALLS: Sequence[Callable[[], Any]] = ()  # what `forked_map`'s workers run (inherited, not pickled)


def _call(i: int) -> Any:
    return _CALLS[i]()


def forked_map(calls: Sequence[Callable[[], T]]) -> list[T]:
    """Each call's result, in order: from forked workers where there are several cores and calls
    (they inherit the calls, closures included; only the results are pickled back), else in turn."""
    global _CALLS
    workers = fork_workers(len(calls))
    if workers:
        _CALLS = calls
        try:
            with forked_pool(workers) as pool:
                if pool is not None:
                    return list(pool.map(_call, range(len(calls))))
        finally:
            _CALLS = ()
    return [call() for call in calls]


__all__ = ["Pause", "fork_workers", "forked_map", "forked_pool", "pausable"]
