"""The `*.safetensors` files of a `--weights` folder, each checked before safetensors opens it (issue 35).

safetensors trusts the file it is given: a FIFO named `model.safetensors` blocks the open (and
`verify` past its `--timeout`), `/dev/zero` behind a link reads forever, and an empty file, a header
length past the end, tensor offsets past the end or a pickle renamed `.safetensors` raise its own
errors, which named no file and no fix. Here every file is a regular file (from `os.stat`, before
anything is opened) whose 8-byte header length and JSON header fit inside it and whose tensors'
data offsets do too; `open_checkpoint` turns whatever safetensors still refuses into the same
one-line error. Nothing here unpickles anything.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tpplan.errors import TpplanError
from tpplan.inputs import check_path

MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit on the JSON header
FIX = "point weights= at a folder of real *.safetensors files (re-export the checkpoint with safetensors if needed)"


def check_folder(folder: Path | None) -> None:
    """`--weights` (None: random weights): a folder whose `*.safetensors` files all pass `check_file`,
    checked in the command before any rank starts."""
    if folder is None:
        return
    check_path(folder, f"weights={folder}", FIX)
    if not folder.is_dir():
        raise TpplanError(f"weights={folder}", "not a folder", "pass the folder holding the *.safetensors files")
    checkpoint_files(folder)


def checkpoint_files(folder: str | Path) -> list[Path]:
    """The folder's `*.safetensors` files, sorted, each checked (`check_file`); none: TpplanError."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise TpplanError(str(folder), "no *.safetensors files found", "point at the checkpoint folder")
    for f in files:
        check_file(f)
    return files


def check_file(path: Path) -> None:
    """Refuse `path` unless it is a regular file laid out as safetensors (header length, JSON header,
    every tensor's data offsets inside the file), read without blocking."""
    where = f"weights={path}"
    try:
        st = os.stat(path)  # follows links: /dev/zero behind one is a device here
    except FileNotFoundError:
        raise TpplanError(where, "is a link to nothing (dangling)", FIX) from None
    except OSError as exc:
        raise TpplanError(where, f"cannot be read ({exc.strerror or exc})", FIX) from None
    if stat.S_ISDIR(st.st_mode):
        raise TpplanError(where, "is a folder, not a file", FIX)
    if not stat.S_ISREG(st.st_mode):
        raise TpplanError(
            where, "is not a regular file (a FIFO, socket or device), which would block or never end", FIX
        )
    size = st.st_size
    if size < 8:
        raise TpplanError(where, f"is {size} bytes, too short for a safetensors file (an 8-byte header length first)",
                          FIX)  # fmt: skip
    raw = _read_header(path, where, size)
    header = _header(raw, where)
    data = size - 8 - len(raw)
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
                and 0 <= offsets[0] <= offsets[1] <= data):  # fmt: skip
            raise TpplanError(where, f"tensor {name[:80]!r} has data offsets {str(offsets)[:80]} outside the file's "
                              f"{data:,} data bytes (truncated or corrupt)", FIX)  # fmt: skip


def _read_header(path: Path, where: str, size: int) -> bytes:
    """The JSON header's bytes: the 8-byte little-endian length, then that many bytes, both inside the file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # swapped for a FIFO after the stat: no wait
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise TpplanError(where, "is not a regular file", FIX)
            first = f.read(8)
            if first is None or len(first) < 8:
                raise TpplanError(where, "changed while it was read", FIX)
            (n,) = struct.unpack("<Q", first)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise TpplanError(where, f"is not a safetensors file: its header length {n:,} runs past its {size:,} "
                                  "bytes (a PyTorch .bin or pickle renamed .safetensors?)", FIX)  # fmt: skip
            raw = f.read(n)
    except OSError as exc:
        raise TpplanError(where, f"cannot be read ({exc.strerror or exc})", FIX) from None
    if raw is None or len(raw) < n:
        raise TpplanError(where, "changed while it was read", FIX)
    return raw


def _header(raw: bytes, where: str) -> dict[str, Any]:
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        header = None
    if not isinstance(header, dict):
        raise TpplanError(where, "is not a safetensors file: its header is not a JSON object", FIX)
    return header


@contextmanager
def open_checkpoint(path: Path) -> Iterator[Any]:
    """`safetensors.safe_open(path)`, its errors (a dtype or shape the header gets wrong) as one line."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            yield fh
    except SafetensorError as exc:
        raise TpplanError(f"weights={path}", f"safetensors cannot read it ({str(exc)[:200]})", FIX) from None


__all__ = ["check_file", "check_folder", "checkpoint_files", "open_checkpoint"]
