"""Output paths: checked before any work starts, written atomically, never over what tpplan did not write.

Every command that writes files checks each output path first (`check_file`, `check_dir`), so a
bad path costs one line and exit 2 before minutes of work and leaves nothing behind. The writers
(`write_files`, `write_dir`) go through a temporary file or folder beside the target and rename it
into place; on any failure the temporary is removed and whatever was there before stays.

A folder output (`report --out`) carries MARKER: the files tpplan put there and their SHA-256.
An existing folder is replaced only when it is empty or holds exactly those files, unchanged;
any other non-empty folder (notes, a git repository, an edited report) is refused, untouched.
A file output (`--json`, `--md`, `bench --out`, `calibrate --out`) is recorded with its SHA-256
in LEDGER, a small file in the same folder; an existing file is replaced only when the ledger lists
it unchanged (tpplan wrote it), any other existing file is refused, untouched.
No torch here: the planner's commands use it too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from tpplan.errors import TpplanError

MARKER = ".tpplan-output"
LEDGER = ".tpplan-files"  # beside single-file outputs: the files tpplan wrote in this folder, with SHA-256


def _ledger(folder: Path) -> dict[str, str]:
    """name -> SHA-256 of the files tpplan wrote in `folder` (empty when it has no readable ledger)."""
    try:
        data = json.loads((folder / LEDGER).read_text(encoding="utf-8"))
        files = data["files"]
        return {str(k): str(v) for k, v in files.items()} if data.get("written_by") == "tpplan" else {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def record_written(written: Mapping[Path, bytes]) -> None:
    """Add the files just written (path -> the bytes written) with their SHA-256 to their folders'
    ledgers, so that a later run may replace them and nothing else."""
    by_folder: dict[Path, dict[str, bytes]] = {}
    for path, data in written.items():
        by_folder.setdefault(path.parent, {})[path.name] = data
    for folder, contents in by_folder.items():
        files = {**_ledger(folder), **_fingerprint(contents)}
        text = json.dumps({"written_by": "tpplan", "files": dict(sorted(files.items()))}, indent=1) + "\n"
        fd, tmp = tempfile.mkstemp(prefix=f"{LEDGER}.", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, folder / LEDGER)


def _written_by_tpplan(p: Path) -> bool:
    digest = _ledger(p.parent).get(p.name)
    return digest is not None and digest == _fingerprint({p.name: p.read_bytes()})[p.name]


def _error(option: str, path: Path, reason: str, fix: str) -> TpplanError:
    return TpplanError(f"{option} {path}", reason, fix)


def _no_write_bits(path: Path) -> bool:
    """Nobody may write here by its mode (checked by bits, so that it also holds for root)."""
    return not stat.S_IMODE(path.stat().st_mode) & 0o222


def _check_folder(option: str, path: Path, folder: Path) -> None:
    """`folder` (where `path`'s temporary goes) exists, is a folder, and takes new files."""
    existing = folder
    while not existing.exists() and not existing.is_symlink() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise _error(option, path, f"{existing} is a file, not a folder", "pass a path inside an existing folder")
    if existing != folder:
        raise _error(option, path, f"folder {folder} does not exist", f"create it first (mkdir -p {folder})")
    try:
        if _no_write_bits(folder) or not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError("permission denied")
        fd, probe = tempfile.mkstemp(prefix=".tpplan-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise _error(
            option, path, f"cannot create files in folder {folder} ({reason.lower()})", "pass a folder you can write to"
        ) from None


def check_file(option: str, path: str | Path) -> Path:
    """A file output: not a folder, not read-only, and its folder exists and is writable."""
    p = Path(path)
    if p.is_dir():
        raise _error(option, p, "is a folder, not a file", f"pass a file path, e.g. {p / 'out.json'}")
    if p.exists():
        if not p.is_file():
            raise _error(option, p, "is not a regular file", "pass a path to a new or regular file")
        if _no_write_bits(p):
            raise _error(option, p, "is read-only", "make it writable (chmod u+w) or pass another path")
        if p.stat().st_size and not _written_by_tpplan(p):
            raise _error(
                option, p, "exists and tpplan did not write it (or it changed since)",
                "pass a new file path (or move this file away yourself); tpplan replaces only its own files",
            )  # fmt: skip
    _check_folder(option, p, p.parent)
    return p


def _fingerprint(files: Mapping[str, bytes]) -> dict[str, str]:
    return {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())}


