"""Output paths: checked before any work starts, written whole or not at all, never over what tpplan did not write.

Every command that writes files checks its output paths first, all together (`check_outputs`: each
by `check_file`/`check_dir`, then no two naming one file and none inside a folder output, which is
replaced whole), so a bad path costs one line and exit 2 before minutes of work and leaves nothing
behind. The writers (`write_files`, `write_dir`) go through temporaries beside the targets and
rename them into place; on any failure (a full disk, SIGINT, SIGTERM, SIGHUP) the temporaries are
removed and what was there stays. Each temporary is recorded the instant it exists (signals held
until then, `tpplan.signals.deferred`), so no signal can leave one behind.

A folder output (`report --out`, `search --save`) carries MARKER: the command that wrote it and
the files it put there with their SHA-256. An existing folder is replaced only when it is empty and
writable, or holds exactly those files, unchanged, written by the same command; any other folder
(notes, a git repository, an edited report, another command's output) is refused, untouched.
A MARKER from an older tpplan names no command: it was written by `search --save` when it lists
that command's `index.json`, otherwise by `report` (the only two folder writers then).

A file output (`--json`, `--md`, `bench --out`, `calibrate --out`) is recorded with its SHA-256
in LEDGER, a small file in the same folder; an existing file (even an empty one) is replaced only
when the ledger lists its content (tpplan wrote it, unchanged since), any other is refused. A file
named LEDGER that is not a ledger tpplan wrote is refused too (never replaced). The ledger is read,
changed and renamed while holding LOCK (fcntl.flock), an empty file beside it that tpplan creates
and never writes or removes (removing it would let two runs hold two locks), so two runs writing
into one folder keep each other's entries; under the lock each target is checked once more.
Symbolic links are never outputs (tpplan would replace the link, not what it points to), and
LEDGER, LOCK and MARKER themselves are never outputs.

`write_files` writes in this order, so that each failure leaves a state the next run accepts:
1. every output's temporary and then every folder's new ledger temporary, each fsynced. The new
   ledger accepts, for each name written, both the content recorded before and the new content.
   A failure here (ENOSPC, a signal) removes every temporary: nothing new, nothing left.
2. rename the ledgers, then the outputs. A failure between these renames leaves every output
   either old or new, and the ledger accepts both: no file tpplan wrote is ever unrecorded.
3. rename a compacted ledger (only the new contents) over it; best effort, since a ledger that
   also accepts the previous content is harmless.
SIGTERM and SIGHUP during a write are turned into an exception (exit 143, 129) so they clean up as
SIGINT does (`tpplan.signals.exit_cleanly`).
No torch here: the planner's commands use it too.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from tpplan.errors import TpplanError
from tpplan.inputs import check_path
from tpplan.signals import deferred, exit_cleanly

MARKER = ".tpplan-output"
LEDGER = ".tpplan-files"  # beside single-file outputs: the files tpplan wrote in this folder, with SHA-256
LOCK = ".tpplan-files.lock"  # beside LEDGER: held (flock) while a run reads, changes and renames the ledger
_RESERVED = (MARKER, LEDGER, LOCK)
FOLDER_WRITERS = {"--out": "report", "--save": "search --save"}  # a folder option -> the command it belongs to
_LEGACY_SEARCH_INDEX = "index.json"  # what an older `search --save` folder always held (tpplan.plans.files)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fingerprint(files: Mapping[str, bytes]) -> dict[str, str]:
    return {name: _sha256(data) for name, data in sorted(files.items())}


def _read_ledger(folder: Path) -> dict[str, tuple[str, ...]] | None:
    """name -> the SHA-256 digests tpplan wrote under that name in `folder` ({}: no ledger there);
    None when a file of that name is there that is not a ledger tpplan wrote (never replaced). A
    value is one digest, or a list while a write is under way (see the module docstring)."""
    path = folder / LEDGER
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return None
    except FileNotFoundError:
        return {}
    except OSError:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("written_by") != "tpplan":
            return None
        return {str(k): (str(v),) if isinstance(v, str) else tuple(str(d) for d in v) for k, v in data["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None


def _ledger(folder: Path) -> dict[str, tuple[str, ...]]:
    """The ledger of `folder`, empty when there is none or it is not tpplan's."""
    return _read_ledger(folder) or {}


def _own_ledger(option: str, path: Path) -> dict[str, tuple[str, ...]]:
    """The ledger beside output `path`; refused (exit 2) when a file tpplan did not write has its name."""
    found = _read_ledger(path.parent)
    if found is None:
        raise _error(
            option, path, f"its folder holds {path.parent / LEDGER}, which is not the record tpplan keeps there "
            "(tpplan did not write it) and would have to replace",
            "move that file away, or pass a path in another folder",
        )  # fmt: skip
    return found


