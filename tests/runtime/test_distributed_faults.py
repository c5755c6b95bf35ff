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