def _foreign(folder: Path) -> str | None:
    """Why `folder` is not tpplan's to replace (None: it is empty, or tpplan's own unchanged output)."""
    entries = sorted(p.name for p in folder.iterdir())
    if not entries:
        return None
    marker = folder / MARKER
    if not marker.is_file():
        shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
        return f"is not empty ({shown}) and tpplan did not write it"
    try:
        listed = json.loads(marker.read_text(encoding="utf-8"))["files"]
        assert isinstance(listed, dict)
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        return f"its {MARKER} file is not one tpplan wrote"
    for name in entries:
        if name == MARKER:
            continue
        f = folder / name
        if name not in listed or not f.is_file() or f.is_symlink():
            return f"holds {name}, which tpplan did not write"
        if hashlib.sha256(f.read_bytes()).hexdigest() != listed[name]:
            return f"{name} was changed after tpplan wrote it"
    return None


def check_dir(option: str, path: str | Path) -> Path:
    """A folder output: new, empty, or tpplan's own earlier output (see MARKER); its parent writable."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise _error(option, p, "is a file, not a directory", "pass a folder path (a new one, or one tpplan wrote)")
    if p.is_dir() and Path.cwd().resolve().is_relative_to(p.resolve()):
        raise _error(option, p, "is the current folder or holds it", "pass a new folder path, e.g. --out report")
    if p.is_dir():
        why = _foreign(p)
        if why is not None:
            raise _error(
                option, p, f"{why}; tpplan replaces only its own earlier output",
                "pass a new folder path (or move this folder's contents away yourself)",
            )  # fmt: skip
    _check_folder(option, p, p.parent)
    return p


@contextmanager
def write_errors(option: str, path: Path) -> Iterator[None]:
    """An OS error while writing (disk full, permissions changed since the check): one line, exit 2."""
    try:
        yield
    except OSError as exc:
        reason = f"could not be written ({exc.strerror or exc})"
        raise _error(option, path, reason, "free space or pass another path; nothing was written") from None


def write_files(files: Mapping[Path, str | bytes], option: str | None = None) -> None:
    """Write every file to a temporary beside it, then rename them all; on any error none is left.

    With `option`, an OS error (disk full, permissions changed since the check) becomes a
    TpplanError naming the option; without, it is re-raised as it is.
    """
    tmps: list[tuple[Path, Path]] = []
    written: dict[Path, bytes] = {}
    try:
        for path, content in files.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
            tmps.append((Path(tmp), path))
            data = written[path] = content.encode("utf-8") if isinstance(content, str) else content
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
        for tmp, path in tmps:
            os.replace(tmp, path)
        record_written(written)
    except BaseException as exc:
        for tmp, _ in tmps:
            tmp.unlink(missing_ok=True)
        if option is not None and isinstance(exc, OSError):
            with write_errors(option, tmps[-1][1] if tmps else next(iter(files), Path("."))):
                raise
        raise


def write_dir(out: str | Path, files: Mapping[str, bytes], option: str = "--out") -> Path:
    """Put `files` (name -> bytes) and MARKER in folder `out`, replacing only tpplan's own output.

    Checked again here (the folder may have changed during the work), written into a temporary
    folder beside `out`, then renamed into place; an error removes the temporary folder and puts
    an earlier output back, so a failed run leaves no half-written or empty folder.
    """
    target = check_dir(option, out)
    with write_errors(option, target):
        return _replace_dir(target, files)


def _replace_dir(target: Path, files: Mapping[str, bytes]) -> Path:
    parent = target.parent
    marker = json.dumps({"written_by": "tpplan", "files": _fingerprint(files)}, indent=1) + "\n"
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=parent))
    old: Path | None = None
    try:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        (tmp / MARKER).write_text(marker, encoding="utf-8")
        os.chmod(tmp, 0o755)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=parent))
            os.rmdir(old)
            os.rename(target, old)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and old.exists() and not target.exists():
            os.rename(old, target)  # put the earlier output back
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target
