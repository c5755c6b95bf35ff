"""Signals and concurrent runs, as separate processes (issue 35; slow lane): SIGTERM, SIGHUP or SIGINT
at a random moment of `search --json --save` (during the forked ranking or the writes) ends every
process of the run, end-of-file arrives, the exit code is the signal's (or 0 when the run had
finished, or death by the signal while Python was still starting), no traceback is printed, and
each output is whole or absent with no temporary left; two runs writing into one folder at once
keep both ledger entries. A background job of a non-interactive shell starts with SIGINT ignored,
and a child inherits that: each child here gets the default dispositions back first."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fuzzing import FUZZ, SCALE
from hypothesis import given, settings
from hypothesis import strategies as st

from tpplan.outputs import LEDGER, LOCK, MARKER, check_dir, check_file
from tpplan.signals import STOPPING

ROOT = Path(__file__).resolve().parents[2]


def _default_signals() -> None:
    for s in STOPPING:
        signal.signal(s, signal.SIG_DFL)


def _start(args: list[str], cwd: Path, slow_search: float = 0) -> subprocess.Popen:
    """`tpplan ARGS` in `cwd`; with `slow_search`, each deployment the search's workers take starts
    with that long a sleep (tests/slow_search), so that a signal can land while they rank."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "slow_search"), str(ROOT)])}
    if slow_search:
        env["TPPLAN_TEST_SLOW_SEARCH"] = str(slow_search)
    return subprocess.Popen([sys.executable, "-m", "tpplan", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=_default_signals)  # fmt: skip


def _descendants(pid: int) -> set[int]:
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        try:
            kids = [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            kids = []
        out.update(kids)
        todo += kids
    return out


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] in "ZX"
    except OSError:
        return True


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads the process tree from /proc")
@settings(FUZZ, max_examples=6 * SCALE)
@given(
    sig=st.sampled_from([signal.SIGTERM, signal.SIGHUP, signal.SIGINT]),
    delay=st.sampled_from([0.5, 1, 2, 3, 5]),
    slow=st.sampled_from([0, 3]),
)
def test_a_signal_at_any_moment_ends_every_process_and_leaves_outputs_whole_or_absent(
    sig, delay, slow, tmp_path_factory
):
    folder = tmp_path_factory.mktemp("run")
    args = ["search", "-m", "deepseek-v3", "--topology", "h200x8-ib400", "--nodes", "2", "--top", "3",
            "--json", "out.json", "--save", "saved"]  # fmt: skip
    proc = _start(args, folder, slow)
    seen: set[int] = set()
    end = time.monotonic() + delay
    while time.monotonic() < end and proc.poll() is None:
        seen |= _descendants(proc.pid)
        time.sleep(0.01)
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=60)  # end-of-file: no process of the run holds the pipes
    finally:
        proc.kill()
    # 128 + sig: stopped and cleaned up; -sig: killed while Python was still starting, before any work
    assert proc.returncode in (0, 128 + sig, -sig), err[-2000:]
    assert b"Traceback" not in err
    end = time.monotonic() + 10
    while not all(_gone(p) for p in seen) and time.monotonic() < end:
        time.sleep(0.05)
    assert all(_gone(p) for p in seen)
    left = {p.name for p in folder.iterdir()}
    assert left <= {"out.json", "saved", LEDGER, LOCK}, left  # no temporary
    if "out.json" in left:
        json.loads((folder / "out.json").read_text())
        check_file("--json", folder / "out.json")  # whole, and recorded as tpplan's
    if "saved" in left:
        assert (folder / "saved" / MARKER).is_file()
        check_dir("--save", folder / "saved")


@pytest.mark.slow
def test_concurrent_runs_into_one_folder_keep_every_ledger_entry(tmp_path):
    names = []
    for round_ in range(3):
        pair = [f"a{round_}.json", f"b{round_}.json"]
        procs = [_start(["search", "-m", "tiny-kimi-k3", "-t", "h200x2", "--tp", "2", "--json", n], tmp_path)
                 for n in pair]  # fmt: skip
        for p in procs:
            _, err = p.communicate(timeout=300)
            assert p.returncode == 0, err[-2000:]
        names += pair
    assert set(json.loads((tmp_path / LEDGER).read_text())["files"]) == set(names)
    for n in names:
        check_file("--json", tmp_path / n)  # tpplan still owns every file it wrote
