"""A local process group exposes nothing and runs nothing it is told to by its environment (issue 35):
spawned ranks meet through a file, listen on the loopback address only, look no name up, and import
no module `TPPLAN_RANK_HOOKS` (the former test seam) names."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tpplan.runtime import group


def _listening(pid: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp* writes them) of the TCP sockets process `pid` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = str(fd.readlink())
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # LISTEN, and this process's
                found.append(cols[1].rsplit(":", 1)[0])
    return found


def _report(rank: int, world: int, device: Any, payload: str) -> dict[str, Any]:
    import os

    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)  # gloo has connected every pair by now
    return {"listening": _listening(os.getpid()), "sum": float(t.item()), "hook_ran": Path(payload).exists()}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One two-rank gloo group, started with TPPLAN_RANK_HOOKS naming a module that leaves a mark."""
    folder = tmp_path_factory.mktemp("hooks")
    mark = folder / "imported"
    hook = folder / "evil_hook.py"
    hook.write_text(f"from pathlib import Path\nPath({str(mark)!r}).write_text('ran')\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TPPLAN_RANK_HOOKS", str(hook))
        out = group.run_group(_report, group.GroupSpec("gloo", 2, 60), str(mark))
    return {**out, "mark": mark}


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/net/tcp").exists(), reason="needs Linux /proc")
def test_the_ranks_listen_on_the_loopback_address_only(ranks):
    assert ranks["sum"] == 2.0
    loopback = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}
    assert ranks["listening"], "gloo listens for its peers somewhere"
    assert set(ranks["listening"]) <= loopback, ranks["listening"]  # not 0.0.0.0 or ::, as torch's TCP store


@pytest.mark.slow
def test_the_product_imports_no_module_its_environment_names(ranks):
    """TPPLAN_RANK_HOOKS imported arbitrary modules in every rank; now it is ignored (the tests load
    their fault injection through a sitecustomize on PYTHONPATH instead: tests/rank_hooks/)."""
    assert not ranks["hook_ran"] and not ranks["mark"].exists()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace to see the ranks' system calls")
def test_a_verify_run_looks_no_name_up(tmp_path):
    """No process of `tpplan verify --tp 2` reads the resolver's configuration or sends a DNS query
    (torch's TCP store client did: a reverse lookup of every address it tried)."""
    log = tmp_path / "trace"
    cmd = ["strace", "-f", "-e", "trace=openat,connect", "-o", str(log), sys.executable, "-m", "tpplan", "verify",
           "--model", "tiny-llama", "--tp", "2", "--plan", "baseline", "--tokens", "8", "--no-progress"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "ptrace" in r.stderr:
        pytest.skip("strace cannot trace here")
    assert r.returncode == 0, r.stderr
    lookups = [line for line in log.read_text().splitlines()
               if "/etc/resolv.conf" in line or "/etc/hosts" in line or "htons(53)" in line]  # fmt: skip
    assert not lookups, lookups[:5]
