"""A rank that dies or hangs makes every rank exit with a clear error within a bounded time, and
`tpplan verify --json` leaves no partial output file."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from fault_injection import fault_env

from tpplan.runtime.group import RankFailed
from tpplan.runtime.verify import VerifyCase, verify_cases


@pytest.mark.slow
def test_rank_that_dies_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in fault_env("1:all_gather").items():
        monkeypatch.setenv(k, v)
    t0 = time.monotonic()
    with pytest.raises(RankFailed, match=r"rank 1 failed first: RuntimeError: injected fault before all_gather"):
        verify_cases([VerifyCase("tiny-llama", "sequence-parallel", tokens=8)], nproc=2, timeout_s=20)
    assert time.monotonic() - t0 < 120  # timeout 20 s; the rest is spawning on a busy machine


@pytest.mark.slow
def test_rank_that_hangs_times_out_without_partial_output(tmp_path) -> None:
    out = tmp_path / "verify.json"
    env = dict(os.environ, **fault_env("1:reduce_scatter:hang"))
    cmd = [sys.executable, "-m", "tpplan", "verify", "--model", "tiny-llama", "--tp", "2", "--plan",
           "sequence-parallel", "--tokens", "8", "--timeout", "3", "--json", str(out)]  # fmt: skip
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert time.monotonic() - t0 < 120  # timeout 3 s; the rest is spawning on a busy machine
    assert res.returncode == 1, res.stderr[-2000:]
    assert "verify failed: rank" in res.stderr
    assert not out.exists() and not list(tmp_path.iterdir())


def _rank_sum(rank: int, world: int, device: object, payload: int) -> int:
    import torch
    import torch.distributed as dist

    t = torch.tensor([rank + payload])
    dist.all_reduce(t)
    return int(t.item())


def test_a_port_taken_before_the_store_binds_it_starts_the_group_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process can take the free port between `_free_port` and rank 0's store (seen on CI):
    rank 0 fails to listen (EADDRINUSE) before any rank runs `fn`, and the group starts again on a
    new port instead of failing the run."""
    import socket

    from tpplan.runtime import group

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    ports = iter([held.getsockname()[1]])
    real = group._free_port
    monkeypatch.setattr(group, "_free_port", lambda: next(ports, None) or real())
    try:
        assert group.run_group(_rank_sum, group.GroupSpec("gloo", 2, 60), 10) == 21
    finally:
        held.close()
    monkeypatch.setattr(group, "PORT_ATTEMPTS", 1)
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    ports = iter([held.getsockname()[1]])
    try:
        with pytest.raises(RankFailed, match="EADDRINUSE"):
            group.run_group(_rank_sum, group.GroupSpec("gloo", 2, 60), 10)
    finally:
        held.close()