@contextmanager
def _locked(option: str, path: Path) -> Iterator[None]:
    """Hold LOCK beside output `path` (fcntl.flock, exclusive), so that two runs writing into one
    folder read, change and rename its ledger one after the other and neither loses the other's
    entry. LOCK is created empty and never written; a LOCK that is not a regular file is refused."""
    try:
        import fcntl
    except ImportError:  # no flock on this platform: unlocked, as before
        yield
        return
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path.parent / LOCK, flags, 0o644)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise  # as any OS error while writing (a folder gone, a full disk)
        raise _error(option, path, f"{path.parent / LOCK} is a symbolic link",
                     f"remove {path.parent / LOCK} (tpplan's lock file)") from None  # fmt: skip
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _error(option, path, f"{path.parent / LOCK} is not a plain file",
                         f"remove {path.parent / LOCK} (tpplan's lock file)")  # fmt: skip
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _ledger_text(files: Mapping[str, tuple[str, ...]]) -> bytes:
    shown = {k: v[0] if len(v) == 1 else list(v) for k, v in sorted(files.items())}
    return (json.dumps({"written_by": "tpplan", "files": shown}, indent=1) + "\n").encode("utf-8")


def _write_temp(folder: Path, prefix: str, data: bytes, temps: dict[Path, Path], key: Path) -> Path:
    """`data` in a new temporary file in `folder`, fsynced and world-readable, recorded as `temps[key]`
    the instant it exists (signals held until then: `tpplan.signals.deferred`), so that the caller's
    cleanup, which removes every temporary in `temps`, always knows it."""
    fd = -1
    try:
        with deferred():
            fd, name = tempfile.mkstemp(prefix=prefix, dir=folder)
            tmp = temps[key] = Path(name)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        if fd >= 0:
            os.close(fd)
    os.chmod(tmp, 0o644)
    return tmp


def _written_by_tpplan(p: Path) -> bool:
    digests = _ledger(p.parent).get(p.name, ())
    return bool(digests) and _sha256(p.read_bytes()) in digests


def _error(option: str, path: Path, reason: str, fix: str) -> TpplanError:
    return TpplanError(f"{option} {path}", reason, fix)


def _no_write_bits(path: Path) -> bool:
    """Nobody may write here by its mode (checked by bits, so that it also holds for root)."""
    return not stat.S_IMODE(path.stat().st_mode) & 0o222


def _check_name(option: str, path: Path) -> None:
    """Not one of tpplan's own bookkeeping files, and not a symbolic link (dangling or not)."""
    check_path(path, f"{option} {path}", "pass a shorter path")
    if str(path) == "-":  # what `--json -` means; a file or folder named '-' would be a surprise
        raise _error(option, path, "names standard output, which only --json writes to",
                     "pass a file or folder path (`--json -` prints the JSON)")  # fmt: skip
    if path.name in _RESERVED:
        raise _error(option, path, f"is the name of tpplan's own record ({path.name})", "pass another file name")
    if path.is_symlink():
        raise _error(
            option, path, "is a symbolic link; tpplan never replaces one",
            "pass the path it points to, or a new path",
        )  # fmt: skip


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
        with deferred():  # a signal here must not leave the probe behind
            fd, probe = tempfile.mkstemp(prefix=".tpplan-probe-", dir=folder)
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise _error(
            option, path, f"cannot create files in folder {folder} ({reason.lower()})", "pass a folder you can write to"
        ) from None


def check_file(option: str, path: str | Path) -> Path:
    """A file output: not a link, a folder or tpplan's record; not read-only; new or tpplan's own; its
    folder exists and is writable, and any ledger there is tpplan's."""
    with _usable(option, path):
        return _check_file(option, Path(path))


@contextmanager
def _usable(option: str, path: str | Path) -> Iterator[None]:
    """A path the OS cannot even look at (a name over 255 bytes, a loop of links): one line, exit 2."""
    try:
        yield
    except OSError as exc:
        fix = "pass a shorter path" if exc.errno == errno.ENAMETOOLONG else "pass another path"
        raise _error(
            option, Path(path), f"cannot be used as a path ({(exc.strerror or str(exc)).lower()})", fix
        ) from None


def _check_file(option: str, p: Path) -> Path:
    _check_name(option, p)
    if p.is_dir():
        raise _error(option, p, "is a folder, not a file", f"pass a file path, e.g. {p / 'out.json'}")
    if p.exists():
        if not p.is_file():
            raise _error(option, p, "is not a regular file", "pass a path to a new or regular file")
        if _no_write_bits(p):
            raise _error(option, p, "is read-only", "make it writable (chmod u+w) or pass another path")
        if not _written_by_tpplan(p):
            raise _error(
                option, p, "exists and tpplan did not write it (or it changed since)",
                "pass a new file path (or move this file away yourself); tpplan replaces only its own files",
            )  # fmt: skip
    _check_folder(option, p, p.parent)
    _own_ledger(option, p)
    lock = p.parent / LOCK
    if lock.is_symlink() or (lock.exists() and not lock.is_file()):
        raise _error(option, p, f"{lock} is not a plain file", f"remove {lock} (tpplan's lock file)")
    return p


