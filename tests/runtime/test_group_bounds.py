"""A local process group ends in bounded time and leaves no scratch folder behind (issue 35): a rank
stopped after rank 0 returned its result was waited for forever, and runs killed outright left
`tpplan-group-*` folders in the temp folder."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tpplan.runtime import group, group_dir


def _returns() -> None:
    os._exit(0)


def _stops_itself() -> None:
    time.sleep(0.2)  # after rank 0 has returned
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(60)


def test_a_rank_stopped_after_rank_0_returned_is_not_waited_for_forever(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(group, "PEER_EXIT_S", 0.1)
    monkeypatch.setattr(group, "STOP_GRACE_S", 0.1)
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_returns), ctx.Process(target=_stops_itself)]
    for p in procs:
        p.start()
    t0 = time.monotonic()
    exited, silent = group._wait(SimpleNamespace(processes=procs), timeout_s=1.0)
    assert time.monotonic() - t0 < 10
    assert (exited, silent) == ([], [1])
    assert not procs[1].is_alive()  # stopped, then killed
    msg = str(group.RankSilent(silent, 1.0, None))
    assert msg.startswith("rank 1 did not answer within 1 s (after rank 0 had returned the result)")


def test_ranks_that_all_return_are_not_cut_short() -> None:
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_returns), ctx.Process(target=time.sleep, args=(0.5,))]
    for p in procs:
        p.start()
    assert group._wait(SimpleNamespace(processes=procs), timeout_s=5.0) == ([], [])


@pytest.fixture
def tmpdir_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _folder(root: Path, pid: int, owner: dict | None) -> Path:
    f = root / f"{group_dir.PREFIX}{pid}-abc"
    f.mkdir()
    (f / "rank0.pkl").write_bytes(b"x")
    if owner is not None:
        (f / group_dir.OWNER).write_text(json.dumps(owner))
    return f


def test_only_folders_of_dead_tpplan_runs_are_removed(tmpdir_root: Path) -> None:
    dead = _dead_pid()
    stale = _folder(tmpdir_root, dead, {"pid": dead, "started": "1"})
    live = _folder(tmpdir_root, os.getpid(), {"pid": os.getpid(), "started": group_dir._started(os.getpid())})
    no_owner = _folder(tmpdir_root, dead + 1, None)  # not identifiable as tpplan's (an older tpplan's, or not ours)
    mismatch = _folder(tmpdir_root, dead + 2, {"pid": 1, "started": None})  # the record names another process
    target = tmpdir_root / "elsewhere"
    target.mkdir()
    (target / group_dir.OWNER).write_text(json.dumps({"pid": dead, "started": "1"}))
    link = tmpdir_root / f"{group_dir.PREFIX}{dead}-link"
    link.symlink_to(target)
    assert group_dir.remove_stale() == [stale]
    assert not stale.exists()
    assert live.exists() and no_owner.exists() and mismatch.exists() and link.is_symlink() and target.exists()


def test_a_reused_pid_does_not_keep_a_dead_runs_folder(tmpdir_root: Path) -> None:
    """Our own pid, but another start time: the run that made it is gone and the pid was reused."""
    reused = _folder(tmpdir_root, os.getpid(), {"pid": os.getpid(), "started": "-1"})
    if group_dir._started(os.getpid()) is None:
        pytest.skip("process start times cannot be read here")
    assert group_dir.remove_stale() == [reused]


def test_a_new_group_folder_records_its_owner_and_clears_stale_ones(tmpdir_root: Path) -> None:
    dead = _dead_pid()
    stale = _folder(tmpdir_root, dead, {"pid": dead, "started": "1"})
    with group_dir.make() as tmp:
        assert Path(tmp).name.startswith(f"{group_dir.PREFIX}{os.getpid()}-")
        assert json.loads((Path(tmp) / group_dir.OWNER).read_text())["pid"] == os.getpid()
        assert not stale.exists()
        assert group_dir.remove_stale() == []  # this run's own folder stays
    assert not Path(tmp).exists()


def _verify(tmp: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tpplan", "verify", "-m", "tiny-llama", "--tp", "2", "-p", "sequence-parallel",
           "--tokens", "8", "--no-progress"]  # fmt: skip
    env = dict(os.environ, TMPDIR=str(tmp))
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_default_signals)


def _default_signals() -> None:
    """In the child: a background job of a non-interactive shell starts with SIGINT ignored."""
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)


def _wait_for_group(tmp: Path) -> Path:
    end = time.monotonic() + 120
    while time.monotonic() < end:
        found = [p for p in tmp.glob(f"{group_dir.PREFIX}*") if (p / group_dir.OWNER).exists()]
        if found:
            return found[0]
        time.sleep(0.02)
    raise AssertionError("verify made no group folder")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_verify_leaves_no_rank_and_no_folder_for_long(sig: int, tmp_path: Path) -> None:
    """SIGTERM: the run removes its folder itself; SIGKILL: its ranks die with it and the next run
    removes the folder (and that run passes)."""
    proc = _verify(tmp_path)
    folder = _wait_for_group(tmp_path)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)  # end-of-file: no rank holds the pipes
    assert proc.returncode == (128 + sig if sig != signal.SIGKILL else -sig), err[-2000:]
    if sig == signal.SIGKILL:
        assert folder.exists()
        again = _verify(tmp_path)
        _, err = again.communicate(timeout=300)
        assert again.returncode == 0, err[-2000:]
    assert not folder.exists()
    assert not list(tmp_path.glob(f"{group_dir.PREFIX}*"))
