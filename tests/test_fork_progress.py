"""The search forks its workers while the progress display runs (issues 30/32/35): the display's
thread (plain lines off a terminal, rich's status refresh in one) is stopped and joined for the fork
and runs again after (`tpplan.search.pool.pausable`); a thread nobody registered makes the pool
decline, so nothing forks a process with a running thread; and the output is the same as one core's.

The checks run in a fresh interpreter: pytest's own workers (xdist) run threads of their own."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from rich.console import Console

from tpplan.commands._console import PlainSteps

ROOT = Path(__file__).resolve().parents[1]


def _tickers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tpplan-steps"]


def test_the_plain_ticker_stops_while_paused_and_runs_again_after() -> None:
    before = set(_tickers())
    plain = PlainSteps(Console(file=io.StringIO()), "x", tick=0.01)
    mine = set(_tickers()) - before
    assert len(mine) == 1
    with plain.paused():
        assert not any(t.is_alive() for t in mine)
        assert set(_tickers()) == before
    again = set(_tickers()) - before
    assert len(again) == 1 and again != mine
    with plain.paused():
        plain.stop()  # a run that fails while the workers fork: no thread comes back
    assert set(_tickers()) == before


def _python(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_the_pool_forks_with_the_plain_ticker_paused_and_declines_beside_another_thread() -> None:
    out = _python("""
        import io, os, threading
        from rich.console import Console
        from tpplan.commands._console import PlainSteps
        from tpplan.search.pool import forked_map, forked_pool, pausable

        plain = PlainSteps(Console(file=io.StringIO()), "x", tick=0.01)
        with pausable(plain.paused):
            with forked_pool(2) as pool:
                assert pool is not None, "declined to fork beside the ticker"
                assert "tpplan-steps" in [t.name for t in threading.enumerate()], "the ticker did not start again"
                assert list(pool.map(abs, [-1, -2])) == [1, 2]
        plain.stop()

        stop = threading.Event()
        other = threading.Thread(target=stop.wait)
        other.start()
        with forked_pool(2) as pool:
            assert pool is None, "forked beside a thread nobody paused"
        assert forked_map([os.getpid, os.getpid]) == [os.getpid()] * 2  # in turn, here
        stop.set()
        other.join()
        print("ok")
    """)
    assert out.strip() == "ok"


@pytest.mark.slow
def test_the_pool_forks_with_richs_status_paused_and_its_line_comes_back() -> None:
    out = _python("""
        import io, threading
        from rich.console import Console
        from tpplan.commands._console import _status_paused
        from tpplan.search.pool import forked_pool, pausable

        err = Console(file=io.StringIO(), force_terminal=True)
        with err.status("searching") as status:
            with pausable(lambda: _status_paused(status)):
                with forked_pool(2) as pool:
                    assert pool is not None, "declined to fork beside rich's refresh thread"
                    assert list(pool.map(abs, [-3])) == [3]
                    refresh = status._live._refresh_thread
                    assert refresh is not None and refresh.is_alive(), "the status line did not come back"
        print("ok")
    """)
    assert out.strip() == "ok"


SEARCH = ["search", "-m", "tiny-llama", "-t", "h200x8-ib400", "-w", "prompt4k-out512-c16",
          "--ttft-target", "2s", "--tpot-target", "50ms"]  # fmt: skip
# wraps the pool's fork to record each one it made (tpplan itself has no such seam)
_RECORD = """
import os
from tpplan.search import pool
_real = pool._fork
def _fork(workers):
    with open(os.environ["TPPLAN_TEST_FORKS"], "a") as f:
        f.write(f"{workers}\\n")
    return _real(workers)
pool._fork = _fork
"""


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the search forks workers only on two cores or more")
def test_a_search_under_targets_in_a_pipe_forks_and_prints_what_one_core_prints(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(_RECORD)
    forks = tmp_path / "forks.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT)]),
           "TPPLAN_TEST_FORKS": str(forks)}  # fmt: skip
    one_core = {min(os.sched_getaffinity(0))}
    runs = {}
    for name, cores in (("workers", None), ("one core", one_core)):
        out = tmp_path / f"{name}.json"
        done = subprocess.run([sys.executable, "-m", "tpplan", *SEARCH, "--json", str(out)], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300,
                              preexec_fn=(lambda c=cores: os.sched_setaffinity(0, c)) if cores else None)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert "Traceback" not in done.stderr
        runs[name] = (_timeless(done.stdout), _secondless(json.loads(out.read_text())))
        if name == "workers":  # the grid searched and the deployments served by forked workers
            made = forks.read_text().split()
            assert made == ["2"] * len(made) and len(made) >= 3, made  # the grid, the deployments, the P/D pairs
            forks.unlink()
    assert not forks.exists()  # one core: nothing forked
    assert runs["workers"] == runs["one core"]


def _timeless(text: str) -> str:
    """stdout without the search's own time ("searched N families in 0.91 s")."""
    import re

    return re.sub(r" in\s+[0-9.]+ s\b", " in ? s", text)


def _secondless(data: object) -> object:
    if isinstance(data, dict):
        return {k: _secondless(v) for k, v in data.items() if k != "seconds"}
    if isinstance(data, list):
        return [_secondless(v) for v in data]
    return data