def _foreign(folder: Path, command: str) -> str | None:
    """Why `folder` is not `command`'s to replace (None: it is empty, or that command's unchanged output)."""
    entries = sorted(p.name for p in folder.iterdir())
    if not entries:
        return None
    marker = folder / MARKER
    if not marker.is_file() or marker.is_symlink():
        shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
        return f"is not empty ({shown}) and tpplan did not write it"
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
        listed, writer = data["files"], data.get("command")
        assert isinstance(listed, dict) and (writer is None or isinstance(writer, str))
    except (OSError, ValueError, KeyError, TypeError, AssertionError, AttributeError, RecursionError):
        return f"its {MARKER} file is not one tpplan wrote"
    if writer is None:  # an older tpplan's marker: told apart by what the folder holds
        writer = FOLDER_WRITERS["--save"] if _LEGACY_SEARCH_INDEX in listed else FOLDER_WRITERS["--out"]
    if writer != command:
        return f"was written by `tpplan {writer}`, not `tpplan {command}`"
    for name in entries:
        if name == MARKER:
            continue
        f = folder / name
        if name not in listed or not f.is_file() or f.is_symlink():
            return f"holds {name}, which tpplan did not write"
        if _sha256(f.read_bytes()) != listed[name]:
            return f"{name} was changed after tpplan wrote it"
    return None


def check_dir(option: str, path: str | Path, command: str | None = None) -> Path:
    """A folder output: new, empty and writable, or `command`'s own earlier output (see MARKER); its
    parent writable. `command` defaults to the one that owns `option` (FOLDER_WRITERS)."""
    with _usable(option, path):
        return _check_dir(option, Path(path), command or FOLDER_WRITERS.get(option, option))


@dataclass(frozen=True)
class Output:
    """One output of a command: a file (`--json`, `--md`, `bench --out`) or, with `folder`, a folder it
    replaces whole (`report --out`, `search --save`; `command` as in `check_dir`)."""

    option: str
    path: Path | str
    folder: bool = False
    command: str | None = None


def check_outputs(*outputs: Output) -> list[Path]:
    """Every output of one command, each checked and all against each other, before any work: no two
    name the same file, and none lies inside a folder output (replaced whole, it would drop the file,
    or be refused after the file was written). The paths, as `check_file`/`check_dir` return them."""
    paths = [Path(o.path) for o in outputs]
    with _usable(outputs[0].option if outputs else "", paths[0] if paths else ""):
        real = [Path(os.path.realpath(p)) for p in paths]
    for j in range(len(outputs)):
        for i in range(j):
            if real[i] == real[j]:
                raise _error(outputs[j].option, paths[j], f"is the same path as {outputs[i].option} {paths[i]}",
                             "give each option a path of its own")  # fmt: skip
            for f, x in ((i, j), (j, i)):
                if outputs[f].folder and real[x].is_relative_to(real[f]):
                    raise _error(outputs[x].option, paths[x],
                                 f"is inside {outputs[f].option} {paths[f]}, a folder tpplan replaces whole",
                                 "pass a path outside that folder")  # fmt: skip
    return [check_dir(o.option, o.path, o.command) if o.folder else check_file(o.option, o.path) for o in outputs]


def _check_dir(option: str, p: Path, command: str) -> Path:
    _check_name(option, p)
    if p.exists() and not p.is_dir():
        raise _error(option, p, "is a file, not a directory", "pass a folder path (a new one, or one tpplan wrote)")
    if p.is_dir() and Path.cwd().resolve().is_relative_to(p.resolve()):
        raise _error(option, p, "is the current folder or holds it", "pass a new folder path, e.g. --out report")
    if p.is_dir():
        if _no_write_bits(p):
            raise _error(option, p, "is a read-only folder", "make it writable (chmod u+w) or pass another path")
        why = _foreign(p, command)
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
    """Write every file whole, record it in its folder's ledger, or leave everything as it was.

    The order of the steps is the module docstring's, under each folder's LOCK. With `option`, the
    paths are checked again, together (they may have appeared during the work), and an OS error
    becomes a TpplanError naming the option; without, the error is re-raised as it is. Under the
    lock, each target must still be new or tpplan's and its ledger tpplan's (else exit 2).
    """
    if not files:
        return
    data = {Path(p): c.encode("utf-8") if isinstance(c, str) else c for p, c in files.items()}
    shown = list(data)[-1]
    where = option or "output"
    try:
        with exit_cleanly(), ExitStack() as held:
            if option is not None:
                check_outputs(*(Output(option, p) for p in data))
            first = {p.parent: p for p in reversed(list(data))}  # a folder -> one output in it, for messages
            for folder in first:  # every folder there before any lock file is made in one
                if not folder.is_dir():
                    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(folder))
            for folder in sorted(first, key=lambda f: os.path.realpath(f)):
                held.enter_context(_locked(where, first[folder]))
            for p in data:
                _still_ours(where, p)
            _write_recorded(data)
    except OSError:
        if option is None:
            raise
        with write_errors(option, shown):
            raise


