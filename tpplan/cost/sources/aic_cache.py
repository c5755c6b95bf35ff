"""AIConfigurator's answers kept on disk, so `--engine` prices at interactive speed.

Asking AIC's database costs seconds per process before the first answer: importing the package
(~0.5 s), listing its databases (~3 s), loading one database (~0.8 s) and each op family's tables
(1-10 s per family on a 2-core machine, most of it turning parquet rows into Python mappings). A
command asks a few hundred distinct questions. This module keeps, per AIC system x engine x
engine version, a compact JSON file of the answers the adapter gave (`AicSource.gemm`, `attention`,
`moe`, `collective`: seconds, source name, extrapolated, or "no answer"), the database listing and
the default versions, which tables AIC served low-fidelity fallback rows for, and each table's
measured axes (`aic_axes`, keys `axes:<family>`), so a new question loads AIC's engine but not its
slow Python view of the table. A question the
file holds is answered without importing AIC; one it lacks loads the database as before and adds
its answer (written when the process or a forked worker ends, atomically: a temporary file in the same folder, then
`os.replace`, merged with what another process wrote meanwhile, under a lock on `.lock` in the
folder so that concurrent writers do not drop each other's answers).

Where: `$TPPLAN_CACHE_DIR`, else `$XDG_CACHE_HOME/tpplan/aic`, else `~/.cache/tpplan/aic`. Each file's
name and header carry the installed `aiconfigurator-core` version and a digest of the adapter's
source (this module, `aic.py`, `aic_axes.py` and the shapes of `kernel_source.py`), so a new package or a changed
adapter starts a new file and never reads an old answer. Only files of this naming in that folder
are written, and a new file replaces its predecessors (the same database's files of another version
or adapter). A folder that cannot be written is not an error: the answers are then recomputed next
time.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

CACHE_ENV = "TPPLAN_CACHE_DIR"
PACKAGE = "aiconfigurator-core"
FORMAT = 1  # the file layout below; the adapter digest covers what the answers mean
_LOG = logging.getLogger("tpplan.aic")


def cache_dir() -> Path:
    """The folder tpplan keeps AIC's answers in (see the module docstring)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tpplan" / "aic"


@cache
def package_version() -> str:
    """The installed aiconfigurator-core version ("none" where it is absent): from its dist-info folder's
    name beside the package (importing `importlib.metadata` alone costs ~0.07 s of an audit), else
    from the package metadata."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None:
        return "none"
    for where in spec.submodule_search_locations or ():
        for info in Path(where).parent.glob("aiconfigurator_core-*.dist-info"):
            return info.name.removeprefix("aiconfigurator_core-").removesuffix(".dist-info")
    from importlib import metadata

    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return "none"


@cache
def adapter_digest() -> str:
    """Digest of the adapter code whose answers the files hold: a change to it starts new files."""
    here = Path(__file__).parent
    h = hashlib.sha256()
    for path in (here / "aic.py", here / "aic_axes.py", here / "aic_cache.py", here.parent / "kernel_source.py"):
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


class AnswerFile:
    """One cache file: a mapping of question keys to JSON answers, plus the fallback tables."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.header = {"format": FORMAT, "package": PACKAGE, "version": package_version(), "adapter": adapter_digest()}
        self.path = cache_dir() / f"{name}.aic-{package_version()}.{adapter_digest()}.json"
        self.answers: dict[str, Any] = {}
        self.fallbacks: dict[str, str] = {}
        self._new: dict[str, Any] = {}
        self._read_into(self.answers, self.fallbacks)

    def _read_into(self, answers: dict[str, Any], fallbacks: dict[str, str]) -> None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return  # absent or unreadable: start empty (the file is rewritten whole on save)
        if not isinstance(data, dict) or data.get("header") != self.header:
            return
        answers.update(data.get("answers") or {})
        fallbacks.update(data.get("fallbacks") or {})

    def get(self, key: str) -> tuple[bool, Any]:
        """(held, answer): whether the file holds `key`, and its answer."""
        if key in self.answers:
            return True, self.answers[key]
        return False, None

    def put(self, key: str, answer: Any, fallbacks: dict[str, str] | None = None) -> None:
        self.answers[key] = answer
        self._new[key] = answer
        if fallbacks:
            self.fallbacks.update(fallbacks)
        _dirty.add(self)

    def save(self) -> None:
        """Merge the new answers into the file on disk and replace it atomically."""
        if not self._new:
            return
        tmp = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = os.open(self.path.parent / ".lock", os.O_CREAT | os.O_RDWR, 0o644)
        except OSError as exc:
            _LOG.debug("AIC answer cache %s not written: %s", self.path, exc)
            return
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one writer at a time: a search's workers save together
            answers: dict[str, Any] = {}
            fallbacks: dict[str, str] = {}
            self._read_into(answers, fallbacks)  # another process may have added answers meanwhile
            answers.update(self._new)
            fallbacks.update(self.fallbacks)
            body = json.dumps({"header": self.header, "fallbacks": fallbacks, "answers": answers},
                              separators=(",", ":"))  # fmt: skip
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(body)
            os.replace(tmp, self.path)
            tmp = None
            self._new = {}
            self._drop_stale()
        except OSError as exc:
            _LOG.debug("AIC answer cache %s not written: %s", self.path, exc)
        finally:
            os.close(lock)  # releases the lock
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)

    def _drop_stale(self) -> None:
        """Remove this file's predecessors that tpplan wrote for another package version or adapter
        (same name, same naming pattern), so the folder holds one file per database."""
        for old in self.path.parent.glob(f"{self.name}.aic-*.json"):
            if old != self.path:
                old.unlink(missing_ok=True)


_files: dict[str, AnswerFile] = {}
_dirty: set[AnswerFile] = set()


def answer_file(name: str) -> AnswerFile:
    """The process's one `AnswerFile` of this name (under the current cache folder)."""
    key = f"{cache_dir()}/{name}"
    if key not in _files:
        _files[key] = AnswerFile(name)
    return _files[key]


def save_all() -> None:
    """Write every file with new answers (at exit; tests call it to check the round trip)."""
    for f in list(_dirty):
        f.save()
    _dirty.clear()


def forget() -> None:
    """Drop the in-process copies (the files stay): the next `answer_file` reads the disk again."""
    save_all()
    _files.clear()


class _ForkHook:
    """Registered with multiprocessing (held weakly there, so kept alive here): in a forked worker,
    registers the save as a multiprocessing finalizer, since the worker leaves through `os._exit`
    (skipping atexit) after running those."""

    def __call__(self, _self: object) -> None:
        from multiprocessing import util

        util.Finalize(None, save_all, exitpriority=10)


def _hook_forked_workers() -> None:
    from multiprocessing import util

    util.register_after_fork(_FORK_HOOK, _FORK_HOOK)


_FORK_HOOK = _ForkHook()
atexit.register(save_all)
_hook_forked_workers()

__all__ = [
    "CACHE_ENV",
    "AnswerFile",
    "adapter_digest",
    "answer_file",
    "cache_dir",
    "forget",
    "package_version",
    "save_all",
]
