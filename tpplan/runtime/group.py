"""Form a torch.distributed group and run a function on every rank: spawned locally, or in place
under torchrun.

Used by `verify`, `run`, `bench` and `calibrate`. A rank that fails or hangs makes `run_group`
raise `RankFailed` naming the rank that failed first, by what was observed: `RankKilled` when a rank
died of a SIGKILL tpplan did not send (the OOM killer), `RankSilent` when ranks were still running
without an error after a peer timed out waiting for them. Spawned ranks meet through a file in their
private folder and connect over the loopback interface: nothing listens on an outside address, no
name is looked up. torch is imported inside the functions so that importing this module stays cheap.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from tpplan.errors import TpplanError
from tpplan.runtime import group_dir

INPUT_ERROR = "tpplan-input-error: "  # a rank's error file: the TpplanError's where/reason/fix follow


class RankFailed(RuntimeError):
    """A worker process failed or timed out; the message says which rank and why."""


class RankKilled(RankFailed):
    """The operating system killed a rank (SIGKILL): on a worker box almost always out of memory.

    The commands add what they know (the predicted memory per rank, a smaller setting to try).
    """

    def __init__(self, rank: int, signal_name: str) -> None:
        self.rank = rank
        super().__init__(
            f"rank {rank} was killed by the operating system ({signal_name}), most likely because it ran out of memory"
        )


class RankSilent(RankFailed):
    """Ranks still running, without an error, when a peer gave up waiting for them: stopped (SIGSTOP),
    deadlocked or too slow. Not a crash and not memory: what was observed is that they did not answer."""

    def __init__(self, ranks: list[int], timeout_s: float, waiter: int | None) -> None:
        self.ranks = ranks
        who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
        seen = f"rank {waiter} timed out waiting" if waiter is not None else "after rank 0 had returned the result"
        super().__init__(
            f"{who} did not answer within {timeout_s:g} s ({seen}); stopped, deadlocked or too slow. "
            "Try a longer --timeout, or check that nothing stops the processes"
        )


@dataclass(frozen=True)
class GroupSpec:
    """How to form the group: backend 'gloo'|'nccl', local process count, timeout."""

    backend: str
    nproc: int
    timeout_s: float


def under_torchrun() -> bool:
    """True when torchrun (or another launcher) already set RANK and WORLD_SIZE."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def resolve_backend(backend: str) -> str:
    """'auto' -> nccl when CUDA is available, else gloo."""
    if backend != "auto":
        return backend
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


STORE_CONNECT_S = 60.0  # joining the rendezvous: a loaded machine starts processes slowly
STORE_FILE = "rendezvous"  # spawned ranks' store: a file in the group's private temporary folder


def _loopback_interface() -> str:
    """The loopback network interface's name (`lo` on Linux, `lo0` on macOS)."""
    names = [name for _, name in socket.if_nameindex()]
    return next((n for n in names if n in ("lo", "lo0")), next((n for n in names if n.startswith("lo")), "lo"))


def _init(spec: GroupSpec, rank: int, world: int, store_file: Path | None = None) -> Any:
    """Join the group. `store_file` (spawned ranks): they meet through a file store in the group's
    private folder, not a TCP store: nothing listens on any network address, and no rank resolves a
    name (torch's TCP store client looks up the reverse name of every address it tries, a DNS query).
    It waits STORE_CONNECT_S for the others to start, so that a short `--timeout` bounds the
    collectives, not process start-up on a busy machine."""
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device("cpu")
    if spec.backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    timeout = timedelta(seconds=spec.timeout_s)
    if store_file is not None:
        store = dist.FileStore(str(store_file), world)
        store.set_timeout(timedelta(seconds=max(STORE_CONNECT_S, spec.timeout_s)))
        dist.init_process_group(spec.backend, store=store, rank=rank, world_size=world, timeout=timeout)
    else:
        dist.init_process_group(spec.backend, rank=rank, world_size=world, timeout=timeout)
    return device


