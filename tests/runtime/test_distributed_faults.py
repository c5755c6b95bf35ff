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
    assert "verify failed: rank 1 did not answer within 3 s" in res.stderr and "memory" not in res.stderr
    assert not out.exists() and not list(tmp_path.iterdir())


def _rank_sum(rank: int, world: int, device: object, payload: int) -> int:
    import torch
    import torch.distributed as dist

    t = torch.tensor([rank + payload])
    dist.all_reduce(t)
    return int(t.item())


@pytest.mark.slow
def test_a_stopped_rank_is_named_as_not_answering_not_as_out_of_memory() -> None:
    """SIGSTOP: the stopped rank never answers; its peer times out. torch's own join would SIGKILL the
    stopped rank after 30 s and that used to read as the OS killing it for memory."""
    env = dict(os.environ, **fault_env("1:all_gather:stop"))
    cmd = [sys.executable, "-m", "tpplan", "verify", "-m", "tiny-llama", "--tp", "2", "-p", "sequence-parallel",
           "--tokens", "8", "--timeout", "3", "--no-progress"]  # fmt: skip
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert time.monotonic() - t0 < 100  # no 30 s grace for a rank that cannot take SIGTERM
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1, res.stderr[-2000:]
    assert "rank 1 did not answer within 3 s (rank 0 timed out waiting)" in lines[0]
    assert "memory" not in lines[0] and "SIGKILL" not in lines[0]


def _port_taken_env(monkeypatch: pytest.MonkeyPatch, port: int) -> None:
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(port)}.items():  # fmt: skip
        monkeypatch.setenv(k, v)


def test_a_taken_master_port_under_torchrun_is_one_named_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from tpplan.errors import TpplanError
    from tpplan.runtime import group

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        _port_taken_env(monkeypatch, port)
        with pytest.raises(TpplanError) as info:
            group.run_group(_rank_sum, group.GroupSpec("gloo", 1, 10), 0)
    assert info.value.where == f"MASTER_PORT {port}" and "already taken" in info.value.reason
    assert "--master-port" in info.value.fix


@pytest.mark.slow
def test_verify_under_torchrun_with_a_taken_port_ends_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port)}  # fmt: skip
        cmd = [sys.executable, "-m", "tpplan", "verify", "-m", "tiny-llama", "--tp", "1", "-p", "baseline",
               "--tokens", "8", "--no-progress"]  # fmt: skip
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert f"MASTER_PORT {port}" in lines[0] and "--master-port" in lines[0]