def _still_ours(option: str, path: Path) -> None:
    """Under the lock: `path`'s ledger is tpplan's, and `path` is new or tpplan's unchanged file."""
    _own_ledger(option, path)
    if (path.exists() or path.is_symlink()) and (
        not stat.S_ISREG(path.lstat().st_mode) or not _written_by_tpplan(path)
    ):
        raise _error(option, path, "appeared while tpplan worked, and tpplan did not write it",
                     "pass a new file path (or move this file away yourself); nothing was written")  # fmt: skip


def _write_recorded(files: Mapping[Path, bytes]) -> None:
    temps: dict[Path, Path] = {}  # target -> its temporary, while not yet renamed
    by_folder: dict[Path, dict[str, bytes]] = {}
    for path, data in files.items():
        by_folder.setdefault(path.parent, {})[path.name] = data
    final: dict[Path, dict[str, tuple[str, ...]]] = {}
    try:
        for path, data in files.items():
            _write_temp(path.parent, f".{path.name}.", data, temps, path)
        for folder, contents in by_folder.items():
            before = _ledger(folder)
            new = {name: (digest,) for name, digest in _fingerprint(contents).items()}
            final[folder] = {**before, **new}
            pending = {**before, **{n: (*d, *(x for x in before.get(n, ()) if x not in d)) for n, d in new.items()}}
            _write_temp(folder, f"{LEDGER}.", _ledger_text(pending), temps, folder / LEDGER)
        for folder in by_folder:  # ledgers first: they accept the old and the new content
            os.replace(temps[folder / LEDGER], folder / LEDGER)
            del temps[folder / LEDGER]
            _fsync_folder(folder)
        for path in files:
            os.replace(temps[path], path)
            del temps[path]
        for folder, entries in final.items():  # best effort: a ledger that also accepts the old content is harmless
            with suppress(OSError):
                _write_temp(folder, f"{LEDGER}.", _ledger_text(entries), temps, folder / LEDGER)
                os.replace(temps[folder / LEDGER], folder / LEDGER)
                del temps[folder / LEDGER]
    finally:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)


def _fsync_folder(folder: Path) -> None:
    """Make a rename durable before the next one depends on it (not every file system allows it)."""
    with suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_dir(out: str | Path, files: Mapping[str, bytes], option: str = "--out", command: str | None = None) -> Path:
    """Put `files` (name -> bytes) and MARKER in folder `out`, replacing only `command`'s own output.

    Checked again here (the folder may have changed during the work), written into a temporary
    folder beside `out`, then renamed into place; an error (SIGINT and SIGTERM included) removes the
    temporary folder and puts an earlier output back, so a failed run leaves no half-written or
    empty folder. `command` defaults to the one that owns `option` (FOLDER_WRITERS).
    """
    command = command or FOLDER_WRITERS.get(option, option)
    with exit_cleanly():
        target = check_dir(option, out, command)
        with write_errors(option, target):
            return _replace_dir(target, files, command)


def _replace_dir(target: Path, files: Mapping[str, bytes], command: str) -> Path:
    """Write `files` into a temporary folder beside `target`, move an earlier `target` aside, rename
    the new one into place and remove the old. Each temporary name is recorded the instant it exists
    (signals held until then), and cleanup goes by what is on disk: the new folder in place, the old
    one is removed; not in place, the old one is put back."""
    parent = target.parent
    marker = {"written_by": "tpplan", "command": command, "files": _fingerprint(files)}
    tmp: Path | None = None
    old: Path | None = None
    try:
        with deferred():
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=parent))
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        (tmp / MARKER).write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
        os.chmod(tmp, 0o755)
        if target.exists():
            with deferred():  # a free name for the old folder, taken by the rename below
                old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=parent))
                os.rmdir(old)
            os.rename(target, old)
        os.rename(tmp, target)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and old.exists():
            if target.exists():
                shutil.rmtree(old, ignore_errors=True)  # the new output got into place after all
            else:
                os.rename(old, target)  # put the earlier output back
        raise
    if old is not None:
        try:
            shutil.rmtree(old)
        except BaseException:
            shutil.rmtree(old, ignore_errors=True)  # a signal mid-way: still nothing left
            raise
    return target
