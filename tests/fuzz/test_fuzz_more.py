"""The slow lane's share of the fuzzing (issue 35): the quick lane's fuzz tests again at four times
their examples (`TPPLAN_FUZZ_SCALE=4`; still derandomized, so a failure reproduces), in a pytest of
its own so each test keeps its own example count."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
def test_the_fuzz_suite_at_four_times_its_examples() -> None:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-m", "not slow", str(HERE)]
    env = {**os.environ, "TPPLAN_FUZZ_SCALE": "4"}
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=HERE.parents[1], timeout=1800)
    assert res.returncode == 0, res.stdout[-4000:]