def _child(local_rank: int, fn: Callable[..., Any], spec: GroupSpec, out: str, payload: Any, parent: int) -> None:
    import torch.distributed as dist

    from tpplan.signals import die_with_parent

    die_with_parent(parent)  # a rank never outlives the command that started it, however it ended
    # A local group (issue 35): the ranks meet through a file (`_init`), and gloo connects them over the
    # loopback interface, named so that it does not resolve the host's name (a DNS lookup) for an address.
    os.environ.update(LOCAL_RANK=str(local_rank), GLOO_SOCKET_IFNAME=_loopback_interface())
    try:
        device = _init(spec, local_rank, spec.nproc, Path(out).with_name(STORE_FILE))
        result = fn(local_rank, spec.nproc, device, payload)
        if local_rank == 0:
            Path(out).write_bytes(pickle.dumps(result))
    except BaseException as exc:
        # Record when and why, so the parent can name the rank that failed first (peers of a
        # dead rank fail afterwards with "connection reset", which is not the cause). A bad input
        # found here (TpplanError) also records its parts, so the parent raises it again: exit 2.
        err = Path(out).with_name(f"rank{local_rank}.err")
        text = f"{time.time()!r}\n{type(exc).__name__}: {exc}"
        if isinstance(exc, TpplanError):
            text += f"\n{INPUT_ERROR}" + json.dumps([exc.where, exc.reason, exc.fix])
        err.write_text(text)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_group(fn: Callable[..., Any], spec: GroupSpec, payload: Any) -> Any:
    """Run fn(rank, world, device, payload) on every rank; return rank 0's result.

    Under torchrun this process is one rank (non-zero ranks get None back). Otherwise `spec.nproc`
    local processes are spawned; any child failure or timeout raises RankFailed.
    """
    if under_torchrun():
        import torch.distributed as dist

        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        try:
            device = _init(spec, rank, world)
            result = fn(rank, world, device, payload)
        except TpplanError:
            raise  # a bad input: the CLI prints it and exits 2
        except Exception as exc:
            if PORT_TAKEN in str(exc):
                port = os.environ.get("MASTER_PORT", "?")
                raise TpplanError(
                    f"MASTER_PORT {port}", f"is already taken on {os.environ.get('MASTER_ADDR', 'this machine')}",
                    "pass a free port to torchrun (--master-port) or stop what holds it",
                ) from None  # fmt: skip
            raise RankFailed(f"rank {rank}: {type(exc).__name__}: {exc}") from exc
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
        return result if rank == 0 else None
    return _spawn(fn, spec, payload)


PORT_TAKEN = "EADDRINUSE"  # under torchrun: its MASTER_PORT is another process's


def _spawn(fn: Callable[..., Any], spec: GroupSpec, payload: Any) -> Any:
    """Start `spec.nproc` local ranks meeting through a file store; rank 0's result (see run_group)."""
    import logging

    import torch.multiprocessing as mp

    # torch logs a warning per peer it terminates after a failure; the error below says it once
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    with group_dir.make() as tmp:
        out = str(Path(tmp) / "rank0.pkl")
        ctx = mp.start_processes(
            _child,
            args=(fn, spec, out, payload, os.getpid()),
            nprocs=spec.nproc,
            join=False,
            start_method="spawn",
        )
        try:
            exited, silent = _wait(ctx, spec.timeout_s)
        except BaseException:  # Ctrl-C or SIGTERM here: no rank outlives the run
            for proc in ctx.processes:
                if proc.is_alive():
                    proc.kill()
                proc.join()
            raise
        finally:
            for f in ctx.error_files:  # torch's own record of a child's traceback; ours is rank*.err
                Path(f).unlink(missing_ok=True)
        if exited:
            _raise_input_error(Path(tmp))
            killed = [i for i in exited if ctx.processes[i].exitcode == -signal.SIGKILL]
            if killed:  # SIGKILL that tpplan did not send: the rank exited so before anything was stopped
                raise RankKilled(killed[0], "SIGKILL")
            errors = _rank_errors(Path(tmp))
            if silent and errors and TIMED_OUT.search(errors[0][2]):
                raise RankSilent(silent, spec.timeout_s, errors[0][1])
            raise RankFailed(_first_failure(errors, exited, ctx.processes))
        if silent:  # every rank that ended succeeded, and these never ended
            raise RankSilent(silent, spec.timeout_s, None)
        if not Path(out).exists():
            raise RankFailed("rank 0 returned no result")
        return pickle.loads(Path(out).read_bytes())


