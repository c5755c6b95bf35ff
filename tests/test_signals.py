"""Signals end a command cleanly (issue 35): SIGTERM/SIGHUP/SIGINT unwind it with its cleanup, a
second one during that cleanup changes nothing, a signal held during a critical step arrives after
it, and worker processes die with their parent (the search's forked workers once outlived a
SIGTERM'd `tpplan search`, holding its stdout, so a caller waiting for end-of-file hung)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tpplan.signals import STOPPING, Terminated, deferred, exit_cleanly

ROOT = Path(__file__).resolve().parents[1]
SLOW_SEARCH = ROOT / "tests" / "slow_search"  # its sitecustomize slows each deployment of the search


def test_sigterm_and_sighup_raise_terminated_with_their_exit_codes(handlers) -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with pytest.raises(Terminated) as got, exit_cleanly():
            os.kill(os.getpid(), sig)
            time.sleep(1)  # not reached: the handler raises first
        assert got.value.code == 128 + sig
        for s in STOPPING:
            signal.signal(s, signal.SIG_DFL if s != signal.SIGINT else signal.default_int_handler)


def test_a_second_signal_during_cleanup_is_ignored(handlers) -> None:
    cleaned = []
    with pytest.raises(KeyboardInterrupt), exit_cleanly():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        finally:
            os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C while cleaning up
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            cleaned.append(True)
    assert cleaned == [True]


def test_handlers_are_put_back_and_others_left_alone(handlers) -> None:
    def mine(signum, frame):  # someone else's handler
        pass

    signal.signal(signal.SIGHUP, mine)
    with exit_cleanly():
        assert signal.getsignal(signal.SIGHUP) is mine
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, mine)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_signal_held_by_deferred_arrives_after_the_block(handlers) -> None:
    done = []
    with pytest.raises(Terminated), exit_cleanly():
        with deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            done.append("inside")  # the held signal did not interrupt this
        done.append("after")  # not reached: delivered on leaving the block
    assert done == ["inside"]


# A parent that forks a worker (which asks to die with it), prints the worker's pid and waits.
_PARENT = textwrap.dedent("""
    import os, sys, time
    from tpplan.signals import die_with_parent
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        die_with_parent(parent)
        time.sleep(60)
        os._exit(0)
    print(pid, flush=True)
    time.sleep(60)
""")


def _gone(pid: int) -> bool:
    """No such process, or only its zombie (dead, not yet reaped by init)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except OSError:
        return True
    return state in "ZX"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_worker_dies_when_its_parent_is_killed() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    worker = int(proc.stdout.readline())
    assert not _gone(worker)
    proc.kill()  # SIGKILL: no handler of the parent's runs
    proc.wait(timeout=10)
    end = time.monotonic() + 10
    while not _gone(worker) and time.monotonic() < end:
        time.sleep(0.02)
    assert _gone(worker)


def _reset_signals() -> None:
    """In the child: default dispositions (a background job of a non-interactive shell starts with
    SIGINT ignored, and a child inherits that)."""
    for s in STOPPING:
        signal.signal(s, signal.SIG_DFL)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.mark.slow
@pytest.mark.skipif(
    not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists() or len(os.sched_getaffinity(0)) < 2,
    reason="needs /proc children lists and two cores (the search forks workers only then)",
)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
@pytest.mark.parametrize("targets", [False, True], ids=["search", "under-targets-progress-ticking"])
def test_a_signal_during_ranking_ends_every_process_and_eof_arrives(sig: int, targets: bool, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "tpplan", "search", "-m", "deepseek-v3", "--topology", "h200x8-ib400", "--nodes", "4"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SLOW_SEARCH), str(ROOT)]), "TPPLAN_TEST_SLOW_SEARCH": "60"}
    if targets:  # forks beside the progress thread, paused for the fork (search/pool.py)
        cmd += ["--workload", "prompt4k-out512-c16", "--ttft-target", "2s", "--tpot-target", "50ms"]
        env["TPPLAN_TEST_KEEP_TICK"] = "1"
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=_reset_signals)  # fmt: skip
    end = time.monotonic() + 60
    while len(_children(proc.pid)) < 2 and time.monotonic() < end and proc.poll() is None:
        time.sleep(0.01)
    workers = _children(proc.pid)
    assert len(workers) >= 2, "the search forked no workers"
    time.sleep(0.3)  # the workers are in their deployments now (each starts with a minute's sleep)
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=30)  # end-of-file on both pipes: nothing holds them
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, err[-2000:]
    assert b"Traceback" not in err
    end = time.monotonic() + 10
    while not all(_gone(w) for w in workers) and time.monotonic() < end:
        time.sleep(0.02)
    assert all(_gone(w) for w in workers)
