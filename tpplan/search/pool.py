"""The search's forked workers: they die with the command, whatever ends it.

`forked_pool` is a process pool whose workers inherit the parent's search set-up (forked, not
pickled). A worker must never outlive the command: a SIGTERM or SIGHUP to `tpplan search` or
`tpplan report` once left the workers blocked forever on their task queue, holding the command's
stdout and stderr open, so a caller waiting for end-of-file hung. Two guards: each worker asks the
kernel for SIGKILL when its parent dies (`tpplan.signals.die_with_parent`, which also covers a
SIGKILL to the parent), and a search stopped by an exception (KeyboardInterrupt, `Terminated`, an
error) kills its workers at once instead of letting the pool wait for each to finish.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager


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
def forked_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """A pool of `workers` forked processes: shut down normally when the block ends, killed when an
    exception (a signal's included) leaves it."""
    import multiprocessing as mp

    pool = ProcessPoolExecutor(
        workers, mp_context=mp.get_context("fork"), initializer=_worker_init, initargs=(os.getpid(),)
    )
    try:
        yield pool
    except BaseException:
        _kill_workers(pool)
        raise
    pool.shutdown(wait=True)


__all__ = ["forked_pool"]
