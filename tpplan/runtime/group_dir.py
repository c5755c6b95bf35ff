"""The scratch folder of one local process group (rank 0's result, each rank's error file), and the
removal of those that runs killed outright (SIGKILL, a lost machine) left in the temp folder.

A folder is `tpplan-group-<pid>-<random>` in the temp folder, holding OWNER: the pid and start time
of the process that made it. A later run removes a folder only when everything says tpplan made it
and its maker is gone: a real folder (not a link), owned by this user, its name's pid the one OWNER
records, and no process with that pid and start time alive. Anything else (another user's, an older
tpplan's, one a live run uses) is left alone.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

PREFIX = "tpplan-group-"
OWNER = "tpplan-owner.json"


def _started(pid: int) -> str | None:
    """When process `pid` started (clock ticks after boot, Linux), None where that cannot be read."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None  # field 22 of proc(5); fields[0] is field 3


def _alive(pid: int, started: str | None) -> bool:
    """A process `pid` runs and, where start times can be read, is the one that started then."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive, and not ours to judge
    now = _started(pid)
    return now is None or started is None or now == started


def _stale(folder: Path) -> bool:
    """`folder` is a group folder tpplan made whose maker is no longer running."""
    try:
        info = folder.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return False
        pid = int(folder.name[len(PREFIX) :].split("-", 1)[0])
        owner = folder / OWNER
        if not stat.S_ISREG(owner.lstat().st_mode):
            return False
        data = json.loads(owner.read_text(encoding="utf-8"))
        if data.get("pid") != pid:
            return False
    except (OSError, ValueError, AttributeError):
        return False
    return not _alive(pid, data.get("started"))


def remove_stale() -> list[Path]:
    """Remove the group folders of runs that are no longer running (see the module docstring)."""
    removed: list[Path] = []
    root = Path(tempfile.gettempdir())
    try:
        candidates = [p for p in root.iterdir() if p.name.startswith(PREFIX)]
    except OSError:
        return removed
    for folder in candidates:
        if _stale(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def make() -> tempfile.TemporaryDirectory[str]:
    """A new group folder for this process (after removing stale ones), OWNER written in it."""
    remove_stale()
    pid = os.getpid()
    tmp = tempfile.TemporaryDirectory(prefix=f"{PREFIX}{pid}-")
    owner = {"pid": pid, "started": _started(pid)}
    (Path(tmp.name) / OWNER).write_text(json.dumps(owner), encoding="utf-8")
    return tmp


__all__ = ["OWNER", "PREFIX", "make", "remove_stale"]