PEER_EXIT_S = 3.0  # after a rank failed: how long its peers get to fail on their own (a closed connection)
STOP_GRACE_S = 3.0  # then SIGTERM to those still running, and SIGKILL after this
TIMED_OUT = re.compile(r"time(d)? ?out", re.IGNORECASE)


def _wait(ctx: Any, timeout_s: float) -> tuple[list[int], list[int]]:
    """Wait for every rank; on the first failure, stop the rest. (the ranks that exited non-zero by
    themselves, the ranks still running PEER_EXIT_S later): both empty when every rank succeeded.
    Once rank 0 has returned the result, the others get `timeout_s` (the collectives' own bound) to
    finish too: a rank stopped (SIGSTOP) after that would otherwise be waited for forever.

    torch's `ProcessContext.join` is not used: it SIGKILLs a rank that ignores SIGTERM (a stopped one)
    and then reports that as the rank's own death. Here only what each process did by itself counts."""
    from multiprocessing.connection import wait

    procs = ctx.processes
    pending = {p.sentinel: i for i, p in enumerate(procs)}
    end: float | None = None  # set when the first rank has finished
    while pending:
        ready = wait(list(pending), None if end is None else max(0.0, end - time.monotonic()))
        for sentinel in ready:
            procs[pending.pop(sentinel)].join()
        if any(p.exitcode not in (None, 0) for p in procs) or (end is not None and not ready):
            break
        if end is None and procs[0].exitcode == 0:
            end = time.monotonic() + timeout_s
    else:
        return [], []
    end = time.monotonic() + PEER_EXIT_S
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
    exited = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
    silent = [i for i, p in enumerate(procs) if p.is_alive()]
    for i in silent:
        procs[i].terminate()
    end = time.monotonic() + STOP_GRACE_S
    for i in silent:
        procs[i].join(max(0.0, end - time.monotonic()))
    for i in silent:
        if procs[i].is_alive():
            procs[i].kill()
        procs[i].join()
    return exited, silent


def _raise_input_error(tmp: Path) -> None:
    """A rank found a bad input (its error file says so): raise that TpplanError here, exit 2."""
    for f in sorted(tmp.glob("rank*.err")):
        _, _, parts = f.read_text().partition(INPUT_ERROR)
        if parts:
            where, reason, fix = json.loads(parts.splitlines()[0])
            raise TpplanError(where, reason, fix)


def _rank_errors(tmp: Path) -> list[tuple[float, int, str]]:
    """(when, rank, first line) of every error a rank recorded, earliest first."""
    errs = []
    for f in tmp.glob("rank*.err"):
        stamp, _, msg = f.read_text().partition("\n")
        errs.append((float(stamp), int(f.stem[len("rank") :]), (msg.strip().splitlines() or [""])[0]))
    return sorted(errs)


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"was ended by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was ended by signal {-code}"
    return f"exited with code {code}"


def _first_failure(errs: list[tuple[float, int, str]], exited: list[int], procs: list[Any]) -> str:
    """Describe the failure: the earliest recorded rank error first, then the others."""
    if not errs:
        return "; ".join(f"rank {i} {_exit_text(procs[i].exitcode)} and left no error" for i in exited)
    _, rank, msg = errs[0]
    text = f"rank {rank} failed first: {msg}"
    if len(errs) > 1:
        text += " (then " + "; ".join(f"rank {r}: {m[:80]}" for _, r, m in errs[1:]) + ")"
    return text


__all__ = ["GroupSpec", "RankFailed", "RankKilled", "RankSilent", "resolve_backend", "run_group", "under_torchrun"]
